//! The float codecs: `f32` (exact), IEEE `f16` and `bf16`, all little-endian.
//!
//! Conversions round to nearest even with branch-free bit arithmetic (after F. Giesen's
//! well-known float/half conversion scheme), so the loops vectorize and a CUDA kernel can
//! reproduce every bit. Values beyond a format's largest finite number saturate to it
//! instead of becoming infinite; a decoder rejects any Inf or NaN pattern it receives.

use super::CodecError;
use super::finite::check_input;
use super::kernels::{INF_BITS, multiversion};

/// Largest finite `f16`.
const F16_MAX: f32 = 65504.0;
/// Largest finite `bf16`, as an `f32`.
const BF16_MAX: f32 = f32::from_bits(0x7f7f_0000);

// ---- f32 ---------------------------------------------------------------------------------

pub(super) fn encode_f32(src: &[f32], dst: &mut [u8]) -> Result<(), CodecError> {
    check_input(src)?;
    encode_f32_kernel(src, dst);
    Ok(())
}

multiversion! { fn encode_f32_kernel(src: &[f32], dst: &mut [u8]) = encode_f32_impl; }

#[inline(always)]
fn encode_f32_impl(src: &[f32], dst: &mut [u8]) {
    for (out, x) in dst.chunks_exact_mut(4).zip(src) {
        out.copy_from_slice(&x.to_le_bytes());
    }
}

pub(super) fn decode_f32(
    src: &[u8],
    out: &mut [f32],
    weight: Option<f32>,
) -> Result<(), CodecError> {
    if max_abs_bits_f32(src) >= INF_BITS {
        let index = src
            .chunks_exact(4)
            .position(|b| !load_f32(b).is_finite())
            .unwrap_or(0);
        return Err(CodecError::NonFiniteDecoded { index });
    }
    match weight {
        None => decode_f32_kernel(src, out),
        Some(w) => accumulate_f32_kernel(src, w, out),
    }
    Ok(())
}

#[inline(always)]
fn load_f32(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

multiversion! { fn max_abs_bits_f32(src: &[u8]) -> u32 = max_abs_bits_f32_impl; }

#[inline(always)]
fn max_abs_bits_f32_impl(src: &[u8]) -> u32 {
    let mut lanes = [0u32; 8];
    let mut chunks = src.chunks_exact(32);
    for chunk in &mut chunks {
        for (lane, b) in lanes.iter_mut().zip(chunk.chunks_exact(4)) {
            *lane = (*lane).max(load_f32(b).to_bits() & 0x7fff_ffff);
        }
    }
    let mut max = lanes.into_iter().max().unwrap_or(0);
    for b in chunks.remainder().chunks_exact(4) {
        max = max.max(load_f32(b).to_bits() & 0x7fff_ffff);
    }
    max
}

multiversion! { fn decode_f32_kernel(src: &[u8], out: &mut [f32]) = decode_f32_impl; }

#[inline(always)]
fn decode_f32_impl(src: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
        *o = load_f32(b);
    }
}

multiversion! { fn accumulate_f32_kernel(src: &[u8], w: f32, acc: &mut [f32]) = accumulate_f32_impl; }

#[inline(always)]
fn accumulate_f32_impl(src: &[u8], w: f32, acc: &mut [f32]) {
    for (a, b) in acc.iter_mut().zip(src.chunks_exact(4)) {
        *a += w * load_f32(b);
    }
}

// ---- f16 ---------------------------------------------------------------------------------

/// `f32` → `f16` bits, round to nearest even, for finite `x` with `|x| ≤ 65504`.
#[inline(always)]
pub(crate) fn f32_to_f16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = (bits >> 16) & 0x8000;
    let abs = bits & 0x7fff_ffff;
    // Normal results: rebias the exponent, then round the 13 dropped mantissa bits to even.
    let mantissa_odd = (abs >> 13) & 1;
    let normal = abs.wrapping_add(0xc800_0fff).wrapping_add(mantissa_odd) >> 13;
    // Subnormal results (|x| < 2⁻¹⁴): an add of 0.5 lets the FPU do the rounding.
    const SUBNORMAL_MAGIC: u32 = 126 << 23;
    let subnormal = (f32::from_bits(abs) + f32::from_bits(SUBNORMAL_MAGIC))
        .to_bits()
        .wrapping_sub(SUBNORMAL_MAGIC);
    let half = if abs < (113 << 23) { subnormal } else { normal };
    (half | sign) as u16
}

/// `f16` bits → `f32`, exact, for finite halves (the decoder rejects Inf/NaN before this).
#[inline(always)]
pub(crate) fn f16_bits_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let shifted = (h & 0x7fff) << 13;
    let normal = shifted + ((127 - 15) << 23);
    // Subnormal halves: build 2⁻¹⁴ × (1 + m) and subtract 2⁻¹⁴.
    const MAGIC: f32 = f32::from_bits(113 << 23);
    let subnormal = (f32::from_bits(normal + (1 << 23)) - MAGIC).to_bits();
    let magnitude = if shifted & (0x7c00 << 13) == 0 {
        subnormal
    } else {
        normal
    };
    f32::from_bits(magnitude | ((h & 0x8000) << 16))
}

pub(super) fn encode_f16(src: &[f32], dst: &mut [u8]) -> Result<(), CodecError> {
    check_input(src)?;
    encode_f16_kernel(src, dst);
    Ok(())
}

multiversion! { fn encode_f16_kernel(src: &[f32], dst: &mut [u8]) = encode_f16_impl; }

#[inline(always)]
fn encode_f16_impl(src: &[f32], dst: &mut [u8]) {
    for (out, x) in dst.chunks_exact_mut(2).zip(src) {
        let h = f32_to_f16_bits(x.clamp(-F16_MAX, F16_MAX));
        out.copy_from_slice(&h.to_le_bytes());
    }
}

pub(super) fn decode_f16(
    src: &[u8],
    out: &mut [f32],
    weight: Option<f32>,
) -> Result<(), CodecError> {
    if !halves_finite(src, 0x7c00) {
        return Err(CodecError::NonFiniteDecoded {
            index: first_non_finite_half(src, 0x7c00),
        });
    }
    match weight {
        None => decode_f16_kernel(src, out),
        Some(w) => accumulate_f16_kernel(src, w, out),
    }
    Ok(())
}

multiversion! { fn decode_f16_kernel(src: &[u8], out: &mut [f32]) = decode_f16_impl; }

#[inline(always)]
fn decode_f16_impl(src: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

multiversion! { fn accumulate_f16_kernel(src: &[u8], w: f32, acc: &mut [f32]) = accumulate_f16_impl; }

#[inline(always)]
fn accumulate_f16_impl(src: &[u8], w: f32, acc: &mut [f32]) {
    for (a, b) in acc.iter_mut().zip(src.chunks_exact(2)) {
        *a += w * f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

// ---- bf16 --------------------------------------------------------------------------------

/// `f32` → `bf16` bits, round to nearest even, for finite `x` with `|x| ≤` bf16's maximum.
#[inline(always)]
pub(crate) fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

pub(super) fn encode_bf16(src: &[f32], dst: &mut [u8]) -> Result<(), CodecError> {
    check_input(src)?;
    encode_bf16_kernel(src, dst);
    Ok(())
}

multiversion! { fn encode_bf16_kernel(src: &[f32], dst: &mut [u8]) = encode_bf16_impl; }

#[inline(always)]
fn encode_bf16_impl(src: &[f32], dst: &mut [u8]) {
    for (out, x) in dst.chunks_exact_mut(2).zip(src) {
        let h = f32_to_bf16_bits(x.clamp(-BF16_MAX, BF16_MAX));
        out.copy_from_slice(&h.to_le_bytes());
    }
}

pub(super) fn decode_bf16(
    src: &[u8],
    out: &mut [f32],
    weight: Option<f32>,
) -> Result<(), CodecError> {
    if !halves_finite(src, 0x7f80) {
        return Err(CodecError::NonFiniteDecoded {
            index: first_non_finite_half(src, 0x7f80),
        });
    }
    match weight {
        None => decode_bf16_kernel(src, out),
        Some(w) => accumulate_bf16_kernel(src, w, out),
    }
    Ok(())
}

#[inline(always)]
fn bf16_to_f32(b: &[u8]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
}

multiversion! { fn decode_bf16_kernel(src: &[u8], out: &mut [f32]) = decode_bf16_impl; }

#[inline(always)]
fn decode_bf16_impl(src: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_to_f32(b);
    }
}

multiversion! { fn accumulate_bf16_kernel(src: &[u8], w: f32, acc: &mut [f32]) = accumulate_bf16_impl; }

#[inline(always)]
fn accumulate_bf16_impl(src: &[u8], w: f32, acc: &mut [f32]) {
    for (a, b) in acc.iter_mut().zip(src.chunks_exact(2)) {
        *a += w * bf16_to_f32(b);
    }
}

// ---- shared ------------------------------------------------------------------------------

multiversion! {
    /// Whether no 16-bit float in `src` has all exponent bits set (`exp_mask`), i.e. is
    /// neither Inf nor NaN.
    fn halves_finite(src: &[u8], exp_mask: u16) -> bool = halves_finite_impl;
}

#[inline(always)]
fn halves_finite_impl(src: &[u8], exp_mask: u16) -> bool {
    let mut lanes = [0u16; 16];
    let mut chunks = src.chunks_exact(32);
    for chunk in &mut chunks {
        for (lane, b) in lanes.iter_mut().zip(chunk.chunks_exact(2)) {
            // Adding the lowest exponent bit carries into bit 15 exactly when all exponent
            // bits are set.
            let e = u16::from_le_bytes([b[0], b[1]]) & exp_mask;
            *lane |= e.wrapping_add(exp_mask & exp_mask.wrapping_neg());
        }
    }
    let mut flags = lanes.into_iter().fold(0, |a, l| a | l);
    for b in chunks.remainder().chunks_exact(2) {
        let e = u16::from_le_bytes([b[0], b[1]]) & exp_mask;
        flags |= e.wrapping_add(exp_mask & exp_mask.wrapping_neg());
    }
    flags & 0x8000 == 0
}

fn first_non_finite_half(src: &[u8], exp_mask: u16) -> usize {
    src.chunks_exact(2)
        .position(|b| u16::from_le_bytes([b[0], b[1]]) & exp_mask == exp_mask)
        .unwrap_or(0)
}

/// Max-abs error bound of `f16` on `src`: half an ulp, or the clipped amount past 65504.
pub(super) fn f16_error_bound(src: &[f32]) -> f32 {
    src.iter()
        .map(|x| {
            let a = x.abs();
            if a > F16_MAX {
                a - F16_MAX
            } else {
                a * 2f32.powi(-11) + 2f32.powi(-25)
            }
        })
        .fold(0.0, f32::max)
}

/// Max-abs error bound of `bf16` on `src`: half an ulp, or the clipped amount past its max.
pub(super) fn bf16_error_bound(src: &[f32]) -> f32 {
    src.iter()
        .map(|x| {
            let a = x.abs();
            if a > BF16_MAX {
                a - BF16_MAX
            } else {
                a * 2f32.powi(-8) + f32::from_bits(1)
            }
        })
        .fold(0.0, f32::max)
}

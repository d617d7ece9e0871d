//! Blockwise absmax quantization to `int8` and `int4`.
//!
//! Each block of `B` elements is scaled by its largest magnitude `m`: element `x` becomes the
//! integer `q = round(x · L / m)` in `-L..=L` (`L` = 127 or 7), and decodes to `q · m / L`.
//! The error is at most half a step, `m / 2L`, so it follows the block's own range rather
//! than the tensor's (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization").
//!
//! Layout: `⌈n/B⌉` scales `m / L` as `f32` LE, then the elements: one `i8` each for `int8`;
//! two per byte for `int4`, element `2j` in the low nibble of byte `j`. Blocks whose `m` is
//! below 2⁻¹⁰⁰ encode as zeros, so that `L / m` cannot overflow, and `m` is capped at
//! 2¹²⁷ (larger elements saturate), so that no byte a part can hold decodes to ±Inf.

use super::CodecError;
use super::finite::{block_count, check_encoded_blocks, check_scales};
use super::kernels::{INF_BITS, abs_max_bits, multiversion, round_to_i32};

/// Magnitudes below 2⁻¹⁰⁰ flush a block to zero.
const FLUSH_BITS: u32 = (127 - 100) << 23;
/// Block maxima are capped at 2¹²⁷, so that every level a part can hold (including one
/// past the encoder's, −128 or −8) decodes to a finite value; larger elements saturate.
const CAP_BITS: u32 = (127 + 127) << 23;

/// The decode scale `m / L` and the encode multiplier `L / m` for a block whose largest
/// magnitude has bit pattern `max_bits`.
#[inline(always)]
fn block_scale(max_bits: u32, levels: f32) -> (f32, f32) {
    if max_bits < FLUSH_BITS {
        (0.0, 0.0)
    } else {
        let m = f32::from_bits(max_bits.min(CAP_BITS));
        (m / levels, levels / m)
    }
}

/// The bound from the module docs, evaluated block by block: half a step plus a margin for
/// the roundings of `L / m` and `q · m / L`.
fn error_bound(src: &[f32], block: u32, levels: f32) -> f32 {
    src.chunks(block as usize)
        .map(|xs| {
            let bits = abs_max_bits(xs);
            let m = f32::from_bits(bits);
            let cap = f32::from_bits(CAP_BITS);
            if bits < FLUSH_BITS {
                m
            } else {
                (m - cap).max(0.0) + m.min(cap) / levels * 0.5 * (1.0 + 2f32.powi(-12))
            }
        })
        .fold(0.0, f32::max)
}

/// Blockwise absmax `int8`.
#[derive(Debug)]
pub(super) struct Int8;

impl Int8 {
    const LEVELS: f32 = 127.0;
    /// A byte can hold −128, one level past what the encoder writes; scales are checked
    /// against it so that even such a byte decodes to a finite value.
    const MAX_BYTE: f32 = 128.0;

    pub(super) fn encoded_len(elements: usize, block: u32) -> usize {
        block_count(elements, block) * 4 + elements
    }

    pub(super) fn encode(src: &[f32], dst: &mut [u8], block: u32) -> Result<(), CodecError> {
        let (scales, q) = dst.split_at_mut(block_count(src.len(), block) * 4);
        let first_bad_block = encode_int8(src, scales, q, block as usize);
        check_encoded_blocks(src, block, first_bad_block)
    }

    pub(super) fn decode(
        src: &[u8],
        out: &mut [f32],
        block: u32,
        weight: Option<f32>,
    ) -> Result<(), CodecError> {
        let (scales, q) = src.split_at(block_count(out.len(), block) * 4);
        check_scales(scales, Self::MAX_BYTE, block as usize, "int8")?;
        match weight {
            None => decode_int8(scales, q, out, block as usize),
            Some(w) => accumulate_int8(scales, q, w, out, block as usize),
        }
        Ok(())
    }

    pub(super) fn error_bound(src: &[f32], block: u32) -> f32 {
        error_bound(src, block, Self::LEVELS)
    }
}

multiversion! {
    /// Quantizes every block; returns the index of the first block holding a non-finite value.
    fn encode_int8(src: &[f32], scales: &mut [u8], q: &mut [u8], block: usize) -> Option<usize> = encode_int8_impl;
}

#[inline(always)]
fn encode_int8_impl(src: &[f32], scales: &mut [u8], q: &mut [u8], block: usize) -> Option<usize> {
    let blocks = src
        .chunks(block)
        .zip(q.chunks_mut(block))
        .zip(scales.chunks_exact_mut(4));
    for (b, ((xs, qs), scale_out)) in blocks.enumerate() {
        let max_bits = abs_max_bits(xs);
        if max_bits >= INF_BITS {
            return Some(b);
        }
        let (scale, inv) = block_scale(max_bits, Int8::LEVELS);
        scale_out.copy_from_slice(&scale.to_le_bytes());
        for (x, q) in xs.iter().zip(qs.iter_mut()) {
            *q = round_to_i32(x * inv).clamp(-127, 127) as i8 as u8;
        }
    }
    None
}

#[inline(always)]
fn load_scale(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

multiversion! { fn decode_int8(scales: &[u8], q: &[u8], out: &mut [f32], block: usize) = decode_int8_impl; }

#[inline(always)]
fn decode_int8_impl(scales: &[u8], q: &[u8], out: &mut [f32], block: usize) {
    let blocks = out
        .chunks_mut(block)
        .zip(q.chunks(block))
        .zip(scales.chunks_exact(4));
    for ((os, qs), scale) in blocks {
        let scale = load_scale(scale);
        for (o, q) in os.iter_mut().zip(qs) {
            *o = f32::from(*q as i8) * scale;
        }
    }
}

multiversion! {
    fn accumulate_int8(scales: &[u8], q: &[u8], w: f32, acc: &mut [f32], block: usize) = accumulate_int8_impl;
}

#[inline(always)]
fn accumulate_int8_impl(scales: &[u8], q: &[u8], w: f32, acc: &mut [f32], block: usize) {
    let blocks = acc
        .chunks_mut(block)
        .zip(q.chunks(block))
        .zip(scales.chunks_exact(4));
    for ((acc, qs), scale) in blocks {
        let scale = load_scale(scale);
        for (a, q) in acc.iter_mut().zip(qs) {
            *a += w * (f32::from(*q as i8) * scale);
        }
    }
}

/// Blockwise absmax `int4`.
#[derive(Debug)]
pub(super) struct Int4;

impl Int4 {
    const LEVELS: f32 = 7.0;
    /// A nibble can hold −8, one level past what the encoder writes; scales are checked
    /// against it so that even such a nibble decodes to a finite value.
    const MAX_NIBBLE: f32 = 8.0;

    pub(super) fn encoded_len(elements: usize, block: u32) -> usize {
        block_count(elements, block) * 4 + elements.div_ceil(2)
    }

    pub(super) fn encode(src: &[f32], dst: &mut [u8], block: u32) -> Result<(), CodecError> {
        let (scales, q) = dst.split_at_mut(block_count(src.len(), block) * 4);
        let first_bad_block = encode_int4(src, scales, q, block as usize);
        check_encoded_blocks(src, block, first_bad_block)
    }

    pub(super) fn decode(
        src: &[u8],
        out: &mut [f32],
        block: u32,
        weight: Option<f32>,
    ) -> Result<(), CodecError> {
        let (scales, q) = src.split_at(block_count(out.len(), block) * 4);
        check_scales(scales, Self::MAX_NIBBLE, block as usize, "int4")?;
        if out.len() % 2 == 1 && q.last().is_some_and(|b| b >> 4 != 0) {
            return Err(CodecError::Corrupt {
                codec: "int4",
                reason: "padding nibble is not zero",
            });
        }
        match weight {
            None => decode_int4(scales, q, out, block as usize),
            Some(w) => accumulate_int4(scales, q, w, out, block as usize),
        }
        Ok(())
    }

    pub(super) fn error_bound(src: &[f32], block: u32) -> f32 {
        error_bound(src, block, Self::LEVELS)
    }
}

#[inline(always)]
fn quantize4(x: f32, inv: f32) -> u8 {
    (round_to_i32(x * inv).clamp(-7, 7) & 0xf) as u8
}

#[inline(always)]
fn low_nibble(byte: u8) -> f32 {
    f32::from(((byte << 4) as i8) >> 4)
}

#[inline(always)]
fn high_nibble(byte: u8) -> f32 {
    f32::from((byte as i8) >> 4)
}

multiversion! {
    /// Quantizes every block; returns the index of the first block holding a non-finite value.
    fn encode_int4(src: &[f32], scales: &mut [u8], q: &mut [u8], block: usize) -> Option<usize> = encode_int4_impl;
}

#[inline(always)]
fn encode_int4_impl(src: &[f32], scales: &mut [u8], q: &mut [u8], block: usize) -> Option<usize> {
    // Blocks hold an even number of elements (a multiple of 8), so each starts on a byte.
    let blocks = src
        .chunks(block)
        .zip(q.chunks_mut(block / 2))
        .zip(scales.chunks_exact_mut(4));
    for (b, ((xs, qs), scale_out)) in blocks.enumerate() {
        let max_bits = abs_max_bits(xs);
        if max_bits >= INF_BITS {
            return Some(b);
        }
        let (scale, inv) = block_scale(max_bits, Int4::LEVELS);
        scale_out.copy_from_slice(&scale.to_le_bytes());
        let pairs = xs.chunks_exact(2);
        let odd = pairs.remainder().first().copied();
        for (pair, byte) in pairs.zip(qs.iter_mut()) {
            *byte = quantize4(pair[0], inv) | (quantize4(pair[1], inv) << 4);
        }
        if let (Some(x), Some(last)) = (odd, qs.last_mut()) {
            *last = quantize4(x, inv);
        }
    }
    None
}

multiversion! { fn decode_int4(scales: &[u8], q: &[u8], out: &mut [f32], block: usize) = decode_int4_impl; }

#[inline(always)]
fn decode_int4_impl(scales: &[u8], q: &[u8], out: &mut [f32], block: usize) {
    let blocks = out
        .chunks_mut(block)
        .zip(q.chunks(block / 2))
        .zip(scales.chunks_exact(4));
    for ((os, qs), scale) in blocks {
        let scale = load_scale(scale);
        let mut pairs = os.chunks_exact_mut(2);
        for (pair, byte) in (&mut pairs).zip(qs) {
            pair[0] = low_nibble(*byte) * scale;
            pair[1] = high_nibble(*byte) * scale;
        }
        if let (Some(o), Some(byte)) = (pairs.into_remainder().first_mut(), qs.last()) {
            *o = low_nibble(*byte) * scale;
        }
    }
}

multiversion! {
    fn accumulate_int4(scales: &[u8], q: &[u8], w: f32, acc: &mut [f32], block: usize) = accumulate_int4_impl;
}

#[inline(always)]
fn accumulate_int4_impl(scales: &[u8], q: &[u8], w: f32, acc: &mut [f32], block: usize) {
    let blocks = acc
        .chunks_mut(block)
        .zip(q.chunks(block / 2))
        .zip(scales.chunks_exact(4));
    for ((acc, qs), scale) in blocks {
        let scale = load_scale(scale);
        let mut pairs = acc.chunks_exact_mut(2);
        for (pair, byte) in (&mut pairs).zip(qs) {
            pair[0] += w * (low_nibble(*byte) * scale);
            pair[1] += w * (high_nibble(*byte) * scale);
        }
        if let (Some(a), Some(byte)) = (pairs.into_remainder().first_mut(), qs.last()) {
            *a += w * (low_nibble(*byte) * scale);
        }
    }
}

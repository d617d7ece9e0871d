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

/// Calls `$kernel::<B>` for the block sizes configs use most, so that each of their blocks
/// is a fixed-size array the compiler unrolls; any other size takes `$fallback`.
macro_rules! by_block_size {
    ($block:expr, $kernel:ident, $fallback:ident, ($($arg:expr),*)) => {
        match $block {
            32 => $kernel::<32>($($arg),*),
            64 => $kernel::<64>($($arg),*),
            128 => $kernel::<128>($($arg),*),
            256 => $kernel::<256>($($arg),*),
            block => $fallback($($arg,)* block),
        }
    };
}

/// Elements handled together in the int8 kernels: one AVX2 register of `f32`.
const LANES: usize = 8;

#[inline(always)]
fn quantize8(x: f32, inv: f32) -> u8 {
    round_to_i32(x * inv).clamp(-127, 127) as i8 as u8
}

/// Quantizes one block into `qs` (as long as `xs`) and writes its scale; false if the block
/// holds a non-finite value. Blocks are whole multiples of [`LANES`] except the last one
/// of a vector, whose leftover elements take the scalar loop.
#[inline(always)]
fn encode_int8_block(xs: &[f32], qs: &mut [u8], scale_out: &mut [u8; 4]) -> bool {
    let max_bits = abs_max_bits(xs);
    if max_bits >= INF_BITS {
        return false;
    }
    let (scale, inv) = block_scale(max_bits, Int8::LEVELS);
    *scale_out = scale.to_le_bytes();
    let (x_lanes, x_rest) = xs.as_chunks::<LANES>();
    let (q_lanes, q_rest) = qs.as_chunks_mut::<LANES>();
    for (x, q) in x_lanes.iter().zip(q_lanes) {
        for (x, q) in x.iter().zip(q) {
            *q = quantize8(*x, inv);
        }
    }
    for (x, q) in x_rest.iter().zip(q_rest) {
        *q = quantize8(*x, inv);
    }
    true
}

#[inline(always)]
fn encode_int8_impl(src: &[f32], scales: &mut [u8], q: &mut [u8], block: usize) -> Option<usize> {
    by_block_size!(block, encode_int8_fixed, encode_int8_any, (src, scales, q))
}

#[inline(always)]
fn encode_int8_fixed<const B: usize>(
    src: &[f32],
    scales: &mut [u8],
    q: &mut [u8],
) -> Option<usize> {
    let (blocks, _) = src.as_chunks::<B>();
    let (q_blocks, _) = q.as_chunks_mut::<B>();
    let (scale_out, _) = scales.as_chunks_mut::<4>();
    let whole = blocks.len().min(q_blocks.len()).min(scale_out.len());
    for (b, ((xs, qs), s)) in blocks.iter().zip(q_blocks).zip(scale_out).enumerate() {
        if !encode_int8_block(xs, qs, s) {
            return Some(b);
        }
    }
    // The short block at the end, if any.
    let rest = encode_int8_any(
        &src[whole * B..],
        &mut scales[whole * 4..],
        &mut q[whole * B..],
        B,
    );
    rest.map(|b| b + whole)
}

#[inline(always)]
fn encode_int8_any(src: &[f32], scales: &mut [u8], q: &mut [u8], block: usize) -> Option<usize> {
    let (scale_out, _) = scales.as_chunks_mut::<4>();
    let blocks = src.chunks(block).zip(q.chunks_mut(block)).zip(scale_out);
    for (b, ((xs, qs), s)) in blocks.enumerate() {
        if !encode_int8_block(xs, qs, s) {
            return Some(b);
        }
    }
    None
}

#[inline(always)]
fn load_scale(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Writes `q · scale` into `os` (as long as `qs`), or adds `w · (q · scale)` when `w` is
/// given; both operations in the same order as the scalar definition, so every build gives
/// the same bits.
#[inline(always)]
fn decode_int8_block(qs: &[u8], scale: [u8; 4], w: Option<f32>, os: &mut [f32]) {
    let scale = f32::from_le_bytes(scale);
    match w {
        None => {
            for (q, o) in qs.iter().zip(os) {
                *o = f32::from(*q as i8) * scale;
            }
        }
        Some(w) => {
            for (q, a) in qs.iter().zip(os) {
                *a += w * (f32::from(*q as i8) * scale);
            }
        }
    }
}

#[inline(always)]
fn decode_int8_fixed<const B: usize>(scales: &[u8], q: &[u8], w: Option<f32>, out: &mut [f32]) {
    let (q_blocks, _) = q.as_chunks::<B>();
    let (o_blocks, _) = out.as_chunks_mut::<B>();
    let (scale_in, _) = scales.as_chunks::<4>();
    let whole = q_blocks.len().min(o_blocks.len()).min(scale_in.len());
    for ((qs, os), s) in q_blocks.iter().zip(o_blocks).zip(scale_in) {
        decode_int8_block(qs, *s, w, os);
    }
    // The short block at the end, if any.
    decode_int8_any(
        &scales[whole * 4..],
        &q[whole * B..],
        w,
        &mut out[whole * B..],
        B,
    );
}

#[inline(always)]
fn decode_int8_any(scales: &[u8], q: &[u8], w: Option<f32>, out: &mut [f32], block: usize) {
    let (scale_in, _) = scales.as_chunks::<4>();
    let blocks = out.chunks_mut(block).zip(q.chunks(block)).zip(scale_in);
    for ((os, qs), s) in blocks {
        decode_int8_block(qs, *s, w, os);
    }
}

multiversion! { fn decode_int8(scales: &[u8], q: &[u8], out: &mut [f32], block: usize) = decode_int8_impl; }

#[inline(always)]
fn decode_int8_impl(scales: &[u8], q: &[u8], out: &mut [f32], block: usize) {
    by_block_size!(
        block,
        decode_int8_fixed,
        decode_int8_any,
        (scales, q, None, out)
    )
}

multiversion! {
    fn accumulate_int8(scales: &[u8], q: &[u8], w: f32, acc: &mut [f32], block: usize) = accumulate_int8_impl;
}

#[inline(always)]
fn accumulate_int8_impl(scales: &[u8], q: &[u8], w: f32, acc: &mut [f32], block: usize) {
    by_block_size!(
        block,
        decode_int8_fixed,
        decode_int8_any,
        (scales, q, Some(w), acc)
    )
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

#[cfg(test)]
mod tests {
    use super::{decode_int8_any, decode_int8_fixed, encode_int8_any, encode_int8_fixed};

    /// Values spanning many magnitudes, with exact ties at half a step in some blocks.
    fn values(len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| match i % 97 {
                0 => 127.0,
                1 => 0.5,
                _ => ((i as f32) * 0.37).sin() * (1 + i % 13) as f32 * 10f32.powi(i as i32 % 7 - 3),
            })
            .collect()
    }

    /// The kernels unrolled for a block size give the bytes and floats of the loop over
    /// any block size, for vectors ending in a whole block, a short block, or a sliver.
    #[test]
    fn fixed_block_kernels_match_the_general_loop() {
        for len in [0, 5, 64, 64 * 7, 64 * 7 + 3, 64 * 9 + 40, 1000] {
            let src = values(len);
            let blocks = len.div_ceil(64);
            let (mut scales_a, mut q_a) = (vec![0u8; blocks * 4], vec![0u8; len]);
            let (mut scales_b, mut q_b) = (vec![1u8; blocks * 4], vec![1u8; len]);
            assert_eq!(encode_int8_fixed::<64>(&src, &mut scales_a, &mut q_a), None);
            assert_eq!(encode_int8_any(&src, &mut scales_b, &mut q_b, 64), None);
            assert_eq!(
                (&scales_a, &q_a),
                (&scales_b, &q_b),
                "encoded, {len} elements"
            );
            for w in [None, Some(0.3f32)] {
                let (mut out_a, mut out_b) = (values(len), values(len));
                decode_int8_fixed::<64>(&scales_a, &q_a, w, &mut out_a);
                decode_int8_any(&scales_a, &q_a, w, &mut out_b, 64);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&out_a),
                    bits(&out_b),
                    "decoded ({w:?}), {len} elements"
                );
            }
        }
        let mut bad = values(64 * 5 + 9);
        bad[64 * 5 + 2] = f32::NAN;
        let (mut scales, mut q) = (vec![0u8; 6 * 4], vec![0u8; bad.len()]);
        assert_eq!(encode_int8_fixed::<64>(&bad, &mut scales, &mut q), Some(5));
        bad[64 * 2] = f32::INFINITY;
        assert_eq!(encode_int8_fixed::<64>(&bad, &mut scales, &mut q), Some(2));
    }
}

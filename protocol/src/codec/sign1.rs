//! `sign1`: one sign bit per element and one scale per block (signSGD with a magnitude,
//! Bernstein et al. 2018; with error feedback as in Karimireddy et al. 2019).
//!
//! A block decodes to `±s` where `s` is the block's mean `|x|`, the scale that minimises the
//! squared error for fixed signs. Layout: `⌈n/B⌉` scales as `f32` LE, then the sign bits,
//! element `i` in bit `i mod 8` of byte `i / 8` (set = negative).
//!
//! The mean is summed in a fixed order so that every implementation gets the same bits:
//! lane `l` sums `|x|` of the block's elements `l, l+8, l+16, …` in index order, then the
//! lanes combine as `((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))`, and the sum is divided by the
//! block length. If that sum overflows (elements near `f32::MAX`), the scale is the block's
//! largest magnitude instead.

use super::CodecError;
use super::finite::{block_count, check_encoded_blocks, check_scales};
use super::kernels::{INF_BITS, abs_max_bits, multiversion};

pub(super) fn encoded_len(elements: usize, block: u32) -> usize {
    block_count(elements, block) * 4 + elements.div_ceil(8)
}

pub(super) fn encode(src: &[f32], dst: &mut [u8], block: u32) -> Result<(), CodecError> {
    let (scales, bits) = dst.split_at_mut(block_count(src.len(), block) * 4);
    let first_bad_block = encode_kernel(src, scales, bits, block as usize);
    check_encoded_blocks(src, block, first_bad_block)
}

pub(super) fn decode(
    src: &[u8],
    out: &mut [f32],
    block: u32,
    weight: Option<f32>,
) -> Result<(), CodecError> {
    let (scales, bits) = src.split_at(block_count(out.len(), block) * 4);
    check_scales(scales, 1.0, block as usize, "sign1")?;
    let tail = out.len() % 8;
    if tail != 0 && bits.last().is_some_and(|b| b >> tail != 0) {
        return Err(CodecError::Corrupt {
            codec: "sign1",
            reason: "padding bits are not zero",
        });
    }
    decode_kernel(
        scales,
        bits,
        out,
        block as usize,
        weight.unwrap_or(1.0),
        weight.is_some(),
    );
    Ok(())
}

/// Each element errs by at most its block's largest magnitude: `|x − sign(x)·s|` with
/// `0 ≤ s ≤ max |x|`.
pub(super) fn error_bound(src: &[f32], block: u32) -> f32 {
    src.chunks(block as usize)
        .map(|xs| f32::from_bits(abs_max_bits(xs)) * (1.0 + 2f32.powi(-12)))
        .fold(0.0, f32::max)
}

/// The block's mean magnitude, summed in the documented order.
#[inline(always)]
fn mean_abs(xs: &[f32], max_bits: u32) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = xs.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *lane += x.abs();
        }
    }
    for (lane, x) in lanes.iter_mut().zip(chunks.remainder()) {
        *lane += x.abs();
    }
    let [l0, l1, l2, l3, l4, l5, l6, l7] = lanes;
    let sum = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7));
    if sum.is_finite() {
        sum / xs.len() as f32
    } else {
        f32::from_bits(max_bits)
    }
}

#[inline(always)]
fn sign_byte(xs: &[f32]) -> u8 {
    xs.iter().enumerate().fold(0u8, |byte, (k, x)| {
        byte | (((x.to_bits() >> 31) as u8) << k)
    })
}

multiversion! {
    /// Encodes every block; returns the index of the first block holding a non-finite value.
    fn encode_kernel(src: &[f32], scales: &mut [u8], bits: &mut [u8], block: usize) -> Option<usize> = encode_impl;
}

#[inline(always)]
fn encode_impl(src: &[f32], scales: &mut [u8], bits: &mut [u8], block: usize) -> Option<usize> {
    // Blocks are multiples of 8 elements, so each starts on a byte.
    let blocks = src
        .chunks(block)
        .zip(bits.chunks_mut(block / 8))
        .zip(scales.chunks_exact_mut(4));
    for (b, ((xs, bs), scale_out)) in blocks.enumerate() {
        let max_bits = abs_max_bits(xs);
        if max_bits >= INF_BITS {
            return Some(b);
        }
        scale_out.copy_from_slice(&mean_abs(xs, max_bits).to_le_bytes());
        for (byte, eight) in bs.iter_mut().zip(xs.chunks(8)) {
            *byte = sign_byte(eight);
        }
    }
    None
}

multiversion! {
    fn decode_kernel(scales: &[u8], bits: &[u8], out: &mut [f32], block: usize, w: f32, accumulate: bool) = decode_impl;
}

#[inline(always)]
fn decode_impl(
    scales: &[u8],
    bits: &[u8],
    out: &mut [f32],
    block: usize,
    w: f32,
    accumulate: bool,
) {
    let blocks = out
        .chunks_mut(block)
        .zip(bits.chunks(block / 8))
        .zip(scales.chunks_exact(4));
    for ((os, bs), scale) in blocks {
        let ws = w * f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
        let ws_bits = ws.to_bits();
        for (eight, byte) in os.chunks_mut(8).zip(bs) {
            for (k, o) in eight.iter_mut().enumerate() {
                let v = f32::from_bits(ws_bits ^ ((u32::from(*byte >> k) & 1) << 31));
                if accumulate {
                    *o += v;
                } else {
                    *o = v;
                }
            }
        }
    }
}

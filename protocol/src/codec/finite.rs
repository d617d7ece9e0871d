//! Checks that a decoded scale or a whole received part holds only finite values.

use super::CodecError;
use super::kernels::{INF_BITS, abs_max_bits, first_non_finite, multiversion};

multiversion! {
    /// Whether every element of `xs` is finite.
    pub(crate) fn all_finite(xs: &[f32]) -> bool = all_finite_impl;
}

#[inline(always)]
fn all_finite_impl(xs: &[f32]) -> bool {
    abs_max_bits(xs) < INF_BITS
}

/// Fails with [`CodecError::NonFiniteInput`] naming the first non-finite element of `src`.
pub(crate) fn check_input(src: &[f32]) -> Result<(), CodecError> {
    if all_finite(src) {
        Ok(())
    } else {
        Err(CodecError::NonFiniteInput {
            index: first_non_finite(src),
        })
    }
}

/// Checks the per-block scales of a received blockwise part: each must be non-negative and
/// finite even after multiplying by the codec's largest level, so that no element can decode
/// to ±Inf. An honest encoder always produces such scales.
pub(crate) fn check_scales(
    scales: &[u8],
    max_level: f32,
    block: usize,
    codec: &'static str,
) -> Result<(), CodecError> {
    if scales_valid(scales, max_level) {
        return Ok(());
    }
    // Some scale is bad: find the first one and say what is wrong with it.
    for (i, bytes) in scales.chunks_exact(4).enumerate() {
        let scale = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if scale.is_nan() || !(scale * max_level).is_finite() {
            return Err(CodecError::NonFiniteDecoded { index: i * block });
        }
        if scale < 0.0 {
            return Err(CodecError::Corrupt {
                codec,
                reason: "negative block scale",
            });
        }
    }
    Ok(())
}

multiversion! {
    /// Whether every scale passes [`check_scales`], tested without a branch per scale.
    fn scales_valid(scales: &[u8], max_level: f32) -> bool = scales_valid_impl;
}

#[inline(always)]
fn scales_valid_impl(scales: &[u8], max_level: f32) -> bool {
    // `s >= 0` fails for NaN and negative scales (−0 passes, as in the loop), and the
    // product is below +Inf exactly when it is finite, given `s >= 0`.
    let valid = |bytes: &[u8; 4]| {
        let scale = f32::from_le_bytes(*bytes);
        scale >= 0.0 && scale * max_level < f32::INFINITY
    };
    let (lanes_in, _) = scales.as_chunks::<32>();
    let mut ok = true;
    for lanes in lanes_in {
        let (group, _) = lanes.as_chunks::<4>();
        ok &= group.iter().fold(true, |ok, bytes| ok & valid(bytes));
    }
    let (rest, _) = scales[lanes_in.len() * 32..].as_chunks::<4>();
    ok & rest.iter().fold(true, |ok, bytes| ok & valid(bytes))
}

/// The result of a blockwise encode kernel, which reports the first block that holds a
/// non-finite value: the error names that value's element.
pub(crate) fn check_encoded_blocks(
    src: &[f32],
    block: u32,
    first_bad_block: Option<usize>,
) -> Result<(), CodecError> {
    match first_bad_block {
        None => Ok(()),
        Some(b) => {
            let start = b * block as usize;
            Err(CodecError::NonFiniteInput {
                index: start + first_non_finite(&src[start..]),
            })
        }
    }
}

/// Number of blocks of `block` elements covering `elements`.
pub(crate) fn block_count(elements: usize, block: u32) -> usize {
    elements.div_ceil(block as usize)
}

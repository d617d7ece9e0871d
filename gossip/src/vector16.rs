//! A vector of `f32`s kept in 16 bits an element: about half the bytes.
//!
//! Each block of [`BLOCK`] elements is stored as `i16` steps of its largest magnitude /
//! 32767, with that step as an `f32`. Storing rounds each element to within half a step,
//! 2⁻¹⁶ of its block's largest magnitude; reading gives back the same bits every time, and
//! two vectors that store the same `f32`s with the same operations (no fused or reordered
//! arithmetic, a maximum, a multiply and a round to nearest even) hold the same bits.
//!
//! SGP keeps its edges' references this way (`sgp::reference`), and butterfly and ring
//! members their error feedback's residuals ([`crate::butterfly::Residuals`]).

use std::ops::Range;

/// Elements that share one scale.
pub(crate) const BLOCK: usize = 64;

/// Bytes a vector of `len` elements takes.
pub(crate) fn vector16_bytes(len: usize) -> u64 {
    (len as u64) * 2 + (len.div_ceil(BLOCK) as u64) * 4
}

/// Adding 1.5·2²³ rounds an `f32` of magnitude below 2²² to the nearest integer, ties to
/// even, into the sum's last bits.
const ROUNDING: f32 = 12_582_912.0;

/// The largest step count.
const STEPS: f32 = 32_767.0;

/// A vector of `f32`s kept in 16 bits an element.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Vector16 {
    steps: Vec<i16>,
    /// One step's size for each block.
    scales: Vec<f32>,
}

impl Vector16 {
    /// `len` zeros.
    pub(crate) fn zeros(len: usize) -> Vector16 {
        Vector16 {
            steps: vec![0; len],
            scales: vec![0.0; len.div_ceil(BLOCK)],
        }
    }

    /// Elements.
    pub(crate) fn len(&self) -> usize {
        self.steps.len()
    }

    /// Bytes the steps and scales occupy.
    pub(crate) fn bytes(&self) -> usize {
        self.steps.len() * 2 + self.scales.len() * 4
    }

    /// Sets every element to zero.
    pub(crate) fn clear(&mut self) {
        self.steps.fill(0);
        self.scales.fill(0.0);
    }

    /// Writes elements `start..start + out.len()` into `out`, exactly; `start` is a
    /// multiple of [`BLOCK`].
    pub(crate) fn read_into(&self, start: usize, out: &mut [f32]) {
        debug_assert_eq!(start % BLOCK, 0);
        let steps = &self.steps[start..start + out.len()];
        let scales = &self.scales[start / BLOCK..];
        for ((out, steps), &scale) in out.chunks_mut(BLOCK).zip(steps.chunks(BLOCK)).zip(scales) {
            for (out, &step) in out.iter_mut().zip(steps) {
                *out = f32::from(step) * scale;
            }
        }
    }

    /// Sets elements `start..start + values.len()` to `values`, rounded; `start` is a
    /// multiple of [`BLOCK`], and `values` ends at a block's end or at the
    /// vector's. Every value is finite.
    pub(crate) fn store(&mut self, start: usize, values: &[f32]) {
        debug_assert_eq!(start % BLOCK, 0);
        let steps = &mut self.steps[start..start + values.len()];
        let scales = &mut self.scales[start / BLOCK..];
        for ((values, steps), scale) in values
            .chunks(BLOCK)
            .zip(steps.chunks_mut(BLOCK))
            .zip(scales)
        {
            // The largest magnitude, as the largest of the magnitudes' bits (the same
            // number for finite values, and a maximum of integers vectorizes).
            let largest_bits = values.iter().map(|v| v.to_bits() & 0x7fff_ffff).max();
            let largest = f32::from_bits(largest_bits.unwrap_or(0));
            if largest == 0.0 || !largest.is_finite() {
                *scale = 0.0;
                steps.fill(0);
                continue;
            }
            *scale = largest / STEPS;
            let inverse = STEPS / largest;
            for (step, &value) in steps.iter_mut().zip(values) {
                // Past 2²³ the float's last bits count whole units: the sum's bits less the
                // constant's are the rounded step, read with integer operations only.
                let shifted = (value * inverse + ROUNDING).to_bits() as i32;
                let rounded = shifted.wrapping_sub(ROUNDING.to_bits() as i32);
                *step = rounded.clamp(-(STEPS as i32), STEPS as i32) as i16;
            }
        }
    }
}

impl Vector16 {
    /// Where its steps live, for tests that check no round moves it.
    #[cfg(test)]
    pub(crate) fn address(&self) -> usize {
        self.steps.as_ptr() as usize
    }

    /// Grows or shrinks it to `len` elements; new elements are zero.
    pub(crate) fn resize(&mut self, len: usize) {
        if len < self.steps.len() && !len.is_multiple_of(BLOCK) {
            // The last block keeps its scale: its elements past `len` are read as zero.
            self.steps[len..].fill(0);
        }
        self.steps.resize(len, 0);
        self.scales.resize(len.div_ceil(BLOCK), 0.0);
    }

    /// Writes elements `start..start + out.len()` into `out`, from any `start`.
    pub(crate) fn read_range(&self, start: usize, out: &mut [f32]) {
        let mut block = [0.0f32; BLOCK];
        for piece in pieces(self.len(), start, out.len()) {
            let out = &mut out[piece.offset..piece.offset + piece.within.len()];
            if piece.is_whole() {
                self.read_into(piece.block.start, out);
            } else {
                let block = &mut block[..piece.block.len()];
                self.read_into(piece.block.start, block);
                out.copy_from_slice(&block[piece.within]);
            }
        }
    }

    /// Sets elements `start..start + values.len()` to `values`, rounded, from any `start`.
    /// A block the range covers in part is read, changed and stored again, so its other
    /// elements are rounded again to the block's new scale (within half its step).
    pub(crate) fn store_range(&mut self, start: usize, values: &[f32]) {
        let mut block = [0.0f32; BLOCK];
        for piece in pieces(self.len(), start, values.len()) {
            let values = &values[piece.offset..piece.offset + piece.within.len()];
            if piece.is_whole() {
                self.store(piece.block.start, values);
            } else {
                let block = &mut block[..piece.block.len()];
                self.read_into(piece.block.start, block);
                block[piece.within].copy_from_slice(values);
                self.store(piece.block.start, block);
            }
        }
    }
}

/// The blocks of a vector of `vector_len` elements that elements `start..start + len` fall
/// in, one piece each.
fn pieces(vector_len: usize, start: usize, len: usize) -> impl Iterator<Item = Piece> {
    let end = start + len;
    let first_block = start / BLOCK * BLOCK;
    (first_block..end).step_by(BLOCK).map(move |block_start| {
        let block = block_start..(block_start + BLOCK).min(vector_len);
        let from = start.max(block.start);
        let to = end.min(block.end);
        Piece {
            offset: from - start,
            within: from - block.start..to - block.start,
            block,
        }
    })
}

/// Part of a range that falls in one block.
struct Piece {
    /// The block's elements.
    block: Range<usize>,
    /// The range's elements in it, from the block's start.
    within: Range<usize>,
    /// Where they are in the range.
    offset: usize,
}

impl Piece {
    fn is_whole(&self) -> bool {
        self.within.len() == self.block.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_within_half_a_step_and_reads_back_the_same_bits_twice() {
        let len = 3 * BLOCK + 5;
        let values: Vec<f32> = (0..len)
            .map(|i| ((i as f32) * 0.37).sin() * if i < BLOCK { 1e4 } else { 0.02 })
            .collect();
        let mut vector = Vector16::zeros(len);
        vector.store(0, &values);
        let mut back = vec![0.0f32; len];
        vector.read_into(0, &mut back);
        for (block, (values, back)) in values.chunks(BLOCK).zip(back.chunks(BLOCK)).enumerate() {
            // The largest magnitude, as the largest of the magnitudes' bits (the same
            // number for finite values, and a maximum of integers vectorizes).
            let largest_bits = values.iter().map(|v| v.to_bits() & 0x7fff_ffff).max();
            let largest = f32::from_bits(largest_bits.unwrap_or(0));
            for (v, b) in values.iter().zip(back) {
                assert!(
                    (v - b).abs() <= largest / STEPS * 0.5001,
                    "block {block}: {v} stored as {b}"
                );
            }
        }
        // Pieces of whole blocks read and store like the whole vector.
        let mut pieces = Vector16::zeros(len);
        pieces.store(0, &values[..BLOCK]);
        pieces.store(BLOCK, &values[BLOCK..]);
        assert_eq!(pieces, vector);
        let mut tail = vec![0.0f32; len - 2 * BLOCK];
        vector.read_into(2 * BLOCK, &mut tail);
        assert_eq!(tail, back[2 * BLOCK..]);
        vector.clear();
        vector.read_into(0, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
        assert_eq!(vector16_bytes(len), (len * 2 + 4 * 4) as u64);
    }

    #[test]
    fn ranges_that_cut_blocks_read_and_store_like_whole_blocks() {
        let len = 3 * BLOCK + 7;
        let values: Vec<f32> = (0..len).map(|i| ((i as f32) * 0.61).cos() * 0.3).collect();
        let mut whole = Vector16::zeros(len);
        whole.store(0, &values);
        let mut back = vec![0.0f32; len];
        whole.read_into(0, &mut back);
        // Any range reads the same bits as the whole vector.
        for (start, end) in [(0, 5), (3, 70), (64, 128), (100, len), (len - 3, len)] {
            let mut part = vec![0.0f32; end - start];
            whole.read_range(start, &mut part);
            assert_eq!(part, back[start..end], "{start}..{end}");
        }
        // Stored in ranges that cut blocks, every element is within a step of its value
        // (half a step when stored, half another when its block was stored again).
        let mut pieces = Vector16::zeros(len);
        for (start, end) in [(0, 10), (10, 100), (100, 129), (129, len)] {
            pieces.store_range(start, &values[start..end]);
        }
        let mut again = vec![0.0f32; len];
        pieces.read_range(0, &mut again);
        for (block, (values, again)) in values.chunks(BLOCK).zip(again.chunks(BLOCK)).enumerate() {
            let largest = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (v, a) in values.iter().zip(again) {
                assert!(
                    (v - a).abs() <= largest / STEPS * 1.0001,
                    "block {block}: {v} as {a}"
                );
            }
        }
        // Shrinking to a cut block zeroes what it drops; growing adds zeros.
        pieces.resize(BLOCK + 3);
        pieces.resize(2 * BLOCK);
        let mut grown = vec![1.0f32; 2 * BLOCK];
        pieces.read_range(0, &mut grown);
        assert!(grown[BLOCK + 3..].iter().all(|&v| v == 0.0));
    }
}

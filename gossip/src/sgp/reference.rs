//! An edge's reference vector, kept in 16 bits an element: about half the bytes of the
//! parameters.
//!
//! Each block of [`REFERENCE_BLOCK`] elements is stored as `i16` steps of its largest
//! magnitude / 32767, with that step as an `f32`. Both ends of an edge round the same `f32`
//! values with the same operations (no fused or reordered arithmetic, a maximum, a
//! multiply and a round to nearest even), so they hold the same bits.
//!
//! The rounding is never part of the mass a share moves (that is `r + Q⁻¹(Q(z − r))`,
//! computed in `f32` from these bits), only of the next share's deviation `z − r`, which
//! carries it back. It costs at most half a step, 2⁻¹⁶ of the block's largest magnitude,
//! and the share's codec then quantizes that residue with its own error: with `int8`
//! another 2⁻⁸ of it, about `f32`'s resolution of the parameters. A `bf16` reference would
//! have left up to 2⁻⁹ of each element for the next share: 128 times as much at a block's
//! largest element.

/// Elements that share one scale.
pub(crate) const REFERENCE_BLOCK: usize = 64;

/// Bytes a reference of `len` elements takes.
pub(crate) fn reference_bytes(len: usize) -> u64 {
    (len as u64) * 2 + (len.div_ceil(REFERENCE_BLOCK) as u64) * 4
}

/// Adding 1.5·2²³ rounds an `f32` of magnitude below 2²² to the nearest integer, ties to
/// even, into the sum's last bits.
const ROUNDING: f32 = 12_582_912.0;

/// The largest step count.
const STEPS: f32 = 32_767.0;

/// A reference vector `r`, 16 bits an element.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reference {
    steps: Vec<i16>,
    /// One step's size for each block.
    scales: Vec<f32>,
}

impl Reference {
    /// The zero reference of `len` elements, where every edge starts.
    pub(crate) fn zeros(len: usize) -> Reference {
        Reference {
            steps: vec![0; len],
            scales: vec![0.0; len.div_ceil(REFERENCE_BLOCK)],
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
    /// multiple of [`REFERENCE_BLOCK`].
    pub(crate) fn read_into(&self, start: usize, out: &mut [f32]) {
        debug_assert_eq!(start % REFERENCE_BLOCK, 0);
        let steps = &self.steps[start..start + out.len()];
        let scales = &self.scales[start / REFERENCE_BLOCK..];
        for ((out, steps), &scale) in out
            .chunks_mut(REFERENCE_BLOCK)
            .zip(steps.chunks(REFERENCE_BLOCK))
            .zip(scales)
        {
            for (out, &step) in out.iter_mut().zip(steps) {
                *out = f32::from(step) * scale;
            }
        }
    }

    /// Sets elements `start..start + values.len()` to `values`, rounded; `start` is a
    /// multiple of [`REFERENCE_BLOCK`], and `values` ends at a block's end or at the
    /// vector's. Every value is finite.
    pub(crate) fn store(&mut self, start: usize, values: &[f32]) {
        debug_assert_eq!(start % REFERENCE_BLOCK, 0);
        let steps = &mut self.steps[start..start + values.len()];
        let scales = &mut self.scales[start / REFERENCE_BLOCK..];
        for ((values, steps), scale) in values
            .chunks(REFERENCE_BLOCK)
            .zip(steps.chunks_mut(REFERENCE_BLOCK))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_within_half_a_step_and_reads_back_the_same_bits_twice() {
        let len = 3 * REFERENCE_BLOCK + 5;
        let values: Vec<f32> = (0..len)
            .map(|i| ((i as f32) * 0.37).sin() * if i < REFERENCE_BLOCK { 1e4 } else { 0.02 })
            .collect();
        let mut reference = Reference::zeros(len);
        reference.store(0, &values);
        let mut back = vec![0.0f32; len];
        reference.read_into(0, &mut back);
        for (block, (values, back)) in values
            .chunks(REFERENCE_BLOCK)
            .zip(back.chunks(REFERENCE_BLOCK))
            .enumerate()
        {
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
        let mut pieces = Reference::zeros(len);
        pieces.store(0, &values[..REFERENCE_BLOCK]);
        pieces.store(REFERENCE_BLOCK, &values[REFERENCE_BLOCK..]);
        assert_eq!(pieces, reference);
        let mut tail = vec![0.0f32; len - 2 * REFERENCE_BLOCK];
        reference.read_into(2 * REFERENCE_BLOCK, &mut tail);
        assert_eq!(tail, back[2 * REFERENCE_BLOCK..]);
        reference.clear();
        reference.read_into(0, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
        assert_eq!(reference_bytes(len), (len * 2 + 4 * 4) as u64);
    }
}

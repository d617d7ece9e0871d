//! Squared L2 norms of whole vectors at memory speed: a round's drift and error feedback's
//! tally measure them once per round, inside the engine's turns, where a plain `f64` sum
//! at 500M elements held the engine for more than a second.

/// Elements summed in `f32` lanes before the block's sum is added in `f64`: 16 lanes of 256
/// elements each, so an `f32` lane's rounding error stays near 2⁻¹⁶ of the block's sum.
const BLOCK: usize = 4096;

/// `Σ x²` over `values`.
pub(crate) fn squared_norm(values: &[f32]) -> f64 {
    values.chunks(BLOCK).map(block_squared_norm).sum()
}

murmur_protocol::multiversion! {
    /// `Σ x²` over at most a block, in sixteen `f32` lanes.
    fn block_squared_norm(values: &[f32]) -> f64 = block_squared_norm_impl;
}

#[inline(always)]
fn block_squared_norm_impl(values: &[f32]) -> f64 {
    let (lanes_in, rest) = values.as_chunks::<16>();
    let mut lanes = [0f32; 16];
    for chunk in lanes_in {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *lane += x * x;
        }
    }
    let tail: f32 = rest.iter().map(|x| x * x).sum();
    lanes.iter().map(|&l| f64::from(l)).sum::<f64>() + f64::from(tail)
}

#[cfg(test)]
mod tests {
    use super::squared_norm;

    /// Blocks, lanes and the tail add up to the plain `f64` sum of squares, at lengths
    /// around every boundary, within `f32` lanes' rounding.
    #[test]
    fn the_squared_norm_is_the_sum_of_squares() {
        for len in (0..40).chain([4095, 4096, 4097, 3 * 4096 + 17, 100_003]) {
            let values: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
            let plain: f64 = values.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
            let norm = squared_norm(&values);
            assert!(
                (norm - plain).abs() <= 1e-5 * plain.max(1e-30),
                "{len}: {norm} against {plain}"
            );
        }
    }
}

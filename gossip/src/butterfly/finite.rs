//! The check that a member's contribution holds only finite values, made over the whole
//! vector at a round's beginning (by the engine, and again by the round, which validates
//! its input), so it runs at memory speed.

/// Index of the first non-finite element, if any. The check over the whole vector is
/// branch-free so that it vectorizes; the position is looked for only when it fails.
pub(crate) fn first_non_finite(values: &[f32]) -> Option<usize> {
    if all_finite(values) {
        None
    } else {
        values.iter().position(|x| !x.is_finite())
    }
}

murmur_protocol::multiversion! {
    /// Whether every element of `values` is finite.
    fn all_finite(values: &[f32]) -> bool = all_finite_impl;
}

/// Bit pattern of `+Inf`: a magnitude's bits at or above it are `±Inf` or NaN.
const INF_BITS: u32 = 0x7f80_0000;

/// The largest magnitude's bit pattern (sign cleared) over eight lanes: comparing IEEE
/// magnitudes as integers orders them, and puts NaN and `±Inf` at [`INF_BITS`] or above,
/// so one integer max per element answers the question, at memory speed.
#[inline(always)]
fn all_finite_impl(values: &[f32]) -> bool {
    let magnitude = |x: &f32| x.to_bits() & 0x7fff_ffff;
    let (lanes_in, rest) = values.as_chunks::<8>();
    let mut lanes = [0u32; 8];
    for chunk in lanes_in {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *lane = (*lane).max(magnitude(x));
        }
    }
    let max = lanes
        .into_iter()
        .chain(rest.iter().map(magnitude))
        .max()
        .unwrap_or(0);
    max < INF_BITS
}

#[cfg(test)]
mod tests {
    use super::first_non_finite;

    /// Every position and kind of non-finite value is found, whether it falls in the
    /// eight-lane body or in the leftover elements, and finite extremes pass.
    #[test]
    fn finds_the_first_non_finite_element_anywhere() {
        let len = 83;
        let finite = vec![f32::MAX; len];
        assert_eq!(first_non_finite(&finite), None);
        assert_eq!(
            first_non_finite(&[-f32::MAX, f32::MIN_POSITIVE, -0.0]),
            None
        );
        assert_eq!(first_non_finite(&[]), None);
        for bad in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 7, 8, 40, len - 3, len - 1] {
                let mut values = finite.clone();
                values[at] = bad;
                values[len - 1] = if at == len - 1 { bad } else { f32::NAN };
                let expected = at.min(len - 1);
                assert_eq!(first_non_finite(&values), Some(expected), "{bad} at {at}");
            }
        }
    }
}

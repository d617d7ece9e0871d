//! The host functions of CenteredClip: the tiled distance equals the plain sum up to
//! rounding (exactly, on values whose sums are exact), and the step follows its formula.

use murmur_gpu::clip::{CLIP_TILE, clip_factor, clip_step, squared_distance};
use proptest::prelude::*;

proptest! {
    /// The tiled order changes only roundings: it stays within a few ulps per element of
    /// a plain sequential sum.
    #[test]
    fn tiled_distance_is_the_distance(
        pairs in prop::collection::vec((-1e3f32..1e3, -1e3f32..1e3), 0..3 * CLIP_TILE),
    ) {
        let (x, v): (Vec<f32>, Vec<f32>) = pairs.into_iter().unzip();
        let plain: f64 = x.iter().zip(&v).map(|(a, b)| f64::from(a - b).powi(2)).sum();
        let tiled = squared_distance(&x, &v);
        prop_assert!((tiled - plain).abs() <= plain * 1e-13, "{tiled} vs {plain}");
    }
}

/// Small integers square and sum exactly in any order, so the tiled sum is exact.
#[test]
fn tiled_distance_is_exact_on_integers() {
    let x: Vec<f32> = (0..5000).map(|i| (i % 13) as f32).collect();
    let v = vec![1.0f32; 5000];
    let exact: i64 = (0..5000i64).map(|i| (i % 13 - 1).pow(2)).sum();
    assert_eq!(squared_distance(&x, &v), exact as f64);
}

#[test]
fn factor_clips_only_far_rows() {
    assert_eq!(clip_factor(9.0, 5.0, 0.5), 0.5);
    assert_eq!(clip_factor(100.0, 5.0, 0.5), 0.25);
    assert_eq!(clip_factor(0.0, 5.0, 1.0), 1.0);
}

/// A step with unclipped equal shares lands on the mean; a clipped outlier pulls by at most
/// its share of the radius.
#[test]
fn step_moves_by_clipped_shares() {
    let rows: [&[f32]; 2] = [&[2.0, 4.0], &[4.0, 8.0]];
    let mut center = [0.0f32, 0.0];
    clip_step(&rows, &[0.5, 0.5], &mut center);
    assert_eq!(center, [3.0, 6.0]);

    let outlier: [&[f32]; 1] = [&[1e6]];
    let mut center = [0.0f32];
    let factor = clip_factor(squared_distance(outlier[0], &center), 1.0, 0.25);
    clip_step(&outlier, &[factor], &mut center);
    assert!(center[0] > 0.0 && center[0] <= 0.25 + 1e-6, "{center:?}");
}

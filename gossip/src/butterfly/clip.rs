//! CenteredClip: a robust average that bounds how far any one contribution can pull it.
//!
//! Karimireddy, He and Jaggi ("Learning from History for Byzantine Robust Optimization",
//! ICML 2021) average `n` vectors `x_i` by iterating
//!
//! ```text
//! v ← v + Σ_i (w_i / W) · (x_i − v) · min(1, τ / ‖x_i − v‖)
//! ```
//!
//! Each step moves `v` toward every contribution, but by at most `τ` for any one of them,
//! so a contribution scaled by a thousand pulls no harder than one at distance `τ`. BTARD
//! (Gorbunov et al., "Secure Distributed Training at Scale", ICML 2022) runs the same
//! iteration at the reducers of a butterfly all-reduce, which is what murmur does.
//!
//! The iteration starts from the coordinate-wise median of the contributions, a starting
//! point no minority of contributions can move far, and runs a fixed number of steps per
//! chunk.
//!
//! Clipping alone cannot remove a minority's pull: at its fixed point `b` contributions far
//! away each pull with force τ, and `n − b` honest ones at distance ≈ σ pull back with
//! about τ·δ/σ each, so the result settles at `δ ≈ b·σ/(n − b)` from the honest mean, for
//! any τ; and a τ much wider than the honest spread lets them pull by up to `b·τ/(n − b)`.
//! So before clipping, contributions that lie more than `reject_factor` times the median
//! distance from the coordinate-wise median are set aside: a sign-flipped ×1000 gradient is
//! hundreds of times farther out than an honest one, whatever τ is. Rejection only ever
//! removes a minority, so it cannot be turned against an honest majority, and an attacker
//! that stays within the threshold is held to the clipping bound above.
//!
//! Clipping needs all contributions to a chunk at once, so a clipping reducer keeps each
//! sender's copy of its part until the chunk completes: up to `members × part` elements
//! instead of `part`. That is why clipping is optional.

/// Where the contributions to one chunk lie: row `i` of a `rows × stride` buffer, elements
/// `range` of each row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkRows<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) stride: usize,
    pub(crate) start: usize,
    pub(crate) len: usize,
}

impl ChunkRows<'_> {
    fn row(&self, index: usize) -> &[f32] {
        let start = index * self.stride + self.start;
        &self.data[start..start + self.len]
    }
}

/// Reusable space for [`centered_clip`], so that clipping allocates nothing per chunk.
#[derive(Debug, Default)]
pub(crate) struct ClipScratch {
    column: Vec<f32>,
    step: Vec<f32>,
    distances: Vec<f64>,
    sorted: Vec<f64>,
    kept: Vec<usize>,
}

/// Writes the CenteredClip average of the rows in `included` (with their `weights`) into
/// `out`, whose length is the chunk's. `tau` is the clipping radius for the whole chunk;
/// with `reject_factor > 0`, rows farther than that many median distances from the
/// coordinate-wise median are set aside first. Returns how many were set aside.
#[allow(clippy::too_many_arguments)] // The reducer's buffers, passed apart so none is copied.
pub(crate) fn centered_clip(
    rows: ChunkRows<'_>,
    included: &[usize],
    weights: &[f32],
    tau: f32,
    iterations: u32,
    reject_factor: f32,
    scratch: &mut ClipScratch,
    out: &mut [f32],
) -> usize {
    debug_assert_eq!(out.len(), rows.len);
    if included.is_empty() {
        return 0;
    }
    let rejected = if reject_factor > 0.0 && included.len() >= 3 {
        set_aside_outliers(rows, included, reject_factor, scratch, out)
    } else {
        0
    };
    if rejected == 0 {
        clip_iterations(rows, included, weights, tau, iterations, scratch, out);
    } else {
        let kept = std::mem::take(&mut scratch.kept);
        clip_iterations(rows, &kept, weights, tau, iterations, scratch, out);
        scratch.kept = kept;
    }
    rejected
}

/// Measures every row's distance from the coordinate-wise median (left in `out`) and keeps
/// in `scratch.kept` those within `reject_factor` times the median distance. The median
/// is the reference, not a clipped center: a center that clipping let the outliers pull
/// would hide them behind a radius chosen too wide. Returns how many were set aside; 0
/// when a majority would be (nothing then tells honest rows from the others).
fn set_aside_outliers(
    rows: ChunkRows<'_>,
    included: &[usize],
    reject_factor: f32,
    scratch: &mut ClipScratch,
    out: &mut [f32],
) -> usize {
    median_into(rows, included, &mut scratch.column, out);
    scratch.distances.clear();
    scratch
        .distances
        .extend(included.iter().map(|&i| distance(rows.row(i), out)));
    scratch.sorted.clear();
    scratch.sorted.extend_from_slice(&scratch.distances);
    let middle = scratch.sorted.len() / 2;
    let (_, median, _) = scratch
        .sorted
        .select_nth_unstable_by(middle, f64::total_cmp);
    let threshold = f64::from(reject_factor) * *median;
    scratch.kept.clear();
    scratch.kept.extend(
        included
            .iter()
            .zip(&scratch.distances)
            .filter(|&(_, d)| *d <= threshold)
            .map(|(&i, _)| i),
    );
    let rejected = included.len() - scratch.kept.len();
    // Only a minority may be set aside; otherwise nothing tells honest from not.
    if 2 * scratch.kept.len() <= included.len() {
        return 0;
    }
    rejected
}

fn distance(row: &[f32], center: &[f32]) -> f64 {
    row.iter()
        .zip(center)
        .map(|(x, v)| f64::from(x - v).powi(2))
        .sum::<f64>()
        .sqrt()
}

/// The CenteredClip fixed-point iteration from the coordinate-wise median.
fn clip_iterations(
    rows: ChunkRows<'_>,
    included: &[usize],
    weights: &[f32],
    tau: f32,
    iterations: u32,
    scratch: &mut ClipScratch,
    out: &mut [f32],
) {
    median_into(rows, included, &mut scratch.column, out);
    let total: f64 = included.iter().map(|&i| f64::from(weights[i])).sum();
    let uniform = total.is_nan() || total <= 0.0;
    scratch.step.clear();
    scratch.step.resize(out.len(), 0.0);
    for _ in 0..iterations {
        scratch.step.iter_mut().for_each(|s| *s = 0.0);
        for &i in included {
            let row = rows.row(i);
            let distance = distance(row, out);
            let clip = if distance > f64::from(tau) {
                f64::from(tau) / distance
            } else {
                1.0
            };
            let share = if uniform {
                1.0 / included.len() as f64
            } else {
                f64::from(weights[i]) / total
            };
            let factor = (share * clip) as f32;
            for ((s, x), v) in scratch.step.iter_mut().zip(row).zip(out.iter()) {
                *s += factor * (x - v);
            }
        }
        out.iter_mut().zip(&scratch.step).for_each(|(v, s)| *v += s);
    }
}

/// The coordinate-wise median (the mean of the two middle values for an even count).
fn median_into(rows: ChunkRows<'_>, included: &[usize], column: &mut Vec<f32>, out: &mut [f32]) {
    let n = included.len();
    for (element, v) in out.iter_mut().enumerate() {
        column.clear();
        column.extend(included.iter().map(|&i| rows.row(i)[element]));
        let (_, upper, _) = column.select_nth_unstable_by(n / 2, f32::total_cmp);
        let upper = *upper;
        *v = if n % 2 == 1 {
            upper
        } else {
            let lower = column[..n / 2].iter().copied().fold(f32::MIN, f32::max);
            0.5 * (lower + upper)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::{ChunkRows, ClipScratch, centered_clip};

    #[test]
    fn without_outliers_and_a_wide_radius_it_is_the_weighted_mean() {
        let data = [1.0, 2.0, 3.0, 4.0, 5.0, 9.0];
        let rows = ChunkRows {
            data: &data,
            stride: 2,
            start: 0,
            len: 2,
        };
        let mut out = [0.0; 2];
        let weights = [1.0, 1.0, 2.0];
        centered_clip(
            rows,
            &[0, 1, 2],
            &weights,
            1e6,
            50,
            0.0,
            &mut ClipScratch::default(),
            &mut out,
        );
        let mean = [(1.0 + 3.0 + 2.0 * 5.0) / 4.0, (2.0 + 4.0 + 2.0 * 9.0) / 4.0];
        assert!(
            (out[0] - mean[0]).abs() < 1e-4 && (out[1] - mean[1]).abs() < 1e-4,
            "{out:?}"
        );
    }

    #[test]
    fn one_huge_outlier_moves_the_result_by_at_most_its_share_of_tau_per_step() {
        // Four honest rows at 0 and one at 1e6: each step, the outlier pulls by ≤ τ/5.
        let data = [0.0, 0.0, 0.0, 0.0, 1e6];
        let rows = ChunkRows {
            data: &data,
            stride: 1,
            start: 0,
            len: 1,
        };
        let mut out = [0.0];
        let tau = 1.0;
        centered_clip(
            rows,
            &[0, 1, 2, 3, 4],
            &[1.0; 5],
            tau,
            3,
            0.0,
            &mut ClipScratch::default(),
            &mut out,
        );
        assert!(out[0] >= 0.0 && out[0] <= 3.0 * tau / 5.0 + 1e-6, "{out:?}");
    }

    #[test]
    fn a_far_outlier_is_set_aside_whatever_the_radius() {
        // Three honest rows around (1, -1) and one flipped a thousand times; a radius so
        // wide that clipping alone is the plain mean, which the outlier would drag far.
        let data = [1.0, -1.0, 1.2, -0.8, 0.8, -1.2, -1000.0, 1000.0];
        let rows = ChunkRows {
            data: &data,
            stride: 2,
            start: 0,
            len: 2,
        };
        let mut out = [0.0; 2];
        let rejected = centered_clip(
            rows,
            &[0, 1, 2, 3],
            &[1.0; 4],
            1e6,
            3,
            4.0,
            &mut ClipScratch::default(),
            &mut out,
        );
        assert_eq!(rejected, 1);
        assert!(
            (out[0] - 1.0).abs() < 1e-5 && (out[1] + 1.0).abs() < 1e-5,
            "{out:?}"
        );
    }

    #[test]
    fn a_far_outlier_is_set_aside_and_a_near_majority_never_is() {
        // Honest rows spread around 1.0; one row a thousand times farther out.
        let data = [0.9, 1.1, 1.0, 0.95, 1.05, -1000.0];
        let rows = ChunkRows {
            data: &data,
            stride: 1,
            start: 0,
            len: 1,
        };
        let mut scratch = ClipScratch::default();
        let mut out = [0.0];
        let rejected = centered_clip(
            rows,
            &[0, 1, 2, 3, 4, 5],
            &[1.0; 6],
            0.5,
            20,
            4.0,
            &mut scratch,
            &mut out,
        );
        assert_eq!(rejected, 1);
        assert!((out[0] - 1.0).abs() < 1e-6, "{out:?}");

        // Three far rows out of five are a majority: nothing may be set aside.
        let data = [1.0, 1.0, 50.0, 60.0, 70.0];
        let rows = ChunkRows {
            data: &data,
            stride: 1,
            start: 0,
            len: 1,
        };
        let rejected = centered_clip(
            rows,
            &[0, 1, 2, 3, 4],
            &[1.0; 5],
            0.5,
            20,
            4.0,
            &mut scratch,
            &mut out,
        );
        assert_eq!(rejected, 0);
    }
}

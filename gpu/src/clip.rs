//! CenteredClip's arithmetic in the fixed order the CUDA kernels use, on the host.
//!
//! A clipping reducer (Karimireddy, He and Jaggi, ICML 2021; BTARD, Gorbunov et al., ICML
//! 2022) iterates `v ← v + Σ_i f_i · (x_i − v)` with `f_i = share_i · min(1, τ / ‖x_i − v‖)`.
//! The step is an elementwise loop over rows in order, so it has one natural order. The
//! squared distance is a reduction, and a GPU cannot sum it in one sequential pass; murmur
//! fixes a tiled order instead, which [`squared_distance`] reproduces on the host:
//!
//! - the row is cut into tiles of [`CLIP_TILE`] elements;
//! - in a tile, sum `t` (of 256) adds the squares of elements `t, t+256, …, t+1792` in
//!   index order, in `f64`;
//! - the 256 sums combine in a halving tree: sum `t` += sum `t+128` for `t < 128`, then
//!   `t+64`, …, down to `t+1`;
//! - the tile results are added in tile order.
//!
//! Each square of an `f32` difference is exact in `f64`, so only the additions round and
//! the order above fixes every bit. A CPU reducer that uses these functions computes the
//! same average as a GPU reducer running `CudaBackend::clip_squared_distances` and
//! `CudaBackend::clip_step`.

/// Elements per tile of the distance reduction.
pub const CLIP_TILE: usize = 2048;
/// Partial sums per tile.
const TILE_SUMS: usize = 256;

/// `‖x − v‖²` summed in `f64` in the tiled order described in the module docs. The
/// slices have equal length; extra elements of the longer one are ignored.
pub fn squared_distance(x: &[f32], v: &[f32]) -> f64 {
    let mut total = 0.0f64;
    for (xs, vs) in x.chunks(CLIP_TILE).zip(v.chunks(CLIP_TILE)) {
        total += tile_squared_distance(xs, vs);
    }
    total
}

fn tile_squared_distance(xs: &[f32], vs: &[f32]) -> f64 {
    let len = xs.len().min(vs.len());
    let mut sums = [0.0f64; TILE_SUMS];
    for (t, sum) in sums.iter_mut().enumerate() {
        for j in (t..len).step_by(TILE_SUMS) {
            let d = f64::from(xs[j] - vs[j]);
            *sum += d * d;
        }
    }
    let mut half = TILE_SUMS / 2;
    while half > 0 {
        for t in 0..half {
            sums[t] += sums[t + half];
        }
        half /= 2;
    }
    sums[0]
}

/// The weight `share · min(1, τ / ‖x − v‖)` of one row in a step, from its squared
/// distance: rows farther than `tau` pull by at most `tau`.
pub fn clip_factor(squared_distance: f64, tau: f32, share: f64) -> f32 {
    let distance = squared_distance.sqrt();
    let clip = if distance > f64::from(tau) {
        f64::from(tau) / distance
    } else {
        1.0
    };
    (share * clip) as f32
}

/// One step on the host: `center[j] += Σ_r factors[r] · (rows[r][j] − center[j])`, the
/// terms added in row order in `f32`, exactly as the `clip_step` kernel does.
pub fn clip_step(rows: &[&[f32]], factors: &[f32], center: &mut [f32]) {
    for (j, v) in center.iter_mut().enumerate() {
        let mut step = 0.0f32;
        for (row, factor) in rows.iter().zip(factors) {
            step += factor * (row[j] - *v);
        }
        *v += step;
    }
}

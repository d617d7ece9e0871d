//! LAMB: layer-wise adaptive moments (You et al., ICLR 2020, Algorithm 2).
//!
//! Each tensor takes an Adam-style direction `u = m̂/(√v̂ + ε) + λp`, rescaled by the trust
//! ratio `‖p‖ / ‖u‖` (φ is the identity), so every layer moves by a step proportional to its
//! own norm whatever the gradient's scale. A ratio with a zero norm on either side is 1.
//! The trust ratio applies to every tensor, biases and norms included, as in the paper.

use super::adamw::AdamStep;
use super::grads::GradSlots;

/// The trust ratio `‖p‖ / ‖u‖`, or 1 when either norm is zero.
pub(crate) fn trust_ratio(param_norm: f64, update_norm: f64) -> f64 {
    if param_norm > 0.0 && update_norm > 0.0 {
        param_norm / update_norm
    } else {
        1.0
    }
}

/// One step over one tensor; returns the trust ratio it used.
///
/// Two passes and no scratch buffer: the first updates the moments and measures `‖p‖` and
/// `‖u‖`, the second recomputes `u` and applies it.
pub(crate) fn step(
    params: &mut [f32],
    mut grad: impl GradSlots,
    m: &mut [f32],
    v: &mut [f32],
    s: AdamStep,
) -> f32 {
    let n = params.len();
    assert!(grad.len() == n && m.len() == n && v.len() == n);
    let inv_bc1 = 1.0 / s.bc1;
    let inv_bc2 = 1.0 / s.bc2;
    let direction = |p: f32, m: f32, v: f32| {
        (m * inv_bc1) / ((v * inv_bc2).sqrt() + s.eps) + s.weight_decay * p
    };

    let mut param_sq = 0.0f64;
    let mut update_sq = 0.0f64;
    for i in 0..n {
        let (p, g) = (params[i], grad.grad(i));
        m[i] = s.beta1 * m[i] + (1.0 - s.beta1) * g;
        v[i] = s.beta2 * v[i] + (1.0 - s.beta2) * g * g;
        let u = direction(p, m[i], v[i]);
        param_sq += f64::from(p * p);
        update_sq += f64::from(u * u);
    }
    let ratio = trust_ratio(param_sq.sqrt(), update_sq.sqrt()) as f32;
    let scale = s.lr * ratio;
    for i in 0..n {
        let before = params[i];
        params[i] = before - scale * direction(before, m[i], v[i]);
        grad.moved(i, before, params[i]);
    }
    ratio
}

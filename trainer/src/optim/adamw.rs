//! AdamW: Adam with decoupled weight decay (Loshchilov and Hutter, ICLR 2019), in the form
//! PyTorch's `AdamW` computes it.

use super::grads::GradSlots;

/// Bias corrections `1 − β₁ᵗ` and `1 − β₂ᵗ` for step `t` (1-based).
pub(crate) fn bias_corrections(beta1: f32, beta2: f32, t: u64) -> (f32, f32) {
    let t = t as f64;
    (
        (1.0 - f64::from(beta1).powf(t)) as f32,
        (1.0 - f64::from(beta2).powf(t)) as f32,
    )
}

/// Hyperparameters of one AdamW step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdamStep {
    pub(crate) lr: f32,
    pub(crate) beta1: f32,
    pub(crate) beta2: f32,
    pub(crate) eps: f32,
    pub(crate) weight_decay: f32,
    /// `1 − β₁ᵗ`.
    pub(crate) bc1: f32,
    /// `1 − β₂ᵗ`.
    pub(crate) bc2: f32,
}

/// One step over one tensor.
///
/// `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`, `p ← p(1 − ηλ)`,
/// `p ← p − (η/bc₁)·m / (√v/√bc₂ + ε)`.
pub(crate) fn step(
    params: &mut [f32],
    mut grad: impl GradSlots,
    m: &mut [f32],
    v: &mut [f32],
    s: AdamStep,
) {
    let n = params.len();
    assert!(grad.len() == n && m.len() == n && v.len() == n);
    let decay = 1.0 - s.lr * s.weight_decay;
    let step_size = s.lr / s.bc1;
    let inv_sqrt_bc2 = 1.0 / s.bc2.sqrt();
    for i in 0..n {
        let g = grad.grad(i);
        m[i] = s.beta1 * m[i] + (1.0 - s.beta1) * g;
        v[i] = s.beta2 * v[i] + (1.0 - s.beta2) * g * g;
        let denom = v[i].sqrt() * inv_sqrt_bc2 + s.eps;
        let before = params[i];
        params[i] = before * decay - step_size * m[i] / denom;
        grad.moved(i, before, params[i]);
    }
}

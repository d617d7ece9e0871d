//! AdamW: Adam with decoupled weight decay (Loshchilov and Hutter, ICLR 2019), in the form
//! PyTorch's `AdamW` computes it.

use super::Group;
use super::grads::GradSlots;
use super::moment_codes::{BLOCK, Coder, MomentCodes};

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

/// [`step`] over the whole vector with the moments in 8-bit codes, a block at a time: each
/// block's moments are decoded, stepped with each tensor's hyperparameters (`step_of` its
/// group) and coded again.
pub(crate) fn step_coded(
    params: &mut [f32],
    mut grad: impl GradSlots,
    m: &mut MomentCodes,
    v: &mut MomentCodes,
    groups: &[Group],
    step_of: impl Fn(&Group) -> AdamStep,
) {
    let n = params.len();
    assert!(grad.len() == n && m.len() == n && v.len() == n);
    let (m_coder, v_coder) = (Coder::new(m.kind()), Coder::new(v.kind()));
    let (mut m_block, mut v_block) = ([0.0; BLOCK], [0.0; BLOCK]);
    let mut group = 0;
    for block in 0..m.blocks() {
        let start = block * BLOCK;
        let end = (start + BLOCK).min(n);
        let (m_values, v_values) = (&mut m_block[..end - start], &mut v_block[..end - start]);
        m_coder.load(m, block, m_values);
        v_coder.load(v, block, v_values);
        let mut at = start;
        while at < end {
            while groups[group].range.end <= at {
                group += 1;
            }
            let to = groups[group].range.end.min(end);
            let within = at - start..to - start;
            step(
                &mut params[at..to],
                grad.part(at..to),
                &mut m_values[within.clone()],
                &mut v_values[within],
                step_of(&groups[group]),
            );
            at = to;
        }
        m_coder.store(m, block, m_values);
        v_coder.store(v, block, v_values);
    }
}

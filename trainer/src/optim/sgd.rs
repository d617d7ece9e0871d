//! SGD with Nesterov momentum, as PyTorch's `SGD(nesterov=True)` computes it
//! (Sutskever et al. 2013): weight decay is coupled (added to the gradient).

use super::grads::GradSlots;

/// One step over one tensor.
///
/// `g' = g + λp`, `b ← μb + g'`, `p ← p − η(g' + μb)`.
pub(crate) fn step(
    params: &mut [f32],
    mut grad: impl GradSlots,
    momentum_buf: &mut [f32],
    lr: f32,
    momentum: f32,
    weight_decay: f32,
) {
    let n = params.len();
    assert!(grad.len() == n && momentum_buf.len() == n);
    for i in 0..n {
        let before = params[i];
        let g = grad.grad(i) + weight_decay * before;
        momentum_buf[i] = momentum * momentum_buf[i] + g;
        params[i] = before - lr * (g + momentum * momentum_buf[i]);
        grad.moved(i, before, params[i]);
    }
}

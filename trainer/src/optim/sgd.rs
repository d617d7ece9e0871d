//! SGD with Nesterov momentum, as PyTorch's `SGD(nesterov=True)` computes it
//! (Sutskever et al. 2013): weight decay is coupled (added to the gradient).

/// One step over one tensor.
///
/// `g' = g + λp`, `b ← μb + g'`, `p ← p − η(g' + μb)`.
pub(crate) fn step(
    params: &mut [f32],
    grad: &[f32],
    momentum_buf: &mut [f32],
    lr: f32,
    momentum: f32,
    weight_decay: f32,
) {
    for ((p, &g), b) in params.iter_mut().zip(grad).zip(momentum_buf) {
        let g = g + weight_decay * *p;
        *b = momentum * *b + g;
        *p -= lr * (g + momentum * *b);
    }
}

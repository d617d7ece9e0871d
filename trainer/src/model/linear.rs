//! `x · w` whose backward pass keeps nothing alive but the gradients it returns.
//!
//! candle's own matmul computes a weight's gradient as `xᵀ · g` from the forward pass's `x`
//! as it is, still part of the graph, so the gradient records the product it came from, and
//! the weight's summed gradient records that gradient in turn: every weight's raw gradient
//! stays alive beside its sum until the gradients are dropped, about one more parameter
//! vector at the end of a backward pass (trainer test `step_rss`). This op computes the
//! same products from detached inputs, so a gradient is a plain tensor.
//!
//! The kernel is candle's CPU matmul; on a GPU the product is candle's own.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};

/// `x · w` for `x` of `[m, k]` and `w` of `[k, n]`.
pub(crate) fn linear(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    if !x.device().is_cpu() {
        return x.matmul(w);
    }
    x.apply_op2(w, Linear)
}

struct Linear;

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "murmur-linear"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        w: &CpuStorage,
        w_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (m, k) = x_layout.shape().dims2()?;
        let (k2, n) = w_layout.shape().dims2()?;
        if k != k2 {
            candle_core::bail!("linear: [{m}, {k}] · [{k2}, {n}]");
        }
        let product = x.matmul(w, (1, m, n, k), x_layout, w_layout)?;
        Ok((product, Shape::from((m, n))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _product: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.detach();
        let x_grad = grad.matmul(&w.detach().t()?)?;
        let w_grad = x.detach().t()?.matmul(&grad)?;
        Ok((Some(x_grad), Some(w_grad)))
    }
}

//! `x · w` whose backward pass keeps nothing alive but the gradients it returns.
//!
//! candle's own matmul computes a weight's gradient as `xᵀ · g` from the forward pass's `x`
//! as it is, still part of the graph, so the gradient records the product it came from, and
//! the weight's summed gradient records that gradient in turn: every weight's raw gradient
//! stays alive beside its sum until the gradients are dropped, about one more parameter
//! vector at the end of a backward pass (trainer test `step_rss`). This op computes the
//! same products from detached inputs, so a gradient is a plain tensor.
//!
//! With a gradient sink for the pass ([`super::grad_sink`]) the weight's gradient is added
//! into the trainer's flat gradient as it is computed, and candle's store never holds it.
//!
//! The kernel is candle's CPU matmul; on a GPU the product is candle's own.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};

use super::autograd::with_host_values;
use super::grad_sink::{GradSink, add_transposed_product};

/// `x · w` for `x` of `[m, k]` and `w` of `[k, n]`. With `sink`, `w` is the parameter
/// tensor at that layout index, and its gradient goes into the sink.
pub(crate) fn linear(
    x: &Tensor,
    w: &Tensor,
    sink: Option<(&Arc<GradSink>, usize)>,
) -> candle_core::Result<Tensor> {
    if !x.device().is_cpu() {
        return x.matmul(w);
    }
    let sink = sink.map(|(sink, index)| (Arc::clone(sink), index));
    x.apply_op2(w, Linear { sink })
}

struct Linear {
    sink: Option<(Arc<GradSink>, usize)>,
}

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
        let Some((sink, index)) = &self.sink else {
            let w_grad = x.detach().t()?.matmul(&grad)?;
            return Ok((Some(x_grad), Some(w_grad)));
        };
        // dW += xᵀ · grad, into the flat gradient.
        let ((m, k), n) = (x.dims2()?, grad.dims2()?.1);
        let mut added = Ok(());
        let read = with_host_values(x, m * k, |x| {
            let read = with_host_values(&grad, m * n, |grad| {
                added = sink.add_with(*index, |dw, scale| {
                    add_transposed_product(dw, scale, x, grad, (k, m, n));
                });
            });
            if let Err(error) = read {
                added = Err(candle_core::Error::Msg(error.to_string()));
            }
        });
        read.map_err(|error| candle_core::Error::Msg(error.to_string()))?;
        added?;
        Ok((Some(x_grad), None))
    }
}

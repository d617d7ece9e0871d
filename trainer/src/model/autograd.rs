//! Glue between the flat parameter vector and candle's autograd.
//!
//! Each step turns the flat slice into one candle `Var` per tensor, runs the forward pass,
//! calls `backward`, and moves each tensor's gradient into the caller's flat gradient buffer
//! without an intermediate `Vec`, freeing candle's copy as it goes. A training step on the
//! CPU borrows the flat parameters for its passes ([`ParamTensors::lend`]): their pages go
//! back to the kernel while candle holds the values, and come back with them afterwards, so
//! the step holds the parameters once. On a GPU the same copies are the host-to-device and
//! device-to-host transfers of the step (the gradient comes back through one host tensor per
//! parameter tensor), and the host vector stays as it is.

use candle_core::backprop::GradStore;
use candle_core::{D, Device, Storage, Tensor, Var};

use super::grad_sink::Written;
use crate::error::TrainerError;
use crate::layout::ParamLayout;
use crate::{pages, transfer};

/// The model's parameters as candle tensors, either tracked (`Var`s, for a training step) or
/// plain (for evaluation, where no graph is recorded).
#[derive(Debug)]
pub(crate) struct ParamTensors {
    tensors: Vec<Tensor>,
    /// The flat vector's pages were released as the tensors were made
    /// ([`ParamTensors::lend`]): [`ParamTensors::give_back`] writes the values back.
    released: bool,
}

impl ParamTensors {
    /// Copies each tensor of `params` into its own candle tensor.
    pub(crate) fn from_flat(
        layout: &ParamLayout,
        params: &[f32],
        device: &Device,
        track: bool,
    ) -> Result<Self, TrainerError> {
        TrainerError::check_len("params", layout.len(), params.len())?;
        let mut tensors = Vec::with_capacity(layout.tensors().len());
        for spec in layout.tensors() {
            let values = &params[spec.range()];
            let tensor = if track {
                Var::from_slice(values, spec.shape(), device)?.into_inner()
            } else {
                Tensor::from_slice(values, spec.shape(), device)?
            };
            tensors.push(tensor);
        }
        transfer::uploaded(device, std::mem::size_of_val(params));
        Ok(Self {
            tensors,
            released: false,
        })
    }

    /// Lends `params` to candle for a step's passes, as tracked variables when `track` (an
    /// eval records no graph). On the CPU each tensor's whole pages of `params` go back to
    /// the kernel once copied ([`pages`]), so that the values are held once;
    /// [`ParamTensors::give_back`] writes them back. On a GPU `params` stays as it is.
    pub(crate) fn lend(
        layout: &ParamLayout,
        params: &mut [f32],
        device: &Device,
        track: bool,
    ) -> Result<Self, TrainerError> {
        TrainerError::check_len("params", layout.len(), params.len())?;
        let mut lent = Self {
            tensors: Vec::with_capacity(layout.tensors().len()),
            released: device.is_cpu(),
        };
        for spec in layout.tensors() {
            let values = &mut params[spec.range()];
            let tensor = if track {
                Var::from_slice(values, spec.shape(), device).map(Var::into_inner)
            } else {
                Tensor::from_slice(values, spec.shape(), device)
            };
            match tensor {
                Ok(tensor) => lent.tensors.push(tensor),
                Err(e) => {
                    // The tensors made so far hold their values: put them back first.
                    lent.give_back(layout, params)?;
                    return Err(e.into());
                }
            }
            if lent.released {
                pages::release(values);
            }
        }
        transfer::uploaded(device, std::mem::size_of_val(params));
        Ok(lent)
    }

    /// Ends a loan ([`ParamTensors::lend`]): writes each tensor's values back into its range
    /// of `params` where its pages were released, dropping the tensor as it goes.
    pub(crate) fn give_back(
        self,
        layout: &ParamLayout,
        params: &mut [f32],
    ) -> Result<(), TrainerError> {
        if !self.released {
            return Ok(());
        }
        for (spec, tensor) in layout.tensors().iter().zip(self.tensors) {
            copy_to_slice(&tensor, &mut params[spec.range()])?;
        }
        Ok(())
    }

    /// The tensor at `index` in layout order.
    pub(crate) fn get(&self, index: usize) -> &Tensor {
        &self.tensors[index]
    }

    /// Moves every tensor's gradient into `grad_out` as `write` says (a tensor that got
    /// none counts as zeros), freeing each of candle's gradients once it is written; the
    /// tensors the pass's ops `written` into `grad_out` themselves are left as they are.
    pub(crate) fn write_grads(
        &self,
        mut grads: GradStore,
        layout: &ParamLayout,
        grad_out: &mut [f32],
        write: GradWrite,
        written: &Written,
    ) -> Result<(), TrainerError> {
        TrainerError::check_len("grad", layout.len(), grad_out.len())?;
        for (index, (spec, tensor)) in layout.tensors().iter().zip(&self.tensors).enumerate() {
            if written.contains(index) {
                continue;
            }
            let out = &mut grad_out[spec.range()];
            match (grads.remove(tensor), write) {
                (Some(grad), GradWrite::Overwrite) => copy_to_slice(&grad, out)?,
                (Some(grad), GradWrite::Add { scale }) => add_to_slice(&grad, scale, out)?,
                (None, GradWrite::Overwrite) => out.fill(0.0),
                (None, GradWrite::Add { .. }) => {}
            }
        }
        Ok(())
    }
}

/// Adds row `i` of `rows_grad` (`[ids.len(), width]`) into row `ids[i]` of `out` (a
/// `[rows, width]` gradient, already written this pass), scaled as `write` scales the pass:
/// the gradient of a row lookup, without a dense copy of the looked-up matrix.
pub(crate) fn add_rows(
    rows_grad: &Tensor,
    ids: &[u32],
    out: &mut [f32],
    write: GradWrite,
) -> Result<(), TrainerError> {
    let scale = write.scale();
    let len = rows_grad.elem_count();
    with_host_values(rows_grad, len, |values| {
        let width = values.len() / ids.len().max(1);
        for (&id, row) in ids.iter().zip(values.chunks_exact(width)) {
            let start = id as usize * width;
            for (out, &value) in out[start..start + width].iter_mut().zip(row) {
                *out += scale * value;
            }
        }
    })
}

/// How a backward pass writes its gradient into the caller's flat buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GradWrite {
    /// Replace the buffer's contents.
    Overwrite,
    /// Add `scale` times the gradient (micro-batches: `1 / k` each, summed over `k`).
    Add {
        /// The factor on this pass's gradient.
        scale: f32,
    },
}

impl GradWrite {
    /// The factor on this pass's gradient: 1 for [`GradWrite::Overwrite`] (added to a
    /// tensor's range once the graph's gradient, or zeros, were written there).
    pub(crate) fn scale(self) -> f32 {
        match self {
            GradWrite::Overwrite => 1.0,
            GradWrite::Add { scale } => scale,
        }
    }
}

/// Copies an f32 tensor into `out` (which must have its element count); a tensor on a GPU
/// comes to the host first.
pub(crate) fn copy_to_slice(tensor: &Tensor, out: &mut [f32]) -> Result<(), TrainerError> {
    with_host_values(tensor, out.len(), |values| out.copy_from_slice(values))
}

/// Adds `scale` times an f32 tensor to `out` (which must have its element count).
fn add_to_slice(tensor: &Tensor, scale: f32, out: &mut [f32]) -> Result<(), TrainerError> {
    with_host_values(tensor, out.len(), |values| {
        for (out, &value) in out.iter_mut().zip(values) {
            *out += scale * value;
        }
    })
}

/// Calls `use_values` with a tensor's `len` f32 values in host memory.
pub(crate) fn with_host_values(
    tensor: &Tensor,
    len: usize,
    use_values: impl FnOnce(&[f32]),
) -> Result<(), TrainerError> {
    let tensor = if tensor.device().is_cpu() {
        tensor.contiguous()?
    } else {
        transfer::downloaded(tensor.device(), len * std::mem::size_of::<f32>());
        tensor.to_device(&Device::Cpu)?.contiguous()?
    };
    let (storage, layout) = tensor.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(TrainerError::BatchMismatch {
            reason: "the trainer reads gradients from CPU tensors only".into(),
        });
    };
    let values = cpu.as_slice::<f32>()?;
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| TrainerError::BatchMismatch {
            reason: "gradient tensor is not contiguous".into(),
        })?;
    let values = &values[start..end];
    TrainerError::check_len("grad tensor", len, values.len())?;
    use_values(values);
    Ok(())
}

/// Mean cross-entropy of `logits` (`[n, classes]`) against `targets` (`[n]`, u32), in nats.
pub(crate) fn cross_entropy(logits: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
    let log_probs = log_softmax_last(logits)?;
    let picked = log_probs.gather(&targets.unsqueeze(1)?, 1)?;
    picked.mean_all()?.neg()
}

/// Log-softmax over the last dimension, shifted by the (detached) row maximum for stability.
pub(crate) fn log_softmax_last(x: &Tensor) -> candle_core::Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&log_sum)
}

/// Softmax over the last dimension, shifted by the (detached) row maximum for stability.
pub(crate) fn softmax_last(x: &Tensor) -> candle_core::Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let exp = x.broadcast_sub(&max)?.exp()?;
    let sum = exp.sum_keepdim(D::Minus1)?;
    exp.broadcast_div(&sum)
}

/// Layer normalisation over the last dimension (Ba et al. 2016) with gain and shift.
pub(crate) fn layer_norm(
    x: &Tensor,
    gain: &Tensor,
    shift: &Tensor,
    eps: f64,
) -> candle_core::Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = centered.broadcast_div(&var.affine(1.0, eps)?.sqrt()?)?;
    normed.broadcast_mul(gain)?.broadcast_add(shift)
}

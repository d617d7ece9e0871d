//! A GPT's tied output projection and its cross-entropy as one op, a block of rows at a
//! time.
//!
//! The logits are `n × vocab` floats: 206 MB for 1,024 tokens of GPT-2's 50,257-token
//! vocabulary. Built from generic candle ops, the projection and a log-softmax held eight
//! tensors of that size at once in the backward pass, the largest part of a
//! large-vocabulary trainer's peak memory (BENCHMARKS.md). This op holds one block of
//! logits at a time. For each block it computes the rows' log-sum-exps and, when a gradient
//! is wanted, turns the block in place into `(softmax − one_hot) / n` and multiplies that
//! into both gradients at once, so that the backward pass only hands them over (scaled, if
//! the loss's own gradient is not 1). No product is computed twice. The idea is that of
//! chunked "linear cross-entropy" kernels such as Liger-Kernel's.
//!
//! The output matrix's gradient does not go through candle's gradient store, which would
//! have summed it into a zeroed copy of the matrix at the end of the backward pass, and
//! then been copied into the trainer's flat gradient: the op adds it, block by block,
//! straight into the flat gradient through the pass's sink ([`super::grad_sink`]).
//!
//! The kernel is the CPU's; on a GPU the loss is the generic ops' (the same formula), and
//! the matrix's gradient comes through candle's store.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};

use std::sync::Arc;

use super::autograd::cross_entropy;
use super::grad_sink::{GradSink, add_transposed_product};

/// The most logits one block holds on the CPU: 4 Mi floats (16 MiB).
pub const BLOCK_LOGITS: usize = 1 << 22;

/// Mean cross-entropy, in nats, of the logits `x · weightᵀ` (`x`: `[n, d]`, `weight`:
/// `[vocab, d]`) against `targets` (`n` token ids below `vocab`). With `head_grad`, the
/// pass's sink and `weight`'s layout index, the gradients of both inputs are computed with
/// the loss: `x`'s for the backward pass to hand over (from the loss itself, a loss
/// gradient of 1), the matrix's into the sink. On a GPU the graph carries both.
pub(crate) fn projected_cross_entropy(
    x: &Tensor,
    weight: &Tensor,
    targets: &[u32],
    head_grad: Option<(&Arc<GradSink>, usize)>,
) -> candle_core::Result<Tensor> {
    let vocab = weight.dims2()?.0;
    let rows = (BLOCK_LOGITS / vocab.max(1)).max(1);
    with_block_rows(x, weight, targets, head_grad, rows)
}

/// [`projected_cross_entropy`] with `rows` rows a block.
fn with_block_rows(
    x: &Tensor,
    weight: &Tensor,
    targets: &[u32],
    head_grad: Option<(&Arc<GradSink>, usize)>,
    rows: usize,
) -> candle_core::Result<Tensor> {
    let with_grad = head_grad.is_some();
    let (n, d) = x.dims2()?;
    let (vocab, weight_d) = weight.dims2()?;
    if targets.len() != n || weight_d != d || n == 0 {
        candle_core::bail!(
            "projected cross-entropy: {n} rows of width {d}, {} targets, an output matrix of \
             width {weight_d}",
            targets.len()
        );
    }
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        candle_core::bail!("projected cross-entropy: target {bad} outside a vocabulary of {vocab}");
    }
    if !x.device().is_cpu() {
        let targets = Tensor::from_slice(targets, n, x.device())?;
        return cross_entropy(&x.matmul(&weight.t()?)?, &targets);
    }
    let (tracked_x, tracked_weight) = (x, weight);
    let (x, weight) = (x.detach(), weight.detach());
    let transposed = weight.t()?;
    let scale = 1.0 / n as f32;
    let mut total = 0.0f64;
    let mut x_blocks = Vec::with_capacity(if with_grad { n.div_ceil(rows) } else { 0 });
    let x_values = with_grad
        .then(|| x.flatten_all()?.to_vec1::<f32>())
        .transpose()?;
    for start in (0..n).step_by(rows) {
        let len = rows.min(n - start);
        let x_block = x.narrow(0, start, len)?;
        let mut logits = x_block
            .matmul(&transposed)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let block_targets = &targets[start..start + len];
        for (row, &target) in logits.chunks_exact_mut(vocab).zip(block_targets) {
            let lse = log_sum_exp(row);
            total += f64::from(lse - row[target as usize]);
            if with_grad {
                for v in row.iter_mut() {
                    *v = (*v - lse).exp() * scale;
                }
                row[target as usize] -= scale;
            }
        }
        if !with_grad {
            continue;
        }
        if let (Some(x_values), Some((sink, index))) = (&x_values, head_grad) {
            // dW += blockᵀ · x_block, into the flat gradient.
            let x_block = &x_values[start * d..(start + len) * d];
            sink.add_with(index, |dw, scale| {
                add_transposed_product(dw, scale, &logits, x_block, (vocab, len, d));
            })?;
        }
        let block = Tensor::from_vec(logits, (len, vocab), x.device())?;
        x_blocks.push(block.matmul(&weight)?);
    }
    let x_grad = if with_grad {
        Some(Tensor::cat(&x_blocks, 0)?)
    } else {
        None
    };
    let op = ProjectedCrossEntropy {
        loss: (total / n as f64) as f32,
        x_grad,
    };
    tracked_x.apply_op2(tracked_weight, op)
}

/// The op as the graph records it: its value and `x`'s gradient (for a loss gradient of
/// 1) were computed from the same two tensors before it was applied.
struct ProjectedCrossEntropy {
    /// The mean loss.
    loss: f32,
    /// The gradient of `x`, when it was wanted.
    x_grad: Option<Tensor>,
}

impl CustomOp2 for ProjectedCrossEntropy {
    fn name(&self) -> &'static str {
        "murmur-projected-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Ok((CpuStorage::F32(vec![self.loss]), Shape::from(())))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _weight: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let Some(x_grad) = &self.x_grad else {
            candle_core::bail!(
                "projected cross-entropy: a backward pass through a loss computed without gradients"
            );
        };
        let g = f64::from(grad_res.to_scalar::<f32>()?);
        if g != 1.0 {
            // The matrix's gradient went to the caller for a loss gradient of 1.
            candle_core::bail!(
                "projected cross-entropy: a backward pass must start from the loss itself"
            );
        }
        Ok((Some(x_grad.clone()), None))
    }
}

/// `ln Σ exp(v)` over a row, shifted by its maximum.
fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
    max + sum.ln()
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;
    use crate::layout::{Init, ParamLayout};
    use crate::model::autograd::GradWrite;
    use crate::model::grad_sink::OpenSink;

    use crate::model::wave as values;

    /// The loss and both gradients, by the op with `rows` a block or by generic ops.
    fn loss_and_grads(rows: Option<usize>) -> (f32, Vec<f32>, Vec<f32>) {
        let (n, d, vocab) = (7, 5, 11);
        let x = Var::from_vec(values(n * d, 1, 2.0), (n, d), &Device::Cpu).unwrap();
        let w = Var::from_vec(values(vocab * d, 2, 1.5), (vocab, d), &Device::Cpu).unwrap();
        let targets: Vec<u32> = (0..n as u32).map(|i| (i * 4 + 3) % vocab as u32).collect();
        let mut head_grad = vec![7.0f32; vocab * d];
        let mut layout = ParamLayout::default();
        layout.push("w".into(), &[vocab, d], true, Init::Zeros);
        let (loss, written) = match rows {
            Some(rows) => {
                let without = with_block_rows(x.as_tensor(), w.as_tensor(), &targets, None, rows);
                let open = OpenSink::open(&mut head_grad, &layout, GradWrite::Overwrite);
                let into = Some((open.sink(), 0));
                let with = with_block_rows(x.as_tensor(), w.as_tensor(), &targets, into, rows);
                let (without, with) = (without.unwrap(), with.unwrap());
                assert_eq!(
                    without.to_scalar::<f32>().unwrap(),
                    with.to_scalar::<f32>().unwrap()
                );
                assert!(open.close().contains(0));
                (with, true)
            }
            None => {
                let logits = x.as_tensor().matmul(&w.as_tensor().t().unwrap()).unwrap();
                let targets = Tensor::from_slice(&targets, n, &Device::Cpu).unwrap();
                (cross_entropy(&logits, &targets).unwrap(), false)
            }
        };
        let grads = loss.backward().unwrap();
        let flat = |g: &Tensor| g.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let w_grad = if written {
            assert!(
                grads.get(w.as_tensor()).is_none(),
                "the op writes the matrix's gradient, not the graph"
            );
            head_grad
        } else {
            flat(grads.get(w.as_tensor()).expect("a gradient"))
        };
        let x_grad = flat(grads.get(x.as_tensor()).expect("a gradient"));
        (loss.to_scalar::<f32>().unwrap(), x_grad, w_grad)
    }

    #[test]
    fn blocks_of_any_size_give_the_generic_ops_loss_and_gradients() {
        let (loss, x_grad, w_grad) = loss_and_grads(None);
        assert!(x_grad.iter().any(|g| g.abs() > 1e-2));
        // One block, blocks of three with a remainder of one, and one row a block.
        for rows in [16, 3, 1] {
            let (l, xg, wg) = loss_and_grads(Some(rows));
            assert!(
                (l - loss).abs() < 1e-5,
                "{rows} rows: loss {l} against {loss}"
            );
            for (name, got, want) in [("x", &xg, &x_grad), ("weight", &wg, &w_grad)] {
                for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                    assert!(
                        (g - w).abs() < 1e-5,
                        "{rows} rows: d{name}[{i}] {g} against {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_target_outside_the_vocabulary_is_an_error_not_a_panic() {
        let x = Tensor::zeros((2, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        let w = Tensor::zeros((4, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        let mut out = vec![0.0; 12];
        let mut layout = ParamLayout::default();
        layout.push("w".into(), &[4, 3], true, Init::Zeros);
        let open = OpenSink::open(&mut out, &layout, GradWrite::Overwrite);
        let error = projected_cross_entropy(&x, &w, &[1, 4], Some((open.sink(), 0))).unwrap_err();
        assert!(error.to_string().contains("target 4"), "{error}");
    }
}

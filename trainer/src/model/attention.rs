//! A GPT's causal attention weights, `softmax(scale · q·kᵀ + mask)`, as one op.
//!
//! Built from generic candle ops the weights went through six tensors of `heads × t × t`
//! floats (the scores, scaled, masked, shifted, exponentiated, normalised), each kept by
//! the graph for the backward pass: at GPT-2 small's 12 heads and 256 tokens, 19 MB a layer
//! for one sequence. This op computes the scores and the weights in one buffer and keeps
//! only the weights `P`; its backward pass needs nothing else, since `dS = scale · P ⊙ (dP −
//! rowsum(dP ⊙ P))` (masked entries have `P = 0`, so their gradient is zero).
//!
//! The kernel is the CPU's (the scores are candle's CPU matrix product, gemm); on a GPU the
//! weights are the generic ops'.

use candle_core::{CpuStorage, CustomOp2, D, Layout, Shape, Tensor};

use super::autograd::softmax_last;
use super::grad_sink::gemm_parallelism;

/// The attention weights of `q` and `k` (`[rows, heads, t, head_width]` each): row `i` of
/// each head attends to positions `0..=i`. `mask` is the generic ops' additive causal mask
/// (`[t, t]`, 0 or −∞), used on a GPU.
pub(crate) fn causal_weights(
    q: &Tensor,
    k: &Tensor,
    scale: f64,
    mask: &Tensor,
) -> candle_core::Result<Tensor> {
    if !q.device().is_cpu() {
        let scores = q.matmul(&k.t()?)?.affine(scale, 0.0)?;
        return softmax_last(&scores.broadcast_add(mask)?);
    }
    q.contiguous()?
        .apply_op2(&k.contiguous()?, CausalWeights { scale })
}

struct CausalWeights {
    scale: f64,
}

/// The f32 values of a contiguous CPU tensor.
fn values<'a>(storage: &'a CpuStorage, layout: &Layout) -> candle_core::Result<&'a [f32]> {
    let values = storage.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&values[start..end]),
        None => candle_core::bail!("causal attention weights need contiguous inputs"),
    }
}

impl CustomOp2 for CausalWeights {
    fn name(&self) -> &'static str {
        "murmur-causal-weights"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        q_layout: &Layout,
        k: &CpuStorage,
        k_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, heads, t, width) = q_layout.shape().dims4()?;
        if k_layout.shape().dims4()? != (rows, heads, t, width) {
            candle_core::bail!(
                "causal attention weights: q of {:?}, k of {:?}",
                q_layout.shape(),
                k_layout.shape()
            );
        }
        let (q, k) = (values(q, q_layout)?, values(k, k_layout)?);
        let mut weights = vec![0.0f32; rows * heads * t * t];
        let parallelism = gemm_parallelism();
        let scale = self.scale as f32;
        for ((q, k), out) in q
            .chunks_exact(t * width)
            .zip(k.chunks_exact(t * width))
            .zip(weights.chunks_exact_mut(t * t))
        {
            // out = scale · q · kᵀ (t × t), q and k row-major t × width.
            // SAFETY: `out` holds t·t elements (rows of t), `q` and `k` t·width each (rows of
            // width); kᵀ's (p, j) is `k[j·width + p]`; `out` does not overlap the inputs.
            unsafe {
                gemm::gemm(
                    t,
                    t,
                    width,
                    out.as_mut_ptr(),
                    1,
                    t as isize,
                    false,
                    q.as_ptr(),
                    1,
                    width as isize,
                    k.as_ptr(),
                    width as isize,
                    1,
                    0.0,
                    scale,
                    false,
                    false,
                    false,
                    parallelism,
                );
            }
            for (i, row) in out.chunks_exact_mut(t).enumerate() {
                let (seen, future) = row.split_at_mut(i + 1);
                let max = seen.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f32;
                for v in seen.iter_mut() {
                    *v = (*v - max).exp();
                    sum += *v;
                }
                let inverse = 1.0 / sum;
                seen.iter_mut().for_each(|v| *v *= inverse);
                future.fill(0.0);
            }
        }
        Ok((CpuStorage::F32(weights), Shape::from((rows, heads, t, t))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        weights: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let (p, dp) = (weights.detach(), grad.detach());
        // dS = scale · P ⊙ (dP − rowsum(dP ⊙ P)).
        let dot = (&dp * &p)?.sum_keepdim(D::Minus1)?;
        let ds = (p * dp.broadcast_sub(&dot)?)?.affine(self.scale, 0.0)?;
        let q_grad = ds.matmul(&k.detach())?;
        let k_grad = ds.t()?.matmul(&q.detach())?;
        Ok((Some(q_grad), Some(k_grad)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;

    use crate::model::wave as values;

    /// The weights, and the gradients of q and k under a fixed linear read-out of them, by
    /// the op or by the generic ops.
    fn weights_and_grads(fused: bool) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (rows, heads, t, width) = (2, 3, 5, 4);
        let shape = (rows, heads, t, width);
        let n = rows * heads * t * width;
        let q = Var::from_vec(values(n, 1, 2.0), shape, &Device::Cpu).unwrap();
        let k = Var::from_vec(values(n, 2, 1.5), shape, &Device::Cpu).unwrap();
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), &Device::Cpu).unwrap();
        let scale = 0.5;
        let weights = if fused {
            causal_weights(q.as_tensor(), k.as_tensor(), scale, &mask).unwrap()
        } else {
            let scores = q.as_tensor().matmul(&k.as_tensor().t().unwrap()).unwrap();
            let scores = scores.affine(scale, 0.0).unwrap();
            softmax_last(&scores.broadcast_add(&mask).unwrap()).unwrap()
        };
        let readout = Tensor::from_vec(
            values(rows * heads * t * t, 3, 1.0),
            (rows, heads, t, t),
            &Device::Cpu,
        )
        .unwrap();
        let loss = (&weights * &readout).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let flat = |x: &Tensor| x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        (
            flat(&weights),
            flat(grads.get(q.as_tensor()).unwrap()),
            flat(grads.get(k.as_tensor()).unwrap()),
        )
    }

    #[test]
    fn the_op_gives_the_generic_ops_weights_and_gradients() {
        let (weights, q_grad, k_grad) = weights_and_grads(false);
        let (fused_weights, fused_q, fused_k) = weights_and_grads(true);
        assert!(q_grad.iter().any(|g| g.abs() > 1e-2));
        for (name, got, want) in [
            ("weights", &fused_weights, &weights),
            ("dq", &fused_q, &q_grad),
            ("dk", &fused_k, &k_grad),
        ] {
            for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                assert!((g - w).abs() < 1e-5, "{name}[{i}]: {g} against {w}");
            }
        }
        // Row 0 of each head attends to itself alone.
        assert_eq!(fused_weights[0], 1.0);
        assert!(fused_weights[1..5].iter().all(|&w| w == 0.0));
    }
}

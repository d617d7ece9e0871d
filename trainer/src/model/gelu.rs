//! GELU (tanh approximation, as in GPT-2) as one fused candle op with a fused backward.
//!
//! candle's own `gelu` differentiates through a dozen tensor ops with `powf` and `tanh` from
//! libm, which made it the largest cost of a small GPT's step on CPU. This op computes the
//! forward and the backward in one pass each, with `tanh(u) = 1 − 2/(e^{2u} + 1)`.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};

/// √(2/π).
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh approximation.
const CUBIC: f32 = 0.044_715;

fn tanh(u: f32) -> f32 {
    1.0 - 2.0 / ((2.0 * u).exp() + 1.0)
}

fn gelu(x: f32) -> f32 {
    let t = tanh(SQRT_2_OVER_PI * (x + CUBIC * x * x * x));
    0.5 * x * (1.0 + t)
}

fn gelu_derivative(x: f32) -> f32 {
    // Beyond ±10 the derivative is 1 or 0 to f32 precision; cutting off there also keeps
    // x³ from overflowing into inf · 0.
    if x > 10.0 {
        return 1.0;
    }
    if x < -10.0 {
        return 0.0;
    }
    let t = tanh(SQRT_2_OVER_PI * (x + CUBIC * x * x * x));
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * CUBIC * x * x);
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
}

/// The f32 values of a contiguous CPU tensor.
fn contiguous_f32<'a>(storage: &'a CpuStorage, layout: &Layout) -> candle_core::Result<&'a [f32]> {
    let values = storage.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&values[start..end]),
        None => candle_core::bail!("gelu needs a contiguous input"),
    }
}

/// Applies GELU to `x` (made contiguous first), recording a fused backward.
///
/// The fused op has a CPU kernel only; on a GPU this is candle's own `gelu`, the same tanh
/// approximation, whose backward runs as device ops.
pub(crate) fn apply(x: &Tensor) -> candle_core::Result<Tensor> {
    if x.device().is_cpu() {
        x.contiguous()?.apply_op1(Gelu)
    } else {
        x.gelu()
    }
}

/// The forward op.
struct Gelu;

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "murmur-gelu"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(storage, layout)?;
        let out = x.iter().map(|&v| gelu(v)).collect();
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let grad = grad_res.contiguous()?;
        Ok(Some(arg.apply_op2_no_bwd(&grad, &GeluBackward)?))
    }
}

/// `grad · gelu'(x)`, elementwise.
struct GeluBackward;

impl CustomOp2 for GeluBackward {
    fn name(&self) -> &'static str {
        "murmur-gelu-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s1, l1)?;
        let grad = contiguous_f32(s2, l2)?;
        if x.len() != grad.len() {
            candle_core::bail!(
                "gelu backward: {} inputs, {} gradients",
                x.len(),
                grad.len()
            );
        }
        let out = x
            .iter()
            .zip(grad)
            .map(|(&v, &g)| g * gelu_derivative(v))
            .collect();
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_tanh_formula_and_its_derivative() {
        for i in -60..=60 {
            let x = i as f32 * 0.25;
            let reference = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + CUBIC * x.powi(3))).tanh());
            assert!((gelu(x) - reference).abs() < 1e-5, "gelu({x})");
            let h = 1e-2;
            let numeric = (f64::from(gelu(x + h)) - f64::from(gelu(x - h))) / (2.0 * f64::from(h));
            assert!(
                (f64::from(gelu_derivative(x)) - numeric).abs() < 1e-3,
                "gelu'({x})"
            );
        }
        // Far tails: no NaN from exp overflow.
        assert_eq!(gelu(100.0), 100.0);
        assert_eq!(gelu(-100.0), 0.0);
        assert_eq!((gelu_derivative(1e30), gelu_derivative(-1e30)), (1.0, 0.0));
    }
}

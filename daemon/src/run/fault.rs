//! A test-only fault switch: `MURMUR_TEST_FAULT` makes this peer a byzantine member, so
//! that what the reducers' defences hold can be measured between real processes. It is
//! not a config key and volunteers never set it; a peer running with it says so in its
//! log at start.
//!
//! The value is a comma-separated list of:
//! - `flip:S` — every gradient is sent as `−S ×` what it should be;
//! - `inflate:K` — every step declares `K ×` the samples it used, so its contribution
//!   claims `K ×` its weight.

use anyhow::Context as _;

/// The environment variable that turns the fault on.
pub(crate) const FAULT_VAR: &str = "MURMUR_TEST_FAULT";

/// How a faulty peer corrupts what it contributes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fault {
    /// Gradients are scaled by `−flip`.
    pub(crate) flip: Option<f32>,
    /// Declared samples are multiplied by this.
    pub(crate) inflate: Option<u64>,
}

impl Fault {
    /// The fault `MURMUR_TEST_FAULT` asks for, if it is set.
    pub(crate) fn from_env() -> anyhow::Result<Option<Fault>> {
        match std::env::var(FAULT_VAR) {
            Ok(spec) => Fault::parse(&spec)
                .with_context(|| format!("{FAULT_VAR}={spec}"))
                .map(Some),
            Err(_) => Ok(None),
        }
    }

    fn parse(spec: &str) -> anyhow::Result<Fault> {
        let mut fault = Fault {
            flip: None,
            inflate: None,
        };
        for part in spec.split(',') {
            match part.trim().split_once(':') {
                Some(("flip", scale)) => {
                    let scale: f32 = scale.parse().context("flip:S takes a number")?;
                    anyhow::ensure!(scale.is_finite(), "flip:S takes a finite number");
                    fault.flip = Some(scale);
                }
                Some(("inflate", factor)) => {
                    let factor: u64 = factor.parse().context("inflate:K takes an integer")?;
                    anyhow::ensure!(factor >= 1, "inflate:K takes an integer of at least 1");
                    fault.inflate = Some(factor);
                }
                _ => anyhow::bail!("{part:?}: expected flip:S or inflate:K"),
            }
        }
        Ok(fault)
    }

    /// Corrupts a gradient and the samples it declares.
    pub(crate) fn corrupt(&self, grad: &mut [f32], samples: &mut u64) {
        if let Some(scale) = self.flip {
            grad.iter_mut().for_each(|g| *g *= -scale);
        }
        if let Some(factor) = self.inflate {
            *samples = samples.saturating_mul(factor);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_flips_and_inflates_as_asked() {
        let fault = Fault::parse("flip:1000, inflate:7").unwrap();
        let (mut grad, mut samples) = (vec![1.0, -2.0], 16);
        fault.corrupt(&mut grad, &mut samples);
        assert_eq!(grad, [-1000.0, 2000.0]);
        assert_eq!(samples, 112);
        assert!(Fault::parse("flip").is_err());
        assert!(Fault::parse("inflate:0").is_err());
        assert!(Fault::parse("drop:1").is_err());
    }
}

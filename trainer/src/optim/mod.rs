//! Optimizers over the flat parameter vector, without candle.
//!
//! The state (momentum, moment estimates) lives in flat slots the same length as the
//! parameters, so the daemon can checkpoint it or hand it to a joining peer like any other
//! buffer: `f32` vectors, or AdamW's moments in 8-bit codes ([`MomentCodes`]) when
//! `moment_bits = 8`. A step allocates nothing.

mod adamw;
mod grads;
mod lamb;
mod moment_codes;
mod sgd;
mod slot;

use std::ops::Range;

use serde::{Deserialize, Serialize};

use self::grads::{GradSlots, KeepUpdate};
pub use self::moment_codes::{MomentCodes, MomentKind};
pub use self::slot::Slot;
use crate::error::{ConfigError, TrainerError};
use crate::layout::ParamLayout;

fn default_momentum() -> f32 {
    0.9
}
fn default_beta1() -> f32 {
    0.9
}
fn default_beta2() -> f32 {
    0.999
}
fn default_adam_eps() -> f32 {
    1e-8
}
fn default_lamb_eps() -> f32 {
    1e-6
}
fn default_adamw_decay() -> f32 {
    0.01
}
fn default_moment_bits() -> u8 {
    32
}

/// The `[optimizer]` section.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", deny_unknown_fields)]
pub enum OptimizerConfig {
    /// SGD with Nesterov momentum and coupled (L2) weight decay.
    #[serde(rename = "sgd-nesterov")]
    SgdNesterov {
        /// Momentum coefficient μ, in `[0, 1)`.
        #[serde(default = "default_momentum")]
        momentum: f32,
        /// L2 coefficient added to the gradient, in `[0, 1]`.
        #[serde(default)]
        weight_decay: f32,
    },
    /// AdamW (decoupled weight decay).
    #[serde(rename = "adamw")]
    AdamW {
        /// First-moment decay β₁, in `[0, 1)`.
        #[serde(default = "default_beta1")]
        beta1: f32,
        /// Second-moment decay β₂, in `[0, 1)`.
        #[serde(default = "default_beta2")]
        beta2: f32,
        /// Denominator guard ε, in `(0, 1]`.
        #[serde(default = "default_adam_eps")]
        eps: f32,
        /// Decoupled weight decay λ, in `[0, 1]`.
        #[serde(default = "default_adamw_decay")]
        weight_decay: f32,
        /// Bits an element of each moment is kept in: 32 (`f32`), or 8 (block-wise codes,
        /// [`MomentCodes`]: a quarter of the memory).
        #[serde(default = "default_moment_bits")]
        moment_bits: u8,
    },
    /// LAMB (per-tensor trust ratios).
    #[serde(rename = "lamb")]
    Lamb {
        /// First-moment decay β₁, in `[0, 1)`.
        #[serde(default = "default_beta1")]
        beta1: f32,
        /// Second-moment decay β₂, in `[0, 1)`.
        #[serde(default = "default_beta2")]
        beta2: f32,
        /// Denominator guard ε, in `(0, 1]`.
        #[serde(default = "default_lamb_eps")]
        eps: f32,
        /// Weight decay λ folded into the direction, in `[0, 1]`.
        #[serde(default = "default_adamw_decay")]
        weight_decay: f32,
    },
}

/// Checks `value` lies in `range` (as `[lo, hi)` or `[lo, hi]`), naming `key` if not.
fn check(key: &str, value: f32, lo: f32, hi: f32, hi_inclusive: bool) -> Result<(), ConfigError> {
    let ok = value >= lo
        && if hi_inclusive {
            value <= hi
        } else {
            value < hi
        };
    if ok {
        Ok(())
    } else {
        let close = if hi_inclusive { ']' } else { ')' };
        Err(ConfigError::out_of_range(
            format!("optimizer.{key}"),
            value,
            format!("[{lo}, {hi}{close}"),
        ))
    }
}

impl OptimizerConfig {
    /// Checks every hyperparameter's range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            OptimizerConfig::SgdNesterov {
                momentum,
                weight_decay,
            } => {
                check("momentum", momentum, 0.0, 1.0, false)?;
                check("weight_decay", weight_decay, 0.0, 1.0, true)
            }
            OptimizerConfig::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
                ..
            }
            | OptimizerConfig::Lamb {
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                if let OptimizerConfig::AdamW { moment_bits, .. } = *self
                    && moment_bits != 8
                    && moment_bits != 32
                {
                    return Err(ConfigError::out_of_range(
                        "optimizer.moment_bits",
                        moment_bits,
                        "8 or 32",
                    ));
                }
                check("beta1", beta1, 0.0, 1.0, false)?;
                check("beta2", beta2, 0.0, 1.0, false)?;
                check("eps", eps, f32::MIN_POSITIVE, 1.0, true)?;
                check("weight_decay", weight_decay, 0.0, 1.0, true)
            }
        }
    }

    /// Names of the state slots this optimizer keeps, one flat vector each.
    pub fn slot_names(&self) -> &'static [&'static str] {
        match self {
            OptimizerConfig::SgdNesterov { .. } => &["momentum"],
            OptimizerConfig::AdamW { .. } | OptimizerConfig::Lamb { .. } => {
                &["exp_avg", "exp_avg_sq"]
            }
        }
    }

    /// How each slot is coded: `None` for `f32`.
    fn slot_kinds(&self) -> &'static [Option<MomentKind>] {
        match self {
            OptimizerConfig::AdamW { moment_bits: 8, .. } => {
                &[Some(MomentKind::Signed), Some(MomentKind::Squared)]
            }
            OptimizerConfig::AdamW { .. } | OptimizerConfig::Lamb { .. } => &[None, None],
            OptimizerConfig::SgdNesterov { .. } => &[None],
        }
    }

    /// Bytes the state keeps per parameter: 4 a slot in `f32`, a little over 1 in codes.
    pub fn state_bytes_per_param(&self) -> f64 {
        self.slot_kinds()
            .iter()
            .map(|kind| match kind {
                None => 4.0,
                Some(_) => 1.0 + 4.0 / moment_codes::BLOCK as f64,
            })
            .sum()
    }
}

/// One tensor's range and whether weight decay applies to it.
#[derive(Debug, Clone)]
struct Group {
    range: Range<usize>,
    decay: bool,
}

/// An optimizer and its state, stepping a flat parameter vector.
#[derive(Debug, Clone)]
pub struct Optimizer {
    config: OptimizerConfig,
    groups: Vec<Group>,
    slots: Vec<Slot>,
    steps: u64,
    trust_ratios: Vec<f32>,
}

impl Optimizer {
    /// A fresh optimizer (zero state) for parameters laid out by `layout`.
    pub fn new(config: OptimizerConfig, layout: &ParamLayout) -> Result<Self, ConfigError> {
        config.validate()?;
        let groups: Vec<Group> = layout
            .tensors()
            .iter()
            .map(|t| Group {
                range: t.range(),
                decay: t.decay(),
            })
            .collect();
        let slots = config
            .slot_kinds()
            .iter()
            .map(|&kind| Slot::zeros(kind, layout.len()))
            .collect();
        let trust_ratios = match config {
            OptimizerConfig::Lamb { .. } => vec![1.0; groups.len()],
            _ => Vec::new(),
        };
        Ok(Self {
            config,
            groups,
            slots,
            steps: 0,
            trust_ratios,
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// Applies one update with learning rate `lr`: `params` moves along `-grad`.
    pub fn step(&mut self, params: &mut [f32], grad: &[f32], lr: f32) -> Result<(), TrainerError> {
        self.step_along(params, grad, lr)
    }

    /// [`Optimizer::step`], then leaves in `grad` how far each parameter moved: `after −
    /// before`, in `f32`, exactly what subtracting the parameters before the step from
    /// those after it gives, without a copy of them from before it.
    pub fn step_keeping_update(
        &mut self,
        params: &mut [f32],
        grad: &mut [f32],
        lr: f32,
    ) -> Result<(), TrainerError> {
        self.step_along(params, KeepUpdate(grad), lr)
    }

    fn step_along(
        &mut self,
        params: &mut [f32],
        mut grad: impl GradSlots,
        lr: f32,
    ) -> Result<(), TrainerError> {
        let n = self.slots.first().map_or(0, Slot::len);
        TrainerError::check_len("params", n, params.len())?;
        TrainerError::check_len("grad", n, grad.len())?;
        self.steps += 1;
        match self.config {
            OptimizerConfig::SgdNesterov {
                momentum,
                weight_decay,
            } => {
                let [Slot::Floats(buf)] = self.slots.as_mut_slice() else {
                    return Err(TrainerError::StateForm("SGD keeps one f32 slot"));
                };
                for g in &self.groups {
                    let wd = if g.decay { weight_decay } else { 0.0 };
                    let r = g.range.clone();
                    sgd::step(
                        &mut params[r.clone()],
                        grad.part(r.clone()),
                        &mut buf[r],
                        lr,
                        momentum,
                        wd,
                    );
                }
            }
            OptimizerConfig::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
                ..
            }
            | OptimizerConfig::Lamb {
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                let lamb = matches!(self.config, OptimizerConfig::Lamb { .. });
                let (bc1, bc2) = adamw::bias_corrections(beta1, beta2, self.steps);
                let step_of = |g: &Group| adamw::AdamStep {
                    lr,
                    beta1,
                    beta2,
                    eps,
                    weight_decay: if g.decay { weight_decay } else { 0.0 },
                    bc1,
                    bc2,
                };
                let (m, v) = match self.slots.as_mut_slice() {
                    [Slot::Floats(m), Slot::Floats(v)] => (m, v),
                    [Slot::Codes(m), Slot::Codes(v)] if !lamb => {
                        adamw::step_coded(params, grad, m, v, &self.groups, step_of);
                        return Ok(());
                    }
                    _ => {
                        return Err(TrainerError::StateForm(
                            "Adam's moments are two slots, both f32 or both coded (AdamW only)",
                        ));
                    }
                };
                for (i, g) in self.groups.iter().enumerate() {
                    let s = step_of(g);
                    let r = g.range.clone();
                    let (p, gr) = (&mut params[r.clone()], grad.part(r.clone()));
                    let (m, v) = (&mut m[r.clone()], &mut v[r]);
                    if lamb {
                        self.trust_ratios[i] = lamb::step(p, gr, m, v, s);
                    } else {
                        adamw::step(p, gr, m, v, s);
                    }
                }
            }
        }
        Ok(())
    }

    /// Number of steps taken (drives Adam's bias correction; part of the state).
    pub fn steps_taken(&self) -> u64 {
        self.steps
    }

    /// Names of the state slots, in the order of [`Optimizer::slots`].
    pub fn slot_names(&self) -> &'static [&'static str] {
        self.config.slot_names()
    }

    /// The state slots, each a flat vector laid out like the parameters.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// `values` for slot `index` (from a checkpoint or a peer, in `f32`), in the form this
    /// optimizer keeps that slot in: coded when its moments are 8-bit.
    pub fn slot_from_values(&self, index: usize, values: Vec<f32>) -> Slot {
        match self.slots.get(index) {
            Some(own) => Slot::shaped_like(own, values),
            None => Slot::Floats(values),
        }
    }

    /// The trust ratio each tensor used in the last LAMB step (empty for other optimizers).
    pub fn trust_ratios(&self) -> &[f32] {
        &self.trust_ratios
    }

    /// Swaps the state slots with `others`, one vector each, in [`Optimizer::slots`]'s order:
    /// a caller can keep the state between steps and lend it to the optimizer for a step,
    /// without a copy. Nothing changes when the counts differ.
    ///
    /// A slot lent in another form than this optimizer keeps (`f32` for 8-bit, say) fails
    /// its next step.
    pub fn exchange_slots<'a>(
        &mut self,
        others: impl ExactSizeIterator<Item = &'a mut Slot>,
    ) -> Result<(), TrainerError> {
        TrainerError::check_len("optimizer slots", self.slots.len(), others.len())?;
        for (own, other) in self.slots.iter_mut().zip(others) {
            std::mem::swap(own, other);
        }
        Ok(())
    }

    /// Sets the step count (Adam's bias correction goes on from it), for state loaded into
    /// slots the caller keeps (see [`Optimizer::exchange_slots`]).
    pub fn set_steps_taken(&mut self, steps_taken: u64) {
        self.steps = steps_taken;
    }

    /// Replaces the state with a checkpointed or transferred one.
    pub fn load_state(&mut self, steps_taken: u64, slots: &[&[f32]]) -> Result<(), TrainerError> {
        TrainerError::check_len("optimizer slots", self.slots.len(), slots.len())?;
        for (own, new) in self.slots.iter().zip(slots) {
            TrainerError::check_len("optimizer slot", own.len(), new.len())?;
        }
        for (own, new) in self.slots.iter_mut().zip(slots) {
            own.assign(new);
        }
        self.steps = steps_taken;
        Ok(())
    }
}

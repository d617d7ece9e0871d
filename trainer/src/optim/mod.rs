//! Optimizers over the flat parameter vector, without candle.
//!
//! The state (momentum, moment estimates) lives in flat `Vec<f32>` slots the same length as
//! the parameters, so the daemon can checkpoint it, average it or hand it to a joining peer
//! like any other buffer. A step allocates nothing.

mod adamw;
mod grads;
mod lamb;
mod sgd;

use std::ops::Range;

use serde::{Deserialize, Serialize};

use self::grads::{GradSlots, KeepUpdate};
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
            }
            | OptimizerConfig::Lamb {
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
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
    slots: Vec<Vec<f32>>,
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
            .slot_names()
            .iter()
            .map(|_| vec![0.0; layout.len()])
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
        let n = self.slots.first().map_or(0, Vec::len);
        TrainerError::check_len("params", n, params.len())?;
        TrainerError::check_len("grad", n, grad.len())?;
        self.steps += 1;
        match self.config {
            OptimizerConfig::SgdNesterov {
                momentum,
                weight_decay,
            } => {
                let [buf] = self.slots.as_mut_slice() else {
                    unreachable!("SGD keeps exactly one slot (built in `new`)")
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
            }
            | OptimizerConfig::Lamb {
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                let lamb = matches!(self.config, OptimizerConfig::Lamb { .. });
                let [m, v] = self.slots.as_mut_slice() else {
                    unreachable!("Adam-style optimizers keep exactly two slots (built in `new`)")
                };
                let (bc1, bc2) = adamw::bias_corrections(beta1, beta2, self.steps);
                for (i, g) in self.groups.iter().enumerate() {
                    let s = adamw::AdamStep {
                        lr,
                        beta1,
                        beta2,
                        eps,
                        weight_decay: if g.decay { weight_decay } else { 0.0 },
                        bc1,
                        bc2,
                    };
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
    pub fn slots(&self) -> &[Vec<f32>] {
        &self.slots
    }

    /// One state slot, writable (e.g. to average it with peers').
    pub fn slot_mut(&mut self, index: usize) -> Option<&mut [f32]> {
        self.slots.get_mut(index).map(Vec::as_mut_slice)
    }

    /// The trust ratio each tensor used in the last LAMB step (empty for other optimizers).
    pub fn trust_ratios(&self) -> &[f32] {
        &self.trust_ratios
    }

    /// Swaps the state slots with `others`, one vector each, in [`Optimizer::slots`]'s order:
    /// a caller can keep the state between steps and lend it to the optimizer for a step,
    /// without a copy. Nothing changes when the counts differ.
    pub fn exchange_slots<'a>(
        &mut self,
        others: impl ExactSizeIterator<Item = &'a mut Vec<f32>>,
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
            own.copy_from_slice(new);
        }
        self.steps = steps_taken;
        Ok(())
    }
}

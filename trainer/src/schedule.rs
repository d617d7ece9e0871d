//! Learning-rate schedule: linear warm-up, then cosine decay to a floor (Loshchilov and Hutter,
//! 2017), optionally scaled linearly with the swarm's batch (Goyal et al. 2017).

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

fn default_min_lr_ratio() -> f32 {
    0.1
}

/// The `[schedule]` section.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// Peak learning rate, reached at the end of warm-up (before batch scaling).
    pub peak_lr: f32,
    /// Steps of linear warm-up from `peak_lr / warmup_steps` to `peak_lr`.
    #[serde(default)]
    pub warmup_steps: u64,
    /// Step at which the cosine reaches its floor; the rate stays there afterwards.
    pub total_steps: u64,
    /// The floor as a fraction of the peak, in `[0, 1]`.
    #[serde(default = "default_min_lr_ratio")]
    pub min_lr_ratio: f32,
    /// When set, the rate is multiplied by `swarm batch / reference_batch` (linear scaling rule).
    #[serde(default)]
    pub reference_batch: Option<u64>,
}

impl ScheduleConfig {
    /// Checks every value's range and that warm-up ends before the decay does.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.peak_lr > 0.0 && self.peak_lr <= 10.0) {
            return Err(ConfigError::out_of_range(
                "schedule.peak_lr",
                self.peak_lr,
                "(0, 10]",
            ));
        }
        if self.total_steps == 0 {
            return Err(ConfigError::out_of_range(
                "schedule.total_steps",
                0,
                "at least 1",
            ));
        }
        if self.warmup_steps > self.total_steps {
            return Err(ConfigError::out_of_range(
                "schedule.warmup_steps",
                self.warmup_steps,
                format!("0..={} (schedule.total_steps)", self.total_steps),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(ConfigError::out_of_range(
                "schedule.min_lr_ratio",
                self.min_lr_ratio,
                "[0, 1]",
            ));
        }
        if self.reference_batch == Some(0) {
            return Err(ConfigError::out_of_range(
                "schedule.reference_batch",
                0,
                "at least 1",
            ));
        }
        Ok(())
    }
}

/// A validated schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    config: ScheduleConfig,
}

impl LrSchedule {
    /// A schedule from a checked config.
    pub fn new(config: ScheduleConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self { config })
    }

    /// The config it was built from.
    pub fn config(&self) -> &ScheduleConfig {
        &self.config
    }

    /// The learning rate for 0-based `step`, before batch scaling.
    ///
    /// Warm-up: `peak · (step + 1) / warmup`. Then
    /// `floor + (peak − floor) · ½(1 + cos(π · progress))` with progress running from 0 at
    /// the end of warm-up to 1 at `total_steps`, and `floor` afterwards.
    pub fn base_lr(&self, step: u64) -> f32 {
        let c = &self.config;
        let peak = f64::from(c.peak_lr);
        if step < c.warmup_steps {
            return (peak * (step + 1) as f64 / c.warmup_steps as f64) as f32;
        }
        let floor = peak * f64::from(c.min_lr_ratio);
        let decay_steps = c.total_steps - c.warmup_steps;
        if decay_steps == 0 || step >= c.total_steps {
            return floor as f32;
        }
        let progress = (step - c.warmup_steps) as f64 / decay_steps as f64;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        (floor + (peak - floor) * cosine) as f32
    }

    /// The learning rate for `step` when the swarm's samples per update are `swarm_batch`.
    ///
    /// With `reference_batch` unset this is [`LrSchedule::base_lr`]; otherwise that times
    /// `swarm_batch / reference_batch`.
    pub fn lr(&self, step: u64, swarm_batch: u64) -> f32 {
        let base = self.base_lr(step);
        match self.config.reference_batch {
            Some(reference) => (f64::from(base) * swarm_batch as f64 / reference as f64) as f32,
            None => base,
        }
    }
}

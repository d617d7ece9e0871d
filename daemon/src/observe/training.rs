//! [`TrainingMetrics`]: the optimizer's progress, and the device it trains on.

use murmur_trainer::TrainerDevice;
use prometheus::{Gauge, IntCounter, IntGauge, Opts, Registry};

use super::ObserveError;
use super::registry::{named, register};

/// The `murmur_training_*` metrics. A no-op when made by [`TrainingMetrics::disabled`].
#[derive(Debug, Clone)]
pub(crate) struct TrainingMetrics {
    inner: Option<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    step: IntGauge,
    samples: IntCounter,
    loss: Gauge,
    eval_loss: Gauge,
    samples_per_second: Gauge,
    learning_rate: Gauge,
}

impl TrainingMetrics {
    /// Registers the metrics; `murmur_training_device_info` names `device` in its label.
    pub(super) fn register(
        registry: &Registry,
        device: TrainerDevice,
    ) -> Result<TrainingMetrics, ObserveError> {
        let info = "murmur_training_device_info";
        let device_info = named(
            info,
            IntGauge::with_opts(
                Opts::new(
                    info,
                    "Always 1; the device label says where the model's passes run (cpu, cuda:N).",
                )
                .const_label("device", device.to_string()),
            ),
        )?;
        device_info.set(1);
        register(registry, device_info)?;
        let step = "murmur_training_step";
        let samples = "murmur_training_samples_total";
        let loss = "murmur_training_loss";
        let eval_loss = "murmur_training_eval_loss";
        let speed = "murmur_training_samples_per_second";
        let lr = "murmur_training_learning_rate";
        let inner = Inner {
            step: named(step, IntGauge::new(step, "Optimizer step this peer is at."))?,
            samples: named(
                samples,
                IntCounter::new(samples, "Samples trained on since the daemon started."),
            )?,
            loss: named(loss, Gauge::new(loss, "Training loss of the last step."))?,
            eval_loss: named(
                eval_loss,
                Gauge::new(eval_loss, "Loss of the last evaluation."),
            )?,
            samples_per_second: named(
                speed,
                Gauge::new(speed, "Recent training throughput, samples per second."),
            )?,
            learning_rate: named(lr, Gauge::new(lr, "Learning rate of the last step."))?,
        };
        register(registry, inner.step.clone())?;
        register(registry, inner.samples.clone())?;
        register(registry, inner.loss.clone())?;
        register(registry, inner.eval_loss.clone())?;
        register(registry, inner.samples_per_second.clone())?;
        register(registry, inner.learning_rate.clone())?;
        Ok(TrainingMetrics { inner: Some(inner) })
    }

    pub(super) fn disabled() -> TrainingMetrics {
        TrainingMetrics { inner: None }
    }

    /// One optimizer step done: this peer is now at `step`, having trained on `samples` more
    /// samples, with training loss `loss` and learning rate `learning_rate`.
    pub(crate) fn record_step(&self, step: u64, samples: u64, loss: f64, learning_rate: f64) {
        if let Some(m) = &self.inner {
            m.step.set(saturating_i64(step));
            m.samples.inc_by(samples);
            m.loss.set(loss);
            m.learning_rate.set(learning_rate);
        }
    }

    /// The training loss, set on its own (for loops that report it less often than steps).
    pub(crate) fn set_loss(&self, loss: f64) {
        if let Some(m) = &self.inner {
            m.loss.set(loss);
        }
    }

    /// The loss of the evaluation that just finished.
    pub(crate) fn set_eval_loss(&self, loss: f64) {
        if let Some(m) = &self.inner {
            m.eval_loss.set(loss);
        }
    }

    /// The recent training throughput.
    pub(crate) fn set_samples_per_second(&self, rate: f64) {
        if let Some(m) = &self.inner {
            m.samples_per_second.set(rate);
        }
    }
}

/// `value` as an `i64` gauge value; steps and byte counts never reach `i64::MAX`, but a
/// corrupt checkpoint must not wrap them negative.
pub(super) fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        super::super::registry::exposition(registry)
    }

    #[test]
    fn steps_set_the_gauges_and_add_up_the_samples() {
        let registry = Registry::new();
        let m = TrainingMetrics::register(&registry, TrainerDevice::Cuda(1)).expect("registers");
        m.record_step(10, 32, 2.5, 0.001);
        m.record_step(11, 32, 2.25, 0.002);
        m.set_eval_loss(3.0);
        m.set_samples_per_second(128.5);
        let text = text(&registry);
        for line in [
            "murmur_training_step 11\n",
            "murmur_training_samples_total 64\n",
            "murmur_training_loss 2.25\n",
            "murmur_training_learning_rate 0.002\n",
            "murmur_training_eval_loss 3\n",
            "murmur_training_samples_per_second 128.5\n",
            "murmur_training_device_info{device=\"cuda:1\"} 1\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn a_step_beyond_i64_saturates_instead_of_wrapping() {
        assert_eq!(saturating_i64(u64::MAX), i64::MAX);
        assert_eq!(saturating_i64(5), 5);
    }
}

//! [`Metrics`]: the daemon's one Prometheus registry and the typed groups registered in it.

use std::collections::HashMap;

use murmur_trainer::TrainerDevice;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder as _, Registry, TextEncoder};

use super::ObserveError;
use super::averaging::AveragingMetrics;
use super::gpu::GpuMetrics;
use super::network::NetworkMetrics;
use super::process::ProcessCollector;
use super::training::TrainingMetrics;

/// What to register besides the metrics every daemon has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MetricsOptions {
    /// Register the `murmur_gpu_*` gauges: a GPU backend is in use.
    pub(crate) gpu: bool,
    /// The device the model trains on, for `murmur_training_device_info`.
    pub(crate) device: TrainerDevice,
}

/// Every metric of one daemon, registered once in one registry.
///
/// Cheap to clone (every group shares its counters). The run loop updates the groups through
/// their methods; each update costs one or two relaxed atomic operations, and none when the
/// metrics were made with [`Metrics::disabled`].
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    registry: Registry,
    /// Optimizer progress.
    pub(crate) training: TrainingMetrics,
    /// Averaging rounds, by mode and outcome.
    pub(crate) averaging: AveragingMetrics,
    /// The network layer: peers, bytes, refusals.
    pub(crate) network: NetworkMetrics,
    /// Device memory and kernel time; no-ops unless made with [`MetricsOptions::gpu`].
    pub(crate) gpu: GpuMetrics,
    enabled: bool,
}

impl Metrics {
    /// Registers every metric in a fresh registry.
    pub(crate) fn new(options: MetricsOptions) -> Result<Metrics, ObserveError> {
        let registry = Registry::new();
        let training = TrainingMetrics::register(&registry, options.device)?;
        let averaging = AveragingMetrics::register(&registry)?;
        let network = NetworkMetrics::register(&registry)?;
        let gpu = if options.gpu {
            GpuMetrics::register(&registry)?
        } else {
            GpuMetrics::disabled()
        };
        register(&registry, ProcessCollector::new()?)?;
        Ok(Metrics {
            registry,
            training,
            averaging,
            network,
            gpu,
            enabled: true,
        })
    }

    /// Metrics that record nothing: every update is a branch on a `None`, and `/metrics`
    /// serves an empty page. For measuring what collection costs.
    pub(crate) fn disabled() -> Metrics {
        Metrics {
            registry: Registry::new(),
            training: TrainingMetrics::disabled(),
            averaging: AveragingMetrics::disabled(),
            network: NetworkMetrics::disabled(),
            gpu: GpuMetrics::disabled(),
            enabled: false,
        }
    }

    /// Whether updates are recorded.
    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Appends every metric, read now, to `out` in the Prometheus text format 0.0.4.
    pub(crate) fn encode_text(&self, out: &mut Vec<u8>) -> Result<(), ObserveError> {
        let families = self.registry.gather();
        TextEncoder::new()
            .encode(&families, out)
            .map_err(ObserveError::Encode)
    }
}

/// Registers `collector`, naming its first metric in the error.
pub(super) fn register<C: Collector + 'static>(
    registry: &Registry,
    collector: C,
) -> Result<(), ObserveError> {
    let name = collector
        .desc()
        .first()
        .map(|d| d.fq_name.clone())
        .unwrap_or_default();
    registry
        .register(Box::new(collector))
        .map_err(|source| ObserveError::Register { name, source })
}

/// Wraps a prometheus constructor error with the metric's name.
pub(super) fn named<T>(name: &str, made: prometheus::Result<T>) -> Result<T, ObserveError> {
    made.map_err(|source| ObserveError::Register {
        name: name.to_owned(),
        source,
    })
}

/// The descriptor of a metric family a custom collector builds at scrape time.
pub(super) fn describe(name: &str, help: &str, labels: &[&str]) -> Result<Desc, ObserveError> {
    named(
        name,
        Desc::new(
            name.to_owned(),
            help.to_owned(),
            labels.iter().map(|l| (*l).to_owned()).collect(),
            HashMap::new(),
        ),
    )
}

/// One sample of a family a custom collector builds: its label values (in the order of the
/// descriptor's label names) and its value.
pub(super) fn sample(labels: &[(&str, &str)], value: f64, kind: MetricType) -> Metric {
    let pairs = labels
        .iter()
        .map(|(name, value)| {
            let mut pair = LabelPair::default();
            pair.set_name((*name).to_owned());
            pair.set_value((*value).to_owned());
            pair
        })
        .collect();
    let mut metric = Metric::from_label(pairs);
    match kind {
        MetricType::COUNTER => {
            let mut counter = Counter::default();
            counter.set_value(value);
            metric.set_counter(counter);
        }
        _ => {
            let mut gauge = Gauge::default();
            gauge.set_value(value);
            metric.set_gauge(gauge);
        }
    }
    metric
}

/// A family of counter or gauge samples described by `desc`.
pub(super) fn family(desc: &Desc, kind: MetricType, samples: Vec<Metric>) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(desc.fq_name.clone());
    family.set_help(desc.help.clone());
    family.set_field_type(kind);
    family.set_metric(samples);
    family
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_registered_once_with_help_and_a_murmur_name() {
        let metrics = Metrics::new(MetricsOptions {
            gpu: true,
            ..MetricsOptions::default()
        })
        .expect("registers");
        let families = metrics.registry.gather();
        let mut names: Vec<&str> = families.iter().map(|f| f.name()).collect();
        assert!(
            names.len() >= 20,
            "only {} families: {names:?}",
            names.len()
        );
        for family in &families {
            assert!(family.name().starts_with("murmur_"), "{}", family.name());
            assert!(!family.help().is_empty(), "{} has no help", family.name());
        }
        let before = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), before, "a family appears twice");
    }

    #[test]
    fn gpu_gauges_exist_only_when_asked_for() {
        let has_gpu = |gpu| {
            let metrics = Metrics::new(MetricsOptions {
                gpu,
                ..MetricsOptions::default()
            })
            .expect("registers");
            metrics.gpu.set_memory(1, 2);
            let mut text = Vec::new();
            metrics.encode_text(&mut text).expect("encodes");
            String::from_utf8(text)
                .expect("utf-8")
                .contains("murmur_gpu_memory_used_bytes")
        };
        assert!(has_gpu(true));
        assert!(!has_gpu(false));
    }

    #[test]
    fn disabled_metrics_record_and_serve_nothing() {
        let metrics = Metrics::disabled();
        assert!(!metrics.is_enabled());
        metrics.training.set_loss(1.0);
        metrics.network.set_connected_peers(3);
        let mut text = Vec::new();
        metrics.encode_text(&mut text).expect("encodes");
        assert!(text.is_empty(), "{}", String::from_utf8_lossy(&text));
    }

    #[test]
    fn two_daemons_in_one_process_have_separate_registries() {
        let a = Metrics::new(MetricsOptions::default()).expect("registers");
        let b = Metrics::new(MetricsOptions::default()).expect("registers");
        a.training.set_loss(7.5);
        let mut text = Vec::new();
        b.encode_text(&mut text).expect("encodes");
        let text = String::from_utf8(text).expect("utf-8");
        assert!(text.contains("murmur_training_loss 0\n"), "{text}");
    }
}

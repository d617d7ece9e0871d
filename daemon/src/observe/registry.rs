//! [`Metrics`]: the daemon's one Prometheus registry and the typed groups registered in it.

use std::collections::HashMap;
use std::time::Instant;

use murmur_trainer::TrainerDevice;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder as _, Registry, TextEncoder};

use super::ObserveError;
use super::averaging::AveragingMetrics;
use super::daemon::DaemonMetrics;
use super::gpu::GpuMetrics;
use super::network::NetworkMetrics;
use super::process::ProcessCollector;
use super::status::{StatusBoard, StatusIdentity};
use super::training::TrainingMetrics;

/// What to register besides the metrics every daemon has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MetricsOptions {
    /// Register the `murmur_gpu_*` metrics: the peer trains on a GPU.
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
    /// What the daemon runs, whether it is paused, its checkpoints.
    pub(crate) daemon: DaemonMetrics,
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
        let daemon = DaemonMetrics::register(&registry)?;
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
            daemon,
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
            daemon: DaemonMetrics::disabled(),
            training: TrainingMetrics::disabled(),
            averaging: AveragingMetrics::disabled(),
            network: NetworkMetrics::disabled(),
            gpu: GpuMetrics::disabled(),
            enabled: false,
        }
    }

    /// Sets `murmur_build_info` for the daemon `identity` (its status board's).
    pub(crate) fn set_build_info(&self, identity: &StatusIdentity) {
        self.daemon.set_build_info(identity);
    }

    /// Brings the gauges that the status board holds the truth of up to date: the paused
    /// flag (which `POST /pause` and SIGUSR1 both set there) and the step rates of this peer
    /// and the peers it hears (SGP stragglers). `/metrics` calls it before every scrape.
    pub(crate) fn refresh_from(&self, board: &StatusBoard) {
        if !self.enabled {
            return;
        }
        self.daemon.set_paused(board.is_paused());
        self.averaging
            .set_stragglers(board.stragglers(Instant::now()));
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

/// `registry` in the Prometheus text format, for the metric modules' tests.
#[cfg(test)]
pub(super) fn exposition(registry: &prometheus::Registry) -> String {
    let mut out = Vec::new();
    prometheus::Encoder::encode(
        &prometheus::TextEncoder::new(),
        &registry.gather(),
        &mut out,
    )
    .expect("encodes");
    String::from_utf8(out).expect("utf-8")
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

    /// The metric names the table in the module docs (`observe/mod.rs`) lists.
    fn documented() -> std::collections::BTreeSet<String> {
        include_str!("mod.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! | `murmur_"))
            .filter_map(|rest| rest.split_once('`'))
            .map(|(name, _)| format!("murmur_{name}"))
            .collect()
    }

    #[test]
    fn the_module_docs_list_exactly_the_metrics_a_daemon_exports() {
        let metrics = Metrics::new(MetricsOptions {
            gpu: true,
            ..MetricsOptions::default()
        })
        .expect("registers");
        // Feed every family that exists only once it has something to say.
        let attached = std::sync::Arc::new(super::super::network::tests::busy_net());
        metrics.network.attach(attached).expect("attach");
        metrics.set_build_info(&StatusIdentity {
            peer_id: "12D3KooW".to_owned(),
            swarm: "s".to_owned(),
            mode: "sgp".to_owned(),
            codec: "f32".to_owned(),
            device: "cpu".to_owned(),
        });
        metrics
            .averaging
            .set_stragglers(Some(super::super::stragglers::StragglerReading {
                ratio: Some(1.0),
                slow_peers: 0,
            }));
        metrics.gpu.set_memory(1, 2);
        metrics.gpu.record_kernel_time("encode", 0.5);
        let kind = murmur_protocol::frame::FrameKind::Heartbeat;
        metrics.network.record_sent(None, kind, 1);
        metrics.network.record_received(None, kind, 1);
        let exported: std::collections::BTreeSet<String> = metrics
            .registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        let listed = documented();
        let unlisted: Vec<&String> = exported.difference(&listed).collect();
        let unexported: Vec<&String> = listed.difference(&exported).collect();
        assert!(
            unlisted.is_empty() && unexported.is_empty(),
            "exported but not in the table of observe/mod.rs: {unlisted:?}\n\
             in the table but not exported: {unexported:?}"
        );
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

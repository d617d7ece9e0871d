//! [`DaemonMetrics`]: the daemon itself: what it runs, whether it trains, and whether its
//! checkpoints land.

use prometheus::{IntCounter, IntGauge, IntGaugeVec, Opts, Registry};

use super::ObserveError;
use super::registry::{named, register};
use super::status::StatusIdentity;

/// The labels of `murmur_build_info`, in order.
const BUILD_LABELS: [&str; 6] = ["version", "swarm", "peer", "mode", "codec", "device"];

/// `murmur_build_info`, `murmur_paused` and the `murmur_checkpoint_*` counters. A no-op when
/// made by [`DaemonMetrics::disabled`].
#[derive(Debug, Clone)]
pub(crate) struct DaemonMetrics {
    inner: Option<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    build_info: IntGaugeVec,
    paused: IntGauge,
    checkpoints_written: IntCounter,
    checkpoint_failures: IntCounter,
    checkpoints_corrupt: IntCounter,
}

impl DaemonMetrics {
    pub(super) fn register(registry: &Registry) -> Result<DaemonMetrics, ObserveError> {
        let name = "murmur_build_info";
        let help = "Always 1; the labels say what this daemon runs: murmur's version, the \
                    swarm, this peer's id, the averaging mode, the wire codec and the device.";
        let build_info = named(name, IntGaugeVec::new(Opts::new(name, help), &BUILD_LABELS))?;
        let name = "murmur_paused";
        let help = "1 while training is paused (SIGUSR1 or POST /pause), else 0.";
        let paused = named(name, IntGauge::new(name, help))?;
        let name = "murmur_checkpoint_writes_total";
        let help = "Checkpoints written.";
        let checkpoints_written = named(name, IntCounter::new(name, help))?;
        let name = "murmur_checkpoint_failures_total";
        let help = "Checkpoints that could not be written (the folder could not be opened, or \
                    the write or rename failed).";
        let checkpoint_failures = named(name, IntCounter::new(name, help))?;
        let name = "murmur_checkpoint_corrupt_total";
        let help = "Checkpoint files that failed their check (torn, damaged) and were moved \
                    aside to <name>.corrupt, at start or while pruning.";
        let checkpoints_corrupt = named(name, IntCounter::new(name, help))?;
        let inner = Inner {
            build_info,
            paused,
            checkpoints_written,
            checkpoint_failures,
            checkpoints_corrupt,
        };
        register(registry, inner.build_info.clone())?;
        register(registry, inner.paused.clone())?;
        register(registry, inner.checkpoints_written.clone())?;
        register(registry, inner.checkpoint_failures.clone())?;
        register(registry, inner.checkpoints_corrupt.clone())?;
        Ok(DaemonMetrics { inner: Some(inner) })
    }

    pub(super) fn disabled() -> DaemonMetrics {
        DaemonMetrics { inner: None }
    }

    /// Sets `murmur_build_info` to 1 for `identity` and this build's version; a daemon has
    /// one identity for its lifetime, so any earlier series is dropped.
    pub(crate) fn set_build_info(&self, identity: &StatusIdentity) {
        let Some(m) = &self.inner else { return };
        m.build_info.reset();
        m.build_info
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                &identity.swarm,
                &identity.peer_id,
                &identity.mode,
                &identity.codec,
                &identity.device,
            ])
            .set(1);
    }

    /// Whether training is paused now.
    pub(crate) fn set_paused(&self, paused: bool) {
        if let Some(m) = &self.inner {
            m.paused.set(i64::from(paused));
        }
    }

    /// A checkpoint was written (`true`) or could not be.
    pub(crate) fn record_checkpoint(&self, written: bool) {
        if let Some(m) = &self.inner {
            if written {
                m.checkpoints_written.inc();
            } else {
                m.checkpoint_failures.inc();
            }
        }
    }

    /// `files` corrupt checkpoint files were moved aside.
    pub(crate) fn record_corrupt_checkpoints(&self, files: usize) {
        if let Some(m) = &self.inner {
            m.checkpoints_corrupt.inc_by(files as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        super::super::registry::exposition(registry)
    }

    fn identity(peer: &str) -> StatusIdentity {
        StatusIdentity {
            peer_id: peer.to_owned(),
            swarm: "tiny-lm".to_owned(),
            mode: "sgp".to_owned(),
            codec: "int8:64".to_owned(),
            device: "cuda:1".to_owned(),
        }
    }

    #[test]
    fn build_info_names_the_daemon_in_one_series() {
        let registry = Registry::new();
        let m = DaemonMetrics::register(&registry).expect("registers");
        assert!(!text(&registry).contains("murmur_build_info{"));
        m.set_build_info(&identity("12D3KooWold"));
        m.set_build_info(&identity("12D3KooWnew"));
        let text = text(&registry);
        let line = format!(
            "murmur_build_info{{codec=\"int8:64\",device=\"cuda:1\",mode=\"sgp\",\
             peer=\"12D3KooWnew\",swarm=\"tiny-lm\",version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&line), "missing {line:?} in\n{text}");
        assert_eq!(text.matches("murmur_build_info{").count(), 1, "{text}");
    }

    #[test]
    fn paused_and_checkpoint_outcomes_are_counted() {
        let registry = Registry::new();
        let m = DaemonMetrics::register(&registry).expect("registers");
        assert!(text(&registry).contains("murmur_paused 0\n"));
        m.set_paused(true);
        m.record_checkpoint(true);
        m.record_checkpoint(false);
        m.record_checkpoint(false);
        m.record_corrupt_checkpoints(3);
        let text_now = text(&registry);
        for line in [
            "murmur_paused 1\n",
            "murmur_checkpoint_writes_total 1\n",
            "murmur_checkpoint_failures_total 2\n",
            "murmur_checkpoint_corrupt_total 3\n",
        ] {
            assert!(text_now.contains(line), "missing {line:?} in\n{text_now}");
        }
        m.set_paused(false);
        assert!(text(&registry).contains("murmur_paused 0\n"));
    }
}

//! Everything `murmur run` needs, checked and ready: built from the config file.

use std::path::PathBuf;
use std::time::Duration;

use murmur_gossip::engine::ModeSettings;
use murmur_gossip::net::NetConfig;
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::identity::Keypair;
use murmur_protocol::message::AveragingMode;
use murmur_trainer::TaskConfig;

use super::device::TrainingDevice;
use super::worker::StepPace;

/// A peer's run, as the config file describes it.
#[derive(Debug)]
pub(crate) struct RunSettings {
    pub(crate) keypair: Keypair,
    /// With swarm id, authority and invite filled in.
    pub(crate) net: NetConfig,
    pub(crate) swarm_id: String,
    pub(crate) task: TaskConfig,
    /// Where the model's passes run (`training.device`, opened).
    pub(crate) device: TrainingDevice,
    /// `averaging.mode` with the settings only that mode reads.
    pub(crate) mode: ModeSettings,
    /// `averaging.codec`.
    pub(crate) codec: CodecSpec,
    /// `averaging.error_feedback`.
    pub(crate) error_feedback: bool,
    pub(crate) heartbeat_interval: Duration,
    /// Local steps before the peer exports and leaves; 0 = until stopped.
    pub(crate) steps: u64,
    pub(crate) eval_every: u64,
    pub(crate) export: Option<PathBuf>,
    pub(crate) slowdown: f64,
    /// Every step is padded to at least this by sleeping, before `slowdown`; zero = off.
    pub(crate) synthetic_step: Duration,
    /// Other peers to wait for before training, and the bound on that wait.
    pub(crate) min_peers: usize,
    pub(crate) start_timeout: Duration,
    /// Passes each step's batch is cut into (gradient accumulation), and whether a pass
    /// computes its blocks again in the backward pass.
    pub(crate) passes: crate::config::memory::Passes,
    pub(crate) checkpoint_dir: PathBuf,
    pub(crate) checkpoint_every: u64,
    pub(crate) checkpoint_keep: usize,
    pub(crate) progress: bool,
    /// The human status line in the log every few seconds (`run` without `--quiet`).
    pub(crate) status_lines: bool,
    /// Where `/metrics`, `/status` and `/healthz` are served; `None` = not served.
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
    /// `metrics.control_token_file`'s token: non-loopback clients may pause and resume.
    pub(crate) metrics_control_token: Option<crate::observe::ControlToken>,
}

impl RunSettings {
    /// The mode.
    pub(crate) fn mode(&self) -> AveragingMode {
        self.mode.mode()
    }

    /// The mode's name as the config spells it.
    pub(crate) fn mode_name(&self) -> &'static str {
        self.mode().name()
    }

    /// How each step is padded and stretched beyond its compute.
    pub(crate) fn pace(&self) -> StepPace {
        StepPace {
            slowdown: self.slowdown,
            synthetic_step: self.synthetic_step,
        }
    }

    /// Whether an eval is due after local step `step` (counted from 1).
    pub(crate) fn eval_due(&self, step: u64) -> bool {
        (self.eval_every > 0 && step.is_multiple_of(self.eval_every))
            || (self.steps > 0 && step >= self.steps)
    }
}

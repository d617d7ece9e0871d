//! The config file as written: one serde struct tree, every table `deny_unknown_fields`,
//! every default in this file.
//!
//! Values here are as the operator typed them (paths relative to the config file, the codec
//! as text); [`super::load()`] checks them and turns them into a [`super::LoadedConfig`].

use std::path::PathBuf;

use murmur_gossip::butterfly::ButterflyConfig;
use murmur_gossip::engine::LocalSgdSettings;
use murmur_gossip::net::NetConfig;
use murmur_gossip::sgp::OutDegree;
use murmur_protocol::message::AveragingMode;
use murmur_trainer::{DataConfig, ModelConfig, OptimizerConfig, ScheduleConfig, TaskPreset};
use serde::{Deserialize, Serialize};

/// The whole config file. Every section but `[swarm]` may be left out.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    /// `[identity]`: this peer's key.
    #[serde(default)]
    pub(crate) identity: IdentitySection,
    /// `[swarm]`: which swarm, whose authority, and this peer's invite.
    pub(crate) swarm: SwarmSection,
    /// `[net]`: the network layer, as murmur-gossip defines it.
    #[serde(default)]
    pub(crate) net: NetConfig,
    /// `[volunteer]`: what this host lends the swarm.
    #[serde(default)]
    pub(crate) volunteer: VolunteerSection,
    /// `[model]`: the trainer's model section.
    #[serde(default = "default_model")]
    pub(crate) model: ModelConfig,
    /// `[data]`: the trainer's data section.
    #[serde(default = "default_data")]
    pub(crate) data: DataConfig,
    /// `[optimizer]`: the trainer's optimizer section.
    #[serde(default = "default_optimizer")]
    pub(crate) optimizer: OptimizerConfig,
    /// `[schedule]`: the trainer's learning-rate schedule.
    #[serde(default = "default_schedule")]
    pub(crate) schedule: ScheduleConfig,
    /// `[training]`: how long this peer trains and where.
    #[serde(default)]
    pub(crate) training: TrainingSection,
    /// `[averaging]`: how peers combine their models.
    #[serde(default)]
    pub(crate) averaging: AveragingSection,
    /// `[checkpoint]`: local checkpoints.
    #[serde(default)]
    pub(crate) checkpoint: CheckpointSection,
    /// `[metrics]`: the HTTP endpoint for Prometheus and the status API.
    #[serde(default)]
    pub(crate) metrics: MetricsSection,
    /// `[log]`: log verbosity and format.
    #[serde(default)]
    pub(crate) log: LogSection,
}

fn default_model() -> ModelConfig {
    TaskPreset::default_local().model
}
fn default_data() -> DataConfig {
    TaskPreset::default_local().data
}
fn default_optimizer() -> OptimizerConfig {
    TaskPreset::default_local().optimizer
}
fn default_schedule() -> ScheduleConfig {
    TaskPreset::default_local().schedule
}

/// `[identity]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct IdentitySection {
    /// The ed25519 key file (mode 0600), relative to the config file.
    pub(crate) key_file: PathBuf,
}

impl Default for IdentitySection {
    fn default() -> Self {
        IdentitySection {
            key_file: PathBuf::from("murmur.key"),
        }
    }
}

/// `[swarm]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SwarmSection {
    /// The swarm's id (`[a-z0-9._-]`, 1 to 64 bytes).
    pub(crate) id: String,
    /// The swarm authority's peer id (`12D3KooW…`), the key that signs invites.
    pub(crate) authority: String,
    /// This peer's invite, as `murmur swarm invite` wrote it, relative to the config file.
    #[serde(default = "default_invite_file")]
    pub(crate) invite_file: PathBuf,
    /// The swarm authority's revocation list, as `murmur swarm revoke` wrote it, relative to
    /// the config file. Read at start when present and again whenever it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) revocation_file: Option<PathBuf>,
}

fn default_invite_file() -> PathBuf {
    PathBuf::from("invite")
}

/// `[volunteer]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct VolunteerSection {
    /// Upload cap in bytes per second; 0 = unlimited.
    pub(crate) max_upload_bytes_per_s: u64,
    /// Download cap in bytes per second; 0 = unlimited.
    pub(crate) max_download_bytes_per_s: u64,
    /// The trainer's compute threads; 0 = all cores.
    pub(crate) cpu_threads: usize,
}

/// `[training]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct TrainingSection {
    /// Local steps before this peer exports and exits; 0 = until stopped.
    pub(crate) steps: u64,
    /// Evaluate every this many local steps; 0 = never.
    pub(crate) eval_every_steps: u64,
    /// Where the final de-biased model is written (safetensors); absent = not written.
    pub(crate) export: Option<PathBuf>,
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    pub(crate) device: String,
    /// Each step is stretched to this many times its compute time (at least 1).
    pub(crate) slowdown: f64,
    /// Pad every step to at least this many milliseconds by sleeping, before `slowdown`
    /// applies; 0 = off. Step time then follows the config, not the CPU.
    pub(crate) synthetic_step_ms: u64,
    /// Wait for this many other peers before training (bounded by `start_timeout_ms`).
    pub(crate) min_peers: usize,
    /// How long to wait for `min_peers`, in milliseconds.
    pub(crate) start_timeout_ms: u64,
    /// Passes each step's batch is cut into, their gradients accumulated.
    pub(crate) micro_batches: usize,
    /// Keep only each GPT block's input through a pass and compute the block again in the
    /// backward pass.
    pub(crate) recompute_activations: bool,
}

impl Default for TrainingSection {
    fn default() -> Self {
        TrainingSection {
            steps: 600,
            eval_every_steps: 50,
            export: None,
            device: "auto".to_owned(),
            slowdown: 1.0,
            synthetic_step_ms: 0,
            min_peers: 0,
            start_timeout_ms: 30_000,
            micro_batches: 1,
            recompute_activations: false,
        }
    }
}

/// `[averaging]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct AveragingSection {
    /// The algorithm: `sgp`, `butterfly`, `local-sgd` or `sync-ring`.
    #[serde(with = "mode_name")]
    pub(crate) mode: AveragingMode,
    /// The wire codec of every averaging mode, as `CodecSpec` text.
    pub(crate) codec: String,
    /// Carry what a lossy codec loses in one round into the next (butterfly, sync-ring and
    /// local-sgd; SGP's shares conserve mass exactly by their own scheme).
    pub(crate) error_feedback: bool,
    /// Butterfly: average once the swarm's accumulated samples reach this.
    pub(crate) target_batch: u64,
    /// Milliseconds between this peer's membership heartbeats.
    pub(crate) heartbeat_interval_ms: u64,
    /// `[averaging.sgp]`.
    pub(crate) sgp: SgpSection,
    /// `[averaging.butterfly]`, as murmur-gossip defines it.
    pub(crate) butterfly: ButterflyConfig,
    /// `[averaging.local_sgd]`, as murmur-gossip defines it.
    pub(crate) local_sgd: LocalSgdSettings,
    /// `[averaging.ring]`.
    pub(crate) ring: RingSection,
}

impl Default for AveragingSection {
    fn default() -> Self {
        AveragingSection {
            mode: AveragingMode::Sgp,
            codec: "int8:64".to_owned(),
            error_feedback: true,
            target_batch: 256,
            heartbeat_interval_ms: 1_000,
            sgp: SgpSection::default(),
            butterfly: ButterflyConfig::default(),
            local_sgd: LocalSgdSettings::default(),
            ring: RingSection::default(),
        }
    }
}

/// `[averaging.sgp]`: SGP's settings but the codec, which is `averaging.codec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SgpSection {
    /// Out-peers per step, or `auto`.
    pub(crate) out_degree: OutDegree,
    /// Overlap τ: steps a peer may run ahead of its unconfirmed shares.
    pub(crate) staleness: u32,
    /// Milliseconds a share may stay unconfirmed before the peer stops waiting for it.
    pub(crate) share_timeout_ms: u64,
    /// With a lossy codec: reference vectors kept per direction.
    pub(crate) max_edge_references: usize,
    /// With a lossy codec: bytes of reference vectors, both directions together.
    pub(crate) max_reference_bytes: u64,
}

impl Default for SgpSection {
    fn default() -> Self {
        SgpSection {
            out_degree: OutDegree::Auto,
            staleness: 1,
            share_timeout_ms: 5_000,
            max_edge_references: 8,
            max_reference_bytes: 1 << 31,
        }
    }
}

/// `[averaging.ring]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RingSection {
    /// Milliseconds a ring step may take before the round is abandoned.
    pub(crate) timeout_ms: u64,
}

impl Default for RingSection {
    fn default() -> Self {
        RingSection { timeout_ms: 10_000 }
    }
}

/// `[checkpoint]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct CheckpointSection {
    /// The checkpoint folder, relative to the config file.
    pub(crate) dir: PathBuf,
    /// Write a checkpoint every this many local steps; 0 = only at exit.
    pub(crate) every_steps: u64,
    /// Newest checkpoints kept.
    pub(crate) keep: usize,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            dir: PathBuf::from("checkpoints"),
            every_steps: 100,
            keep: 3,
        }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct MetricsSection {
    /// `HOST:PORT` of the HTTP endpoint (`/metrics`, `/status`, `/healthz`); absent = off.
    pub(crate) listen: Option<String>,
    /// A file (mode 0600) holding the bearer token that lets clients other than loopback
    /// use `POST /pause` and `/resume`, relative to the config file; absent = loopback only.
    pub(crate) control_token_file: Option<PathBuf>,
}

/// How log lines are written (`log.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum LogFormat {
    /// One readable line per event.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct LogSection {
    /// A level (`error` … `trace`) or a `tracing` filter; `RUST_LOG` overrides it.
    pub(crate) level: String,
    /// `human` or `json`.
    pub(crate) format: LogFormat,
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            level: "info".to_owned(),
            format: LogFormat::Human,
        }
    }
}

/// `averaging.mode` as the config spells it: the mode's name.
mod mode_name {
    use murmur_protocol::message::AveragingMode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(mode: &AveragingMode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(mode.name())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<AveragingMode, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

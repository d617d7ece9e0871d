//! The daemon's config file (`murmur run --config FILE`): schema, checks and loading.
//!
//! [`load()`] reads the TOML file ([`schema::Config`], every table `deny_unknown_fields`),
//! checks every value (the trainer's and murmur-gossip's sections with their own
//! `validate`, the daemon's keys here), resolves relative paths against the config file's
//! folder, loads the key file (refused when others may read it) and the invite (refused
//! unless it admits this peer to this swarm now), and returns a [`LoadedConfig`] the run
//! loop uses as is.
//!
//! Every error names the file, the line and the dotted key (see [`ConfigError`]); `docs/
//! config.md` documents every key and `examples/swarm.toml` ([`template::TEMPLATE`]) shows
//! them all with their defaults.

mod error;
mod files;
pub(crate) mod frames;
mod load;
mod locate;
pub(crate) mod memory;
pub(crate) mod schema;
pub(crate) mod template;
#[cfg(test)]
mod tests;
mod validate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use murmur_gossip::engine::ModeSettings;
use murmur_gossip::net::NetConfig;
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::identity::{Invite, Keypair, PeerId, SwarmId};
use murmur_trainer::{Model, TaskConfig};

pub(crate) use error::ConfigError;
pub(crate) use files::read_regular;
pub(crate) use load::ConfigFile;
pub(crate) use schema::{CheckpointSection, LogFormat, LogSection, VolunteerSection};
pub(crate) use validate::{DeviceChoice, Locator, check};

/// Reads, checks and loads the config file at `path`, checking the invite against this
/// host's clock.
pub(crate) fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    load_at(path, crate::clock::unix_s())
}

/// [`load()`], with the invite checked at `now_unix_s`.
pub(crate) fn load_at(path: &Path, now_unix_s: u64) -> Result<LoadedConfig, ConfigError> {
    ConfigFile::read(path)?.load_at(now_unix_s, load::Host::This)
}

/// [`load()`] of a config written for another host: its listen addresses are not checked
/// against this host's.
#[cfg(test)]
pub(crate) fn load_for_another_host(path: &Path) -> Result<LoadedConfig, ConfigError> {
    ConfigFile::read(path)?.load_at(crate::clock::unix_s(), load::Host::Other)
}

/// Everything the run loop needs, checked and ready to use.
#[derive(Debug)]
pub(crate) struct LoadedConfig {
    /// The config file it came from.
    pub(crate) path: PathBuf,
    /// This peer's key (`identity.key_file`). Not `Clone`: share it behind an `Arc`.
    pub(crate) keypair: Keypair,
    /// Where the key was read from, resolved.
    pub(crate) key_file: PathBuf,
    /// This peer's id.
    pub(crate) peer_id: PeerId,
    /// The swarm (`swarm.id`).
    pub(crate) swarm: SwarmId,
    /// The swarm authority (`swarm.authority`).
    pub(crate) authority: PeerId,
    /// This peer's invite, verified for this peer, swarm and authority at load time.
    pub(crate) invite: Invite,
    /// `[net]`, with `swarm_id`, `authority` and `invite` filled in from `[swarm]`.
    pub(crate) net: NetConfig,
    /// `[volunteer]`.
    pub(crate) volunteer: VolunteerSection,
    /// `[model]`, `[data]`, `[optimizer]`, `[schedule]`, data paths resolved.
    pub(crate) task: TaskConfig,
    /// `[training]`.
    pub(crate) training: Training,
    /// `[averaging]` and its sub-tables.
    pub(crate) averaging: Averaging,
    /// `[checkpoint]`, `dir` resolved.
    pub(crate) checkpoint: CheckpointSection,
    /// `metrics.listen`; `None` = no HTTP endpoint.
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// The token of `metrics.control_token_file`, which lets non-loopback clients pause
    /// and resume; `None` = loopback only.
    pub(crate) metrics_control_token: Option<crate::observe::ControlToken>,
    /// `[log]`.
    pub(crate) log: LogSection,
}

/// `[training]`, loaded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Training {
    /// Local steps before exporting and exiting; 0 = until stopped.
    pub(crate) steps: u64,
    /// Evaluate every this many local steps; 0 = never.
    pub(crate) eval_every_steps: u64,
    /// Where the final model is written, resolved; `None` = not written.
    pub(crate) export: Option<PathBuf>,
    /// Where the model runs.
    pub(crate) device: DeviceChoice,
    /// Each step is stretched to this many times its compute time (≥ 1).
    pub(crate) slowdown: f64,
    /// Every step is padded to at least this by sleeping, before `slowdown`; zero = off.
    pub(crate) synthetic_step: Duration,
    /// Other peers to wait for before training.
    pub(crate) min_peers: usize,
    /// The bound on that wait.
    pub(crate) start_timeout: Duration,
    /// Passes each step's batch is cut into (gradient accumulation), and whether a pass
    /// computes its blocks again in the backward pass.
    pub(crate) passes: memory::Passes,
}

/// `[averaging]`, loaded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Averaging {
    /// `averaging.mode`, with the settings only that mode reads (SGP's `share_codec` is
    /// `codec`).
    pub(crate) mode: ModeSettings,
    /// The wire codec of every mode.
    pub(crate) codec: CodecSpec,
    /// `averaging.error_feedback`.
    pub(crate) error_feedback: bool,
    /// Between this peer's heartbeats.
    pub(crate) heartbeat_interval: Duration,
}

/// How much memory the model needs (see [`memory`]), when its size follows from the config
/// alone.
pub(crate) fn memory_estimate(
    task: &TaskConfig,
    passes: memory::Passes,
    mode: &ModeSettings,
) -> Option<memory::MemoryEstimate> {
    let shape = validate::data_shape(task)?;
    let model = Model::new(&task.model, shape).ok()?;
    let sgp = match mode {
        ModeSettings::Sgp(sgp) => Some(sgp),
        _ => None,
    };
    Some(memory::estimate(
        task,
        shape,
        model.param_count(),
        passes,
        mode.mode(),
        sgp,
    ))
}

/// The model's parameter count, when it follows from the config alone (every data source
/// but IDX files, whose image size is read from the files).
pub(crate) fn param_count(task: &TaskConfig) -> Option<usize> {
    let shape = validate::data_shape(task)?;
    Model::new(&task.model, shape)
        .ok()
        .map(|model| model.param_count())
}

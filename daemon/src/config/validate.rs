//! Checks every value of a parsed [`Config`] and turns the text fields into typed ones.
//!
//! The trainer's and murmur-gossip's sections are checked by their own `validate`; the
//! daemon's own keys are checked here. Every failure names the key (and, through
//! [`Locator`], its line).

use std::fmt::Display;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::Path;
use std::str::FromStr;

use murmur_gossip::butterfly::{ButterflyConfig, ButterflyError};
use murmur_gossip::net::{NetConfig, NetError};
use murmur_gossip::sgp::{SgpConfig, SgpError};
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::identity::{PeerId, SwarmId};
use murmur_protocol::message::AveragingMode;
use murmur_trainer::{DataShape, DataSource, Model, TaskConfig, TrainerDevice};

use super::error::{ConfigError, Location};
use super::frames;
use super::locate::{Document, Place};
use super::memory::{self, Bytes};
use super::schema::{Config, SgpSection};

/// Builds errors that point at a key of one config file.
#[derive(Debug)]
pub(crate) struct Locator<'t> {
    path: &'t Path,
    doc: Document<'t>,
}

impl<'t> Locator<'t> {
    /// A locator for the config `text` read from `path`.
    pub(crate) fn new(path: &'t Path, text: &'t str) -> Self {
        Locator {
            path,
            doc: Document::parse(text),
        }
    }

    /// An error about `key`, whose value (when the key is not written) is `default`; an
    /// empty `default` means the key has none that can be shown.
    pub(crate) fn invalid(
        &self,
        key: &str,
        default: impl Display,
        reason: impl Into<String>,
    ) -> ConfigError {
        let (line, value) = match self.doc.find(key) {
            Place::Key { line, value } => (Some(line), value),
            Place::Absent { line } => {
                let default = default.to_string();
                let value = if default.is_empty() {
                    "(not set)".to_owned()
                } else {
                    format!("{default} (default)")
                };
                (line, value)
            }
        };
        ConfigError::Invalid {
            at: Location {
                path: self.path.to_owned(),
                line,
                key: key.to_owned(),
                value,
            },
            reason: reason.into(),
        }
    }
}

/// Where the model runs (`training.device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceChoice {
    /// The first CUDA GPU when this build and host have one, else the CPU.
    Auto,
    /// Exactly this device; failing to open it is an error.
    Fixed(TrainerDevice),
}

/// The values of a [`Config`] that are checked and typed here.
#[derive(Debug)]
pub(crate) struct Checked {
    pub(crate) swarm: SwarmId,
    pub(crate) authority: PeerId,
    pub(crate) codec: CodecSpec,
    pub(crate) sgp: SgpConfig,
    pub(crate) task: TaskConfig,
    pub(crate) device: DeviceChoice,
    pub(crate) metrics_listen: Option<SocketAddr>,
}

/// Checks every value of `config`.
pub(crate) fn check(config: &Config, at: &Locator<'_>) -> Result<Checked, ConfigError> {
    let swarm = SwarmId::new(config.swarm.id.clone())
        .map_err(|e| at.invalid("swarm.id", "", e.to_string()))?;
    let authority = PeerId::from_str(&config.swarm.authority).map_err(|e| {
        at.invalid(
            "swarm.authority",
            "",
            format!("not a peer id ({e}); copy the authority from the organizer's swarm.toml"),
        )
    })?;
    let averaging = &config.averaging;
    let codec = CodecSpec::parse(&averaging.codec)
        .map_err(|e| at.invalid("averaging.codec", &averaging.codec, e.to_string()))?;
    check_daemon_ranges(config, at)?;
    config.net.check_settings().map_err(|e| net_error(at, e))?;

    let sgp = sgp_config(averaging.sgp, codec);
    sgp.validate().map_err(|e| sgp_error(at, e))?;
    averaging
        .butterfly
        .validate()
        .map_err(|e| butterfly_error(at, e))?;
    if let Some(block) = codec.block()
        && !averaging.butterfly.chunk_elements.is_multiple_of(block)
    {
        return Err(at.invalid(
            "averaging.butterfly.chunk_elements",
            averaging.butterfly.chunk_elements,
            format!(
                "must be a multiple of the codec's block size {block} (averaging.codec = \
                 \"{codec}\"), so that parts start on block boundaries"
            ),
        ));
    }

    let task = TaskConfig {
        model: config.model.clone(),
        data: config.data.clone(),
        optimizer: config.optimizer,
        schedule: config.schedule,
    };
    task.validate().map_err(|e| trainer_error(at, e))?;
    let micro_batches = config.training.micro_batches;
    if micro_batches == 0 || !task.data.batch_size.is_multiple_of(micro_batches) {
        return Err(at.invalid(
            "training.micro_batches",
            1,
            format!(
                "must divide data.batch_size ({}): each step's batch is cut into this many \
                 equal passes",
                task.data.batch_size
            ),
        ));
    }
    // Building the model checks what `validate` cannot see alone, such as a vocabulary
    // smaller than the data's; it only lays out the parameters, so it is cheap.
    if let Some(shape) = data_shape(&task) {
        let model = Model::new(&task.model, shape).map_err(|e| trainer_error(at, e))?;
        let estimate = memory::estimate(
            &task,
            shape,
            model.param_count(),
            memory::Passes {
                micro_batches,
                recompute_activations: config.training.recompute_activations,
            },
            averaging.mode,
            (averaging.mode == AveragingMode::Sgp).then_some(&sgp),
        );
        if let Some(available) = memory::available_bytes()
            && estimate.total() > available
        {
            return Err(at.invalid(
                "model",
                "",
                format!(
                    "this model needs {estimate}, more than the {} this host has available; \
                     make it smaller (model.width, model.layers, model.context), lower \
                     data.batch_size, raise training.micro_batches, or choose an \
                     averaging.mode that holds fewer copies (sync-ring and sgp hold the most)",
                    Bytes(available)
                ),
            ));
        }
        let need = frames::largest_frame(
            averaging.mode,
            codec,
            model.param_count(),
            &averaging.butterfly,
        );
        frames::check(need, config.net.max_frame_payload).map_err(|(key, message)| {
            let default = match key {
                "net.max_frame_payload" => NetConfig::default().max_frame_payload.to_string(),
                "averaging.butterfly.chunk_elements" => {
                    ButterflyConfig::default().chunk_elements.to_string()
                }
                "averaging.mode" => "\"sgp\"".to_owned(),
                _ => String::new(),
            };
            at.invalid(key, default, message)
        })?;
    }

    let device = match config.training.device.as_str() {
        "auto" => DeviceChoice::Auto,
        text => DeviceChoice::Fixed(TrainerDevice::from_str(text).map_err(|_| {
            at.invalid(
                "training.device",
                "auto",
                "expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"",
            )
        })?),
    };
    if let DeviceChoice::Fixed(TrainerDevice::Cuda(_)) = device
        && !TrainerDevice::CUDA_BUILT
    {
        return Err(at.invalid(
            "training.device",
            "auto",
            "this murmur was built without CUDA, so it cannot train on a GPU: use \"auto\" or \
             \"cpu\", or a murmur built with `--features cuda` (docs/gpu.md)",
        ));
    }
    let metrics_listen = match &config.metrics.listen {
        None => None,
        Some(text) => Some(SocketAddr::from_str(text).map_err(|e| {
            at.invalid(
                "metrics.listen",
                "",
                format!("not a HOST:PORT address ({e}); e.g. \"127.0.0.1:9100\""),
            )
        })?),
    };
    Ok(Checked {
        swarm,
        authority,
        codec,
        sgp,
        task,
        device,
        metrics_listen,
    })
}

/// `[averaging.sgp]` with the swarm's codec.
pub(crate) fn sgp_config(section: SgpSection, codec: CodecSpec) -> SgpConfig {
    SgpConfig {
        out_degree: section.out_degree,
        staleness: section.staleness,
        share_timeout_ms: section.share_timeout_ms,
        share_codec: codec,
        max_edge_references: section.max_edge_references,
        max_reference_bytes: section.max_reference_bytes,
    }
}

/// The longest synthetic step: a minute per step is already far slower than any real one.
const MAX_SYNTHETIC_STEP_MS: u64 = 60_000;

/// The daemon's own keys: ranges murmur-gossip and the trainer do not know about.
fn check_daemon_ranges(config: &Config, at: &Locator<'_>) -> Result<(), ConfigError> {
    let volunteer = &config.volunteer;
    for (key, value) in [
        (
            "volunteer.max_upload_bytes_per_s",
            volunteer.max_upload_bytes_per_s,
        ),
        (
            "volunteer.max_download_bytes_per_s",
            volunteer.max_download_bytes_per_s,
        ),
    ] {
        if value != 0 && value < 1024 {
            return Err(at.invalid(
                key,
                value,
                "must be 0 (unlimited) or at least 1024 bytes per second",
            ));
        }
    }
    in_range(
        at,
        "volunteer.cpu_threads",
        volunteer.cpu_threads,
        0..=4096,
        "0 (all cores) to 4096",
    )?;

    let training = &config.training;
    let slowdown = training.slowdown;
    if !(slowdown.is_finite() && (1.0..=1000.0).contains(&slowdown)) {
        return Err(at.invalid(
            "training.slowdown",
            slowdown,
            "out of range: allowed 1.0 to 1000.0 (1.0 = full speed)",
        ));
    }
    in_range(
        at,
        "training.synthetic_step_ms",
        training.synthetic_step_ms,
        0..=MAX_SYNTHETIC_STEP_MS,
        "0 (off) to 60000 milliseconds",
    )?;
    in_range(
        at,
        "training.min_peers",
        training.min_peers,
        0..=4096,
        "0 to 4096",
    )?;
    in_range(
        at,
        "training.start_timeout_ms",
        training.start_timeout_ms,
        0..=3_600_000,
        "0 to 3600000 (an hour)",
    )?;

    let averaging = &config.averaging;
    in_range(
        at,
        "averaging.target_batch",
        averaging.target_batch,
        1..=1 << 40,
        "at least 1",
    )?;
    in_range(
        at,
        "averaging.heartbeat_interval_ms",
        averaging.heartbeat_interval_ms,
        100..=600_000,
        "100 to 600000 milliseconds",
    )?;
    let local_sgd = &averaging.local_sgd;
    in_range(
        at,
        "averaging.local_sgd.local_steps",
        local_sgd.local_steps,
        1..=100_000,
        "1 to 100000",
    )?;
    if !(local_sgd.outer_lr > 0.0 && local_sgd.outer_lr <= 10.0) {
        return Err(at.invalid(
            "averaging.local_sgd.outer_lr",
            local_sgd.outer_lr,
            "out of range: allowed (0, 10]",
        ));
    }
    if !(0.0..1.0).contains(&local_sgd.outer_momentum) {
        return Err(at.invalid(
            "averaging.local_sgd.outer_momentum",
            local_sgd.outer_momentum,
            "out of range: allowed [0, 1)",
        ));
    }
    in_range(
        at,
        "averaging.ring.timeout_ms",
        averaging.ring.timeout_ms,
        10..=3_600_000,
        "10 to 3600000 milliseconds",
    )?;

    in_range(
        at,
        "checkpoint.keep",
        config.checkpoint.keep,
        1..=1000,
        "1 to 1000",
    )?;
    check_log_level(&config.log.level)
        .map_err(|reason| at.invalid("log.level", &config.log.level, reason))
}

fn in_range<T: PartialOrd + Display + Copy>(
    at: &Locator<'_>,
    key: &str,
    value: T,
    range: RangeInclusive<T>,
    allowed: &str,
) -> Result<(), ConfigError> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(at.invalid(key, value, format!("out of range: allowed {allowed}")))
    }
}

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// A bare word must be a level; anything with `=` or `,` is a `tracing` filter.
fn check_log_level(level: &str) -> Result<(), String> {
    if level.contains(['=', ',']) {
        return tracing_subscriber::EnvFilter::builder()
            .parse(level)
            .map(drop)
            .map_err(|e| format!("not a log filter: {e}"));
    }
    if LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
        Ok(())
    } else {
        Err(format!(
            "expected one of {} or a filter such as \"info,murmur_gossip=debug\"",
            LEVELS.join(", ")
        ))
    }
}

fn trainer_error(at: &Locator<'_>, error: murmur_trainer::ConfigError) -> ConfigError {
    match error {
        murmur_trainer::ConfigError::OutOfRange {
            key,
            value,
            allowed,
        } => at.invalid(&key, value, format!("out of range: allowed {allowed}")),
        murmur_trainer::ConfigError::Incompatible { key, reason } => at.invalid(&key, "", reason),
    }
}

fn net_error(at: &Locator<'_>, error: NetError) -> ConfigError {
    match error {
        NetError::Config { key, reason } => at.invalid(key, "", reason),
        other => at.invalid("net", "", other.to_string()),
    }
}

/// Refuses a listen address whose IP is not one of this host's (where binding would fail
/// at start); the unspecified addresses (`0.0.0.0`, `::`) listen everywhere and pass.
/// Runs after [`NetConfig::check_settings`](murmur_gossip::net::NetConfig), so every
/// address is `/ip4|ip6/<ip>/…`.
pub(super) fn check_listen_hosts(addrs: &[String]) -> Result<(), String> {
    for addr in addrs {
        let Some(ip) = addr
            .split('/')
            .nth(2)
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
        else {
            continue;
        };
        if !ip.is_unspecified()
            && let Err(e) = std::net::UdpSocket::bind((ip, 0))
        {
            return Err(format!(
                "`{addr}`: {ip} is not an address of this host ({e}); use one of its \
                 addresses, or 0.0.0.0 for all"
            ));
        }
    }
    Ok(())
}

fn sgp_error(at: &Locator<'_>, error: SgpError) -> ConfigError {
    match error {
        // The share codec is the swarm's codec, written as `averaging.codec`.
        SgpError::InvalidConfig {
            key: "share_codec",
            value,
            allowed,
        } => at.invalid("averaging.codec", value, format!("allowed {allowed}")),
        SgpError::InvalidConfig {
            key,
            value,
            allowed,
        } => at.invalid(
            &format!("averaging.sgp.{key}"),
            value,
            format!("out of range: allowed {allowed}"),
        ),
        other => at.invalid("averaging.sgp", "", other.to_string()),
    }
}

fn butterfly_error(at: &Locator<'_>, error: ButterflyError) -> ConfigError {
    match error {
        ButterflyError::InvalidConfig {
            key,
            value,
            allowed,
        } => at.invalid(
            &format!("averaging.butterfly.{key}"),
            value,
            format!("out of range: allowed {allowed}"),
        ),
        other => at.invalid("averaging.butterfly", "", other.to_string()),
    }
}

/// What the data source yields, when the config alone says (IDX files say it themselves).
pub(crate) fn data_shape(task: &TaskConfig) -> Option<DataShape> {
    let context = task.model.context().unwrap_or(0);
    Some(match &task.data.source {
        DataSource::SyntheticClassification(c) => DataShape::Features {
            width: c.features,
            classes: c.classes,
        },
        DataSource::SyntheticMarkov(c) => DataShape::Tokens {
            vocab: c.states,
            context,
        },
        DataSource::Text(_) => DataShape::Tokens {
            vocab: murmur_trainer::data::BYTE_VOCAB,
            context,
        },
        DataSource::Tokens(c) => DataShape::Tokens {
            vocab: c.vocab,
            context,
        },
        DataSource::Idx(_) => return None,
    })
}

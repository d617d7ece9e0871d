//! Reading a config file: the text, then every value, then the files it names.

use std::path::{Path, PathBuf};
use std::time::Duration;

use murmur_gossip::engine::ModeSettings;
use murmur_gossip::net::NetConfig;
use murmur_gossip::sgp::SgpConfig;
use murmur_protocol::identity::{
    Invite, Keypair, MAX_INVITE_LEN, MAX_REVOCATIONS_LEN, PeerId, Revocations, SwarmId,
};
use murmur_protocol::message::AveragingMode;
use murmur_trainer::DataSource;

use crate::observe::ControlToken;

use super::error::ConfigError;
use super::files::{check_regular, read_regular, read_secret};
use super::locate::{Document, line_col};
use super::schema::{AveragingSection, CheckpointSection, Config};
use super::validate::{Checked, Locator, check, check_listen_hosts};
use super::{Averaging, LoadedConfig, Training};

/// A config file whose values have all been checked, before any file it names is opened.
///
/// `murmur swarm invite` stops here: the organizer's copy of the swarm config names no
/// key or invite of the organizer's.
#[derive(Debug)]
pub(crate) struct ConfigFile {
    /// The config file, as given.
    pub(crate) path: PathBuf,
    /// The folder relative paths in it are resolved against.
    pub(crate) dir: PathBuf,
    /// The file's values, as written.
    pub(crate) config: Config,
    /// The values checked and typed.
    pub(crate) checked: Checked,
    text: String,
}

impl ConfigFile {
    /// Reads and checks the config file at `path`.
    pub(crate) fn read(path: &Path) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        ConfigFile::parse(path, text)
    }

    /// Checks the config `text`, read from `path`.
    pub(crate) fn parse(path: &Path, text: String) -> Result<ConfigFile, ConfigError> {
        let config: Config =
            toml::from_str(&text).map_err(|error| syntax_error(path, &text, &error))?;
        let checked = check(&config, &Locator::new(path, &text))?;
        let dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        };
        Ok(ConfigFile {
            path: path.to_owned(),
            dir,
            config,
            checked,
            text,
        })
    }

    /// `path` from the config, resolved against the config file's folder.
    pub(crate) fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_owned()
        } else {
            self.dir.join(path)
        }
    }

    /// Loads the key and the invite, checks the invite at `now_unix_s`, and resolves every
    /// path. With [`Host::This`], the listen addresses must also be this host's.
    pub(crate) fn load_at(self, now_unix_s: u64, host: Host) -> Result<LoadedConfig, ConfigError> {
        let at = Locator::new(&self.path, &self.text);
        let config = &self.config;
        if host == Host::This {
            check_listen_hosts(&config.net.listen_addrs)
                .map_err(|e| at.invalid("net.listen_addrs", "", e))?;
        }
        let Checked {
            swarm,
            authority,
            codec,
            sgp,
            task,
            device,
            metrics_listen,
        } = &self.checked;
        let (swarm, authority, codec) = (swarm.clone(), *authority, *codec);
        let mut task = task.clone();

        let key_file = self.resolve(&config.identity.key_file);
        let keypair = Keypair::load_file(&key_file)
            .map_err(|e| at.invalid("identity.key_file", "\"murmur.key\"", e.to_string()))?;
        let peer_id = keypair.peer_id();

        let invite_file = self.resolve(&config.swarm.invite_file);
        let invite_error = |reason: String| at.invalid("swarm.invite_file", "\"invite\"", reason);
        let invite_bytes = read_regular(&invite_file, MAX_INVITE_LEN).map_err(|e| {
            invite_error(format!(
                "cannot read the invite: {e}; send your peer id ({peer_id}) to the swarm \
                 organizer, who runs `murmur swarm invite {peer_id}`"
            ))
        })?;
        let invite = Invite::decode(&invite_bytes).map_err(|e| {
            invite_error(format!("{} is not an invite: {e}", invite_file.display()))
        })?;
        invite
            .verify(&authority.public_key(), &swarm, &peer_id, now_unix_s)
            .map_err(|e| invite_error(format!("{}: {e}", invite_file.display())))?;

        let revocation_file = config
            .swarm
            .revocation_file
            .as_ref()
            .map(|f| self.resolve(f));
        if let Some(file) = &revocation_file {
            check_revocations(file, &authority, &swarm)
                .map_err(|reason| at.invalid("swarm.revocation_file", "\"revocations\"", reason))?;
        }

        let net = NetConfig {
            swarm_id: swarm.to_string(),
            authority: authority.to_string(),
            invite: invite_bytes,
            revocation_file,
            max_upload_bytes_per_s: config.volunteer.max_upload_bytes_per_s,
            max_download_bytes_per_s: config.volunteer.max_download_bytes_per_s,
            ..config.net.clone()
        };
        resolve_data_paths(&mut task.data.source, |p| self.resolve(p));
        // Opened only once training starts: a FIFO or a folder here would hang or fail
        // `run` after `config check` said yes.
        for (key, path) in data_paths(&task.data.source) {
            check_regular(path).map_err(|reason| at.invalid(key, "", reason))?;
        }
        if let Some(export) = &config.training.export {
            check_export(&self.resolve(export))
                .map_err(|reason| at.invalid("training.export", "", reason))?;
        }
        let training = Training {
            steps: config.training.steps,
            eval_every_steps: config.training.eval_every_steps,
            export: config.training.export.as_deref().map(|p| self.resolve(p)),
            device: *device,
            slowdown: config.training.slowdown,
            synthetic_step: Duration::from_millis(config.training.synthetic_step_ms),
            min_peers: config.training.min_peers,
            start_timeout: Duration::from_millis(config.training.start_timeout_ms),
            passes: super::memory::Passes {
                micro_batches: config.training.micro_batches,
                recompute_activations: config.training.recompute_activations,
            },
        };
        let averaging = Averaging {
            mode: mode_settings(&config.averaging, sgp),
            codec,
            error_feedback: config.averaging.error_feedback,
            heartbeat_interval: Duration::from_millis(config.averaging.heartbeat_interval_ms),
        };
        let checkpoint = CheckpointSection {
            dir: self.resolve(&config.checkpoint.dir),
            ..config.checkpoint.clone()
        };
        // Here rather than at the first checkpoint: a run must not train for hours and then
        // find that its state has nowhere to go.
        crate::checkpoint::check_writable(&checkpoint.dir).map_err(|reason| {
            at.invalid(
                "checkpoint.dir",
                "\"checkpoints\"",
                format!(
                    "{}: {reason}; point it at a folder this user can create files in",
                    checkpoint.dir.display()
                ),
            )
        })?;
        let metrics_control_token = match &config.metrics.control_token_file {
            None => None,
            Some(file) => {
                let file = self.resolve(file);
                let token = read_secret(&file, 4096).and_then(|bytes| {
                    let text = String::from_utf8(bytes)
                        .map_err(|_| format!("{} is not UTF-8 text", file.display()))?;
                    ControlToken::new(&text).map_err(|e| format!("{}: {e}", file.display()))
                });
                Some(token.map_err(|reason| at.invalid("metrics.control_token_file", "", reason))?)
            }
        };
        Ok(LoadedConfig {
            path: self.path.clone(),
            keypair,
            key_file,
            peer_id,
            swarm,
            authority,
            invite,
            net,
            volunteer: config.volunteer,
            task,
            training,
            averaging,
            checkpoint,
            metrics_listen: *metrics_listen,
            metrics_control_token,
            log: config.log.clone(),
        })
    }
}

/// Which host a config is loaded for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Host {
    /// This one, which will run it: its listen addresses must be this host's.
    This,
    /// Another one (a bench's config for a remote host), whose addresses are its own.
    #[cfg_attr(not(test), allow(dead_code))]
    Other,
}

/// `averaging.mode` with the settings only that mode reads: the one place a config's mode
/// is matched.
fn mode_settings(a: &AveragingSection, sgp: &SgpConfig) -> ModeSettings {
    let butterfly = a.butterfly.clone();
    match a.mode {
        AveragingMode::Sgp => ModeSettings::Sgp(sgp.clone()),
        AveragingMode::Butterfly => ModeSettings::Butterfly {
            target_batch: a.target_batch,
            butterfly,
        },
        AveragingMode::LocalSgd => ModeSettings::LocalSgd {
            local: a.local_sgd,
            butterfly,
        },
        AveragingMode::SyncRing => ModeSettings::SyncRing {
            timeout: Duration::from_millis(a.ring.timeout_ms),
            butterfly,
        },
        AveragingMode::Solo => ModeSettings::Solo,
    }
}

/// A toml error as `FILE:LINE:COL: key: message`.
fn syntax_error(path: &Path, text: &str, error: &toml::de::Error) -> ConfigError {
    let span = error.span().unwrap_or(0..0);
    let (line, column) = line_col(text, span.start);
    ConfigError::Syntax {
        path: path.to_owned(),
        line,
        column,
        key: Document::parse(text).path_at(span),
        message: error.message().trim().to_owned(),
    }
}

/// Every file the data source reads, with its key.
fn data_paths(source: &DataSource) -> Vec<(&'static str, &Path)> {
    match source {
        DataSource::SyntheticClassification(_) | DataSource::SyntheticMarkov(_) => Vec::new(),
        DataSource::Text(c) => vec![("data.source.path", &c.path)],
        DataSource::Tokens(c) => vec![("data.source.path", &c.path)],
        DataSource::Idx(c) => {
            let mut paths = vec![
                ("data.source.images", c.images.as_path()),
                ("data.source.labels", c.labels.as_path()),
            ];
            if let Some(p) = &c.eval_images {
                paths.push(("data.source.eval_images", p));
            }
            if let Some(p) = &c.eval_labels {
                paths.push(("data.source.eval_labels", p));
            }
            paths
        }
    }
}

/// Where the final model goes must be a regular file (or nothing yet) in a folder.
fn check_export(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => check_regular(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if parent.is_dir() {
                Ok(())
            } else {
                Err(format!("{} is not a folder", parent.display()))
            }
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Resolves every file the data source reads.
fn resolve_data_paths(source: &mut DataSource, resolve: impl Fn(&Path) -> PathBuf) {
    match source {
        DataSource::SyntheticClassification(_) | DataSource::SyntheticMarkov(_) => {}
        DataSource::Text(c) => c.path = resolve(&c.path),
        DataSource::Tokens(c) => c.path = resolve(&c.path),
        DataSource::Idx(c) => {
            c.images = resolve(&c.images);
            c.labels = resolve(&c.labels);
            for path in [&mut c.eval_images, &mut c.eval_labels]
                .into_iter()
                .flatten()
            {
                *path = resolve(path);
            }
        }
    }
}

/// A revocation file, when it exists, must be a list this swarm's authority signed for this
/// swarm (a missing one is fine: nothing is revoked until the organizer writes it).
fn check_revocations(file: &Path, authority: &PeerId, swarm: &SwarmId) -> Result<(), String> {
    if file.symlink_metadata().is_err() {
        return Ok(());
    }
    let bytes = read_regular(file, MAX_REVOCATIONS_LEN)
        .map_err(|e| format!("cannot read the revocation list: {e}"))?;
    let list = Revocations::decode(&bytes)
        .map_err(|e| format!("{} is not a revocation list: {e}", file.display()))?;
    list.verify(&authority.public_key(), swarm)
        .map_err(|e| format!("{}: {e}", file.display()))
}

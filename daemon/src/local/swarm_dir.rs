//! The working folder of a local swarm: an authority key, and per peer a key, an invite signed
//! by the authority, and a config file that `murmur run` reads.
//!
//! ```text
//! <out>/authority.key
//! <out>/peer-0/murmur.key   mode 0600
//! <out>/peer-0/invite       the authority's signed invite for peer 0
//! <out>/peer-0/murmur.toml  written when its bootstrap address is known
//! <out>/peer-0/murmur.log   the peer's log (stderr)
//! <out>/peer-0/progress.jsonl  its progress lines (stdout), over all its restarts
//! <out>/peer-0/checkpoints/
//! ```

use std::path::{Path, PathBuf};

use anyhow::Context;
use murmur_gossip::butterfly::{ButterflyConfig, ClipConfig};
use murmur_gossip::net::NetConfig;
use murmur_protocol::identity::{Invite, Keypair, PeerId, SwarmId};
use murmur_trainer::DataConfig;

use super::args::LocalPlan;
use super::overrides;
use crate::config::schema::{
    AveragingSection, CheckpointSection, Config, IdentitySection, LogSection, MetricsSection,
    SwarmSection, TrainingSection, VolunteerSection,
};
use crate::input_error::BadInput;

/// The swarm id of every local swarm: peers of two local swarms never share invites anyway.
const SWARM_ID: &str = "murmur-local";
/// How long the invites stay valid; far longer than any local run.
const INVITE_VALIDITY_S: u64 = 30 * 24 * 3600;
/// The key file name inside a peer's folder.
const KEY_FILE: &str = "murmur.key";
/// The invite file name inside a peer's folder.
const INVITE_FILE: &str = "invite";
/// The config file name inside a peer's folder.
const CONFIG_FILE: &str = "murmur.toml";
/// The log file name inside a peer's folder.
const LOG_FILE: &str = "murmur.log";

/// The folder layout of a created swarm.
#[derive(Debug)]
pub(crate) struct SwarmDir {
    root: PathBuf,
    authority: PeerId,
    peers: Vec<PeerId>,
}

impl SwarmDir {
    /// Creates the folder (`out`, or a fresh one under the temp folder), the authority key,
    /// and every peer's key and invite.
    pub(crate) fn create(out: Option<&Path>, peers: usize) -> anyhow::Result<SwarmDir> {
        let root = match out {
            Some(dir) => prepare_out_dir(dir)?,
            None => tempfile_dir()?,
        };
        let authority = Keypair::create_file(root.join("authority.key"))?;
        let swarm = SwarmId::new(SWARM_ID).context("the local swarm id")?;
        let issued_at = crate::clock::unix_s();
        let mut ids = Vec::with_capacity(peers);
        for index in 0..peers {
            let dir = root.join(peer_dir_name(index));
            std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let key = Keypair::create_file(dir.join(KEY_FILE))?;
            let invite = Invite::issue(
                &authority,
                &key.peer_id(),
                &swarm,
                issued_at,
                issued_at + INVITE_VALIDITY_S,
            )?;
            let path = dir.join(INVITE_FILE);
            std::fs::write(&path, invite.encode())
                .with_context(|| format!("writing {}", path.display()))?;
            ids.push(key.peer_id());
        }
        Ok(SwarmDir {
            root,
            authority: authority.peer_id(),
            peers: ids,
        })
    }

    /// The working folder.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// Peer `index`'s folder.
    pub(crate) fn peer_dir(&self, index: usize) -> PathBuf {
        self.root.join(peer_dir_name(index))
    }

    /// Peer `index`'s config file.
    pub(crate) fn config_path(&self, index: usize) -> PathBuf {
        self.peer_dir(index).join(CONFIG_FILE)
    }

    /// Peer `index`'s log file.
    pub(crate) fn log_path(&self, index: usize) -> PathBuf {
        self.peer_dir(index).join(LOG_FILE)
    }

    /// Peer `index`'s id.
    pub(crate) fn peer_id(&self, index: usize) -> Option<&PeerId> {
        self.peers.get(index)
    }

    /// Writes peer `index`'s config with the given bootstrap addresses.
    pub(crate) fn write_config(
        &self,
        plan: &LocalPlan,
        index: usize,
        bootstrap: &[String],
    ) -> anyhow::Result<()> {
        let config = self.peer_config(plan, index, bootstrap)?;
        self.write_peer_config(plan, index, &config)
    }

    /// Peer `index`'s config, `--set` overrides applied, for a caller to adjust before
    /// [`SwarmDir::write_peer_config`].
    pub(crate) fn peer_config(
        &self,
        plan: &LocalPlan,
        index: usize,
        bootstrap: &[String],
    ) -> anyhow::Result<Config> {
        let config = peer_config(&PeerConfig {
            plan,
            index,
            authority: &self.authority,
            bootstrap,
            cpu_threads: cpu_threads_per_peer(plan.peers),
        });
        Ok(overrides::apply(config, &plan.overrides, index)?)
    }

    /// Writes `config` as peer `index`'s config file.
    pub(crate) fn write_peer_config(
        &self,
        plan: &LocalPlan,
        index: usize,
        config: &Config,
    ) -> anyhow::Result<()> {
        let text = config_text(plan, index, config)?;
        let path = self.config_path(index);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    }
}

fn peer_dir_name(index: usize) -> String {
    format!("peer-{index}")
}

/// Creates `dir` if needed; refuses one with anything in it, so no earlier run's keys or
/// checkpoints are mixed into this one.
fn prepare_out_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| {
        BadInput(format!(
            "--out {}: cannot create the folder: {e}",
            dir.display()
        ))
    })?;
    let mut entries = std::fs::read_dir(dir).map_err(|e| {
        BadInput(format!(
            "--out {}: cannot read the folder: {e}",
            dir.display()
        ))
    })?;
    if entries.next().is_some() {
        return Err(BadInput(format!(
            "--out {}: the folder is not empty; choose a new or empty one",
            dir.display()
        ))
        .into());
    }
    Ok(dir.to_owned())
}

/// A fresh folder under the temp folder that outlives this process.
fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir();
    let stamp = crate::clock::unix_s();
    // The process id makes the name unique among concurrent runs; the counter among retries.
    for attempt in 0..100u32 {
        let dir = base.join(format!(
            "murmur-local-{stamp}-{}-{attempt}",
            std::process::id()
        ));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    anyhow::bail!("no free folder name under {}", base.display())
}

/// Trainer threads per peer: the host's cores shared out, so peers do not oversubscribe them.
fn cpu_threads_per_peer(peers: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (cores / peers.max(1)).max(1)
}

/// Checks `plan`'s `--set` and `--set-peer` overrides against the peer configs they change
/// before anything is created, so a bad one is refused before any peer starts.
pub(crate) fn check_overrides(plan: &LocalPlan) -> Result<(), BadInput> {
    if plan.overrides.is_empty() {
        return Ok(());
    }
    let authority = Keypair::generate()
        .map_err(|e| BadInput(format!("--set: no key to check the overrides with: {e}")))?
        .peer_id();
    // Peer 0 stands for every peer without an override of its own.
    let mut indices: Vec<usize> = plan.overrides.iter().filter_map(|o| o.peer()).collect();
    indices.push(0);
    indices.sort_unstable();
    indices.dedup();
    for index in indices {
        let config = peer_config(&PeerConfig {
            plan,
            index,
            authority: &authority,
            bootstrap: &[],
            cpu_threads: 1,
        });
        overrides::apply(config, &plan.overrides, index)?;
    }
    Ok(())
}

/// What goes into one peer's config file.
#[derive(Debug)]
pub(crate) struct PeerConfig<'a> {
    pub(crate) plan: &'a LocalPlan,
    pub(crate) index: usize,
    pub(crate) authority: &'a PeerId,
    pub(crate) bootstrap: &'a [String],
    pub(crate) cpu_threads: usize,
}

/// The config file of one peer, in the daemon's schema. The task sections are left out, so
/// the daemon trains the built-in preset.
/// The network section of a local peer. Every peer of a local swarm on loopback shares
/// one address, so the limits per source address are those of all sources together: up
/// to 64 peers dial each other from 127.0.0.1 at once.
fn local_net(quic: String, bootstrap: Vec<String>) -> NetConfig {
    let defaults = NetConfig::default();
    NetConfig {
        listen_addrs: vec![quic],
        bootstrap,
        mdns: false,
        max_pending_incoming_per_ip: defaults.max_pending_incoming,
        max_incoming_connections_per_ip: defaults.max_connections,
        ..defaults
    }
}

/// The config file of one peer, as `murmur run` reads it: the config struct itself, every
/// section at the built-in task's and the daemon's defaults but what a local swarm sets.
pub(crate) fn peer_config(c: &PeerConfig<'_>) -> Config {
    let plan = c.plan;
    let task = plan.task.config();
    // QUIC only, as a swarm on one host needs no TCP fallback.
    let [quic, _tcp] = plan.hosts.listen_addrs(c.index);
    let defaults = TrainingSection::default();
    Config {
        identity: IdentitySection {
            key_file: KEY_FILE.into(),
        },
        swarm: SwarmSection {
            id: SWARM_ID.to_owned(),
            authority: c.authority.to_string(),
            invite_file: INVITE_FILE.into(),
            revocation_file: None,
        },
        net: local_net(quic, c.bootstrap.to_vec()),
        volunteer: VolunteerSection {
            cpu_threads: c.cpu_threads,
            ..VolunteerSection::default()
        },
        model: task.model,
        optimizer: task.optimizer,
        schedule: task.schedule,
        training: TrainingSection {
            steps: plan.steps,
            eval_every_steps: eval_every_steps(plan.steps),
            min_peers: plan.peers.saturating_sub(1),
            slowdown: plan.slowdown(c.index).max(1.0),
            synthetic_step_ms: plan.synthetic_step_ms,
            ..defaults
        },
        averaging: AveragingSection {
            mode: plan.mode,
            codec: plan.codec.to_string(),
            error_feedback: plan.error_feedback,
            // One round per local step of every peer: the same batch as the sync ring's.
            target_batch: plan.peers as u64 * task.data.batch_size as u64,
            butterfly: ButterflyConfig {
                // Clipping needs groups of three (`ButterflyConfig::validate`).
                min_group: if plan.clip.is_some() { 3 } else { 2 },
                clip: plan.clip.map(|tau| ClipConfig {
                    tau,
                    iterations: 3,
                    reject_factor: ClipConfig::DEFAULT_REJECT_FACTOR,
                }),
                ..ButterflyConfig::default()
            },
            ..AveragingSection::default()
        },
        data: if plan.non_iid {
            DataConfig {
                shard: c.index as u32,
                shards: plan.peers as u32,
                ..task.data
            }
        } else {
            task.data
        },
        checkpoint: CheckpointSection {
            dir: "checkpoints".into(),
            every_steps: checkpoint_every_steps(plan.steps),
            ..CheckpointSection::default()
        },
        metrics: MetricsSection {
            listen: Some("127.0.0.1:0".to_owned()),
            control_token_file: None,
        },
        log: LogSection::default(),
    }
}

/// `config` as TOML, under a comment that says what wrote it.
fn config_text(plan: &LocalPlan, index: usize, config: &Config) -> anyhow::Result<String> {
    let body = toml::to_string(config).context("writing a peer's config as TOML")?;
    Ok(format!(
        "# murmur local: peer {index} of {}. Paths are relative to this file.\n\n{body}",
        plan.peers
    ))
}

/// [`peer_config`] as the file `murmur run` reads.
#[cfg(test)]
fn peer_config_text(c: &PeerConfig<'_>) -> String {
    config_text(c.plan, c.index, &peer_config(c)).expect("a config serializes")
}

/// About a dozen evals per run for the loss plot, but between every 5 and every 50 steps:
/// an eval costs about as much as a few training steps.
fn eval_every_steps(steps: u64) -> u64 {
    (steps / 12).clamp(5, 50)
}

/// About ten checkpoints per run, so a peer killed by churn loses little: the built-in
/// model's checkpoint is small.
fn checkpoint_every_steps(steps: u64) -> u64 {
    (steps / 10).clamp(10, 100)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use murmur_protocol::codec::CodecSpec;

    use super::*;
    use crate::local::args::{AveragingMode, LocalArgs};

    fn plan(stragglers: &[&str]) -> LocalPlan {
        LocalPlan::from_args(&LocalArgs {
            mode: AveragingMode::Butterfly,
            codec: "int4:128".into(),
            steps: Some(40),
            straggler: stragglers.iter().map(|s| (*s).to_owned()).collect(),
            ..LocalArgs::with_peers(3)
        })
        .unwrap()
    }

    fn table(text: &str) -> toml::Table {
        toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn the_config_has_every_key_the_schema_needs() {
        let plan = plan(&["2:3.5"]);
        let authority = Keypair::from_seed([7; 32]).peer_id();
        let bootstrap = vec!["/ip4/127.0.0.1/udp/4000/quic-v1/p2p/12D3KooWx".to_owned()];
        let text = peer_config_text(&PeerConfig {
            plan: &plan,
            index: 2,
            authority: &authority,
            bootstrap: &bootstrap,
            cpu_threads: 2,
        });
        let t = table(&text);
        assert_eq!(t["identity"]["key_file"].as_str(), Some("murmur.key"));
        assert_eq!(t["swarm"]["id"].as_str(), Some(SWARM_ID));
        assert_eq!(
            t["swarm"]["authority"].as_str(),
            Some(authority.to_string().as_str())
        );
        assert_eq!(t["swarm"]["invite_file"].as_str(), Some("invite"));
        let listen = t["net"]["listen_addrs"].as_array().unwrap();
        assert_eq!(listen[0].as_str(), Some("/ip4/127.0.0.1/udp/0/quic-v1"));
        assert_eq!(
            t["net"]["bootstrap"].as_array().unwrap()[0].as_str(),
            Some(bootstrap[0].as_str())
        );
        assert_eq!(t["net"]["mdns"].as_bool(), Some(false));
        assert_eq!(t["volunteer"]["cpu_threads"].as_integer(), Some(2));
        assert_eq!(t["training"]["steps"].as_integer(), Some(40));
        assert_eq!(t["training"]["slowdown"].as_float(), Some(3.5));
        assert_eq!(t["averaging"]["mode"].as_str(), Some("butterfly"));
        let codec = t["averaging"]["codec"].as_str().unwrap();
        assert_eq!(CodecSpec::parse(codec).unwrap(), plan.codec);
        assert_eq!(t["checkpoint"]["dir"].as_str(), Some("checkpoints"));
        assert_eq!(t["checkpoint"]["every_steps"].as_integer(), Some(10));
        assert_eq!(t["metrics"]["listen"].as_str(), Some("127.0.0.1:0"));
        for task_section in ["model", "data", "optimizer", "schedule"] {
            assert!(
                t.contains_key(task_section),
                "{task_section} is written out"
            );
        }
    }

    #[test]
    fn peers_without_a_slowdown_or_bootstrap_get_neither() {
        let plan = plan(&["2:3.5"]);
        let authority = Keypair::from_seed([1; 32]).peer_id();
        let t = table(&peer_config_text(&PeerConfig {
            plan: &plan,
            index: 0,
            authority: &authority,
            bootstrap: &[],
            cpu_threads: 1,
        }));
        assert_eq!(t["training"]["slowdown"].as_float(), Some(1.0));
        assert!(t["net"]["bootstrap"].as_array().unwrap().is_empty());
    }

    #[test]
    fn the_daemon_loads_the_configs_it_is_given() {
        let tmp = tempfile::tempdir().unwrap();
        let plan = plan(&["1:2"]);
        let dir = SwarmDir::create(Some(tmp.path()), plan.peers).unwrap();
        let bootstrap = vec!["/ip4/127.0.0.1/udp/4000/quic-v1".to_owned()];
        dir.write_config(&plan, 1, &bootstrap).unwrap();
        let loaded = crate::config::load(&dir.config_path(1)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Some(&loaded.peer_id), dir.peer_id(1));
        assert_eq!(loaded.swarm.as_str(), SWARM_ID);
        assert_eq!(loaded.net.bootstrap, bootstrap);
        assert_eq!(loaded.net.listen_addrs, ["/ip4/127.0.0.1/udp/0/quic-v1"]);
        assert!(!loaded.net.mdns);
        assert_eq!(loaded.training.steps, 40);
        assert_eq!(loaded.training.slowdown, 2.0);
        assert_eq!(loaded.averaging.codec, plan.codec);
        assert_eq!(loaded.averaging.mode.mode(), plan.mode);
        assert_eq!(loaded.checkpoint.dir, dir.peer_dir(1).join("checkpoints"));
        assert_eq!(
            loaded.metrics_listen.map(|a| a.ip().to_string()),
            Some("127.0.0.1".to_owned())
        );
        assert_eq!(
            loaded.task,
            murmur_trainer::TaskPreset::default_local(),
            "the task sections default to the built-in preset"
        );
    }

    #[test]
    fn the_task_flag_chooses_the_preset_the_peers_train() {
        let tmp = tempfile::tempdir().unwrap();
        let mut plan = plan(&[]);
        plan.task = murmur_trainer::TaskPreset::TeacherMlp;
        let dir = SwarmDir::create(Some(tmp.path()), plan.peers).unwrap();
        dir.write_config(&plan, 0, &[]).unwrap();
        let loaded = crate::config::load(&dir.config_path(0)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded.task, murmur_trainer::TaskPreset::TeacherMlp.config());
        assert_ne!(loaded.task, murmur_trainer::TaskPreset::default_local());
        // One round per local step of every peer, at this task's batch.
        let text = std::fs::read_to_string(dir.config_path(0)).unwrap();
        assert_eq!(
            table(&text)["averaging"]["target_batch"].as_integer(),
            Some(3 * 64)
        );
    }

    #[test]
    fn peers_listen_where_the_hosts_file_says_and_pad_their_steps() {
        let tmp = tempfile::tempdir().unwrap();
        let hosts = tmp.path().join("hosts.toml");
        let mut text = String::new();
        for peer in 0..3 {
            text.push_str(&format!(
                "[[peer]]\nlaunch = [\"ip\", \"netns\", \"exec\", \"n{peer}\"]\nlisten_ip = \"10.9.{peer}.2\"\n"
            ));
        }
        std::fs::write(&hosts, text).unwrap();
        let plan = LocalPlan::from_args(&LocalArgs {
            mode: AveragingMode::SyncRing,
            codec: "f32".into(),
            steps: Some(20),
            straggler: vec!["1:4".into()],
            hosts: Some(hosts),
            synthetic_step_ms: 150,
            ..LocalArgs::with_peers(3)
        })
        .unwrap();
        let dir = SwarmDir::create(Some(&tmp.path().join("swarm")), plan.peers).unwrap();
        dir.write_config(&plan, 1, &[]).unwrap();
        let loaded = crate::config::load_for_another_host(&dir.config_path(1))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded.net.listen_addrs, ["/ip4/10.9.1.2/udp/0/quic-v1"]);
        assert_eq!(
            loaded.training.synthetic_step,
            std::time::Duration::from_millis(150)
        );
        assert_eq!(loaded.training.slowdown, 4.0);
    }

    #[test]
    fn evals_come_about_a_dozen_times_a_run() {
        assert_eq!(eval_every_steps(600), 50);
        assert_eq!(eval_every_steps(120), 10);
        assert_eq!(eval_every_steps(20), 5);
    }

    #[test]
    fn the_folder_holds_private_keys_and_verifiable_invites() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("swarm");
        let plan = plan(&[]);
        let dir = SwarmDir::create(Some(&out), plan.peers).unwrap();
        let authority = Keypair::load_file(out.join("authority.key")).unwrap();
        let swarm = SwarmId::new(SWARM_ID).unwrap();
        for index in 0..plan.peers {
            let key_path = dir.peer_dir(index).join(KEY_FILE);
            let mode = std::fs::metadata(&key_path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            let key = Keypair::load_file(&key_path).unwrap();
            assert_eq!(dir.peer_id(index), Some(&key.peer_id()));
            let bytes = std::fs::read(dir.peer_dir(index).join(INVITE_FILE)).unwrap();
            let invite = Invite::decode(&bytes).unwrap();
            assert_eq!(invite.peer(), &key.peer_id());
            assert_eq!(invite.swarm(), &swarm);
            invite
                .verify(
                    &authority.public(),
                    &swarm,
                    &key.peer_id(),
                    crate::clock::unix_s(),
                )
                .unwrap();
            dir.write_config(&plan, index, &[]).unwrap();
            assert!(dir.config_path(index).is_file());
        }
        // A second run into the same folder is refused rather than mixed in.
        let e = SwarmDir::create(Some(&out), 2).unwrap_err();
        let e = e.downcast_ref::<BadInput>().unwrap();
        assert!(e.0.contains("--out") && e.0.contains("not empty"), "{e}");
    }
}

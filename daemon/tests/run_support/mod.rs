//! Real `murmur run` peers for the integration tests.
//!
//! [`Swarm`] builds a swarm folder the way an organizer and its volunteers would, with the
//! CLI alone: `murmur swarm new`, then per peer `murmur init` and `murmur swarm invite`,
//! after which each peer's config is written from [`PeerSettings`]. [`RunningPeer`] starts
//! `murmur run --progress`, reads its JSON lines on a thread into a bounded channel, and
//! kills the process when dropped. Every wait is bounded and fails with the peer's log.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use murmur_protocol::snapshot::{Snapshot, SnapshotLimits};
use serde_json::Value;

/// The daemon under test.
pub(crate) const MURMUR: &str = env!("CARGO_BIN_EXE_murmur");

/// The swarm id every test swarm uses.
pub(crate) const SWARM_ID: &str = "test-swarm";

/// Progress lines kept in flight between a peer's reader thread and the test. A peer prints
/// a few lines a second, so this holds minutes of output; a test that stops reading makes
/// the reader drop lines (counted in [`RunningPeer::dropped`]) rather than stall the peer.
const LINE_CAPACITY: usize = 4096;

/// How long a CLI command (`swarm new`, `init`, `swarm invite`) may take.
const CLI_PATIENCE: Duration = Duration::from_secs(30);

/// How long a peer may take from its start to its `ready` line.
const READY_PATIENCE: Duration = Duration::from_secs(60);

/// Serializes the tests of one binary that start peers: the host's cores are few, and two
/// swarms at once would make every timing bound a bound on the other test's load.
pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    // A test that failed while holding the lock poisoned it; the next one may still run.
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs a short `murmur` CLI command to completion (bounded) and returns its stdout.
pub(crate) fn murmur_cli(args: &[&str]) -> String {
    let mut child = Command::new(MURMUR)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("murmur starts");
    let deadline = Instant::now() + CLI_PATIENCE;
    while child.try_wait().expect("waits for murmur").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`murmur {}` still running after {CLI_PATIENCE:?}",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("murmur's output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "`murmur {}` failed ({}):\n{stdout}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The value after `label` on the first line of `text` that starts with it.
fn field_after<'a>(text: &'a str, label: &str) -> &'a str {
    text.lines()
        .find_map(|line| line.strip_prefix(label))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no line starting with {label:?} in\n{text}"))
}

/// A swarm folder: the authority's key and `swarm.toml`, and one folder per peer.
#[derive(Debug)]
pub(crate) struct Swarm {
    root: tempfile::TempDir,
    authority: String,
}

impl Swarm {
    /// `murmur swarm new` in a fresh temporary folder.
    pub(crate) fn create() -> Swarm {
        let mut root = tempfile::tempdir().expect("a temporary folder");
        // Left in place to be read after the test when `MURMUR_TEST_KEEP` is set.
        if std::env::var_os("MURMUR_TEST_KEEP").is_some() {
            root.disable_cleanup(true);
            eprintln!("swarm folder kept: {}", root.path().display());
        }
        let dir = root.path().to_str().expect("a UTF-8 temp path");
        let out = murmur_cli(&["swarm", "new", "--dir", dir, "--id", SWARM_ID]);
        assert_eq!(field_after(&out, "swarm:"), SWARM_ID);
        let authority = field_after(&out, "authority:").to_owned();
        Swarm { root, authority }
    }

    /// The swarm folder.
    pub(crate) fn root(&self) -> &Path {
        self.root.path()
    }

    /// `murmur init` for a new peer in its own folder, and its invite from
    /// `murmur swarm invite`. The config is written later, with [`PeerDir::write_config`].
    pub(crate) fn add_peer(&self, name: &str) -> PeerDir {
        let dir = self.root().join(name);
        let dir_arg = dir.to_str().expect("a UTF-8 path");
        let out = murmur_cli(&["init", "--dir", dir_arg]);
        let peer_id = field_after(&out, "peer id:").to_owned();
        let invite = dir.join("invite");
        let key = self.root().join("authority.key");
        let config = self.root().join("swarm.toml");
        murmur_cli(&[
            "swarm",
            "invite",
            &peer_id,
            "--authority-key",
            key.to_str().expect("a UTF-8 path"),
            "--swarm-config",
            config.to_str().expect("a UTF-8 path"),
            "--out",
            invite.to_str().expect("a UTF-8 path"),
        ]);
        PeerDir {
            name: name.to_owned(),
            dir,
            peer_id,
            authority: self.authority.clone(),
        }
    }
}

impl Swarm {
    /// `murmur swarm revoke` for `peers`, writing the list to `out`; returns its stdout.
    pub(crate) fn revoke(&self, peers: &[&str], out: &Path) -> String {
        let key = self.root().join("authority.key");
        let config = self.root().join("swarm.toml");
        let mut args = vec![
            "swarm",
            "revoke",
            "--authority-key",
            key.to_str().expect("a UTF-8 path"),
            "--swarm-config",
            config.to_str().expect("a UTF-8 path"),
            "--out",
            out.to_str().expect("a UTF-8 path"),
        ];
        args.extend_from_slice(peers);
        murmur_cli(&args)
    }
}

/// What a test chooses in a peer's config; the rest is fixed for fast loopback swarms:
/// one trainer thread, the built-in task, and by default QUIC on 127.0.0.1, SGP and
/// heartbeats every 500 ms.
#[derive(Debug, Clone)]
pub(crate) struct PeerSettings {
    /// `[net] bootstrap`.
    pub(crate) bootstrap: Vec<String>,
    /// `[training] steps` (0 = until stopped).
    pub(crate) steps: u64,
    /// `[training] eval_every_steps`.
    pub(crate) eval_every_steps: u64,
    /// `[training] min_peers`.
    pub(crate) min_peers: usize,
    /// `[training] synthetic_step_ms`: every step padded to at least this (0 = off).
    pub(crate) synthetic_step_ms: u64,
    /// `[training] export`, relative to the peer's folder.
    pub(crate) export: Option<String>,
    /// `[training] device`.
    pub(crate) device: String,
    /// `[averaging.sgp] share_timeout_ms`.
    pub(crate) share_timeout_ms: u64,
    /// `[checkpoint] every_steps` (0 = only at exit).
    pub(crate) checkpoint_every_steps: u64,
    /// `[checkpoint] keep`.
    pub(crate) checkpoint_keep: usize,
    /// `[averaging] mode`.
    pub(crate) mode: String,
    /// `[averaging] codec`; `None` leaves the default.
    pub(crate) codec: Option<String>,
    /// `[averaging] heartbeat_interval_ms`.
    pub(crate) heartbeat_interval_ms: u64,
    /// Serve `/metrics`, `/status` and `/healthz` on a free loopback port (its address is
    /// in the `ready` line).
    pub(crate) metrics: bool,
    /// `[net] listen_addrs`.
    pub(crate) listen_addrs: Vec<String>,
    /// Further integer keys of `[net]` (`max_pending_incoming_per_ip`, …), as written.
    pub(crate) net_keys: Vec<(&'static str, u64)>,
    /// With `metrics`: `[metrics] listen` instead of `127.0.0.1:0`.
    pub(crate) metrics_listen: Option<String>,
    /// With `metrics`: `[metrics] control_token_file`, relative to the peer's folder.
    pub(crate) control_token_file: Option<String>,
    /// `[model] width` of the default GPT shape (2 layers, 2 heads, context 32); `None`
    /// leaves the default model.
    pub(crate) model_width: Option<usize>,
    /// `[swarm] revocation_file`, when set.
    pub(crate) revocation_file: Option<String>,
    /// Run `murmur` inside this network namespace (`ip netns exec`).
    pub(crate) namespace: Option<String>,
    /// More config text, appended as written (whole tables such as `[net.relay]`).
    pub(crate) extra: String,
}

impl Default for PeerSettings {
    fn default() -> Self {
        PeerSettings {
            bootstrap: Vec::new(),
            steps: 0,
            eval_every_steps: 10,
            min_peers: 0,
            synthetic_step_ms: 0,
            export: None,
            device: "cpu".to_owned(),
            share_timeout_ms: 2_000,
            checkpoint_every_steps: 0,
            checkpoint_keep: 3,
            mode: "sgp".to_owned(),
            codec: None,
            heartbeat_interval_ms: 500,
            metrics: false,
            listen_addrs: vec!["/ip4/127.0.0.1/udp/0/quic-v1".to_owned()],
            net_keys: Vec::new(),
            metrics_listen: None,
            control_token_file: None,
            model_width: None,
            revocation_file: None,
            namespace: None,
            extra: String::new(),
        }
    }
}

/// One peer's folder: key, invite, config, log and checkpoints.
#[derive(Debug, Clone)]
pub(crate) struct PeerDir {
    /// A short name for messages (`p0`, `joiner`).
    pub(crate) name: String,
    /// The folder.
    pub(crate) dir: PathBuf,
    /// The peer id `murmur init` printed.
    pub(crate) peer_id: String,
    authority: String,
}

impl PeerDir {
    /// The swarm authority's peer id.
    pub(crate) fn authority(&self) -> &str {
        &self.authority
    }

    /// The config file `murmur run` reads.
    pub(crate) fn config_path(&self) -> PathBuf {
        self.dir.join("murmur.toml")
    }

    /// Where the peer's stderr (its log) goes.
    pub(crate) fn log_path(&self) -> PathBuf {
        self.dir.join("murmur.log")
    }

    /// The checkpoint folder (`[checkpoint] dir`).
    pub(crate) fn checkpoint_dir(&self) -> PathBuf {
        self.dir.join("checkpoints")
    }

    /// Replaces the config `murmur init` wrote with one for `settings`.
    pub(crate) fn write_config(&self, settings: &PeerSettings) {
        let text = config_text(&self.authority, settings);
        std::fs::write(self.config_path(), text).expect("the config is written");
        let namespace = settings.namespace.clone().unwrap_or_default();
        std::fs::write(self.dir.join("namespace"), namespace).expect("the namespace is noted");
    }

    /// Starts `murmur run --progress` on this folder's config.
    pub(crate) fn start(&self) -> RunningPeer {
        self.start_with_env(&[])
    }

    /// Starts `murmur run --progress` with extra environment variables.
    pub(crate) fn start_with_env(&self, env: &[(&str, &str)]) -> RunningPeer {
        let log = File::create(self.log_path()).expect("the log file");
        let namespace = std::fs::read_to_string(self.dir.join("namespace")).unwrap_or_default();
        let mut command = if namespace.is_empty() {
            Command::new(MURMUR)
        } else {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", &namespace, MURMUR]);
            command
        };
        let mut child = command
            .arg("run")
            .arg("--config")
            .arg(self.config_path())
            .arg("--progress")
            .env_remove("RUST_LOG")
            .env_remove("MURMUR_FAULT")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("murmur run starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = sync_channel(LINE_CAPACITY);
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = dropped.clone();
        std::thread::Builder::new()
            .name(format!("{}-progress", self.name))
            .spawn(move || read_lines(stdout, &tx, &counter))
            .expect("the reader thread starts");
        RunningPeer {
            name: self.name.clone(),
            log: self.log_path(),
            child,
            lines: rx,
            seen: Vec::new(),
            cursor: 0,
            dropped,
            exit: None,
        }
    }
}

/// The config text of one test peer.
fn config_text(authority: &str, s: &PeerSettings) -> String {
    let quoted = |text: &str| format!("{text:?}");
    let bootstrap: Vec<String> = s.bootstrap.iter().map(|a| quoted(a)).collect();
    let listen: Vec<String> = s.listen_addrs.iter().map(|a| quoted(a)).collect();
    let mut t = String::new();
    // `write!` into a String cannot fail.
    let _ = write!(
        t,
        "[identity]\nkey_file = \"murmur.key\"\n\n\
         [swarm]\nid = {id}\nauthority = {authority}\ninvite_file = \"invite\"\n{revocation}\n\
         [net]\nlisten_addrs = [{listen}]\nbootstrap = [{bootstrap}]\nmdns = false\n{net_keys}\n\
         [volunteer]\ncpu_threads = 1\n\n\
         [training]\nsteps = {steps}\neval_every_steps = {eval}\nmin_peers = {min_peers}\n\
         start_timeout_ms = 30000\ndevice = {device}\nsynthetic_step_ms = {synthetic}\n",
        id = quoted(SWARM_ID),
        revocation = s
            .revocation_file
            .as_deref()
            .map(|file| format!("revocation_file = {}\n", quoted(file)))
            .unwrap_or_default(),
        device = quoted(&s.device),
        authority = quoted(authority),
        bootstrap = bootstrap.join(", "),
        listen = listen.join(", "),
        net_keys = s
            .net_keys
            .iter()
            .map(|(key, value)| format!("{key} = {value}\n"))
            .collect::<String>(),
        steps = s.steps,
        eval = s.eval_every_steps,
        min_peers = s.min_peers,
        synthetic = s.synthetic_step_ms,
    );
    if let Some(export) = &s.export {
        let _ = writeln!(t, "export = {}", quoted(export));
    }
    let _ = write!(
        t,
        "\n[averaging]\nmode = {mode}\nheartbeat_interval_ms = {heartbeat}\n",
        mode = quoted(&s.mode),
        heartbeat = s.heartbeat_interval_ms,
    );
    if let Some(codec) = &s.codec {
        let _ = writeln!(t, "codec = {}", quoted(codec));
    }
    let _ = write!(
        t,
        "\n[averaging.sgp]\nshare_timeout_ms = {share_timeout}\n\n\
         [checkpoint]\ndir = \"checkpoints\"\nevery_steps = {every}\nkeep = {keep}\n\n\
         [log]\nlevel = \"info\"\nformat = \"human\"\n",
        share_timeout = s.share_timeout_ms,
        every = s.checkpoint_every_steps,
        keep = s.checkpoint_keep,
    );
    if let Some(width) = s.model_width {
        let _ = write!(
            t,
            "\n[model]\nkind = \"gpt\"\nlayers = 2\nheads = 2\nwidth = {width}\ncontext = 32\n"
        );
    }
    t.push_str(&s.extra);
    if s.metrics {
        let listen = s.metrics_listen.as_deref().unwrap_or("127.0.0.1:0");
        let _ = write!(t, "\n[metrics]\nlisten = {}\n", quoted(listen));
        if let Some(file) = &s.control_token_file {
            let _ = writeln!(t, "control_token_file = {}", quoted(file));
        }
    }
    t
}

/// Forwards every JSON object line of `stdout` with the instant it was read.
fn read_lines(
    stdout: std::process::ChildStdout,
    tx: &SyncSender<Line>,
    dropped: &std::sync::atomic::AtomicU64,
) {
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { return };
        // Lines that are not JSON objects with an "event" are not progress lines.
        let Ok(json) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if json.get("event").and_then(Value::as_str).is_none() {
            continue;
        }
        match tx.try_send(Line {
            at: Instant::now(),
            json,
        }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

/// One progress line and when it was read.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    /// When the test's reader got it.
    pub(crate) at: Instant,
    /// The JSON object.
    pub(crate) json: Value,
}

impl Line {
    /// The `event` field.
    pub(crate) fn event(&self) -> &str {
        self.json["event"].as_str().unwrap_or_default()
    }

    /// Whether this is a line of `event`.
    pub(crate) fn is(&self, event: &str) -> bool {
        self.event() == event
    }

    /// An unsigned field; panics naming the line if it is missing.
    pub(crate) fn u64(&self, key: &str) -> u64 {
        self.json[key]
            .as_u64()
            .unwrap_or_else(|| panic!("no unsigned {key:?} in {}", self.json))
    }

    /// A number field; panics naming the line if it is missing.
    pub(crate) fn f64(&self, key: &str) -> f64 {
        self.json[key]
            .as_f64()
            .unwrap_or_else(|| panic!("no number {key:?} in {}", self.json))
    }

    /// A string field; panics naming the line if it is missing.
    pub(crate) fn str(&self, key: &str) -> &str {
        self.json[key]
            .as_str()
            .unwrap_or_else(|| panic!("no string {key:?} in {}", self.json))
    }

    /// A `ready` line's first listen address (with its `/p2p` part).
    pub(crate) fn listen(&self) -> String {
        self.json["listen"][0]
            .as_str()
            .unwrap_or_else(|| panic!("no listen address in {}", self.json))
            .to_owned()
    }

    /// A `ready` line's metrics address.
    pub(crate) fn metrics_addr(&self) -> std::net::SocketAddr {
        self.str("metrics_addr")
            .parse()
            .unwrap_or_else(|_| panic!("no metrics address in {}", self.json))
    }
}

/// A running `murmur run --progress`; killed when dropped.
#[derive(Debug)]
pub(crate) struct RunningPeer {
    /// The name for messages.
    pub(crate) name: String,
    log: PathBuf,
    child: Child,
    lines: Receiver<Line>,
    /// Every progress line read so far, in order.
    pub(crate) seen: Vec<Line>,
    /// Where [`RunningPeer::wait_for`] looks next in `seen`.
    cursor: usize,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    exit: Option<ExitStatus>,
}

impl RunningPeer {
    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Progress lines the reader dropped because the test did not read them in time.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Moves every line read so far into [`RunningPeer::seen`], without waiting.
    pub(crate) fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }

    /// The next line after the last one a wait returned that satisfies `pred`, waiting
    /// until `deadline`; panics with the peer's log if none comes.
    pub(crate) fn wait_until(
        &mut self,
        what: &str,
        deadline: Instant,
        mut pred: impl FnMut(&Line) -> bool,
    ) -> Line {
        loop {
            if let Some(offset) = self.seen[self.cursor..].iter().position(&mut pred) {
                let index = self.cursor + offset;
                self.cursor = index + 1;
                return self.seen[index].clone();
            }
            self.cursor = self.seen.len();
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    self.fail(&format!("{what}: not seen by the deadline"))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.fail(&format!("{what}: the peer's output ended first"))
                }
            }
        }
    }

    /// [`RunningPeer::wait_until`] `within` from now.
    pub(crate) fn wait_for(
        &mut self,
        what: &str,
        within: Duration,
        pred: impl FnMut(&Line) -> bool,
    ) -> Line {
        self.wait_until(what, Instant::now() + within, pred)
    }

    /// The `ready` line.
    pub(crate) fn ready(&mut self) -> Line {
        self.wait_for("the ready line", READY_PATIENCE, |l| l.is("ready"))
    }

    /// The newest `progress` line read so far.
    pub(crate) fn last_progress(&self) -> Option<&Line> {
        self.seen.iter().rev().find(|l| l.is("progress"))
    }

    /// The step of the newest `progress` line read so far (0 before the first).
    pub(crate) fn step(&self) -> u64 {
        self.last_progress().map_or(0, |l| l.u64("step"))
    }

    /// The newest `eval` line read at or before `at`.
    pub(crate) fn last_eval_before(&self, at: Instant) -> Option<&Line> {
        self.seen.iter().rev().find(|l| l.is("eval") && l.at <= at)
    }

    /// Sends a signal by name (`TERM`, `INT`, `USR1`, …) with the system's `kill`.
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// SIGKILL: the process dies at once, with no chance to hand anything off.
    pub(crate) fn kill_hard(&mut self) {
        self.child.kill().expect("SIGKILL is sent");
    }

    /// Waits (bounded) for the process to exit; panics with its log if it does not.
    pub(crate) fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        if let Some(status) = self.exit {
            return status;
        }
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("waits for murmur") {
                self.exit = Some(status);
                return status;
            }
            if Instant::now() > deadline {
                self.fail(&format!("still running {within:?} later"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Reads the rest of the output (bounded) after the process exited.
    pub(crate) fn read_to_end(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => self.fail("output still open after exit"),
            }
        }
    }

    /// The peer's log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log once `pred` holds for it (the log is written apart from the progress
    /// lines, so a line may land a moment after the progress line that follows it),
    /// polled until `within` has passed; panics naming `what` if it never does.
    pub(crate) fn log_once(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + within;
        loop {
            let log = self.log();
            if pred(&log) {
                return log;
            }
            if Instant::now() >= deadline {
                self.fail(&format!("{what}: not in the log by the deadline"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Panics with `why`, the last progress lines and the end of the log.
    pub(crate) fn fail(&self, why: &str) -> ! {
        let lines: Vec<String> = self
            .seen
            .iter()
            .rev()
            .take(8)
            .rev()
            .map(|l| l.json.to_string())
            .collect();
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!(
            "peer {}: {why}\nlast progress lines:\n{}\nlog tail:\n{}",
            self.name,
            lines.join("\n"),
            tail.join("\n")
        );
    }
}

impl Drop for RunningPeer {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Drains every peer until `done` holds, checking every 50 ms; panics naming `what` and
/// each peer's last progress line if `within` passes first.
pub(crate) fn wait_all(
    peers: &mut [&mut RunningPeer],
    what: &str,
    within: Duration,
    mut done: impl FnMut(&[&mut RunningPeer]) -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        for peer in peers.iter_mut() {
            peer.drain();
        }
        if done(peers) {
            return;
        }
        if Instant::now() > deadline {
            let mut report = String::new();
            for peer in peers.iter() {
                let last = peer.last_progress().map(|l| l.json.to_string());
                let _ = writeln!(report, "{}: {}", peer.name, last.unwrap_or_default());
            }
            let first = peers.first().map(|p| &**p);
            match first {
                Some(peer) => peer.fail(&format!("{what}: not within {within:?}\n{report}")),
                None => panic!("{what}: no peers"),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The newest checkpoint file in `dir` (by its zero-padded step), decoded.
pub(crate) fn newest_checkpoint(dir: &Path) -> (PathBuf, Snapshot) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "snap"))
        .collect();
    files.sort();
    let path = files
        .pop()
        .unwrap_or_else(|| panic!("no checkpoint in {}", dir.display()));
    let snapshot = decode_checkpoint(&path).unwrap_or_else(|e| panic!("{e}"));
    (path, snapshot)
}

/// Decodes one checkpoint file.
pub(crate) fn decode_checkpoint(path: &Path) -> Result<Snapshot, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Snapshot::decode(&bytes, &SnapshotLimits::default())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The flat parameter vector of a checkpoint.
pub(crate) fn checkpoint_params(snapshot: &Snapshot) -> &[f32] {
    &snapshot
        .tensors
        .iter()
        .find(|t| t.name == "params")
        .expect("a checkpoint holds the params tensor")
        .data
}

//! A real local swarm for integration tests: N `murmur run` peers on loopback, each with its
//! metrics endpoint, killed when dropped.
//!
//! The folder is built with the CLI alone, as an organizer and volunteers would:
//! `murmur swarm new`, then per peer `murmur init` and `murmur swarm invite`; each peer's
//! config is then rewritten for a fast loopback swarm (QUIC on 127.0.0.1, one trainer
//! thread, `[metrics] listen = "127.0.0.1:0"`). Peer 0 starts first; the others bootstrap
//! from the listen address in its `ready` line. Each peer runs with `--progress`; a thread per
//! peer keeps reading its stdout (so the pipe never fills) and keeps the last lines for
//! failure messages. Every wait has a deadline.
//!
//! Include it with `#[path = "support/swarm.rs"] mod swarm;`.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The daemon under test.
pub(crate) const MURMUR: &str = env!("CARGO_BIN_EXE_murmur");

/// How long a CLI command (`swarm new`, `init`, `swarm invite`) may take.
const CLI_PATIENCE: Duration = Duration::from_secs(60);
/// How long a peer may take from its start to its `ready` line.
const READY_PATIENCE: Duration = Duration::from_secs(90);
/// Progress lines kept per peer for failure messages.
const KEPT_LINES: usize = 16;
/// How long one HTTP request may take, connect to last byte.
pub(crate) const HTTP_PATIENCE: Duration = Duration::from_secs(10);

/// Serializes the tests of one binary that start swarms: the host's cores are few, and two
/// swarms at once would make every timing bound a bound on the other test's load.
pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    // A test that failed while holding the lock poisoned it; the next one may still run.
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What a test chooses about its swarm; the rest is fixed (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct SwarmSpec {
    /// `[swarm] id`.
    pub(crate) swarm_id: String,
    /// Peers to start.
    pub(crate) peers: usize,
    /// `[averaging] mode`.
    pub(crate) mode: String,
    /// `[averaging] codec`.
    pub(crate) codec: String,
    /// `[averaging] heartbeat_interval_ms`.
    pub(crate) heartbeat_interval_ms: u64,
    /// `[training] steps` (0 = until stopped).
    pub(crate) steps: u64,
    /// `[training] eval_every_steps`.
    pub(crate) eval_every_steps: u64,
}

impl Default for SwarmSpec {
    fn default() -> Self {
        SwarmSpec {
            swarm_id: "test-swarm".into(),
            peers: 3,
            mode: "sgp".into(),
            codec: "int8:64".into(),
            heartbeat_interval_ms: 1_000,
            steps: 0,
            eval_every_steps: 5,
        }
    }
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

fn utf8(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// A running swarm; every peer is killed when it is dropped.
#[derive(Debug)]
pub(crate) struct LocalSwarm {
    /// The peers, in start order; peer 0 is everyone's bootstrap.
    pub(crate) peers: Vec<SwarmPeer>,
    spec: SwarmSpec,
    // Dropped after the peers (fields drop in order), so no peer outlives its folder.
    root: tempfile::TempDir,
}

impl LocalSwarm {
    /// Creates the swarm folder and starts every peer, waiting for each one's `ready` line.
    pub(crate) fn start(spec: &SwarmSpec) -> LocalSwarm {
        assert!(spec.peers >= 1, "a swarm needs a peer");
        let root = tempfile::tempdir().expect("a temporary folder");
        let out = murmur_cli(&[
            "swarm",
            "new",
            "--dir",
            utf8(root.path()),
            "--id",
            &spec.swarm_id,
        ]);
        let authority = field_after(&out, "authority:").to_owned();
        let mut swarm = LocalSwarm {
            peers: Vec::with_capacity(spec.peers),
            spec: spec.clone(),
            root,
        };
        let mut bootstrap = Vec::new();
        for index in 0..spec.peers {
            let dir = swarm.root.path().join(format!("peer-{index}"));
            let peer_id =
                field_after(&murmur_cli(&["init", "--dir", utf8(&dir)]), "peer id:").to_owned();
            murmur_cli(&[
                "swarm",
                "invite",
                &peer_id,
                "--authority-key",
                utf8(&swarm.root.path().join("authority.key")),
                "--swarm-config",
                utf8(&swarm.root.path().join("swarm.toml")),
                "--out",
                utf8(&dir.join("invite")),
            ]);
            let config = config_text(spec, &authority, &bootstrap, index);
            std::fs::write(dir.join("murmur.toml"), config).expect("the config is written");
            let peer = SwarmPeer::start(format!("p{index}"), peer_id, dir);
            if index == 0 {
                bootstrap = peer.listen.iter().take(1).cloned().collect();
                assert!(!bootstrap.is_empty(), "peer 0 listens nowhere");
            }
            swarm.peers.push(peer);
        }
        swarm
    }

    /// The spec the swarm was started with.
    pub(crate) fn spec(&self) -> &SwarmSpec {
        &self.spec
    }

    /// Every peer's `/metrics` and `/status` address, in peer order.
    pub(crate) fn metrics_addrs(&self) -> Vec<SocketAddr> {
        self.peers.iter().map(|p| p.metrics_addr).collect()
    }

    /// Waits until every running peer's `/status` lists each other running peer (their
    /// heartbeats arrived); panics naming what each peer saw if `within` passes first.
    pub(crate) fn wait_until_meshed(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let running: Vec<&SwarmPeer> = self.peers.iter().filter(|p| !p.killed).collect();
            let mut seen = String::new();
            let mut meshed = true;
            for peer in &running {
                let listed = peer.status().map(|s| listed_peers(&s)).unwrap_or_default();
                let _ = writeln!(seen, "{}: {listed:?}", peer.name);
                meshed &= running
                    .iter()
                    .filter(|other| other.peer_id != peer.peer_id)
                    .all(|other| listed.contains(&other.peer_id));
            }
            if meshed {
                return;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = running.iter().map(|p| p.log_tail(15)).collect();
                panic!(
                    "the swarm did not mesh within {within:?}; each peer's /status lists:\n\
                     {seen}\n{}",
                    logs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The peer ids a `/status` document lists.
pub(crate) fn listed_peers(status: &Value) -> Vec<String> {
    status["peers"]
        .as_array()
        .map(|peers| {
            peers
                .iter()
                .filter_map(|p| p["peer_id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// One peer's config: a fast loopback swarm serving metrics on a free port.
fn config_text(spec: &SwarmSpec, authority: &str, bootstrap: &[String], index: usize) -> String {
    let quoted = |text: &str| format!("{text:?}");
    let bootstrap: Vec<String> = bootstrap.iter().map(|a| quoted(a)).collect();
    format!(
        "# test peer {index} of {peers}\n\
         [identity]\nkey_file = \"murmur.key\"\n\n\
         [swarm]\nid = {id}\nauthority = {authority}\ninvite_file = \"invite\"\n\n\
         [net]\nlisten_addrs = [\"/ip4/127.0.0.1/udp/0/quic-v1\"]\nbootstrap = [{bootstrap}]\n\
         mdns = false\n\n\
         [volunteer]\ncpu_threads = 1\n\n\
         [training]\nsteps = {steps}\neval_every_steps = {eval}\nmin_peers = 0\n\n\
         [averaging]\nmode = {mode}\ncodec = {codec}\nheartbeat_interval_ms = {heartbeat}\n\n\
         [checkpoint]\ndir = \"checkpoints\"\nevery_steps = 0\n\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n\n\
         [log]\nlevel = \"info\"\nformat = \"human\"\n",
        peers = spec.peers,
        id = quoted(&spec.swarm_id),
        authority = quoted(authority),
        bootstrap = bootstrap.join(", "),
        steps = spec.steps,
        eval = spec.eval_every_steps,
        mode = quoted(&spec.mode),
        codec = quoted(&spec.codec),
        heartbeat = spec.heartbeat_interval_ms,
    )
}

/// One running `murmur run --progress`; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub(crate) struct SwarmPeer {
    /// A short name for messages (`p0`, `p1`, …).
    pub(crate) name: String,
    /// The peer id `murmur init` printed.
    pub(crate) peer_id: String,
    /// The peer's folder (key, invite, config, log).
    pub(crate) dir: PathBuf,
    /// The addresses of its `ready` line, each ending in `/p2p/<peer id>`.
    pub(crate) listen: Vec<String>,
    /// Where it serves `/metrics`, `/status` and `/healthz`.
    pub(crate) metrics_addr: SocketAddr,
    child: Child,
    killed: bool,
    last_lines: Arc<Mutex<VecDeque<String>>>,
}

impl SwarmPeer {
    fn start(name: String, peer_id: String, dir: PathBuf) -> SwarmPeer {
        let log = File::create(dir.join("murmur.log")).expect("the log file");
        let mut child = Command::new(MURMUR)
            .arg("run")
            .arg("--config")
            .arg(dir.join("murmur.toml"))
            .arg("--progress")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("murmur run starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let last_lines = Arc::new(Mutex::new(VecDeque::with_capacity(KEPT_LINES)));
        let (ready_tx, ready_rx) = sync_channel(1);
        let kept = Arc::clone(&last_lines);
        std::thread::Builder::new()
            .name(format!("{name}-progress"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { return };
                    if line.contains("\"event\":\"ready\"") {
                        // The receiver is gone once the test stopped waiting; nothing to do.
                        let _ = ready_tx.try_send(line.clone());
                    }
                    let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                    if kept.len() == KEPT_LINES {
                        kept.pop_front();
                    }
                    kept.push_back(line);
                }
            })
            .expect("the reader thread starts");
        let mut peer = SwarmPeer {
            name,
            peer_id,
            dir,
            listen: Vec::new(),
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            child,
            killed: false,
            last_lines,
        };
        let ready = peer.wait_ready(&ready_rx);
        peer.listen = ready["listen"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        peer.metrics_addr = ready["metrics_addr"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| peer.fail(&format!("no metrics_addr in the ready line {ready}")));
        peer
    }

    fn wait_ready(&mut self, ready: &Receiver<String>) -> Value {
        match ready.recv_timeout(READY_PATIENCE) {
            Ok(line) => serde_json::from_str(&line)
                .unwrap_or_else(|e| self.fail(&format!("unreadable ready line ({e}): {line}"))),
            Err(RecvTimeoutError::Timeout) => {
                self.fail(&format!("no ready line within {READY_PATIENCE:?}"))
            }
            Err(RecvTimeoutError::Disconnected) => self.fail("its output ended before `ready`"),
        }
    }

    /// SIGKILL: the process dies at once, without leaving or handing anything off.
    pub(crate) fn kill_hard(&mut self) {
        self.child.kill().expect("SIGKILL is sent");
        let _ = self.child.wait();
        self.killed = true;
    }

    /// Whether [`SwarmPeer::kill_hard`] was called.
    pub(crate) fn is_killed(&self) -> bool {
        self.killed
    }

    /// `GET path` on the peer's metrics endpoint: the body of a 200 answer.
    pub(crate) fn get(&self, path: &str) -> Result<String, String> {
        match http_get(self.metrics_addr, path)? {
            (200, body) => Ok(body),
            (status, body) => Err(format!("{} {path}: HTTP {status}: {body}", self.name)),
        }
    }

    /// The `/status` document.
    pub(crate) fn status(&self) -> Result<Value, String> {
        let body = self.get("/status")?;
        serde_json::from_str(&body).map_err(|e| format!("{}: /status is not JSON: {e}", self.name))
    }

    /// The `/metrics` page.
    pub(crate) fn metrics(&self) -> Result<String, String> {
        self.get("/metrics")
    }

    /// The last `lines` lines of its log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.join("murmur.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("--- {} log tail ---\n{}", self.name, tail.join("\n"))
    }

    /// Panics with `why`, its last progress lines and the end of its log.
    pub(crate) fn fail(&self, why: &str) -> ! {
        let lines: Vec<String> = self
            .last_lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        panic!(
            "peer {}: {why}\nlast progress lines:\n{}\n{}",
            self.name,
            lines.join("\n"),
            self.log_tail(30)
        );
    }
}

impl Drop for SwarmPeer {
    fn drop(&mut self) {
        if !self.killed {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One `GET` over HTTP/1.0 (so no chunked answers), bounded by [`HTTP_PATIENCE`]: the status
/// code and body.
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_PATIENCE)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let deadline = Instant::now() + HTTP_PATIENCE;
    stream
        .set_write_timeout(Some(HTTP_PATIENCE))
        .and_then(|()| stream.set_read_timeout(Some(HTTP_PATIENCE)))
        .map_err(|e| format!("{addr}: {e}"))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")
        .map_err(|e| format!("cannot send GET {path} to {addr}: {e}"))?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if Instant::now() > deadline {
            return Err(format!(
                "GET {path} on {addr}: no full answer in {HTTP_PATIENCE:?}"
            ));
        }
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("GET {path} on {addr}: {e}")),
        }
    }
    let text = String::from_utf8(answer).map_err(|e| format!("{addr}{path}: not UTF-8: {e}"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}{path}: no header end in {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("{addr}{path}: bad status line in {head:?}"))?;
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err(format!(
            "{addr}{path}: chunked answer to an HTTP/1.0 request"
        ));
    }
    Ok((status, body.to_owned()))
}

/// A free TCP port on 127.0.0.1 (bound, read and released; another process could take it
/// in between, which a test then reports as a failure to start).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

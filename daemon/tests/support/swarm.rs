//! A real local swarm for integration tests that watch peers from outside: N `murmur run`
//! peers on loopback, each serving its metrics endpoint, killed when dropped.
//!
//! Built on `run_support` (the test binary must declare `mod run_support;`): the folder comes
//! from [`Swarm`] and each peer is a [`RunningPeer`] whose config asks for
//! `[metrics] listen = "127.0.0.1:0"`. Peer 0 starts first; the others bootstrap from the
//! listen address in its `ready` line. This module adds what watching needs: each peer's
//! metrics address, bounded HTTP GETs of `/status` and `/metrics`, and a wait until every
//! peer lists every other. Every wait has a deadline.
//!
//! Include it with `#[path = "support/swarm.rs"] mod swarm;`.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

pub(crate) use crate::run_support::exclusive;
use crate::run_support::{PeerSettings, RunningPeer, Swarm};

/// How long one HTTP request may take, connect to last byte.
pub(crate) const HTTP_PATIENCE: Duration = Duration::from_secs(10);
/// How long a killed peer may take to be reaped.
const REAP_PATIENCE: Duration = Duration::from_secs(10);

/// What a test chooses about its swarm; the rest is `run_support`'s fast loopback config.
#[derive(Debug, Clone)]
pub(crate) struct SwarmSpec {
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
            peers: 3,
            mode: "sgp".into(),
            codec: "int8:64".into(),
            heartbeat_interval_ms: 1_000,
            steps: 0,
            eval_every_steps: 5,
        }
    }
}

/// A running swarm; every peer is killed when it is dropped.
#[derive(Debug)]
pub(crate) struct LocalSwarm {
    /// The peers, in start order; peer 0 is everyone's bootstrap.
    pub(crate) peers: Vec<SwarmPeer>,
    spec: SwarmSpec,
    // Dropped after the peers (fields drop in order), so no peer outlives its folder.
    _folder: Swarm,
}

impl LocalSwarm {
    /// Creates the swarm folder and starts every peer, waiting for each one's `ready` line.
    pub(crate) fn start(spec: &SwarmSpec) -> LocalSwarm {
        assert!(spec.peers >= 1, "a swarm needs a peer");
        let folder = Swarm::create();
        let mut settings = PeerSettings {
            steps: spec.steps,
            eval_every_steps: spec.eval_every_steps,
            mode: spec.mode.clone(),
            codec: Some(spec.codec.clone()),
            heartbeat_interval_ms: spec.heartbeat_interval_ms,
            metrics: true,
            ..PeerSettings::default()
        };
        let mut peers = Vec::with_capacity(spec.peers);
        for index in 0..spec.peers {
            let dir = folder.add_peer(&format!("p{index}"));
            dir.write_config(&settings);
            let mut running = dir.start();
            let ready = running.ready();
            let metrics_addr = ready.json["metrics_addr"]
                .as_str()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| {
                    running.fail(&format!("no metrics_addr in the ready line {}", ready.json))
                });
            if index == 0 {
                let first = ready.json["listen"][0].as_str();
                let first = first.unwrap_or_else(|| running.fail("peer 0 listens nowhere"));
                settings.bootstrap = vec![first.to_owned()];
            }
            peers.push(SwarmPeer {
                name: dir.name.clone(),
                peer_id: dir.peer_id.clone(),
                metrics_addr,
                running,
                killed: false,
            });
        }
        LocalSwarm {
            peers,
            spec: spec.clone(),
            _folder: folder,
        }
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

/// One running peer of a [`LocalSwarm`], with its metrics endpoint.
#[derive(Debug)]
pub(crate) struct SwarmPeer {
    /// A short name for messages (`p0`, `p1`, …).
    pub(crate) name: String,
    /// The peer id `murmur init` printed.
    pub(crate) peer_id: String,
    /// Where it serves `/metrics`, `/status` and `/healthz`.
    pub(crate) metrics_addr: SocketAddr,
    running: RunningPeer,
    killed: bool,
}

impl SwarmPeer {
    /// SIGKILL: the process dies at once, without leaving or handing anything off.
    pub(crate) fn kill_hard(&mut self) {
        self.running.kill_hard();
        self.running.wait_exit(REAP_PATIENCE);
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
        let log = self.running.log();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("--- {} log tail ---\n{}", self.name, tail.join("\n"))
    }

    /// Panics with `why`, its last progress lines read and the end of its log.
    pub(crate) fn fail(&self, why: &str) -> ! {
        self.running.fail(why)
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

/// The `/metrics` page of the peer whose metrics listen on `addr`; panics with the answer
/// otherwise.
pub(crate) fn scrape(addr: SocketAddr) -> String {
    match http_get(addr, "/metrics") {
        Ok((200, body)) => body,
        Ok((code, body)) => panic!("GET /metrics answered {code}: {body}"),
        Err(e) => panic!("{e}"),
    }
}

/// The value of `series` (its name and labels as the page writes them) in a metrics page;
/// 0 when the page does not have it.
pub(crate) fn metric(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// A free TCP port on 127.0.0.1 (bound, read and released; another process could take it
/// in between, which a test then reports as a failure to start).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

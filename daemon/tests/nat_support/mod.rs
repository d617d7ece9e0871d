//! The NAT network's three members (`murmur_netns::nat`): a public member serving as a
//! relay and two behind home routers, each bootstrapping from the public one; and what the
//! NAT tests read from them (`/status`, `/metrics`, log times).

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use murmur_netns::nat::{NatHost, NatNetwork};
use serde_json::Value;

use crate::run_support::{PeerDir, PeerSettings, RunningPeer, Swarm};

/// How long the members may take to start, learn their reachability, reserve and meet.
pub(crate) const PATIENCE: Duration = Duration::from_secs(90);
/// How often `/status` is read while waiting.
pub(crate) const POLL: Duration = Duration::from_millis(250);

/// `[net] reachability_probe_interval_ms` of the members unless a test says otherwise:
/// AutoNAT's first probe comes after half of it.
pub(crate) const PROBE_INTERVAL_MS: u64 = 2_000;

/// Settings shared by the three members: fast probes (every `probe_interval_ms`) and DHT
/// walks, `/status` served.
pub(crate) fn settings(
    network: &NatNetwork,
    host: NatHost,
    port: u16,
    bootstrap: Vec<String>,
    probe_interval_ms: u64,
) -> PeerSettings {
    let address = network.address(host);
    PeerSettings {
        namespace: Some(network.namespace(host)),
        // QUIC, and TCP for where UDP is blocked.
        listen_addrs: vec![
            format!("/ip4/{address}/udp/{port}/quic-v1"),
            format!("/ip4/{address}/tcp/{port}"),
        ],
        bootstrap,
        metrics: true,
        net_keys: vec![
            ("reachability_probe_interval_ms", probe_interval_ms),
            ("dht_refresh_interval_ms", 2_000),
        ],
        ..PeerSettings::default()
    }
}

/// The three members running on `network`, the relay first.
pub(crate) struct Members {
    pub(crate) relay: (RunningPeer, std::net::SocketAddr),
    pub(crate) private: Vec<(RunningPeer, std::net::SocketAddr, PeerDir)>,
}

pub(crate) fn start(network: &NatNetwork, swarm: &Swarm) -> Members {
    start_in_mode(network, swarm, "sgp", "")
}

/// The relay serves with `relay_keys` added to its `[net.relay]` table.
pub(crate) fn start_in_mode(
    network: &NatNetwork,
    swarm: &Swarm,
    mode: &str,
    relay_keys: &str,
) -> Members {
    start_with(
        network,
        swarm,
        mode,
        relay_keys,
        0,
        &|_| String::new(),
        PROBE_INTERVAL_MS,
    )
}

/// The same, each member stopping after `steps` (0: until stopped), member `i` (0 the
/// relay) with `tables(i)` added to its config, every member probing its reachability every
/// `probe_interval_ms`.
pub(crate) fn start_with(
    network: &NatNetwork,
    swarm: &Swarm,
    mode: &str,
    relay_keys: &str,
    steps: u64,
    tables: &dyn Fn(u8) -> String,
    probe_interval_ms: u64,
) -> Members {
    let relay_dir = swarm.add_peer("relay");
    let mut relay_settings = settings(
        network,
        NatHost::Public,
        7000,
        Vec::new(),
        probe_interval_ms,
    );
    relay_settings.extra = format!("\n[net.relay]\nserve = true\n{relay_keys}{}", tables(0));
    relay_settings.mode = mode.to_owned();
    relay_settings.steps = steps;
    relay_dir.write_config(&relay_settings);
    let mut relay = relay_dir.start();
    let ready = relay.ready();
    let relay_addrs: Vec<String> = ready.json["listen"]
        .as_array()
        .expect("the relay's listen addresses")
        .iter()
        .filter_map(|a| Some(a.as_str()?.to_owned()))
        .collect();
    let relay_metrics = ready.metrics_addr();
    let mut private = Vec::new();
    for n in 1..=2u8 {
        let host = NatHost::Private(n);
        let dir = swarm.add_peer(&format!("private{n}"));
        dir.write_config(&PeerSettings {
            mode: mode.to_owned(),
            steps,
            extra: tables(n),
            ..settings(
                network,
                host,
                7000 + u16::from(n),
                relay_addrs.clone(),
                probe_interval_ms,
            )
        });
        let mut peer = dir.start();
        let metrics = peer.ready().metrics_addr();
        private.push((peer, metrics, dir));
    }
    Members {
        relay: (relay, relay_metrics),
        private,
    }
}

pub(crate) fn status(network: &NatNetwork, host: NatHost, addr: std::net::SocketAddr) -> Value {
    let body = network
        .http_get(host, addr, "/status", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("/status of {host:?}: {e}"));
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/status of {host:?}: {e}: {body}"))
}

/// The value of the first sample of `/metrics` whose line starts with `series`.
pub(crate) fn metric(
    network: &NatNetwork,
    host: NatHost,
    addr: std::net::SocketAddr,
    series: &str,
) -> f64 {
    let body = network
        .http_get(host, addr, "/metrics", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("/metrics of {host:?}: {e}"));
    body.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or(0.0)
}

/// The time of day, in seconds, of the first log line holding `needle` (log lines start
/// with an RFC 3339 UTC timestamp).
pub(crate) fn log_time(log: &str, needle: &str) -> Option<f64> {
    let line = log.lines().find(|l| l.contains(needle))?;
    let clock = line
        .split_whitespace()
        .next()?
        .split('T')
        .nth(1)?
        .trim_end_matches('Z');
    let mut parts = clock.split(':');
    let hours: f64 = parts.next()?.parse().ok()?;
    let minutes: f64 = parts.next()?.parse().ok()?;
    let seconds: f64 = parts.next()?.parse().ok()?;
    Some(hours * 3600.0 + minutes * 60.0 + seconds)
}

/// Waits until `host`'s `/status` says `reachability`: AutoNAT's verdict comes a probe or
/// two after start, later when a member it asks is busy with another dial-back.
pub(crate) fn wait_reachability(
    network: &NatNetwork,
    host: NatHost,
    addr: std::net::SocketAddr,
    reachability: &str,
) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let s = status(network, host, addr);
        if s["reachability"] == reachability {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{host:?} is not {reachability}: {s}"
        );
        std::thread::sleep(POLL);
    }
}

pub(crate) fn count(status: &Value, kind: &str) -> u64 {
    status["connections"][kind].as_u64().unwrap_or(0)
}

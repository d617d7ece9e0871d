//! Volunteers behind NATs, with real `murmur run` processes in network namespaces (see
//! `murmur_netns::nat`): a public member serves as a relay; two members sit behind home
//! routers that masquerade, each bootstrapping from the public one.
//!
//! - Cone NAT: AutoNAT finds both private members private, they take reservations on the
//!   relay, meet through it, and DCUtR turns their relayed connection into a direct one
//!   within 10 s; the relayed connection closes and their tensors go directly (the hub's
//!   counter of router-to-router bytes grows by megabytes) while the relay opens no further
//!   circuit. The public member finds itself public.
//! - Symmetric NAT: the hole punch fails and is counted, the members stay on the relay and
//!   still train together.
//!
//! Needs root, `ip` and `nft` (`scripts/setup.sh` installs nftables); fails, not skips,
//! without them, like the other namespace tests.

mod run_support;

use std::time::{Duration, Instant};

use murmur_netns::nat::{NatHost, NatKind, NatNetwork};
use run_support::{PeerDir, PeerSettings, RunningPeer, Swarm, exclusive};
use serde_json::Value;

/// How long the members may take to start, learn their reachability, reserve and meet.
const PATIENCE: Duration = Duration::from_secs(90);
/// The longest a hole punch may take after the two private members first connect through
/// the relay.
const PUNCH_WITHIN: Duration = Duration::from_secs(10);
/// How often `/status` is read while waiting.
const POLL: Duration = Duration::from_millis(250);
/// Direct router-to-router bytes the private members must exchange after the hole punch.
const MIN_DIRECT_BYTES: u64 = 1 << 20;

/// Settings shared by the three members: fast probes and DHT walks, `/status` served.
fn settings(
    network: &NatNetwork,
    host: NatHost,
    listen: String,
    bootstrap: Vec<String>,
) -> PeerSettings {
    PeerSettings {
        namespace: Some(network.namespace(host)),
        listen_addrs: vec![listen],
        bootstrap,
        metrics: true,
        net_keys: vec![
            ("reachability_probe_interval_ms", 2_000),
            ("dht_refresh_interval_ms", 2_000),
        ],
        ..PeerSettings::default()
    }
}

/// The three members running on `network`, the relay first.
struct Members {
    relay: (RunningPeer, std::net::SocketAddr),
    private: Vec<(RunningPeer, std::net::SocketAddr, PeerDir)>,
}

fn start(network: &NatNetwork, swarm: &Swarm) -> Members {
    let relay_dir = swarm.add_peer("relay");
    let public = network.address(NatHost::Public);
    let mut relay_settings = settings(
        network,
        NatHost::Public,
        format!("/ip4/{public}/udp/7000/quic-v1"),
        Vec::new(),
    );
    relay_settings.extra = "\n[net.relay]\nserve = true\n".to_owned();
    relay_dir.write_config(&relay_settings);
    let mut relay = relay_dir.start();
    let ready = relay.ready();
    let relay_addr = ready.listen();
    let relay_metrics = ready.metrics_addr();
    let mut private = Vec::new();
    for n in 1..=2u8 {
        let host = NatHost::Private(n);
        let dir = swarm.add_peer(&format!("private{n}"));
        let address = network.address(host);
        dir.write_config(&settings(
            network,
            host,
            format!("/ip4/{address}/udp/700{n}/quic-v1"),
            vec![relay_addr.clone()],
        ));
        let mut peer = dir.start();
        let metrics = peer.ready().metrics_addr();
        private.push((peer, metrics, dir));
    }
    Members {
        relay: (relay, relay_metrics),
        private,
    }
}

fn status(network: &NatNetwork, host: NatHost, addr: std::net::SocketAddr) -> Value {
    let body = network
        .http_get(host, addr, "/status", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("/status of {host:?}: {e}"));
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/status of {host:?}: {e}: {body}"))
}

fn count(status: &Value, kind: &str) -> u64 {
    status["connections"][kind].as_u64().unwrap_or(0)
}

#[test]
fn behind_cone_nats_members_meet_through_the_relay_then_connect_directly() {
    let _serial = exclusive();
    let network = NatNetwork::build(NatKind::Cone).expect("the NAT network");
    let swarm = Swarm::create();
    let mut members = start(&network, &swarm);
    let hosts = [NatHost::Private(1), NatHost::Private(2)];

    // Each private member: private, then relayed to the other, then hole-punched.
    let deadline = Instant::now() + PATIENCE;
    let mut met: [Option<Instant>; 2] = [None, None];
    let mut punched: [Option<Instant>; 2] = [None, None];
    while punched.iter().any(Option::is_none) {
        if Instant::now() > deadline {
            for (peer, _, _) in &members.private {
                eprintln!("--- {} log:\n{}", peer.name, peer.log());
            }
            panic!("no hole punch within {PATIENCE:?}: met {met:?}, punched {punched:?}");
        }
        for (i, (_, metrics, _)) in members.private.iter().enumerate() {
            let s = status(&network, hosts[i], *metrics);
            if met[i].is_none() && (count(&s, "relayed") > 0 || count(&s, "hole_punched") > 0) {
                met[i] = Some(Instant::now());
            }
            if punched[i].is_none() && count(&s, "hole_punched") > 0 {
                punched[i] = Some(Instant::now());
                assert_eq!(s["reachability"], "private", "{s}");
            }
        }
        std::thread::sleep(POLL);
    }
    let first_met = met.iter().flatten().min().copied().expect("they met");
    let last_punch = punched
        .iter()
        .flatten()
        .max()
        .copied()
        .expect("they punched");
    let took = last_punch.saturating_duration_since(first_met);
    eprintln!("hole punch {took:?} after the members met through the relay");
    assert!(took <= PUNCH_WITHIN, "the hole punch took {took:?}");

    let relay_status = status(&network, NatHost::Public, members.relay.1);
    if relay_status["reachability"] != "public" {
        eprintln!("--- relay log:\n{}", members.relay.0.log());
    }
    assert_eq!(relay_status["reachability"], "public", "{relay_status}");

    // From now on their tensors go directly: the hub sees router-to-router bytes, the
    // relayed connections are gone, and the relay opens no new circuit.
    let circuits = |network: &NatNetwork, members: &Members| {
        let body = network
            .http_get(
                NatHost::Public,
                members.relay.1,
                "/metrics",
                Duration::from_secs(5),
            )
            .expect("the relay's /metrics");
        body.lines()
            .find(|l| l.starts_with("murmur_net_relay_accepted_total{request=\"circuit\"}"))
            .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let circuits_before = circuits(&network, &members);
    let direct_before = network.direct_private_bytes().expect("the hub's counter");
    let watch_until = Instant::now() + Duration::from_secs(30);
    let mut direct = 0;
    while Instant::now() < watch_until {
        direct = network.direct_private_bytes().expect("the hub's counter") - direct_before;
        if direct >= MIN_DIRECT_BYTES {
            break;
        }
        std::thread::sleep(POLL);
    }
    assert!(
        direct >= MIN_DIRECT_BYTES,
        "only {direct} bytes went router to router in 30 s"
    );
    for (i, (_, metrics, _)) in members.private.iter().enumerate() {
        let s = status(&network, hosts[i], *metrics);
        assert_eq!(count(&s, "relayed"), 0, "{s}");
        assert!(count(&s, "hole_punched") >= 1, "{s}");
    }
    assert_eq!(circuits(&network, &members), circuits_before);
    for (peer, _, _) in &mut members.private {
        peer.drain();
        assert!(peer.step() > 0, "{} took no step", peer.name);
    }
}

#[test]
fn behind_symmetric_nats_the_hole_punch_fails_and_the_relay_carries_training() {
    let _serial = exclusive();
    let network = NatNetwork::build(NatKind::Symmetric).expect("the NAT network");
    let swarm = Swarm::create();
    let mut members = start(&network, &swarm);
    let hosts = [NatHost::Private(1), NatHost::Private(2)];

    let deadline = Instant::now() + PATIENCE;
    let mut failed = false;
    while !failed {
        if Instant::now() > deadline {
            for (peer, _, _) in &members.private {
                eprintln!("--- {} log:\n{}", peer.name, peer.log());
            }
            panic!("no failed hole punch reported within {PATIENCE:?}");
        }
        for (i, (_, metrics, _)) in members.private.iter().enumerate() {
            let body = network
                .http_get(hosts[i], *metrics, "/metrics", Duration::from_secs(5))
                .expect("/metrics");
            failed |= body.lines().any(|l| {
                l.starts_with("murmur_net_hole_punches_total{result=\"failed\"}")
                    && !l.ends_with(" 0")
            });
        }
        std::thread::sleep(POLL);
    }
    // Both still train with both others: heartbeats from two peers, steps going on, and
    // the relayed connection kept.
    for (i, (peer, metrics, _)) in members.private.iter_mut().enumerate() {
        peer.wait_for("both other members", PATIENCE, |l| {
            l.is("progress") && l.u64("peers") == 2
        });
        let s = status(&network, hosts[i], *metrics);
        assert_eq!(s["reachability"], "private", "{s}");
        assert_eq!(count(&s, "hole_punched"), 0, "{s}");
    }
    let relay_status = status(&network, NatHost::Public, members.relay.1);
    assert!(
        relay_status["connections"]["direct"].as_u64().unwrap_or(0) >= 2,
        "{relay_status}"
    );
}

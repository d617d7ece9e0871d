//! The `[net.relay]` keys acting on real `murmur run` processes behind NATs (the network of
//! `run_nat.rs`: a public relay and two members behind masquerading routers).
//!
//! - `reserve = "always"`: the members reserve on the relay as soon as they meet it, and
//!   meet each other through it before AutoNAT has said anything (with `auto`, as in
//!   `run_nat.rs`, only once found private).
//! - `reserve = "never"`: members found private take no reservation, so they cannot reach
//!   each other.
//! - `max_reservations` and `max_circuit_duration_ms` on the relay: it grants one of two
//!   reservations (the other member, refused, asks again only every `RESERVE_RETRY`, 10 s),
//!   and ends each relayed connection after its time, which the members then open again.
//!
//! Needs root, `ip` and `nft`; fails, not skips, without them.

mod nat_support;
mod run_support;

use std::time::{Duration, Instant};

use murmur_netns::nat::{NatHost, NatKind, NatNetwork};
use nat_support::{PATIENCE, PROBE_INTERVAL_MS, metric, start_with, status, wait_reachability};
use run_support::{Swarm, exclusive};

/// How long the relay keeps a relayed connection open in the limits test.
const CIRCUIT_MS: u64 = 2_000;
/// How long the watch lasts in the reserve and limits tests.
const WATCH: Duration = Duration::from_secs(12);

fn reserve(mode: &'static str) -> impl Fn(u8) -> String {
    move |n| {
        if n == 0 {
            String::new()
        } else {
            format!("\n[net.relay]\nreserve = \"{mode}\"\n")
        }
    }
}

fn relay_series(request: &str) -> String {
    format!("murmur_net_relay_accepted_total{{request=\"{request}\"}}")
}

#[test]
fn with_reserve_always_members_meet_through_the_relay_before_any_verdict() {
    let _serial = exclusive();
    let network = NatNetwork::build(NatKind::Cone).expect("the NAT network");
    let swarm = Swarm::create();
    // A long probe interval puts AutoNAT's first probe 15 s after start.
    let mut members = start_with(
        &network,
        &swarm,
        "sgp",
        "",
        0,
        &reserve("always"),
        86_400_000,
    );
    let started = Instant::now();
    let (peer, metrics, _) = &mut members.private[0];
    peer.wait_for("both other members", PATIENCE, |l| {
        l.is("progress") && l.u64("peers") == 2
    });
    let s = status(&network, NatHost::Private(1), *metrics);
    eprintln!(
        "met the other private member {:.1} s after start; reachability {}",
        started.elapsed().as_secs_f64(),
        s["reachability"]
    );
    assert_eq!(s["reachability"], "unknown", "{s}");
    let granted = metric(
        &network,
        NatHost::Public,
        members.relay.1,
        &relay_series("reservation"),
    );
    assert!(granted >= 1.0, "the relay granted {granted} reservations");
}

#[test]
fn with_reserve_never_members_found_private_stay_out_of_reach_of_each_other() {
    let _serial = exclusive();
    let network = NatNetwork::build(NatKind::Cone).expect("the NAT network");
    let swarm = Swarm::create();
    let mut members = start_with(
        &network,
        &swarm,
        "sgp",
        "",
        0,
        &reserve("never"),
        PROBE_INTERVAL_MS,
    );
    for (i, (_, metrics, _)) in members.private.iter().enumerate() {
        wait_reachability(&network, NatHost::Private(i as u8 + 1), *metrics, "private");
    }
    let until = Instant::now() + WATCH;
    let (peer, _, _) = &mut members.private[0];
    let mut lines = 0;
    while Instant::now() < until {
        let line = peer.wait_for("a progress line", PATIENCE, |l| l.is("progress"));
        assert_eq!(
            line.u64("peers"),
            1,
            "private1 met private2 without a reservation"
        );
        lines += 1;
    }
    assert!(lines >= 5, "{lines} progress lines in {WATCH:?}");
    let granted = metric(
        &network,
        NatHost::Public,
        members.relay.1,
        &relay_series("reservation"),
    );
    assert_eq!(granted, 0.0, "the relay granted a reservation");
}

#[test]
fn a_relay_grants_max_reservations_and_ends_circuits_at_max_circuit_duration() {
    let _serial = exclusive();
    let network = NatNetwork::build(NatKind::Symmetric).expect("the NAT network");
    let swarm = Swarm::create();
    let relay_keys = format!("max_reservations = 1\nmax_circuit_duration_ms = {CIRCUIT_MS}\n");
    let no_tables = |_| String::new();
    let mut members = start_with(
        &network,
        &swarm,
        "sgp",
        &relay_keys,
        0,
        &no_tables,
        PROBE_INTERVAL_MS,
    );
    for (i, (_, metrics, _)) in members.private.iter().enumerate() {
        wait_reachability(&network, NatHost::Private(i as u8 + 1), *metrics, "private");
    }
    let both_private = Instant::now();
    // The member without a reservation dials the other through the relay.
    let (peer, _, _) = &mut members.private[0];
    peer.wait_for("both other members", PATIENCE, |l| {
        l.is("progress") && l.u64("peers") == 2
    });
    let relay_at = members.relay.1;
    let circuits = || {
        metric(
            &network,
            NatHost::Public,
            relay_at,
            &relay_series("circuit"),
        )
    };
    let before = circuits();
    std::thread::sleep(WATCH);
    let after = circuits();
    let granted = metric(
        &network,
        NatHost::Public,
        relay_at,
        &relay_series("reservation"),
    );
    let watched = both_private.elapsed();
    let relay_log = members.relay.0.log();
    let refused = relay_log.matches("relay reservation refused").count();
    eprintln!(
        "reservations granted {granted}, refused {refused} in {:.1} s; circuits {before} -> {after} in {WATCH:?}",
        watched.as_secs_f64()
    );
    assert_eq!(granted, 1.0, "max_reservations = 1");
    assert!(refused >= 1, "the second reservation was refused");
    // Asked again every 10 s at most, from before both were found private (the first
    // verdict) until now.
    let most = 2 + (watched.as_secs() / 10) as usize;
    assert!(
        refused <= most,
        "refused {refused} times, at most {most} expected"
    );
    let expected = (WATCH.as_millis() as u64 / CIRCUIT_MS / 2) as f64;
    assert!(
        after - before >= expected,
        "{} circuits opened in {WATCH:?}; connections ended every {CIRCUIT_MS} ms give at least {expected}",
        after - before
    );
}

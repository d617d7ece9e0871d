//! Revocation between real `murmur run` processes: the organizer's `murmur swarm revoke`,
//! written to one member's `swarm.revocation_file` while the swarm trains, cuts the revoked
//! volunteer off from every member, the ones that never read the file included.

#[path = "support/member.rs"]
mod member;
#[path = "../../gossip/tests/net_support/mod.rs"]
mod net_support;
mod run_support;
#[path = "support/swarm.rs"]
mod swarm;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use member::{Member, peer_id_of, wall_ms};
use net_support::heartbeat;
use run_support::{PeerSettings, Swarm};
use swarm::{exclusive, metric, scrape};

/// How long the three peers may take to start and see each other.
const PATIENCE: Duration = Duration::from_secs(120);
/// How long a written list may take to reach every member and close the connections:
/// a second to notice the file, gossip, and the refusal grace before a connection closes.
const CUT_OFF_WITHIN: Duration = Duration::from_secs(20);

/// The peers' heartbeat interval (the harness's default).
const HEARTBEAT_INTERVAL_S: f64 = 0.5;

/// Seconds since midnight of a log line's RFC 3339 timestamp (`2026-11-27T07:43:59.477Z …`).
fn seconds_of_day(line: &str) -> f64 {
    let clock = line
        .split_once('T')
        .and_then(|(_, rest)| rest.split_once('Z'))
        .map(|(clock, _)| clock)
        .unwrap_or_else(|| panic!("no timestamp in {line:?}"));
    clock
        .split(':')
        .map(|part| {
            part.parse::<f64>()
                .unwrap_or_else(|_| panic!("bad time in {line:?}"))
        })
        .fold(0.0, |total, part| total * 60.0 + part)
}

#[test]
fn a_revoked_volunteer_is_cut_off_by_every_member_though_one_read_the_list() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let first = swarm.add_peer("p0");
    first.write_config(&PeerSettings {
        revocation_file: Some("revocations".to_owned()),
        ..PeerSettings::default()
    });
    let mut p0 = first.start();
    let address = p0.ready().listen();
    let joiner = PeerSettings {
        bootstrap: vec![address],
        ..PeerSettings::default()
    };
    let (second, third) = (swarm.add_peer("p1"), swarm.add_peer("p2"));
    second.write_config(&joiner);
    third.write_config(&joiner);
    let mut p1 = second.start();
    let mut p2 = third.start();
    for peer in [&mut p0, &mut p1, &mut p2] {
        peer.wait_for("both other peers", PATIENCE, |l| {
            l.is("progress") && l.u64("peers") >= 2
        });
    }

    let out = swarm.revoke(&[&third.peer_id], &first.dir.join("revocations"));
    assert!(out.contains("revokes 1 peer"), "{out}");

    // p1 never saw the file: it learns the list from p0's gossip. Both refuse p2 within
    // two heartbeat intervals of the first adoption.
    let refusal = |log: &str| {
        log.lines()
            .find(|l| l.contains("peer not authorized") && l.contains(&third.peer_id))
            .map(str::to_owned)
    };
    let mut refused_at = Vec::new();
    for (peer, name) in [(&p0, "p0"), (&p1, "p1")] {
        let log = peer.log_once("the revoked peer refused", CUT_OFF_WITHIN, |log| {
            log.contains("revocation list adopted") && refusal(log).is_some()
        });
        let line = refusal(&log).unwrap_or_default();
        assert!(
            line.contains("revoked it"),
            "{name} refused it otherwise: {line}"
        );
        refused_at.push(seconds_of_day(&line));
    }
    let adopted_line = p0
        .log()
        .lines()
        .find(|l| l.contains("revocation list adopted"))
        .map(str::to_owned)
        .unwrap_or_default();
    let adopted_at = seconds_of_day(&adopted_line);
    let slowest = refused_at.iter().fold(0f64, |m, &t| m.max(t - adopted_at));
    println!("every member refused the revoked peer {slowest:.3} s after the first adoption");
    assert!(
        slowest <= 2.0 * HEARTBEAT_INTERVAL_S,
        "the last member refused it {slowest:.3} s after the first adoption"
    );
    p2.wait_for("no peer left", CUT_OFF_WITHIN, |l| {
        l.is("progress") && l.u64("peers") == 0
    });
    for peer in [&mut p0, &mut p1] {
        peer.wait_for("only the other member left", CUT_OFF_WITHIN, |l| {
            l.is("progress") && l.u64("peers") == 1
        });
    }
    // Redials (the bootstrap address stays in p2's config) do not bring it back.
    let watched_from = p2.seen.len();
    std::thread::sleep(Duration::from_secs(5));
    p2.drain();
    let back = p2.seen[watched_from..]
        .iter()
        .filter(|l| l.is("progress"))
        .any(|l| l.u64("peers") > 0);
    assert!(!back, "the revoked peer got back in:\n{}", p2.log());
}

/// Heartbeats of `peer`'s (at `metrics`) refused because the revocation list names their
/// signer.
fn refused_revoked(metrics: SocketAddr) -> f64 {
    let series = "murmur_net_heartbeats_refused_total{reason=\"revoked\"}";
    metric(&scrape(metrics), series)
}

/// Two `murmur run` members hold different lists of the same serial, so neither adopts the
/// other's: p0's revokes a member r that p1's does not. r (run in the test process) is
/// admitted by p1 and publishes heartbeats, which p1 relays to p0: p0 refuses them and
/// counts them as revoked.
#[test]
fn a_revoked_members_heartbeats_relayed_by_another_member_are_refused_and_counted() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let revoked = peer_id_of(79);
    let first = swarm.add_peer("p0");
    let second = swarm.add_peer("p1");
    let out = swarm.revoke(&[&revoked], &first.dir.join("revocations"));
    assert!(out.contains("revokes 1 peer"), "{out}");
    let out = swarm.revoke(&[&peer_id_of(80)], &second.dir.join("revocations"));
    assert!(out.contains("revokes 1 peer"), "{out}");
    first.write_config(&PeerSettings {
        metrics: true,
        revocation_file: Some("revocations".to_owned()),
        ..PeerSettings::default()
    });
    let mut p0 = first.start();
    let ready = p0.ready();
    let (metrics, address) = (ready.metrics_addr(), ready.listen());
    second.write_config(&PeerSettings {
        bootstrap: vec![address],
        revocation_file: Some("revocations".to_owned()),
        ..PeerSettings::default()
    });
    let mut p1 = second.start();
    let p1_address = p1.ready().listen();
    for peer in [&mut p0, &mut p1] {
        peer.wait_for("the other member", PATIENCE, |l| {
            l.is("progress") && l.u64("peers") >= 1
        });
    }

    let r = Member::join(&swarm, &second, 79, &p1_address);
    r.admitted_by(&second.peer_id, Duration::from_secs(20));
    let deadline = Instant::now() + CUT_OFF_WITHIN;
    let mut step = 0;
    while refused_revoked(metrics) < 1.0 {
        assert!(
            Instant::now() < deadline,
            "p0 refused none of r's heartbeats as revoked within {CUT_OFF_WITHIN:?}"
        );
        step += 1;
        let _ = r
            .runtime
            .block_on(r.handle.publish_heartbeat(&heartbeat(step, wall_ms())));
        std::thread::sleep(Duration::from_millis(100));
    }
    p0.drain();
    assert!(
        p0.seen
            .iter()
            .filter(|l| l.is("progress"))
            .all(|l| l.u64("peers") <= 1),
        "p0 counted r as a member"
    );
    r.shutdown();
}

//! Stale and replayed heartbeats against a real `murmur run` peer: a member run by this test
//! (an in-process network with an invite from the swarm's authority) publishes fresh
//! heartbeats until the peer accepts one, then one 65 s old, one 65 s ahead, and one with
//! the fresh one's timestamp (a replay). The peer refuses the three and counts them by
//! reason, and still accepts a fresh heartbeat after them.

#[path = "support/member.rs"]
mod member;
#[path = "../../gossip/tests/net_support/mod.rs"]
mod net_support;
mod run_support;
#[path = "support/swarm.rs"]
mod swarm;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use member::{Member, wall_ms};
use murmur_protocol::message::HeartbeatBody;
use net_support::heartbeat as body;
use run_support::{PeerSettings, Swarm};
use swarm::{exclusive, metric, scrape};

/// The peer's `net.max_heartbeat_age_ms` (the default).
const MAX_AGE_MS: u64 = 60_000;
/// How long the peer may take to accept a heartbeat (the gossip mesh forms first).
const HEARD_WITHIN: Duration = Duration::from_secs(30);

/// The peer's heartbeats accepted, and refused as stale and as replayed.
fn counters(addr: SocketAddr) -> [f64; 3] {
    let page = scrape(addr);
    [
        "murmur_net_heartbeats_received_total",
        "murmur_net_heartbeats_refused_total{reason=\"stale\"}",
        "murmur_net_heartbeats_refused_total{reason=\"replayed\"}",
    ]
    .map(|series| metric(&page, series))
}

/// Publishes `body` from `member`, retried while no gossip peer takes it (at most 10 s).
fn publish(member: &Member, body: &HeartbeatBody) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while member
        .runtime
        .block_on(member.handle.publish_heartbeat(body))
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the heartbeat was never published"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the counters reach `at_least` each, and a little longer for any count past
/// it to show; the counters then.
fn counted(addr: SocketAddr, at_least: [f64; 3], within: Duration, what: &str) -> [f64; 3] {
    let deadline = Instant::now() + within;
    loop {
        let now = counters(addr);
        if now.iter().zip(&at_least).all(|(now, least)| now >= least) {
            std::thread::sleep(Duration::from_millis(300));
            return counters(addr);
        }
        assert!(Instant::now() < deadline, "{what}: counters {now:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn stale_future_and_replayed_heartbeats_are_refused_and_counted_by_a_running_peer() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let dir = swarm.add_peer("victim");
    dir.write_config(&PeerSettings {
        metrics: true,
        ..PeerSettings::default()
    });
    let mut peer = dir.start();
    let ready = peer.ready();
    let (metrics, listen) = (ready.metrics_addr(), ready.listen());

    // A member of the same swarm, invited by its authority, in this process.
    let member = Member::join(&swarm, &dir, 77, &listen);

    // Fresh heartbeats until the peer accepts one of the member's.
    let before = counters(metrics);
    let first_ts = wall_ms();
    let deadline = Instant::now() + HEARD_WITHIN;
    let mut step = 1;
    let accepted = loop {
        publish(&member, &body(step, first_ts + step));
        let now = counters(metrics);
        if now[0] > before[0] {
            break now;
        }
        assert!(Instant::now() < deadline, "no heartbeat accepted: {now:?}");
        step += 1;
        std::thread::sleep(Duration::from_millis(100));
    };

    let now = wall_ms();
    publish(&member, &body(1_000, now - MAX_AGE_MS - 5_000));
    publish(&member, &body(1_001, now + MAX_AGE_MS + 5_000));
    // Not after the last accepted timestamp (at most `first_ts + step`).
    publish(&member, &body(1_002, first_ts));
    publish(&member, &body(1_003, wall_ms() + 1_000));
    // Fresh heartbeats published before the first was counted may still arrive; they are
    // accepted, and say nothing of the refusals, so those are waited for too.
    let after = counted(
        metrics,
        [accepted[0] + 1.0, accepted[1] + 2.0, accepted[2] + 1.0],
        Duration::from_secs(10),
        "the refused ones and the fresh heartbeat after them",
    );
    assert_eq!(
        after[1] - accepted[1],
        2.0,
        "the old and the far-future one: {after:?}"
    );
    assert_eq!(after[2] - accepted[2], 1.0, "the replay: {after:?}");
    member.shutdown();
}

//! Stale and replayed heartbeats are dropped and counted: a heartbeat counts only if its
//! timestamp is within `net.max_heartbeat_age_ms` of the receiver's clock and after the last
//! one accepted from its signer.

#[path = "net_support/mod.rs"]
mod support;

use std::time::Duration;

use murmur_gossip::net::{NetEvent, NetHandle};
use murmur_protocol::message::HeartbeatBody;
use support::{Authority, InviteKind, connect, heartbeat as body, wall_ms};
use tokio::sync::broadcast;

/// The receivers' `net.max_heartbeat_age_ms` (the default).
const MAX_AGE_MS: u64 = 60_000;

/// The step of the next heartbeat after step `after` that `events` reports within
/// `within`, if any (late copies of earlier ones are skipped).
async fn next_heartbeat_step(
    events: &mut broadcast::Receiver<NetEvent>,
    after: u64,
    within: Duration,
) -> Option<u64> {
    tokio::time::timeout(within, async {
        loop {
            match events.recv().await {
                Ok(NetEvent::Heartbeat { body, .. }) if body.step > after => {
                    return Some(body.step);
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// Publishes from `from` until it goes out (the receiver's subscription may still be on
/// its way), at most 10 s.
async fn publish(from: &NetHandle, body: &HeartbeatBody) {
    let published = tokio::time::timeout(Duration::from_secs(10), async {
        while from.publish_heartbeat(body).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(published.is_ok(), "the heartbeat was never published");
}

/// A fresh heartbeat counts; one older than the bound, one as far ahead, and one with the
/// timestamp of the last accepted one (a replay) are dropped and counted by reason; a fresh
/// one after them still counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_future_and_replayed_heartbeats_are_dropped_and_counted() {
    let authority = Authority::new();
    let (a, _a_in) = authority.spawn(1, InviteKind::Valid).await;
    let (b, _b_in) = authority.spawn(2, InviteKind::Valid).await;
    let mut events = a.subscribe();
    connect(&b, &a).await;

    // A first fresh heartbeat, retried until a hears one (the mesh forms first).
    let first_ts = wall_ms();
    let mut heard = None;
    for attempt in 0..100u64 {
        publish(&b, &body(1, first_ts + attempt)).await;
        heard = next_heartbeat_step(&mut events, 0, Duration::from_millis(100)).await;
        if heard.is_some() {
            break;
        }
    }
    assert_eq!(heard, Some(1), "a fresh heartbeat counts");
    let accepted = a.metrics().snapshot();

    let now = wall_ms();
    publish(&b, &body(2, now - MAX_AGE_MS - 5_000)).await;
    publish(&b, &body(3, now + MAX_AGE_MS + 5_000)).await;
    // The last accepted timestamp is at most `first_ts + 99`; this one is not after it.
    publish(&b, &body(4, first_ts)).await;
    publish(&b, &body(5, wall_ms() + 1_000)).await;

    assert_eq!(
        next_heartbeat_step(&mut events, 1, Duration::from_secs(5)).await,
        Some(5),
        "the fresh heartbeat after the refused ones counts, and none of those did"
    );
    let after = a.metrics().snapshot();
    assert_eq!(
        after.heartbeats_refused_stale - accepted.heartbeats_refused_stale,
        2,
        "the old and the far-future heartbeat: {after:?}"
    );
    assert_eq!(
        after.heartbeats_refused_replayed - accepted.heartbeats_refused_replayed,
        1,
        "the replay: {after:?}"
    );
    for handle in [a, b] {
        handle.shutdown().await.expect("shutdown");
    }
}

/// Two heartbeats stamped in one millisecond by [`NetHandle::heartbeat_timestamp`] (a
/// peer's state can change twice within one) both count: the second is stamped a
/// millisecond later, so the newer state is not refused as a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_stamped_in_one_millisecond_both_count() {
    let authority = Authority::new();
    let (a, _a_in) = authority.spawn(1, InviteKind::Valid).await;
    let (b, _b_in) = authority.spawn(2, InviteKind::Valid).await;
    let mut events = a.subscribe();
    connect(&b, &a).await;

    let mut heard = None;
    for _ in 0..100 {
        publish(&b, &body(1, b.heartbeat_timestamp(wall_ms()))).await;
        heard = next_heartbeat_step(&mut events, 0, Duration::from_millis(100)).await;
        if heard.is_some() {
            break;
        }
    }
    assert_eq!(heard, Some(1), "a fresh heartbeat counts");
    let before = a.metrics().snapshot();

    let now = wall_ms();
    let (first, second) = (b.heartbeat_timestamp(now), b.heartbeat_timestamp(now));
    assert!(second > first, "{first} then {second}");
    publish(&b, &body(2, first)).await;
    publish(&b, &body(3, second)).await;
    let within = Duration::from_secs(5);
    assert_eq!(next_heartbeat_step(&mut events, 1, within).await, Some(2));
    assert_eq!(
        next_heartbeat_step(&mut events, 2, within).await,
        Some(3),
        "the second heartbeat of the millisecond counts too"
    );
    let after = a.metrics().snapshot();
    assert_eq!(
        after.heartbeats_refused_replayed,
        before.heartbeats_refused_replayed
    );
    for handle in [a, b] {
        handle.shutdown().await.expect("shutdown");
    }
}

//! Bans: a peer refused for its invite `net.ban_after_refusals` times is kept out until its
//! backoff ends, and the counters show it.

#[path = "net_support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use murmur_gossip::net::{self, NetHandle, NetMetricsSnapshot};
use support::{Authority, InviteKind, address_of};

/// The victim's `net.ban_backoff_ms`.
const BACKOFF: Duration = Duration::from_secs(4);
/// How long one dial may take to be judged.
const JUDGED_WITHIN: Duration = Duration::from_secs(5);
/// Between redials.
const REDIAL_EVERY: Duration = Duration::from_millis(100);

fn snapshot(handle: &NetHandle) -> NetMetricsSnapshot {
    handle.metrics().snapshot()
}

/// Dials `to` from `from` every [`REDIAL_EVERY`] (a dial while still connected does
/// nothing) until `done` holds of `to`'s counters; panics after [`JUDGED_WITHIN`].
async fn dial_until(
    from: &NetHandle,
    to: &NetHandle,
    what: &str,
    done: impl Fn(&NetMetricsSnapshot) -> bool,
) {
    let addr: libp2p::Multiaddr = address_of(to).await.parse().expect("multiaddr");
    let deadline = Instant::now() + JUDGED_WITHIN;
    while !done(&snapshot(to)) {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {JUDGED_WITHIN:?}: {:?}; dialer {:?}",
            snapshot(to),
            snapshot(from)
        );
        let _ = from.dial(addr.clone()).await;
        tokio::time::sleep(REDIAL_EVERY).await;
    }
}

/// Three refusals for a bad invite ban the peer: while the backoff runs, its dials are
/// closed as they open (counted as `connections_refused_banned`) and never reach the
/// invite check again (`auth_rejected` stays at 3). Once the backoff has run out, its next
/// dial is judged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_refused_three_times_is_kept_out_until_its_backoff_ends() {
    let authority = Authority::new();
    let (mut config, identity) = authority.config(1, InviteKind::Valid);
    config.ban_after_refusals = 3;
    config.ban_backoff_ms = u64::try_from(BACKOFF.as_millis()).expect("small");
    let (victim, _victim_in) = net::spawn(&config, identity).await.expect("network starts");
    let (bad, _bad_in) = authority.spawn(2, InviteKind::WrongAuthority).await;

    for refusals in 1..=3 {
        dial_until(&bad, &victim, "a refusal for the invite", |s| {
            s.auth_rejected >= refusals
        })
        .await;
    }
    let banned_at = Instant::now();
    let at_ban = snapshot(&victim);
    assert_eq!(
        (at_ban.auth_rejected, at_ban.peers_banned),
        (3, 1),
        "{at_ban:?}"
    );

    // While banned: refused as it connects, never judged again.
    dial_until(&bad, &victim, "a connection refused for the ban", |s| {
        s.connections_refused_banned >= 1
    })
    .await;
    let watch_until = banned_at + BACKOFF - Duration::from_millis(500);
    let addr: libp2p::Multiaddr = address_of(&victim).await.parse().expect("multiaddr");
    while Instant::now() < watch_until {
        let _ = bad.dial(addr.clone()).await;
        tokio::time::sleep(REDIAL_EVERY).await;
    }
    let during = snapshot(&victim);
    assert_eq!(
        during.auth_rejected, 3,
        "the banned peer reached the invite check again: {during:?}"
    );
    assert!(during.connections_refused_banned >= 2, "{during:?}");

    // After the backoff: judged again (and, refused once more, banned for twice as long).
    tokio::time::sleep((banned_at + BACKOFF).saturating_duration_since(Instant::now())).await;
    dial_until(&bad, &victim, "a refusal after the ban", |s| {
        s.auth_rejected >= 4
    })
    .await;
    assert_eq!(snapshot(&victim).peers_banned, 2);
    for handle in [victim, bad] {
        handle.shutdown().await.expect("shutdown");
    }
}

//! Bans between real `murmur run` processes: a volunteer holding an invite from another
//! authority bootstraps from a member and redials it every 5 s while alone. After
//! `net.ban_after_refusals` (3) refusals the member bans it: until the ban's backoff ends,
//! every redial is closed as banned, without being judged (or let in) again, as the
//! member's counters show.

mod run_support;
#[path = "support/swarm.rs"]
mod swarm;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use run_support::{PeerSettings, Swarm};
use swarm::{exclusive, metric, scrape};

/// How long the outsider may take to be refused three times: three redials 5 s apart, and
/// the time to start.
const BANNED_WITHIN: Duration = Duration::from_secs(60);
/// How long the ban is watched: two more redials at least, within the 60 s backoff.
const WATCH: Duration = Duration::from_secs(16);

/// The member's counters the test reads: bans started, invites refused, connections closed
/// as banned, peers let in.
fn counters(addr: SocketAddr) -> [f64; 4] {
    let page = scrape(addr);
    [
        "murmur_net_peers_banned_total",
        "murmur_net_auth_rejections_total",
        "murmur_net_connections_refused_total{reason=\"banned\"}",
        "murmur_net_peers_authorized_total",
    ]
    .map(|series| metric(&page, series))
}

#[test]
fn a_volunteer_refused_three_times_is_not_judged_or_let_in_again_before_its_ban_ends() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let first = swarm.add_peer("member");
    first.write_config(&PeerSettings {
        metrics: true,
        net_keys: vec![("ban_after_refusals", 3), ("ban_backoff_ms", 60_000)],
        ..PeerSettings::default()
    });
    let mut member = first.start();
    let ready = member.ready();
    let (metrics, listen) = (ready.metrics_addr(), ready.listen());

    // Same swarm id, another authority: its invite never verifies here.
    let elsewhere = Swarm::create();
    let outsider_dir = elsewhere.add_peer("outsider");
    outsider_dir.write_config(&PeerSettings {
        bootstrap: vec![listen],
        ..PeerSettings::default()
    });
    let mut outsider = outsider_dir.start();
    outsider.ready();

    let deadline = Instant::now() + BANNED_WITHIN;
    let at_ban = loop {
        let now = counters(metrics);
        if now[0] >= 1.0 {
            break now;
        }
        if Instant::now() > deadline {
            member.fail(&format!(
                "no ban within {BANNED_WITHIN:?}; counters {now:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(at_ban[1] >= 3.0, "banned before 3 refusals: {at_ban:?}");

    std::thread::sleep(WATCH);
    let after = counters(metrics);
    assert_eq!(
        after[0], 1.0,
        "a second ban started within the backoff: {after:?}"
    );
    assert_eq!(
        after[1], at_ban[1],
        "the banned outsider was judged again within its backoff: {at_ban:?} then {after:?}"
    );
    assert!(
        after[2] >= at_ban[2] + 2.0,
        "its redials were not closed as banned: {at_ban:?} then {after:?}"
    );
    assert_eq!(after[3], 0.0, "somebody was let in: {after:?}");
    outsider.drain();
    assert!(
        outsider.last_progress().is_none_or(|l| l.u64("peers") == 0),
        "the outsider saw a peer"
    );
}

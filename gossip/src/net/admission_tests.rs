use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use libp2p::PeerId;
use libp2p::swarm::ConnectionId;

use super::{AdmissionLimits, AdmissionRefusal, AdmissionTable, MAX_BAN_FACTOR};

const BACKOFF: Duration = Duration::from_secs(60);

fn table() -> AdmissionTable {
    AdmissionTable::new(AdmissionLimits {
        pending_per_ip: 2,
        established_per_ip: 3,
        ban_after_refusals: 3,
        ban_backoff: BACKOFF,
    })
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

fn conn(n: usize) -> ConnectionId {
    ConnectionId::new_unchecked(n)
}

/// One address filling its handshake slots leaves another address's slots free, and a
/// slot frees when its handshake ends.
#[test]
fn pending_handshakes_are_bounded_per_source_address() {
    let mut t = table();
    let (attacker, joiner) = (ip(2), ip(1));
    assert!(t.pending_incoming(conn(1), attacker).is_ok());
    assert!(t.pending_incoming(conn(2), attacker).is_ok());
    assert!(matches!(
        t.pending_incoming(conn(3), attacker),
        Err(AdmissionRefusal::PendingPerSource { limit: 2, .. })
    ));
    assert!(t.pending_incoming(conn(4), joiner).is_ok());
    t.connection_gone(conn(1));
    assert_eq!(t.pending_from(attacker), 1);
    assert!(t.pending_incoming(conn(5), attacker).is_ok());
}

/// IPv6 sources are counted per /64: one host's addresses share its handshake slots, a
/// neighbouring /64 has its own, and an IPv4-mapped address counts as its IPv4. Refusals
/// name the network.
#[test]
fn ipv6_handshakes_are_bounded_per_64_network() {
    let mut t = table();
    let v6 = |s: &str| IpAddr::V6(s.parse::<Ipv6Addr>().unwrap());
    assert!(t.pending_incoming(conn(1), v6("2001:db8:1:2::1")).is_ok());
    assert!(
        t.pending_incoming(conn(2), v6("2001:db8:1:2:ffff::7"))
            .is_ok()
    );
    let refused = t.pending_incoming(conn(3), v6("2001:db8:1:2:abcd::9"));
    let Err(refusal) = refused else {
        panic!("a third handshake of the /64 is let in");
    };
    assert!(
        refusal
            .to_string()
            .starts_with("2001:db8:1:2::/64 already has 2"),
        "{refusal}"
    );
    assert!(t.pending_incoming(conn(4), v6("2001:db8:1:3::1")).is_ok());
    assert_eq!(t.pending_from(v6("2001:db8:1:2::42")), 2);
    assert!(t.pending_incoming(conn(5), v6("::ffff:127.0.0.9")).is_ok());
    assert_eq!(t.pending_from(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9))), 1);
}

/// Established incoming connections are bounded per address; a handshake that finishes
/// leaves the pending count, and a closed connection frees its place.
#[test]
fn established_connections_are_bounded_per_source_address() {
    let mut t = table();
    let now = Instant::now();
    let source = ip(2);
    for n in 0..3 {
        assert!(t.pending_incoming(conn(n), source).is_ok());
        let peer = PeerId::random();
        assert!(
            t.established_incoming(conn(n), peer, Some(source), now)
                .is_ok()
        );
    }
    assert_eq!(t.pending_from(source), 0);
    let refused = t.established_incoming(conn(9), PeerId::random(), Some(source), now);
    assert!(matches!(
        refused,
        Err(AdmissionRefusal::EstablishedPerSource { limit: 3, .. })
    ));
    t.connection_gone(conn(0));
    assert!(
        t.established_incoming(conn(10), PeerId::random(), Some(source), now)
            .is_ok()
    );
}

/// The third refusal for an invite bans the peer for the backoff; the ban ends on time,
/// and each later refusal doubles it up to the cap.
#[test]
fn a_peer_refused_three_times_is_banned_with_a_doubling_backoff() {
    let mut t = table();
    let now = Instant::now();
    let peer = PeerId::random();
    assert_eq!(t.refused_for_invite(peer, now), None);
    assert_eq!(t.refused_for_invite(peer, now), None);
    assert!(t.check_ban(peer, now).is_ok());
    assert_eq!(t.refused_for_invite(peer, now), Some(BACKOFF));
    assert!(matches!(
        t.check_ban(peer, now + BACKOFF - Duration::from_millis(1)),
        Err(AdmissionRefusal::Banned { .. })
    ));
    assert!(t.check_ban(peer, now + BACKOFF).is_ok());
    assert_eq!(t.refused_for_invite(peer, now), Some(BACKOFF * 2));
    for _ in 0..20 {
        t.refused_for_invite(peer, now);
    }
    assert_eq!(
        t.refused_for_invite(peer, now),
        Some(BACKOFF * MAX_BAN_FACTOR)
    );
    // A banned peer is refused however it arrives.
    assert!(matches!(
        t.established_incoming(conn(1), peer, Some(ip(1)), now),
        Err(AdmissionRefusal::Banned { .. })
    ));
}

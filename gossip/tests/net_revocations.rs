//! Revocation lists: the authority revokes an invited member; every member cuts it off,
//! though only one of them was given the list, and it cannot get back in.

#[path = "net_support/mod.rs"]
mod support;

use std::time::Duration;

use murmur_gossip::net::{self, NetHandle};
use murmur_protocol::identity::{Keypair, MAX_REVOKED, PeerId, Revocations, SwarmId};
use support::{Authority, InviteKind, SWARM, address_of, connect, eventually, heartbeat, wall_ms};

/// Long enough for a list to be gossiped and a connection closed after its refusal grace.
const WITHIN: Duration = Duration::from_secs(10);

async fn ready_peers(handle: &NetHandle) -> Vec<PeerId> {
    handle.peers().await.unwrap_or_default()
}

/// a, b and c are members, all connected. a alone is handed a list revoking c: a closes
/// c's connection, gossips the list, and b, which never saw it otherwise, adopts it and
/// closes c's connection too. c's later dial to b is refused at the invite check. Older
/// lists and lists signed by another key change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_member_is_cut_off_by_every_member_though_only_one_was_given_the_list() {
    let authority = Authority::new();
    let (a, _a_in) = authority.spawn(1, InviteKind::Valid).await;
    let (b, _b_in) = authority.spawn(2, InviteKind::Valid).await;
    let (c, _c_in) = authority.spawn(3, InviteKind::Valid).await;
    connect(&b, &a).await;
    connect(&c, &a).await;
    connect(&c, &b).await;
    let (b_id, c_id) = (b.local_peer_id(), c.local_peer_id());
    eventually(
        WITHIN,
        "a and b have admitted c, and a has admitted b",
        || {
            let (a, b) = (a.clone(), b.clone());
            async move {
                let (at_a, at_b) = (ready_peers(&a).await, ready_peers(&b).await);
                at_a.contains(&c_id) && at_a.contains(&b_id) && at_b.contains(&c_id)
            }
        },
    )
    .await;
    // b must be on a's revocation topic before a publishes; its admission schedules a
    // republish anyway, so either way the list reaches it.
    // The longest list there is (c and 1,023 other keys, about 33 KiB) must cross gossip.
    let mut revoked: Vec<PeerId> = (0..MAX_REVOKED as u32 - 1)
        .map(|i| {
            let mut seed = [0u8; 32];
            seed[..4].copy_from_slice(&i.to_le_bytes());
            seed[31] = 1;
            Keypair::from_seed(seed).peer_id()
        })
        .collect();
    revoked.push(c_id);
    assert_eq!(
        a.adopt_revocations(authority.revoke(2, &revoked))
            .await
            .ok(),
        Some(true)
    );
    eventually(WITHIN, "a and b both drop c", || {
        let (a, b) = (a.clone(), b.clone());
        async move {
            !ready_peers(&a).await.contains(&c_id) && !ready_peers(&b).await.contains(&c_id)
        }
    })
    .await;
    for (name, handle) in [("a", &a), ("b", &b)] {
        let m = handle.metrics().snapshot();
        assert_eq!(m.revocation_lists_adopted, 1, "{name}: {m:?}");
        assert!(m.peers_refused_revoked >= 1, "{name}: {m:?}");
    }
    assert!(
        ready_peers(&a).await.contains(&b_id),
        "a kept b, which is not revoked"
    );

    // c comes back: refused at b's invite check.
    let refused_before = b.metrics().snapshot().auth_rejected;
    let b_addr: libp2p::Multiaddr = address_of(&b).await.parse().expect("multiaddr");
    eventually(WITHIN, "b refuses c's new connection", || {
        let (b, c, addr) = (b.clone(), c.clone(), b_addr.clone());
        async move {
            let _ = c.dial(addr).await;
            b.metrics().snapshot().auth_rejected > refused_before
        }
    })
    .await;
    assert!(!ready_peers(&b).await.contains(&c_id));

    // A replayed older list (one that named nobody) does not lift the revocation.
    assert_eq!(
        a.adopt_revocations(authority.revoke(1, &[])).await.ok(),
        Some(false)
    );
    // Nor does a newer one signed by another key.
    let forged = Revocations::issue(
        &Keypair::from_seed([77; 32]),
        &SwarmId::new(SWARM).expect("swarm id"),
        9,
        Vec::new(),
    )
    .expect("a list");
    assert!(a.adopt_revocations(forged).await.is_err());
    assert_eq!(a.metrics().snapshot().revocation_lists_adopted, 1);
    for handle in [a, b, c] {
        handle.shutdown().await.expect("shutdown");
    }
}

/// A member whose `revocation_file` is written while it runs reads it within a second or
/// two and closes the revoked peer's connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_written_to_the_revocation_file_takes_effect_while_running() {
    let authority = Authority::new();
    let dir = std::env::temp_dir().join(format!("murmur-revocations-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp folder");
    let file = dir.join("revocations");
    let _ = std::fs::remove_file(&file);
    let (mut config, identity) = authority.config(1, InviteKind::Valid);
    config.revocation_file = Some(file.clone());
    let (a, _a_in) = net::spawn(&config, identity).await.expect("network starts");
    let (b, _b_in) = authority.spawn(2, InviteKind::Valid).await;
    connect(&b, &a).await;
    let b_id = b.local_peer_id();
    eventually(WITHIN, "a admits b", || {
        let a = a.clone();
        async move { ready_peers(&a).await.contains(&b_id) }
    })
    .await;
    // Not a list: reported, and nothing changes.
    std::fs::write(&file, b"not a list").expect("write");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(ready_peers(&a).await.contains(&b_id));
    std::fs::write(&file, authority.revoke(1, &[b_id]).encode()).expect("write");
    eventually(WITHIN, "a drops b", || {
        let a = a.clone();
        async move { !ready_peers(&a).await.contains(&b_id) }
    })
    .await;
    assert_eq!(a.metrics().snapshot().revocation_lists_adopted, 1);
    let _ = std::fs::remove_dir_all(&dir);
    for handle in [a, b] {
        handle.shutdown().await.expect("shutdown");
    }
}

/// a holds a list revoking r; b holds another list of the same serial, so neither adopts
/// the other's and b keeps r. r and c (not revoked) are connected to b, which relays their
/// heartbeats to a: a counts c's, and refuses and counts r's as revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_signers_heartbeat_relayed_by_a_member_is_refused_and_counted() {
    let authority = Authority::new();
    let (a, _a_in) = authority.spawn(11, InviteKind::Valid).await;
    let (b, _b_in) = authority.spawn(12, InviteKind::Valid).await;
    let (r, _r_in) = authority.spawn(13, InviteKind::Valid).await;
    let (c, _c_in) = authority.spawn(14, InviteKind::Valid).await;
    let (b_id, r_id, c_id) = (b.local_peer_id(), r.local_peer_id(), c.local_peer_id());
    let nobody = Keypair::from_seed([99; 32]).peer_id();
    assert_eq!(
        a.adopt_revocations(authority.revoke(5, &[r_id])).await.ok(),
        Some(true)
    );
    assert_eq!(
        b.adopt_revocations(authority.revoke(5, &[nobody]))
            .await
            .ok(),
        Some(true)
    );
    connect(&b, &a).await;
    connect(&r, &b).await;
    connect(&c, &b).await;
    eventually(
        WITHIN,
        "b has admitted r and c, and a has admitted b",
        || {
            let (a, b) = (a.clone(), b.clone());
            async move {
                let at_b = ready_peers(&b).await;
                at_b.contains(&r_id)
                    && at_b.contains(&c_id)
                    && ready_peers(&a).await.contains(&b_id)
            }
        },
    )
    .await;

    let mut events = a.subscribe();
    let (mut heard_c, mut heard_r) = (false, false);
    let deadline = tokio::time::Instant::now() + WITHIN;
    let mut step = 0;
    while tokio::time::Instant::now() < deadline
        && !(heard_c && a.metrics().snapshot().heartbeats_refused_revoked >= 1)
    {
        step += 1;
        let _ = r.publish_heartbeat(&heartbeat(step, wall_ms())).await;
        let _ = c.publish_heartbeat(&heartbeat(step, wall_ms())).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        while let Ok(event) = events.try_recv() {
            if let net::NetEvent::Heartbeat { peer, .. } = event {
                heard_c |= peer == c_id;
                heard_r |= peer == r_id;
            }
        }
    }
    assert!(
        heard_c,
        "a never heard c's heartbeats through b: the relay did not work"
    );
    assert!(!heard_r, "a counted a heartbeat of the revoked r");
    let refused = a.metrics().snapshot().heartbeats_refused_revoked;
    assert!(
        refused >= 1,
        "a did not count r's relayed heartbeats as revoked"
    );
    assert!(
        !ready_peers(&a).await.contains(&r_id),
        "a admitted the revoked r"
    );
    for handle in [a, b, r, c] {
        handle.shutdown().await.expect("shutdown");
    }
}

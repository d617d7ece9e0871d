//! Nothing for strangers: a libp2p client that connects to a member without an invite gets
//! no member's peer id or address from Kademlia, no listen address from identify, and no
//! invite (no hello), until the member closes the connection at its auth deadline.

#[path = "net_support/stranger.rs"]
mod stranger;
#[path = "net_support/mod.rs"]
mod support;

use std::time::Duration;

use libp2p::PeerId;
use support::{Authority, InviteKind, SWARM, address_of, connect, eventually};

/// Longer than the members' `net.auth_timeout_ms` (3 s) and the refusal grace after it.
const WATCH: Duration = Duration::from_secs(6);

/// Two members that know each other; a stranger connects to one of them, asks its DHT for
/// the other and for a random key, and listens. It learns nothing, and the member closes
/// its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_gets_no_member_address_listen_address_or_invite() {
    let authority = Authority::new();
    let (a, _a_in) = authority.spawn(1, InviteKind::Valid).await;
    let (b, _b_in) = authority.spawn(2, InviteKind::Valid).await;
    connect(&b, &a).await;
    let b_id = b.local_peer_id();
    eventually(Duration::from_secs(10), "a's DHT holds b", || {
        let a = a.clone();
        async move { a.known_peers().await.unwrap_or_default().contains(&b_id) }
    })
    .await;
    let a_id = PeerId::from_bytes(&a.local_peer_id().to_bytes()).expect("peer id");
    let b_libp2p = PeerId::from_bytes(&b_id.to_bytes()).expect("peer id");
    let mut a_addr: libp2p::Multiaddr = address_of(&a).await.parse().expect("multiaddr");
    a_addr.pop();

    let learned = stranger::probe(SWARM, a_id, a_addr, b_libp2p, WATCH).await;
    learned.assert_nothing(b_libp2p);
    for handle in [a, b] {
        handle.shutdown().await.expect("shutdown");
    }
}

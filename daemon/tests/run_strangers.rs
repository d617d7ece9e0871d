//! Nothing for strangers, against real `murmur run` processes: a libp2p client with no
//! invite connects to a training member, asks its Kademlia for the other member and for a
//! random key, and listens. It gets no member's peer id or address, no listen address from
//! identify and no hello (no invite), and the member closes its connection at the auth
//! deadline.

mod run_support;
#[path = "../../gossip/tests/net_support/stranger.rs"]
mod stranger;

use std::time::Duration;

use libp2p::{Multiaddr, PeerId};
use run_support::{PeerSettings, SWARM_ID, Swarm, exclusive};

/// How long the two members may take to start and see each other.
const PATIENCE: Duration = Duration::from_secs(120);
/// Longer than the members' `net.auth_timeout_ms` (5 s by default) and the refusal grace
/// after it.
const WATCH: Duration = Duration::from_secs(9);

#[test]
fn a_stranger_learns_no_member_address_or_invite_from_a_running_member() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let first = swarm.add_peer("p0");
    first.write_config(&PeerSettings::default());
    let mut p0 = first.start();
    let listen = p0.ready().listen();
    let second = swarm.add_peer("p1");
    second.write_config(&PeerSettings {
        bootstrap: vec![listen.clone()],
        ..PeerSettings::default()
    });
    let mut p1 = second.start();
    for peer in [&mut p0, &mut p1] {
        peer.wait_for("the other member", PATIENCE, |l| {
            l.is("progress") && l.u64("peers") == 1
        });
    }

    let member: PeerId = first.peer_id.parse().expect("p0's peer id");
    let other: PeerId = second.peer_id.parse().expect("p1's peer id");
    let mut address: Multiaddr = listen.parse().expect("a multiaddr");
    address.pop();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let learned = runtime.block_on(stranger::probe(SWARM_ID, member, address, other, WATCH));
    learned.assert_nothing(other);
}

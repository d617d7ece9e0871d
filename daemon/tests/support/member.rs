//! A member of a test swarm run inside the test process: an in-process network with an
//! invite the swarm's authority signed, for tests that play a misbehaving member against a
//! real `murmur run` peer.

#![allow(dead_code)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use murmur_gossip::net::{self, NetConfig, NetHandle, NetIdentity, NetInbound};
use murmur_protocol::identity::{Invite, Keypair, SwarmId};

use super::run_support::{PeerDir, SWARM_ID, Swarm};

/// Milliseconds since the Unix epoch.
pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The peer id of the member started with `seed`.
pub(crate) fn peer_id_of(seed: u8) -> String {
    NetIdentity::from_seed([seed; 32]).peer_id().to_string()
}

/// The member's network, the runtime its tasks run on, and what reaches it.
pub(crate) struct Member {
    pub(crate) runtime: tokio::runtime::Runtime,
    pub(crate) handle: NetHandle,
    pub(crate) inbound: NetInbound,
}

impl Member {
    /// Starts a member of `swarm` (whose peer `dir` names the authority) invited for an
    /// hour, and dials `peer_address` (a `/p2p` multiaddr of a running peer).
    pub(crate) fn join(swarm: &Swarm, dir: &PeerDir, seed: u8, peer_address: &str) -> Member {
        let authority =
            Keypair::load_file(swarm.root().join("authority.key")).expect("the authority key");
        let identity = NetIdentity::from_seed([seed; 32]);
        let now_s = wall_ms() / 1000;
        let invite = Invite::issue(
            &authority,
            &identity.peer_id(),
            &SwarmId::new(SWARM_ID).expect("a swarm id"),
            now_s - 60,
            now_s + 3600,
        )
        .expect("an invite")
        .encode();
        let config = NetConfig {
            swarm_id: SWARM_ID.to_owned(),
            authority: dir.authority().to_owned(),
            invite,
            listen_addrs: vec!["/ip4/127.0.0.1/udp/0/quic-v1".to_owned()],
            gossip_mesh_interval_ms: 200,
            ..NetConfig::default()
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let (handle, inbound) = runtime
            .block_on(net::spawn(&config, identity))
            .expect("the member's network starts");
        runtime
            .block_on(handle.dial(peer_address.parse().expect("a multiaddr")))
            .expect("dial starts");
        Member {
            runtime,
            handle,
            inbound,
        }
    }

    /// Waits (at most `within`) until the peer with `peer_id` admitted this member.
    pub(crate) fn admitted_by(&self, peer_id: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let peers = self
                .runtime
                .block_on(self.handle.peers())
                .unwrap_or_default();
            if peers.iter().any(|p| p.to_string() == peer_id) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not admitted by {peer_id} in {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(crate) fn shutdown(self) {
        self.runtime
            .block_on(self.handle.shutdown())
            .expect("the member shuts down");
    }
}

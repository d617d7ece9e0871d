//! Shared set-up for the network tests: a throwaway swarm authority that issues invites,
//! and configs with short timeouts on loopback.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use murmur_gossip::net::{self, NetConfig, NetHandle, NetIdentity, NetInbound};
use murmur_protocol::identity::{Invite, Keypair, PeerId, Revocations, SwarmId};
use murmur_protocol::message::{AveragingMode, HeartbeatBody};

pub const SWARM: &str = "net-test";

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Milliseconds since the Unix epoch: a fresh heartbeat's timestamp.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A heartbeat of a peer at `step`, stamped `timestamp_ms`.
pub fn heartbeat(step: u64, timestamp_ms: u64) -> HeartbeatBody {
    HeartbeatBody {
        step,
        timestamp_ms,
        samples_per_s: 10.0,
        upload_bytes_per_s: 1_000_000,
        download_bytes_per_s: 1_000_000,
        mode: AveragingMode::Sgp,
        samples_accumulated: 0,
        looking_round: 0,
        looking_until_ms: 0,
        incarnation: 1,
    }
}

/// Which invite a test peer presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InviteKind {
    /// Valid for an hour.
    Valid,
    /// Ran out an hour ago.
    Expired,
    /// Valid, but for another swarm.
    OtherSwarm,
    /// Signed by a key that is not the swarm authority.
    WrongAuthority,
}

/// The swarm authority of a test.
pub struct Authority {
    key: Keypair,
}

impl Authority {
    pub fn new() -> Authority {
        Authority {
            key: Keypair::from_seed([200; 32]),
        }
    }

    pub fn invite(&self, peer: &PeerId, kind: InviteKind) -> Vec<u8> {
        let now = now();
        let (swarm, from, until) = match kind {
            InviteKind::Valid | InviteKind::WrongAuthority => (SWARM, now - 60, now + 3600),
            InviteKind::Expired => (SWARM, now - 7200, now - 3600),
            InviteKind::OtherSwarm => ("other-swarm", now - 60, now + 3600),
        };
        let swarm = SwarmId::new(swarm).expect("valid swarm id");
        let signer = if kind == InviteKind::WrongAuthority {
            Keypair::from_seed([201; 32])
        } else {
            Keypair::from_seed([200; 32])
        };
        Invite::issue(&signer, peer, &swarm, from, until)
            .expect("valid window")
            .encode()
    }

    /// A revocation list of this swarm, signed by this authority.
    pub fn revoke(&self, serial: u64, peers: &[PeerId]) -> Revocations {
        let swarm = SwarmId::new(SWARM).expect("valid swarm id");
        Revocations::issue(&self.key, &swarm, serial, peers.to_vec()).expect("a list")
    }

    /// A config for the peer with `seed`, on 127.0.0.1 (QUIC), with test-sized timeouts.
    pub fn config(&self, seed: u8, kind: InviteKind) -> (NetConfig, NetIdentity) {
        let identity = NetIdentity::from_seed([seed; 32]);
        let config = NetConfig {
            swarm_id: SWARM.to_owned(),
            authority: self.key.peer_id().to_string(),
            invite: self.invite(&identity.peer_id(), kind),
            listen_addrs: vec!["/ip4/127.0.0.1/udp/0/quic-v1".to_owned()],
            auth_timeout_ms: 3_000,
            dht_refresh_interval_ms: 2_000,
            gossip_mesh_interval_ms: 200,
            tensor_read_timeout_ms: 5_000,
            tensor_write_timeout_ms: 5_000,
            ..NetConfig::default()
        };
        (config, identity)
    }

    pub async fn spawn(&self, seed: u8, kind: InviteKind) -> (NetHandle, NetInbound) {
        let (config, identity) = self.config(seed, kind);
        net::spawn(&config, identity).await.expect("network starts")
    }
}

/// The first listen address of `handle`, with `/p2p/<id>` appended.
pub async fn address_of(handle: &NetHandle) -> String {
    let addrs = handle.listen_addrs().await.expect("listen addresses");
    let addr = addrs.first().expect("one listen address");
    format!("{addr}/p2p/{}", handle.local_peer_id())
}

/// Dials `to` from `from`.
pub async fn connect(from: &NetHandle, to: &NetHandle) {
    let addr = address_of(to).await.parse().expect("multiaddr");
    from.dial(addr).await.expect("dial starts");
}

/// Polls `check` every 50 ms until it holds; panics with `what` after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let result = tokio::time::timeout(within, async {
        loop {
            if check().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(result.is_ok(), "not within {within:?}: {what}");
}

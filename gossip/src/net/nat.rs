//! Peers behind a NAT: what this peer knows of its own reachability, the `[net.relay]`
//! settings, and the rule that only members may use a murmur relay.
//!
//! libp2p's own protocols do the work: AutoNAT (v1) asks connected members to dial this
//! peer back and so learns whether it is reachable; circuit relay v2 lets a peer that is
//! not reachable take a reservation on a member that serves as a relay (opt-in,
//! `[net.relay] serve`) and be dialed through it; DCUtR then turns a relayed connection
//! into a direct one by a simultaneous open (hole punching), over QUIC or TCP.
//!
//! A relay carries tensors at its own cost, so it serves members only: every reservation
//! and every circuit is checked against the set of peers whose invite this relay verified
//! ([`MembersOnly`]). A stranger's request is refused with the relay's own refusal and
//! counted (`murmur_net_relay_refused_total`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use libp2p::{Multiaddr, PeerId};
use serde::{Deserialize, Serialize};

use super::metrics::NetMetrics;

/// When this peer takes a reservation on a relaying member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RelayReserve {
    /// Once AutoNAT finds this peer unreachable (private).
    Auto,
    /// On every relaying member it meets, whatever AutoNAT says.
    Always,
    /// Never: a peer that cannot be dialed is reached only by the peers it dials.
    Never,
}

/// The `[net.relay]` table: serving as a relay, and using one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// Serve members as a circuit relay v2. Only for a peer others can dial at its listen
    /// addresses (a public host): those addresses are announced as its external ones.
    pub serve: bool,
    /// When to take a reservation on a relaying member: `auto`, `always` or `never`.
    pub reserve: RelayReserve,
    /// Reservations a relay holds at once, all peers together.
    pub max_reservations: u32,
    /// Relayed connections (circuits) a relay carries at once, all peers together.
    pub max_circuits: u32,
    /// Circuits a relay carries at once for one source peer.
    pub max_circuits_per_peer: u32,
    /// Bytes one circuit may carry, both ways together; the relay closes it past this.
    pub max_circuit_bytes: u64,
    /// How long one circuit may stay open, in milliseconds.
    pub max_circuit_duration_ms: u64,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            serve: false,
            reserve: RelayReserve::Auto,
            max_reservations: 64,
            max_circuits: 16,
            max_circuits_per_peer: 4,
            max_circuit_bytes: 256 * 1024 * 1024,
            max_circuit_duration_ms: 600_000,
        }
    }
}

/// What AutoNAT found about this peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reachability {
    /// No probe has answered yet.
    #[default]
    Unknown,
    /// A member dialed one of this peer's addresses back.
    Public,
    /// Members tried to dial this peer back and could not: it sits behind a NAT or a
    /// firewall, and others reach it only through a relay or a hole punch.
    Private,
}

impl Reachability {
    /// The name `/status` and the metrics use.
    pub fn name(self) -> &'static str {
        match self {
            Reachability::Unknown => "unknown",
            Reachability::Public => "public",
            Reachability::Private => "private",
        }
    }

    /// Every state, in the order the metrics list them.
    pub const ALL: [Reachability; 3] = [
        Reachability::Unknown,
        Reachability::Public,
        Reachability::Private,
    ];

    fn code(self) -> u8 {
        match self {
            Reachability::Unknown => 0,
            Reachability::Public => 1,
            Reachability::Private => 2,
        }
    }

    fn from_code(code: u8) -> Reachability {
        match code {
            1 => Reachability::Public,
            2 => Reachability::Private,
            _ => Reachability::Unknown,
        }
    }
}

/// This peer's reachability, set by the network task and read by anyone.
#[derive(Debug, Default)]
pub(crate) struct SharedReachability(AtomicU8);

impl SharedReachability {
    pub(crate) fn set(&self, reachability: Reachability) {
        self.0.store(reachability.code(), Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> Reachability {
        Reachability::from_code(self.0.load(Ordering::Relaxed))
    }
}

/// The peers whose invite this peer verified: the only ones its relay serves.
#[derive(Debug, Clone, Default)]
pub(crate) struct Members(Arc<Mutex<HashSet<PeerId>>>);

impl Members {
    pub(crate) fn admit(&self, peer: PeerId) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(peer);
    }

    pub(crate) fn remove(&self, peer: &PeerId) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(peer);
    }

    fn contains(&self, peer: &PeerId) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(peer)
    }
}

/// What a relay request asks for, for the refusal counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RelayRequest {
    Reservation,
    Circuit,
}

/// The relay's check of each reservation and circuit: the requester must be a member.
/// libp2p's relay asks its rate limiters before accepting either; this one says no to
/// every peer that has not proven its invite here, and counts the refusal.
pub(crate) struct MembersOnly {
    members: Members,
    request: RelayRequest,
    metrics: Arc<NetMetrics>,
}

impl MembersOnly {
    pub(crate) fn new(
        members: Members,
        request: RelayRequest,
        metrics: Arc<NetMetrics>,
    ) -> MembersOnly {
        MembersOnly {
            members,
            request,
            metrics,
        }
    }
}

impl libp2p::relay::RateLimiter for MembersOnly {
    fn try_next(&mut self, peer: PeerId, addr: &Multiaddr, _now: std::time::Instant) -> bool {
        let member = self.members.contains(&peer);
        if !member {
            self.metrics.relay_refused(self.request);
            tracing::info!(%peer, %addr, request = ?self.request, "relay request from a peer that is not a member refused");
        }
        member
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libp2p::relay::RateLimiter as _;

    #[test]
    fn the_relay_serves_members_only_and_counts_each_refusal() {
        let members = Members::default();
        let metrics = Arc::new(NetMetrics::default());
        let mut reservations = MembersOnly::new(
            members.clone(),
            RelayRequest::Reservation,
            Arc::clone(&metrics),
        );
        let mut circuits =
            MembersOnly::new(members.clone(), RelayRequest::Circuit, Arc::clone(&metrics));
        let member = PeerId::random();
        let stranger = PeerId::random();
        let addr: Multiaddr = "/ip4/10.0.0.1/udp/4001/quic-v1".parse().unwrap();
        let now = std::time::Instant::now();
        members.admit(member);
        assert!(reservations.try_next(member, &addr, now));
        assert!(circuits.try_next(member, &addr, now));
        assert!(!reservations.try_next(stranger, &addr, now));
        assert!(!reservations.try_next(stranger, &addr, now));
        assert!(!circuits.try_next(stranger, &addr, now));
        let snapshot = metrics.snapshot();
        assert_eq!(snapshot.relay_reservations_refused, 2);
        assert_eq!(snapshot.relay_circuits_refused, 1);
        members.remove(&member);
        assert!(!circuits.try_next(member, &addr, now));
    }

    #[test]
    fn reachability_reads_back_what_was_set() {
        let shared = SharedReachability::default();
        assert_eq!(shared.get(), Reachability::Unknown);
        for state in Reachability::ALL {
            shared.set(state);
            assert_eq!(shared.get(), state);
        }
    }

    #[test]
    fn the_relay_table_reads_from_text_and_refuses_unknown_keys() {
        let config: RelayConfig =
            serde_json::from_str(r#"{"serve": true, "reserve": "never", "max_circuits": 3}"#)
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(config.serve);
        assert_eq!(config.reserve, RelayReserve::Never);
        assert_eq!(config.max_circuits, 3);
        assert_eq!(
            config.max_reservations,
            RelayConfig::default().max_reservations
        );
        assert!(serde_json::from_str::<RelayConfig>(r#"{"reserve": "sometimes"}"#).is_err());
        assert!(serde_json::from_str::<RelayConfig>(r#"{"circuits": 3}"#).is_err());
    }
}

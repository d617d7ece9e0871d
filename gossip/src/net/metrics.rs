//! [`NetMetrics`]: counters of what the network layer did and refused.
//!
//! Plain atomics, updated where the event happens and read at any time through
//! [`NetMetrics::snapshot`]; the daemon exports them to Prometheus. Per-peer traffic is
//! accumulated per stream and folded in once, when the stream ends, so the hot path touches
//! only the global counters.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use murmur_protocol::identity::PeerId;

use super::nat::{Reachability, RelayRequest, SharedReachability};

/// Counters of the network layer. Shared by the network task, its handles and every stream.
#[derive(Debug, Default)]
pub struct NetMetrics {
    auth_rejected: AtomicU64,
    auth_timeouts: AtomicU64,
    peers_authorized: AtomicU64,
    tensor_streams_accepted: AtomicU64,
    tensor_streams_refused_unauthorized: AtomicU64,
    tensor_streams_refused_limit: AtomicU64,
    bad_frames: AtomicU64,
    gossip_rejected: AtomicU64,
    heartbeats_refused_uninvited_signer: AtomicU64,
    heartbeats_received: AtomicU64,
    tensor_bytes_sent: AtomicU64,
    tensor_bytes_received: AtomicU64,
    connections_refused_pending_per_ip: AtomicU64,
    connections_refused_per_ip: AtomicU64,
    connections_refused_limit: AtomicU64,
    connections_refused_banned: AtomicU64,
    peers_banned: AtomicU64,
    handshake_timeouts: AtomicU64,
    heartbeats_refused_stale: AtomicU64,
    heartbeats_refused_replayed: AtomicU64,
    heartbeats_refused_revoked: AtomicU64,
    tensor_frames_timed_out: AtomicU64,
    tensor_streams_over_partial_budget: AtomicU64,
    peers_refused_revoked: AtomicU64,
    revocation_lists_adopted: AtomicU64,
    relay_reservations_refused: AtomicU64,
    relay_circuits_refused: AtomicU64,
    relay_reservations_accepted: AtomicU64,
    relay_circuits_accepted: AtomicU64,
    hole_punches_succeeded: AtomicU64,
    hole_punches_failed: AtomicU64,
    relayed_bytes_sent: AtomicU64,
    relayed_bytes_received: AtomicU64,
    connections: ConnectionKinds,
    reachability: SharedReachability,
    per_peer: Mutex<HashMap<PeerId, PeerTraffic>>,
}

/// A copy of every counter at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetMetricsSnapshot {
    /// Connections closed because the peer's invite did not verify (missing, expired, for
    /// another swarm or peer, badly signed), or the peer refused ours.
    pub auth_rejected: u64,
    /// Connections closed because the peer did not prove its invite within
    /// `net.auth_timeout_ms`.
    pub auth_timeouts: u64,
    /// Peers whose invite verified.
    pub peers_authorized: u64,
    /// Inbound tensor streams handed to the application.
    pub tensor_streams_accepted: u64,
    /// Inbound tensor streams dropped unread because their peer was not authorized.
    pub tensor_streams_refused_unauthorized: u64,
    /// Inbound tensor streams dropped unread because a limit or queue was full.
    pub tensor_streams_refused_limit: u64,
    /// Tensor streams closed because the peer sent a bad frame or message.
    pub bad_frames: u64,
    /// Gossip messages rejected (unauthorized forwarder, bad signature, bad body, uninvited
    /// signer).
    pub gossip_rejected: u64,
    /// Heartbeats refused because their signer holds no invite this node has verified and
    /// that is still valid, whoever forwarded them (also counted in `gossip_rejected`).
    pub heartbeats_refused_uninvited_signer: u64,
    /// Heartbeats accepted from gossip.
    pub heartbeats_received: u64,
    /// Tensor frame bytes written, all peers.
    pub tensor_bytes_sent: u64,
    /// Tensor frame bytes read, all peers.
    pub tensor_bytes_received: u64,
    /// Incoming connections closed at once because their source IP already had `net.max_pending_incoming_per_ip` handshakes under way.
    pub connections_refused_pending_per_ip: u64,
    /// Incoming connections closed after their handshake because their source IP already had `net.max_incoming_connections_per_ip` connections.
    pub connections_refused_per_ip: u64,
    /// Incoming connections closed because a limit of all sources together (`net.max_pending_incoming`, `net.max_connections`, `net.max_connections_per_peer`) was reached.
    pub connections_refused_limit: u64,
    /// Connections (incoming or outgoing) closed because their peer is banned after repeated invite refusals.
    pub connections_refused_banned: u64,
    /// Bans started: a peer was refused for its invite `net.ban_after_refusals` times or more.
    pub peers_banned: u64,
    /// Incoming connections dropped because their transport handshake did not finish within `net.handshake_timeout_ms`.
    pub handshake_timeouts: u64,
    /// Heartbeats refused because their timestamp is further than `net.max_heartbeat_age_ms` from this node's clock (also counted in `gossip_rejected`).
    pub heartbeats_refused_stale: u64,
    /// Heartbeats refused because their timestamp is not after the last one accepted from their signer (also counted in `gossip_rejected`).
    pub heartbeats_refused_replayed: u64,
    /// Heartbeats refused because the swarm's revocation list names their signer, whoever forwarded them (also counted in `gossip_rejected`).
    pub heartbeats_refused_revoked: u64,
    /// Tensor streams closed because a frame did not arrive whole within `net.frame_timeout_ms` of its first byte.
    pub tensor_frames_timed_out: u64,
    /// Tensor streams closed because their peer's partial frames would have held more than `net.max_partial_frame_bytes_per_peer`.
    pub tensor_streams_over_partial_budget: u64,
    /// Peers refused or disconnected because the swarm's revocation list names them (also
    /// counted in `auth_rejected`).
    pub peers_refused_revoked: u64,
    /// Revocation lists this node verified and adopted (each newer than the one before),
    /// from `swarm.revocation_file` or from other members.
    pub revocation_lists_adopted: u64,
    /// Relay reservations refused because the requester is not a member.
    pub relay_reservations_refused: u64,
    /// Relay circuits refused because their source is not a member.
    pub relay_circuits_refused: u64,
    /// Relay reservations this peer granted (renewals included).
    pub relay_reservations_accepted: u64,
    /// Relay circuits this peer opened for members.
    pub relay_circuits_accepted: u64,
    /// Relayed connections turned into direct ones by DCUtR.
    pub hole_punches_succeeded: u64,
    /// DCUtR attempts that failed: the peers stay on their relayed connection.
    pub hole_punches_failed: u64,
    /// Bytes this peer wrote on connections through a relay (every stream, framing included).
    pub relayed_bytes_sent: u64,
    /// Bytes this peer read on connections through a relay.
    pub relayed_bytes_received: u64,
    /// Open connections by kind, now.
    pub connections: ConnectionCounts,
    /// What AutoNAT found about this peer, now.
    pub reachability: Reachability,
}

/// Open connections by how they were made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    /// Dialed or accepted directly.
    pub direct: u64,
    /// Direct, made by DCUtR from a relayed connection.
    pub hole_punched: u64,
    /// Through a relay (a `/p2p-circuit` address).
    pub relayed: u64,
}

/// The kinds of connection, counted as they open and close.
#[derive(Debug, Default)]
struct ConnectionKinds {
    direct: AtomicU64,
    hole_punched: AtomicU64,
    relayed: AtomicU64,
}

/// How a connection was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectionKind {
    Direct,
    HolePunched,
    Relayed,
}

/// Tensor bytes exchanged with one peer, over streams that have ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerTraffic {
    /// Bytes written to the peer.
    pub bytes_sent: u64,
    /// Bytes read from the peer.
    pub bytes_received: u64,
}

impl NetMetrics {
    /// Every counter, read now.
    pub fn snapshot(&self) -> NetMetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NetMetricsSnapshot {
            auth_rejected: get(&self.auth_rejected),
            auth_timeouts: get(&self.auth_timeouts),
            peers_authorized: get(&self.peers_authorized),
            tensor_streams_accepted: get(&self.tensor_streams_accepted),
            tensor_streams_refused_unauthorized: get(&self.tensor_streams_refused_unauthorized),
            tensor_streams_refused_limit: get(&self.tensor_streams_refused_limit),
            bad_frames: get(&self.bad_frames),
            gossip_rejected: get(&self.gossip_rejected),
            heartbeats_refused_uninvited_signer: get(&self.heartbeats_refused_uninvited_signer),
            heartbeats_received: get(&self.heartbeats_received),
            tensor_bytes_sent: get(&self.tensor_bytes_sent),
            tensor_bytes_received: get(&self.tensor_bytes_received),
            connections_refused_pending_per_ip: get(&self.connections_refused_pending_per_ip),
            connections_refused_per_ip: get(&self.connections_refused_per_ip),
            connections_refused_limit: get(&self.connections_refused_limit),
            connections_refused_banned: get(&self.connections_refused_banned),
            peers_banned: get(&self.peers_banned),
            handshake_timeouts: get(&self.handshake_timeouts),
            heartbeats_refused_stale: get(&self.heartbeats_refused_stale),
            heartbeats_refused_replayed: get(&self.heartbeats_refused_replayed),
            heartbeats_refused_revoked: get(&self.heartbeats_refused_revoked),
            tensor_frames_timed_out: get(&self.tensor_frames_timed_out),
            tensor_streams_over_partial_budget: get(&self.tensor_streams_over_partial_budget),
            peers_refused_revoked: get(&self.peers_refused_revoked),
            revocation_lists_adopted: get(&self.revocation_lists_adopted),
            relay_reservations_refused: get(&self.relay_reservations_refused),
            relay_circuits_refused: get(&self.relay_circuits_refused),
            relay_reservations_accepted: get(&self.relay_reservations_accepted),
            relay_circuits_accepted: get(&self.relay_circuits_accepted),
            hole_punches_succeeded: get(&self.hole_punches_succeeded),
            hole_punches_failed: get(&self.hole_punches_failed),
            relayed_bytes_sent: get(&self.relayed_bytes_sent),
            relayed_bytes_received: get(&self.relayed_bytes_received),
            connections: ConnectionCounts {
                direct: get(&self.connections.direct),
                hole_punched: get(&self.connections.hole_punched),
                relayed: get(&self.connections.relayed),
            },
            reachability: self.reachability.get(),
        }
    }

    /// What AutoNAT found about this peer, now.
    pub fn reachability(&self) -> Reachability {
        self.reachability.get()
    }

    pub(crate) fn set_reachability(&self, reachability: Reachability) {
        self.reachability.set(reachability);
    }

    pub(crate) fn relay_refused(&self, request: RelayRequest) {
        let counter = match request {
            RelayRequest::Reservation => &self.relay_reservations_refused,
            RelayRequest::Circuit => &self.relay_circuits_refused,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn relay_reservation_accepted(&self) {
        self.relay_reservations_accepted
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn relay_circuit_accepted(&self) {
        self.relay_circuits_accepted.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn hole_punch(&self, succeeded: bool) {
        let counter = if succeeded {
            &self.hole_punches_succeeded
        } else {
            &self.hole_punches_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// `bytes` written (`sent`) or read on a connection through a relay.
    pub(crate) fn relayed(&self, bytes: u64, sent: bool) {
        let counter = if sent {
            &self.relayed_bytes_sent
        } else {
            &self.relayed_bytes_received
        };
        counter.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A connection of `kind` opened (`opened`) or closed.
    pub(crate) fn connection(&self, kind: ConnectionKind, opened: bool) {
        let counter = match kind {
            ConnectionKind::Direct => &self.connections.direct,
            ConnectionKind::HolePunched => &self.connections.hole_punched,
            ConnectionKind::Relayed => &self.connections.relayed,
        };
        if opened {
            counter.fetch_add(1, Ordering::Relaxed);
        } else {
            // Never below zero, whatever order the events come in.
            let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
        }
    }

    /// Tensor bytes exchanged with `peer` over streams that have ended.
    pub fn peer_traffic(&self, peer: &PeerId) -> PeerTraffic {
        self.lock_per_peer().get(peer).copied().unwrap_or_default()
    }

    pub(crate) fn auth_rejected(&self) {
        self.auth_rejected.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn peer_refused_revoked(&self) {
        self.peers_refused_revoked.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn revocation_list_adopted(&self) {
        self.revocation_lists_adopted
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn auth_timeout(&self) {
        self.auth_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn peer_authorized(&self) {
        self.peers_authorized.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn tensor_stream_accepted(&self) {
        self.tensor_streams_accepted.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn tensor_stream_refused_unauthorized(&self) {
        self.tensor_streams_refused_unauthorized
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn tensor_stream_refused_limit(&self) {
        self.tensor_streams_refused_limit
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn bad_frame(&self) {
        self.bad_frames.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn gossip_rejected(&self) {
        self.gossip_rejected.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn heartbeat_refused_uninvited_signer(&self) {
        self.heartbeats_refused_uninvited_signer
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn heartbeat_received(&self) {
        self.heartbeats_received.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn tensor_bytes_sent(&self, bytes: u64) {
        self.tensor_bytes_sent.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn tensor_bytes_received(&self, bytes: u64) {
        self.tensor_bytes_received
            .fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn connection_refused_pending_per_ip(&self) {
        self.connections_refused_pending_per_ip
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connection_refused_per_ip(&self) {
        self.connections_refused_per_ip
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connection_refused_limit(&self) {
        self.connections_refused_limit
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connection_refused_banned(&self) {
        self.connections_refused_banned
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn peer_banned(&self) {
        self.peers_banned.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn handshake_timeout(&self) {
        self.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn heartbeat_refused_stale(&self) {
        self.heartbeats_refused_stale
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn heartbeat_refused_replayed(&self) {
        self.heartbeats_refused_replayed
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn heartbeat_refused_revoked(&self) {
        self.heartbeats_refused_revoked
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn tensor_frame_timed_out(&self) {
        self.tensor_frames_timed_out.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn tensor_stream_over_partial_budget(&self) {
        self.tensor_streams_over_partial_budget
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Folds one ended stream's traffic into the peer's totals.
    pub(crate) fn add_peer_traffic(&self, peer: PeerId, traffic: PeerTraffic) {
        let mut per_peer = self.lock_per_peer();
        let entry = per_peer.entry(peer).or_default();
        entry.bytes_sent = entry.bytes_sent.saturating_add(traffic.bytes_sent);
        entry.bytes_received = entry.bytes_received.saturating_add(traffic.bytes_received);
    }

    fn lock_per_peer(&self) -> std::sync::MutexGuard<'_, HashMap<PeerId, PeerTraffic>> {
        // Counters stay meaningful even if a holder panicked mid-update.
        self.per_peer.lock().unwrap_or_else(|e| e.into_inner())
    }
}

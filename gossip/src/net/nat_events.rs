//! How the network task follows reachability, relays and hole punches (see the `nat`
//! module for what each protocol does).
//!
//! - AutoNAT's verdict is kept in the metrics (`/status` and `murmur_net_reachability`
//!   read it). When it says *private* and `[net.relay] reserve` is `auto`, this peer takes a
//!   reservation on up to [`MAX_RELAYS`] relaying members; with `always` it does so on
//!   meeting them. Its relayed address is then one of its listen addresses, which identify
//!   and the DHT hand to the other members, who can dial it through the relay.
//! - A relaying member is one whose identify lists the relay's hop protocol; it is
//!   reserved on at the address this peer dialed it at (or, for a member that dialed us,
//!   the first direct address it listens on).
//! - Every connection is counted by kind: direct, relayed, or made direct by DCUtR.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use libp2p::core::ConnectedPoint;
use libp2p::core::transport::ListenerId;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;
use libp2p::{Multiaddr, PeerId, StreamProtocol, autonat, dcutr, relay};

use super::actor::NetActor;
use super::metrics::ConnectionKind;
use super::nat::{Reachability, RelayReserve};

/// Relays this peer holds a reservation on at most: one more than it needs, in case one
/// leaves.
pub(crate) const MAX_RELAYS: usize = 2;

/// How long after a reservation on a relay ends (refused, say because the relay holds
/// `max_reservations` already, or closed) this peer waits before asking that relay again.
pub(crate) const RESERVE_RETRY: Duration = Duration::from_secs(10);

/// How long a relayed connection stays open after DCUtR made a direct one to the same peer.
/// The side whose hole punch completes first must not close the relayed connection at once:
/// the other side may not have finished its end of the direct connection yet, would see its
/// last connection to the peer close, forget the peer's admission, and drop the peer's
/// tensor streams until the auth exchange timed out (5.8 s of lost shares, seen in the
/// cone-NAT test).
pub(crate) const RELAYED_CLOSE_GRACE: Duration = Duration::from_secs(2);

/// What the network task knows about relays and connection kinds.
#[derive(Debug, Default)]
pub(crate) struct NatState {
    /// The kind of each open connection.
    kinds: HashMap<ConnectionId, ConnectionKind>,
    /// Admitted members that serve as relays, and an address to reserve at.
    relays: HashMap<PeerId, Multiaddr>,
    /// Where we dialed each connection, while it is open: a relay is reserved on there.
    dialed_at: HashMap<ConnectionId, Multiaddr>,
    /// Reservations asked for or held: the listener on each relay.
    reservations: HashMap<ListenerId, PeerId>,
    /// Relays whose reservation ended, and when they may be asked again.
    resting: HashMap<PeerId, Instant>,
    /// Relayed connections made redundant by a hole punch, and when they are closed.
    redundant: HashMap<ConnectionId, Instant>,
}

impl NatState {
    /// A connection opened: counted by kind.
    pub(crate) fn opened(
        &mut self,
        connection: ConnectionId,
        endpoint: &ConnectedPoint,
        metrics: &super::NetMetrics,
    ) {
        let kind = if endpoint.is_relayed() {
            ConnectionKind::Relayed
        } else {
            ConnectionKind::Direct
        };
        if self.kinds.contains_key(&connection) {
            // DCUtR reported it first.
            return;
        }
        if let ConnectedPoint::Dialer { address, .. } = endpoint
            && kind == ConnectionKind::Direct
        {
            self.dialed_at.insert(connection, address.clone());
        }
        self.kinds.insert(connection, kind);
        metrics.connection(kind, true);
    }

    /// A connection closed.
    pub(crate) fn closed(&mut self, connection: ConnectionId, metrics: &super::NetMetrics) {
        self.dialed_at.remove(&connection);
        self.redundant.remove(&connection);
        if let Some(kind) = self.kinds.remove(&connection) {
            metrics.connection(kind, false);
        }
    }

    /// DCUtR made `connection` a direct one out of a relayed one.
    fn hole_punched(&mut self, connection: ConnectionId, metrics: &super::NetMetrics) {
        match self.kinds.insert(connection, ConnectionKind::HolePunched) {
            Some(ConnectionKind::HolePunched) => return,
            Some(kind) => metrics.connection(kind, false),
            None => {}
        }
        metrics.connection(ConnectionKind::HolePunched, true);
    }

    /// A listener closed: if it was a reservation, its relay rests for [`RESERVE_RETRY`]
    /// before it is asked again.
    pub(crate) fn listener_closed(&mut self, listener: ListenerId, now: Instant) -> Option<PeerId> {
        let relay = self.reservations.remove(&listener)?;
        self.resting.insert(relay, now + RESERVE_RETRY);
        Some(relay)
    }

    /// A member left: it relays no more.
    pub(crate) fn forget(&mut self, peer: &PeerId) {
        self.relays.remove(peer);
        self.resting.remove(peer);
    }

    /// Ends the rests that are over; `true` if any was, so reservations may be asked for.
    fn rested(&mut self, now: Instant) -> bool {
        let before = self.resting.len();
        self.resting.retain(|_, until| *until > now);
        self.resting.len() < before
    }

    /// Relaying members to ask for a reservation, in a fixed order: those not reserved on
    /// and not resting.
    fn candidates(&self) -> Vec<(PeerId, Multiaddr)> {
        let mut candidates: Vec<(PeerId, Multiaddr)> = self
            .relays
            .iter()
            .filter(|(relay, _)| !self.reserved_on(relay) && !self.resting.contains_key(relay))
            .map(|(relay, at)| (*relay, at.clone()))
            .collect();
        candidates.sort_by_key(|(relay, _)| *relay);
        candidates
    }

    /// The relayed ones among `connections` are closed [`RELAYED_CLOSE_GRACE`] after `now`.
    fn close_relayed_later(&mut self, connections: &[ConnectionId], now: Instant) {
        for connection in connections {
            if self.kinds.get(connection) == Some(&ConnectionKind::Relayed) {
                self.redundant
                    .entry(*connection)
                    .or_insert(now + RELAYED_CLOSE_GRACE);
            }
        }
    }

    /// Redundant relayed connections whose grace is over, taken off the list.
    fn due_to_close(&mut self, now: Instant) -> Vec<ConnectionId> {
        let mut due = Vec::new();
        self.redundant.retain(|connection, at| {
            let keep = *at > now;
            if !keep {
                due.push(*connection);
            }
            keep
        });
        due
    }

    fn reserved_on(&self, relay: &PeerId) -> bool {
        self.reservations.values().any(|r| r == relay)
    }
}

impl NetActor {
    /// What identify told of an admitted peer: whether it serves as a relay.
    pub(crate) fn on_identified(
        &mut self,
        peer: PeerId,
        connection: ConnectionId,
        protocols: &[StreamProtocol],
        listen_addrs: &[Multiaddr],
    ) {
        let relays = protocols.contains(&relay::HOP_PROTOCOL_NAME);
        let admitted = self.peers.get(&peer).is_some_and(|s| s.admitted.is_some());
        if !relays || !admitted || peer == *self.swarm.local_peer_id() {
            return;
        }
        let at = self.nat.dialed_at.get(&connection).cloned().or_else(|| {
            listen_addrs
                .iter()
                .find(|a| !a.iter().any(|p| p == Protocol::P2pCircuit))
                .cloned()
        });
        let Some(mut at) = at else {
            return;
        };
        if matches!(at.iter().last(), Some(Protocol::P2p(_))) {
            at.pop();
        }
        if self.nat.relays.insert(peer, at).is_none() {
            tracing::info!(%peer, "member serves as a relay");
        }
        self.reserve_if_needed();
    }

    /// Takes reservations on relaying members, up to [`MAX_RELAYS`], if this peer needs
    /// them: `[net.relay] reserve` is `always`, or it is `auto` and AutoNAT found this peer
    /// private.
    fn reserve_if_needed(&mut self) {
        let wanted = match self.config.raw.relay.reserve {
            RelayReserve::Always => true,
            RelayReserve::Auto => self.ctx.metrics.reachability() == Reachability::Private,
            RelayReserve::Never => false,
        };
        if !wanted {
            return;
        }
        for (relay, at) in self.nat.candidates() {
            if self.nat.reservations.len() >= MAX_RELAYS {
                break;
            }
            let circuit = at.with(Protocol::P2p(relay)).with(Protocol::P2pCircuit);
            match self.swarm.listen_on(circuit.clone()) {
                Ok(listener) => {
                    tracing::info!(%relay, address = %circuit, "asking a relay for a reservation");
                    self.nat.reservations.insert(listener, relay);
                }
                Err(e) => {
                    tracing::warn!(%relay, address = %circuit, error = %e, "cannot listen through a relay");
                }
            }
        }
    }

    /// A new listen address. A relay announces its own as external: relays serve from
    /// addresses others can dial.
    pub(crate) fn on_listening(&mut self, address: &Multiaddr) {
        let relayed = address.iter().any(|p| p == Protocol::P2pCircuit);
        if relayed {
            tracing::info!(%address, "reachable through a relay");
            return;
        }
        if !self.config.raw.relay.serve {
            return;
        }
        let loopback = address.iter().any(|p| match p {
            Protocol::Ip4(ip) => ip.is_loopback(),
            Protocol::Ip6(ip) => ip.is_loopback(),
            _ => false,
        });
        // A loopback address only when loopback is what the config listens on.
        let loopback_configured = self.config.listen_addrs.iter().any(|a| {
            a.iter().any(|p| match p {
                Protocol::Ip4(ip) => ip.is_loopback(),
                Protocol::Ip6(ip) => ip.is_loopback(),
                _ => false,
            })
        });
        if !loopback || loopback_configured {
            self.swarm.add_external_address(address.clone());
        }
    }

    /// A listener closed; a lost reservation is asked for again from another relay at
    /// once, from the same one after [`RESERVE_RETRY`].
    pub(crate) fn on_listener_closed(&mut self, listener: ListenerId) {
        if let Some(relay) = self.nat.listener_closed(listener, Instant::now()) {
            tracing::info!(%relay, retry_in_s = RESERVE_RETRY.as_secs(), "reservation on a relay ended");
            self.reserve_if_needed();
        }
    }

    /// On the actor's tick: relays whose rest is over may be asked again.
    pub(crate) fn nat_tick(&mut self, now: Instant) {
        if self.nat.rested(now) {
            self.reserve_if_needed();
        }
        for relayed in self.nat.due_to_close(now) {
            self.swarm.close_connection(relayed);
        }
    }

    pub(crate) fn on_autonat(&mut self, event: autonat::Event) {
        let autonat::Event::StatusChanged { old, new } = event else {
            return;
        };
        let reachability = match &new {
            autonat::NatStatus::Public(_) => Reachability::Public,
            autonat::NatStatus::Private => Reachability::Private,
            autonat::NatStatus::Unknown => Reachability::Unknown,
        };
        tracing::info!(
            reachability = reachability.name(),
            was = ?old,
            now = ?new,
            "reachability changed"
        );
        self.ctx.metrics.set_reachability(reachability);
        self.reserve_if_needed();
    }

    pub(crate) fn on_relay_client(&mut self, event: relay::client::Event) {
        match event {
            relay::client::Event::ReservationReqAccepted {
                relay_peer_id,
                renewal: false,
                ..
            } => tracing::info!(relay = %relay_peer_id, "relay granted a reservation"),
            relay::client::Event::InboundCircuitEstablished { src_peer_id, .. } => {
                tracing::debug!(peer = %src_peer_id, "a member reached this peer through a relay");
            }
            relay::client::Event::OutboundCircuitEstablished { relay_peer_id, .. } => {
                tracing::debug!(relay = %relay_peer_id, "reached a member through a relay");
            }
            relay::client::Event::ReservationReqAccepted { .. } => {}
        }
    }

    pub(crate) fn on_relay_server(&mut self, event: relay::Event) {
        let metrics = &self.ctx.metrics;
        match event {
            relay::Event::ReservationReqAccepted {
                src_peer_id,
                renewed,
            } => {
                metrics.relay_reservation_accepted();
                if !renewed {
                    tracing::info!(peer = %src_peer_id, "relay reservation granted");
                }
            }
            relay::Event::CircuitReqAccepted {
                src_peer_id,
                dst_peer_id,
            } => {
                metrics.relay_circuit_accepted();
                tracing::info!(from = %src_peer_id, to = %dst_peer_id, "relaying a circuit");
            }
            relay::Event::ReservationReqDenied {
                src_peer_id,
                status,
            } => tracing::info!(peer = %src_peer_id, ?status, "relay reservation refused"),
            relay::Event::CircuitReqDenied {
                src_peer_id,
                dst_peer_id,
                status,
            } => {
                tracing::info!(from = %src_peer_id, to = %dst_peer_id, ?status, "relay circuit refused")
            }
            relay::Event::CircuitClosed {
                src_peer_id,
                dst_peer_id,
                error,
            } => {
                tracing::debug!(from = %src_peer_id, to = %dst_peer_id, ?error, "relayed circuit closed")
            }
            other => tracing::debug!(event = ?other, "relay"),
        }
    }

    pub(crate) fn on_dcutr(&mut self, event: dcutr::Event) {
        let peer = event.remote_peer_id;
        match event.result {
            Ok(connection) => {
                self.ctx.metrics.hole_punch(true);
                self.nat.hole_punched(connection, &self.ctx.metrics);
                tracing::info!(%peer, "hole punch succeeded: direct connection");
                // Streams pick among a peer's connections at random: the relayed ones go,
                // so that tensors take the direct path and spare the relay; after a grace,
                // so that the other side has its end of the direct connection first.
                let connections = self
                    .peers
                    .get(&peer)
                    .map_or(&[][..], |s| &s.connections[..]);
                self.nat.close_relayed_later(connections, Instant::now());
            }
            Err(error) => {
                self.ctx.metrics.hole_punch(false);
                tracing::info!(%peer, %error, "hole punch failed: staying on the relay");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relay_at(state: &mut NatState, port: u16) -> PeerId {
        let relay = PeerId::random();
        let at: Multiaddr = format!("/ip4/10.0.0.1/udp/{port}/quic-v1").parse().unwrap();
        state.relays.insert(relay, at);
        relay
    }

    /// A relay that refused (or ended) a reservation is not asked again before
    /// [`RESERVE_RETRY`]: without the rest, a relay at `max_reservations` was asked again
    /// the moment it refused, without end.
    #[test]
    fn a_relay_whose_reservation_ended_rests_before_it_is_asked_again() {
        let mut state = NatState::default();
        let relay = relay_at(&mut state, 7000);
        let other = relay_at(&mut state, 7001);
        let listener = ListenerId::next();
        state.reservations.insert(listener, relay);
        let now = Instant::now();
        assert_eq!(state.listener_closed(listener, now), Some(relay));
        let asked: Vec<PeerId> = state.candidates().into_iter().map(|(p, _)| p).collect();
        assert_eq!(asked, vec![other], "only the relay not resting");
        assert!(!state.rested(now + RESERVE_RETRY / 2));
        assert_eq!(state.candidates().len(), 1);
        assert!(state.rested(now + RESERVE_RETRY));
        assert_eq!(state.candidates().len(), 2);
        assert!(
            !state.rested(now + RESERVE_RETRY * 2),
            "nothing left to end"
        );
    }

    /// A listener that was no reservation sets no relay resting; a relay that left is
    /// forgotten with its rest.
    #[test]
    fn only_reservations_rest_and_a_relay_that_left_is_forgotten() {
        let mut state = NatState::default();
        let relay = relay_at(&mut state, 7000);
        let now = Instant::now();
        assert_eq!(state.listener_closed(ListenerId::next(), now), None);
        assert_eq!(state.candidates().len(), 1);
        let listener = ListenerId::next();
        state.reservations.insert(listener, relay);
        assert!(state.candidates().is_empty(), "reserved on already");
        state.listener_closed(listener, now);
        state.forget(&relay);
        assert!(state.candidates().is_empty());
        assert!(!state.rested(now + RESERVE_RETRY), "its rest went with it");
    }

    /// After a hole punch the relayed connection to the peer is closed only once the grace
    /// is over, the direct one never, and one that closed meanwhile is not closed again.
    #[test]
    fn relayed_connections_made_redundant_close_after_the_grace() {
        let mut state = NatState::default();
        let relayed = ConnectionId::new_unchecked(1);
        let direct = ConnectionId::new_unchecked(2);
        let gone = ConnectionId::new_unchecked(3);
        let metrics = super::super::NetMetrics::default();
        state.kinds.insert(relayed, ConnectionKind::Relayed);
        state.kinds.insert(gone, ConnectionKind::Relayed);
        state.kinds.insert(direct, ConnectionKind::HolePunched);
        let now = Instant::now();
        state.close_relayed_later(&[relayed, direct, gone], now);
        assert!(state.due_to_close(now).is_empty(), "not before the grace");
        state.closed(gone, &metrics);
        let later = now + RELAYED_CLOSE_GRACE;
        assert_eq!(state.due_to_close(later), vec![relayed]);
        assert!(state.due_to_close(later).is_empty(), "closed once");
    }
}

//! How the network task reacts to what the swarm reports: connections, the auth exchange,
//! identify, discovery and gossip.

use libp2p::core::ConnectedPoint;
use libp2p::request_response::{self, OutboundFailure};
use libp2p::swarm::dial_opts::DialOpts;
use libp2p::swarm::{ConnectionId, SwarmEvent};
use libp2p::{Multiaddr, gossipsub, identify, kad, mdns};
use murmur_protocol::identity::PeerId;

use super::NetEvent;
use super::actor::{CONTROL_RESENDS, NetActor, PeerState, Refusal, for_peer};
use super::auth::{AuthFailure, reject_frame};
use super::behaviour::MurmurBehaviourEvent;
use super::config::ValidConfig;
use super::control::ControlFrame;
use super::error::NetError;
use super::handle::{InboundControl, unix_now};
use super::identity::from_libp2p;
use super::tensor_inbound::TensorInboundEvent;

type ControlEvent = request_response::Event<ControlFrame, ControlFrame>;

impl NetActor {
    pub(crate) fn on_swarm_event(&mut self, event: SwarmEvent<MurmurBehaviourEvent>) {
        match event {
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                endpoint,
                ..
            } => {
                self.anonymous_dials.remove(&connection_id);
                if is_dial_back(&endpoint) {
                    // AutoNAT's answer is already on its way over the peer's own
                    // connection; this one, with its socket of its own, is not needed.
                    self.swarm.close_connection(connection_id);
                    return;
                }
                self.bootstrap.connected(connection_id, &peer_id);
                self.nat.opened(connection_id, &endpoint, &self.ctx.metrics);
                self.on_connected(peer_id, connection_id, &endpoint);
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established: 0,
                cause,
                ..
            } => {
                self.nat.closed(connection_id, &self.ctx.metrics);
                self.on_disconnected(peer_id, cause.map(|c| c.to_string()));
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                ..
            } => {
                self.nat.closed(connection_id, &self.ctx.metrics);
                let Some(state) = self.peers.get_mut(&peer_id) else {
                    return;
                };
                state.connections.retain(|c| *c != connection_id);
                if state.reannounce_when_alone && state.connections.len() == 1 {
                    state.reannounce_when_alone = false;
                    self.reannounce_subscription();
                }
            }
            SwarmEvent::NewListenAddr { address, .. } => {
                tracing::info!(%address, "listening");
                self.on_listening(&address);
                if !self.listen_addrs.contains(&address) {
                    self.listen_addrs.push(address);
                }
            }
            SwarmEvent::ListenerClosed { listener_id, .. } => {
                self.on_listener_closed(listener_id);
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                self.listen_addrs.retain(|a| a != &address);
            }
            SwarmEvent::ListenerError { error, .. } => {
                tracing::warn!(%error, "listener failed");
            }
            SwarmEvent::OutgoingConnectionError {
                connection_id,
                peer_id,
                error,
            } => {
                self.anonymous_dials.remove(&connection_id);
                self.bootstrap.failed(connection_id, &error.to_string());
                tracing::debug!(peer = ?peer_id, %error, "dial failed");
                if let Some(peer) = peer_id
                    && !self.swarm.is_connected(&peer)
                {
                    let reason = error.to_string();
                    self.fail_waiters(&peer, |id| NetError::OpenStream {
                        peer: id,
                        reason: format!("dial failed: {reason}"),
                    });
                }
            }
            SwarmEvent::IncomingConnectionError { error, .. } => {
                super::admission::count_incoming_failure(&self.ctx.metrics, &error);
                tracing::debug!(%error, "incoming connection failed");
            }
            SwarmEvent::Behaviour(event) => self.on_behaviour_event(event),
            _ => {}
        }
    }

    fn on_connected(
        &mut self,
        peer: libp2p::PeerId,
        connection: ConnectionId,
        endpoint: &ConnectedPoint,
    ) {
        let id = from_libp2p(&peer).ok();
        let state = self.peers.entry(peer).or_insert_with(|| PeerState::new(id));
        state.connections.push(connection);
        if let ConnectedPoint::Dialer { address, .. } = endpoint {
            state.add_addr(address);
        }
        if id.is_none() {
            // Not an ed25519 key: it cannot hold an invite.
            self.refuse(
                &peer,
                Refusal::Rejected,
                "its key is not ed25519".to_owned(),
            );
            return;
        }
        self.disclose_on_connection(peer, connection, endpoint.is_dialer());
        self.add_to_dht(&peer);
    }

    fn on_disconnected(&mut self, peer: libp2p::PeerId, cause: Option<String>) {
        let Some(state) = self.peers.remove(&peer) else {
            return;
        };
        tracing::debug!(%peer, cause = ?cause, "disconnected");
        self.members.remove(&peer);
        self.nat.forget(&peer);
        self.fail_waiters(&peer, |id| NetError::Disconnected { peer: id });
        if let (Some(id), Some(_)) = (state.id, state.admitted) {
            let _ = self.events.send(NetEvent::PeerDisconnected { peer: id });
        }
    }

    fn on_behaviour_event(&mut self, event: MurmurBehaviourEvent) {
        match event {
            MurmurBehaviourEvent::Control(event) => self.on_control_event(event),
            MurmurBehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                connection_id,
                info,
            }) => {
                if let Some(state) = self.peers.get_mut(&peer_id) {
                    let fresh: Vec<Multiaddr> = info
                        .listen_addrs
                        .iter()
                        .filter_map(|addr| state.add_addr(addr))
                        .collect();
                    // A peer already in the DHT that listens somewhere new (a relay
                    // reservation, say): the DHT hands out the new address too.
                    if state.in_dht {
                        let kad = &mut self.swarm.behaviour_mut().kad;
                        for addr in fresh {
                            kad.add_address(&peer_id, addr);
                        }
                    }
                }
                self.add_to_dht(&peer_id);
                self.on_identified(peer_id, connection_id, &info.protocols, &info.listen_addrs);
            }
            MurmurBehaviourEvent::Gossipsub(gossipsub::Event::Message {
                propagation_source,
                message_id,
                message,
            }) => self.on_gossip(propagation_source, message_id, message),
            MurmurBehaviourEvent::Mdns(mdns::Event::Discovered(found)) => {
                for (peer, addr) in found {
                    if peer == *self.swarm.local_peer_id() || self.swarm.is_connected(&peer) {
                        continue;
                    }
                    tracing::debug!(%peer, %addr, "found by mdns; dialing");
                    let opts = DialOpts::peer_id(peer).addresses(vec![addr]).build();
                    if let Err(e) = self.swarm.dial(opts) {
                        tracing::debug!(%peer, error = %e, "dialing an mdns peer failed");
                    }
                }
            }
            MurmurBehaviourEvent::Tensor(TensorInboundEvent { peer, stream }) => {
                self.on_inbound_stream(peer, stream);
            }
            MurmurBehaviourEvent::Autonat(event) => self.on_autonat(event),
            MurmurBehaviourEvent::RelayClient(event) => self.on_relay_client(event),
            MurmurBehaviourEvent::Relay(event) => self.on_relay_server(event),
            MurmurBehaviourEvent::Dcutr(event) => self.on_dcutr(event),
            MurmurBehaviourEvent::Kad(kad::Event::RoutingUpdated { peer, .. }) => {
                tracing::debug!(%peer, "dht routing table updated");
            }
            _ => {}
        }
    }

    fn on_control_event(&mut self, event: ControlEvent) {
        match event {
            request_response::Event::Message {
                peer,
                connection_id,
                message,
            } => match message {
                request_response::Message::Request {
                    request, channel, ..
                } => self.on_control_request(peer, connection_id, request, channel),
                request_response::Message::Response {
                    request_id,
                    response,
                } => {
                    let is_hello = self
                        .peers
                        .get(&peer)
                        .is_some_and(|s| s.hello_request == Some(request_id));
                    if is_hello {
                        self.on_hello_answer(peer, &response);
                    } else if let Some(pending) = self.requests.remove(&request_id) {
                        let _ = pending.reply.send(Ok(response));
                    }
                }
            },
            request_response::Event::OutboundFailure {
                peer,
                request_id,
                error,
                ..
            } => {
                let is_hello = self
                    .peers
                    .get(&peer)
                    .is_some_and(|s| s.hello_request == Some(request_id));
                if is_hello {
                    match error {
                        // The connection it went out on is gone: ask again on another one
                        // if the peer is still connected (otherwise its state is gone too).
                        // (Before the peer proved its invite, the hello goes on the connections
                        // this side dialed only: see the `disclosure` module.)
                        OutboundFailure::ConnectionClosed | OutboundFailure::DialFailure => {
                            let admitted =
                                self.peers.get(&peer).is_some_and(|s| s.admitted.is_some());
                            if admitted && self.swarm.is_connected(&peer) {
                                self.send_hello(peer);
                            }
                        }
                        OutboundFailure::Timeout => self.refuse(
                            &peer,
                            Refusal::TimedOut,
                            "did not answer our hello in time".to_owned(),
                        ),
                        other => self.refuse(
                            &peer,
                            Refusal::Failed,
                            format!("auth exchange failed: {other}"),
                        ),
                    }
                } else if let Some(mut pending) = self.requests.remove(&request_id) {
                    // The connection it went out on closed before the answer came (before
                    // the request was written, or under its stream: "connection lost"), but
                    // the peer is still there (see `CONTROL_RESENDS`): ask again.
                    let resend = matches!(
                        error,
                        OutboundFailure::ConnectionClosed | OutboundFailure::Io(_)
                    ) && pending.resends < CONTROL_RESENDS
                        && self.peers.get(&peer).is_some_and(PeerState::is_ready)
                        && self.swarm.is_connected(&peer);
                    if resend {
                        pending.resends += 1;
                        tracing::debug!(%peer, "control request sent again: its connection closed");
                        self.send_control(peer, pending);
                    } else if matches!(error, OutboundFailure::Timeout) {
                        let after = ValidConfig::ms(self.config.raw.request_timeout_ms);
                        let what = "a control request's answer";
                        let _ = pending.reply.send(Err(NetError::Timeout { what, after }));
                    } else {
                        let reason = error.to_string();
                        let _ = pending
                            .reply
                            .send(Err(for_peer(&peer, |id| NetError::Request {
                                peer: id,
                                reason,
                            })));
                    }
                }
            }
            request_response::Event::ResponseSent { peer, .. } => {
                if self
                    .peers
                    .get(&peer)
                    .is_some_and(|s| s.refused_at.is_some())
                {
                    let _ = self.swarm.disconnect_peer_id(peer);
                }
            }
            request_response::Event::InboundFailure { peer, error, .. } => {
                tracing::debug!(%peer, %error, "inbound control request failed");
            }
        }
    }

    /// A control request: the peer's hello until it is admitted, then control messages for
    /// the application.
    fn on_control_request(
        &mut self,
        peer: libp2p::PeerId,
        connection: ConnectionId,
        request: ControlFrame,
        channel: request_response::ResponseChannel<ControlFrame>,
    ) {
        let Some(state) = self.peers.get(&peer) else {
            return;
        };
        let Some(id) = state.id else {
            return;
        };
        if state.refused_at.is_some() {
            return;
        }
        if state.admitted.is_none() || is_hello(&request) {
            let restarted =
                hello_means_restart(state.admitted.is_some(), &state.admitted_on, connection);
            match self.authorizer.verify(&id, request.as_bytes(), unix_now()) {
                Ok(admitted) => {
                    if restarted {
                        self.close_stale_connections(peer, connection);
                    }
                    let hello = self.authorizer.hello();
                    let _ = self
                        .swarm
                        .behaviour_mut()
                        .control
                        .send_response(channel, hello);
                    self.admit(peer, id, admitted);
                }
                Err(failure) => {
                    if let Some(frame) = reject_frame(failure.reject_code(), &failure.to_string()) {
                        let _ = self
                            .swarm
                            .behaviour_mut()
                            .control
                            .send_response(channel, frame);
                    }
                    self.refuse(&peer, Refusal::Rejected, failure.to_string());
                }
            }
            return;
        }
        let request_id = self.next_response_id;
        self.next_response_id += 1;
        let inbound = InboundControl {
            peer: id,
            id: request_id,
            frame: request,
        };
        match self.inbound_control.try_send(inbound) {
            Ok(()) => {
                self.responses.insert(request_id, channel);
            }
            // Dropping the channel tells the peer at once that no answer is coming.
            Err(_) => tracing::warn!(%peer, "control request queue full; request dropped"),
        }
    }

    /// An admitted peer said hello again on `fresh`, a connection opened after it was
    /// admitted ([`hello_means_restart`]): it restarted under the same key, and its other
    /// connections are the dead process's: gossip would keep sending on the first of them,
    /// and the restarted peer would not hear the swarm until they time out. They are closed
    /// now. (If instead the connection of its first hello closed and it asked again on a
    /// newer one, it keeps the connection its hello came on, and announcing our topic
    /// again costs one leave and join.)
    fn close_stale_connections(&mut self, peer: libp2p::PeerId, fresh: ConnectionId) {
        let Some(state) = self.peers.get_mut(&peer) else {
            return;
        };
        let stale: Vec<ConnectionId> = state
            .connections
            .iter()
            .copied()
            .filter(|c| *c != fresh)
            .collect();
        if stale.is_empty() {
            return;
        }
        tracing::info!(%peer, stale = stale.len(), "peer said hello again (it restarted, or the connection of its first hello closed): closing its older connections");
        state.reannounce_when_alone = true;
        for connection in stale {
            self.swarm.close_connection(connection);
        }
    }

    /// Gossip tells a peer our topics only on its first connection, so a peer that
    /// restarted while its dead connection was still open never learns that we take
    /// heartbeats, and never sends us its own. Once the dead connection is gone, leaving
    /// and rejoining the topic announces it to every peer again (the others see a leave
    /// and a join, and graft us back into their mesh on their next gossip heartbeat).
    fn reannounce_subscription(&mut self) {
        let topic = gossipsub::IdentTopic::new(self.config.heartbeat_topic());
        let gossip = &mut self.swarm.behaviour_mut().gossipsub;
        gossip.unsubscribe(&topic);
        if let Err(e) = gossip.subscribe(&topic) {
            tracing::warn!(error = %e, "cannot rejoin the heartbeat topic");
        }
    }

    /// The peer's answer to our hello: its own hello (it accepted us) or a refusal.
    /// Sends our invite to `peer` and remembers the request, so its answer is recognised.
    pub(crate) fn send_hello(&mut self, peer: libp2p::PeerId) {
        let hello = self.authorizer.hello();
        let request = self
            .swarm
            .behaviour_mut()
            .control
            .send_request(&peer, hello);
        if let Some(state) = self.peers.get_mut(&peer) {
            state.hello_request = Some(request);
        }
    }

    fn on_hello_answer(&mut self, peer: libp2p::PeerId, response: &ControlFrame) {
        let Some(state) = self.peers.get_mut(&peer) else {
            return;
        };
        state.hello_request = None;
        let Some(id) = state.id else {
            return;
        };
        match self.authorizer.verify(&id, response.as_bytes(), unix_now()) {
            Ok(admitted) => {
                state.accepted_us = true;
                self.admit(peer, id, admitted);
            }
            Err(failure) => {
                let kind = match failure {
                    AuthFailure::Refused { .. } => Refusal::Failed,
                    _ => Refusal::Rejected,
                };
                self.refuse(&peer, kind, failure.to_string());
            }
        }
    }

    /// `peer` proved its invite: remembered for its heartbeats (refreshed on every hello,
    /// so a renewed invite counts), and admitted on its first proof.
    fn admit(&mut self, peer: libp2p::PeerId, id: PeerId, admitted: super::auth::Admitted) {
        let Some(state) = self.peers.get_mut(&peer) else {
            return;
        };
        self.invites.verified(id, admitted.expires_at, unix_now());
        if state.admitted.is_none() {
            state.admitted = Some(admitted);
            self.members.admit(peer);
            state.admitted_on.clone_from(&state.connections);
            self.ctx.metrics.peer_authorized();
            tracing::info!(%peer, expires_at = admitted.expires_at, "peer authorized");
            let _ = self.events.send(NetEvent::PeerAuthorized {
                peer: id,
                invite_expires_at: admitted.expires_at,
            });
            self.add_to_dht(&peer);
            self.disclose_to_admitted(peer);
            self.revocations_for_newcomer();
        }
        self.wake_if_ready(&peer);
    }
}

/// Whether this side dialed `endpoint` from a fresh port: the AutoNAT server's dial-back
/// to a peer asking whether it is reachable (every other dial of this peer reuses its
/// listening port).
fn is_dial_back(endpoint: &ConnectedPoint) -> bool {
    matches!(
        endpoint,
        ConnectedPoint::Dialer {
            port_use: libp2p::core::transport::PortUse::New,
            ..
        }
    )
}

/// Whether a hello from an admitted peer, arriving on `connection`, says it restarted.
///
/// A restarted process has new connections only, so a hello on a connection that was open
/// when the peer was admitted comes from the admitted process itself: both ends dialed at
/// once, each sent its hello on its own connection, and one came after the other's answer.
/// Closing the other connection then would lose whatever the peer had just written on it.
pub(crate) fn hello_means_restart(
    admitted: bool,
    admitted_on: &[ConnectionId],
    connection: ConnectionId,
) -> bool {
    admitted && !admitted_on.contains(&connection)
}

/// Whether a control frame is an auth hello (checked by kind byte; the authorizer parses it
/// fully).
fn is_hello(frame: &ControlFrame) -> bool {
    use murmur_protocol::frame::FrameKind;
    frame.as_bytes().get(5) == Some(&FrameKind::AuthHello.to_byte())
}

#[cfg(test)]
mod tests {
    use libp2p::swarm::ConnectionId;

    use super::hello_means_restart;

    /// Both ends of a simultaneous dial say hello on their own connection; the second
    /// hello, on a connection open at admission, is not taken for a restart. A hello on a
    /// connection opened later is.
    #[test]
    fn a_hello_is_a_restart_only_on_a_connection_opened_after_admission() {
        let (first, second, later) = (
            ConnectionId::new_unchecked(1),
            ConnectionId::new_unchecked(2),
            ConnectionId::new_unchecked(3),
        );
        let at_admission = [first, second];
        assert!(!hello_means_restart(true, &at_admission, first));
        assert!(!hello_means_restart(true, &at_admission, second));
        assert!(hello_means_restart(true, &at_admission, later));
        assert!(
            !hello_means_restart(false, &[], later),
            "a first hello admits"
        );
    }
}

//! [`Gated`]: a behaviour whose streams wait until the peer has proven its invite.
//!
//! Kademlia answers FIND_NODE with members' peer ids and addresses, and identify answers
//! with this peer's listen addresses, to whoever opens a stream. Wrapped in [`Gated`], each
//! connection's handler holds the streams the remote opens (negotiated, not one byte read
//! or written) and the streams the inner handler wants to open, until the network task
//! calls [`Gated::open`] for that connection once the peer's invite has verified. A
//! connection that never proves an invite is closed at `net.auth_timeout_ms` with its held
//! streams unanswered, so a stranger learns nothing from these protocols.
//!
//! Holding instead of refusing keeps members working: a member's first identify request
//! arrives before this side has read its hello, and is answered once the hello verifies.
//! At most [`MAX_HELD_STREAMS`] streams wait per direction and connection; the newest past
//! that are dropped.

use std::collections::VecDeque;
use std::task::{Context, Poll};

use libp2p::PeerId;
use libp2p::core::transport::PortUse;
use libp2p::core::{Endpoint, Multiaddr};
use libp2p::swarm::handler::{ConnectionEvent, FullyNegotiatedInbound};
use libp2p::swarm::{
    ConnectionDenied, ConnectionHandler, ConnectionHandlerEvent, ConnectionId, FromSwarm,
    NetworkBehaviour, NotifyHandler, SubstreamProtocol, THandler, THandlerInEvent,
    THandlerOutEvent, ToSwarm,
};

/// Streams held per direction and connection while the gate is closed.
pub(crate) const MAX_HELD_STREAMS: usize = 8;
/// Events of the inner handler passed on in one poll before yielding.
const MAX_EVENTS_PER_POLL: usize = 64;

/// What the behaviour tells a [`GatedHandler`].
#[derive(Debug)]
pub(crate) enum GateIn<T> {
    /// The peer proved its invite: let its streams through.
    Open,
    /// An event for the inner handler.
    Inner(T),
}

/// Wraps a behaviour so that each connection's streams wait for [`Gated::open`].
pub(crate) struct Gated<B> {
    inner: B,
    opening: VecDeque<(PeerId, ConnectionId)>,
}

impl<B> Gated<B> {
    pub(crate) fn new(inner: B) -> Gated<B> {
        Gated {
            inner,
            opening: VecDeque::new(),
        }
    }

    /// Opens the gate of each of `connections` of `peer`.
    pub(crate) fn open(&mut self, peer: PeerId, connections: &[ConnectionId]) {
        for connection in connections {
            self.opening.push_back((peer, *connection));
        }
    }
}

impl<B> std::ops::Deref for Gated<B> {
    type Target = B;

    fn deref(&self) -> &B {
        &self.inner
    }
}

impl<B> std::ops::DerefMut for Gated<B> {
    fn deref_mut(&mut self) -> &mut B {
        &mut self.inner
    }
}

impl<B: NetworkBehaviour> NetworkBehaviour for Gated<B> {
    type ConnectionHandler = GatedHandler<THandler<B>>;
    type ToSwarm = B::ToSwarm;

    fn handle_pending_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<(), ConnectionDenied> {
        self.inner
            .handle_pending_inbound_connection(connection_id, local_addr, remote_addr)
    }

    fn handle_established_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        peer: PeerId,
        local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        let inner = self.inner.handle_established_inbound_connection(
            connection_id,
            peer,
            local_addr,
            remote_addr,
        )?;
        Ok(GatedHandler::new(inner))
    }

    fn handle_pending_outbound_connection(
        &mut self,
        connection_id: ConnectionId,
        maybe_peer: Option<PeerId>,
        addresses: &[Multiaddr],
        effective_role: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        self.inner.handle_pending_outbound_connection(
            connection_id,
            maybe_peer,
            addresses,
            effective_role,
        )
    }

    fn handle_established_outbound_connection(
        &mut self,
        connection_id: ConnectionId,
        peer: PeerId,
        addr: &Multiaddr,
        role_override: Endpoint,
        port_use: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        let inner = self.inner.handle_established_outbound_connection(
            connection_id,
            peer,
            addr,
            role_override,
            port_use,
        )?;
        Ok(GatedHandler::new(inner))
    }

    fn on_swarm_event(&mut self, event: FromSwarm<'_>) {
        self.inner.on_swarm_event(event);
    }

    fn on_connection_handler_event(
        &mut self,
        peer: PeerId,
        connection: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        self.inner
            .on_connection_handler_event(peer, connection, event);
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        if let Some((peer_id, connection)) = self.opening.pop_front() {
            return Poll::Ready(ToSwarm::NotifyHandler {
                peer_id,
                handler: NotifyHandler::One(connection),
                event: GateIn::Open,
            });
        }
        self.inner.poll(cx).map(|event| event.map_in(GateIn::Inner))
    }
}

/// A connection handler that holds its inner handler's streams until opened.
pub(crate) struct GatedHandler<H: ConnectionHandler> {
    inner: H,
    open: bool,
    held_inbound: VecDeque<FullyNegotiatedInbound<H::InboundProtocol, H::InboundOpenInfo>>,
    held_outbound: VecDeque<SubstreamProtocol<H::OutboundProtocol, H::OutboundOpenInfo>>,
}

impl<H: ConnectionHandler> GatedHandler<H> {
    fn new(inner: H) -> GatedHandler<H> {
        GatedHandler {
            inner,
            open: false,
            held_inbound: VecDeque::new(),
            held_outbound: VecDeque::new(),
        }
    }
}

impl<H: ConnectionHandler> ConnectionHandler for GatedHandler<H> {
    type FromBehaviour = GateIn<H::FromBehaviour>;
    type ToBehaviour = H::ToBehaviour;
    type InboundProtocol = H::InboundProtocol;
    type OutboundProtocol = H::OutboundProtocol;
    type InboundOpenInfo = H::InboundOpenInfo;
    type OutboundOpenInfo = H::OutboundOpenInfo;

    fn listen_protocol(&self) -> SubstreamProtocol<Self::InboundProtocol, Self::InboundOpenInfo> {
        self.inner.listen_protocol()
    }

    fn on_behaviour_event(&mut self, event: Self::FromBehaviour) {
        match event {
            GateIn::Open => {
                self.open = true;
                for stream in std::mem::take(&mut self.held_inbound) {
                    self.inner
                        .on_connection_event(ConnectionEvent::FullyNegotiatedInbound(stream));
                }
            }
            GateIn::Inner(event) => self.inner.on_behaviour_event(event),
        }
    }

    fn connection_keep_alive(&self) -> bool {
        self.inner.connection_keep_alive()
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<
        ConnectionHandlerEvent<Self::OutboundProtocol, Self::OutboundOpenInfo, Self::ToBehaviour>,
    > {
        if self.open
            && let Some(protocol) = self.held_outbound.pop_front()
        {
            return Poll::Ready(ConnectionHandlerEvent::OutboundSubstreamRequest { protocol });
        }
        for _ in 0..MAX_EVENTS_PER_POLL {
            match self.inner.poll(cx) {
                Poll::Ready(ConnectionHandlerEvent::OutboundSubstreamRequest { protocol })
                    if !self.open =>
                {
                    if self.held_outbound.len() < MAX_HELD_STREAMS {
                        self.held_outbound.push_back(protocol);
                    }
                }
                other => return other,
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn on_connection_event(
        &mut self,
        event: ConnectionEvent<
            '_,
            Self::InboundProtocol,
            Self::OutboundProtocol,
            Self::InboundOpenInfo,
            Self::OutboundOpenInfo,
        >,
    ) {
        match event {
            ConnectionEvent::FullyNegotiatedInbound(stream) if !self.open => {
                if self.held_inbound.len() < MAX_HELD_STREAMS {
                    self.held_inbound.push_back(stream);
                }
            }
            other => self.inner.on_connection_event(other),
        }
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Option<Self::ToBehaviour>> {
        self.inner.poll_close(cx)
    }
}

//! Inbound tensor streams, taken without loss.
//!
//! libp2p-stream hands inbound streams to its listener through a channel of one slot,
//! filled from the connections' own tasks: when two peers open a stream at the same moment
//! (every member at the start of a round), the second finds the slot taken and is dropped
//! unread. The sender learns of it only from a STOP_SENDING that may come after its write
//! was already reported done, so the message is lost without an error.
//!
//! This behaviour takes the tensor protocol's inbound streams itself: each connection's
//! handler passes a negotiated stream up as a handler event, which the swarm delivers to
//! the behaviour in order and with backpressure, and the behaviour hands it to the network
//! task as a swarm event. Outbound streams still open through libp2p-stream's control, which
//! needs no listener of its own for the protocol.

use std::collections::VecDeque;
use std::task::{Context, Poll};

use libp2p::core::upgrade::{DeniedUpgrade, ReadyUpgrade};
use libp2p::core::{Endpoint, Multiaddr, transport::PortUse};
use libp2p::swarm::handler::{ConnectionEvent, FullyNegotiatedInbound};
use libp2p::swarm::{
    ConnectionDenied, ConnectionHandler, ConnectionHandlerEvent, ConnectionId, FromSwarm,
    NetworkBehaviour, SubstreamProtocol, THandler, THandlerInEvent, THandlerOutEvent, ToSwarm,
};
use libp2p::{PeerId, Stream, StreamProtocol};

/// An inbound stream of the tensor protocol from `peer`, to read.
#[derive(Debug)]
pub(crate) struct TensorInboundEvent {
    pub(crate) peer: PeerId,
    pub(crate) stream: Stream,
}

/// Accepts the tensor protocol's inbound streams on every connection.
pub(crate) struct TensorInbound {
    protocol: StreamProtocol,
    /// Streams not yet handed to the network task. The swarm polls its behaviours after
    /// each connection event and returns the first event they give before it takes the
    /// next connection event, so at most one stream waits here.
    waiting: VecDeque<(PeerId, Stream)>,
}

impl TensorInbound {
    /// Accepts inbound streams of `protocol`.
    pub(crate) fn new(protocol: StreamProtocol) -> TensorInbound {
        TensorInbound {
            protocol,
            waiting: VecDeque::new(),
        }
    }

    fn handler(&self) -> TensorInboundHandler {
        TensorInboundHandler {
            protocol: self.protocol.clone(),
            negotiated: VecDeque::new(),
        }
    }
}

impl NetworkBehaviour for TensorInbound {
    type ConnectionHandler = TensorInboundHandler;
    type ToSwarm = TensorInboundEvent;

    fn handle_established_inbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(self.handler())
    }

    fn handle_established_outbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: Endpoint,
        _: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(self.handler())
    }

    fn on_swarm_event(&mut self, _: FromSwarm<'_>) {}

    fn on_connection_handler_event(
        &mut self,
        peer: PeerId,
        _: ConnectionId,
        stream: THandlerOutEvent<Self>,
    ) {
        self.waiting.push_back((peer, stream));
    }

    fn poll(&mut self, _: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        match self.waiting.pop_front() {
            Some((peer, stream)) => {
                Poll::Ready(ToSwarm::GenerateEvent(TensorInboundEvent { peer, stream }))
            }
            None => Poll::Pending,
        }
    }
}

/// One connection's side: negotiates the tensor protocol for inbound streams and passes
/// each one up. It opens nothing itself.
pub(crate) struct TensorInboundHandler {
    protocol: StreamProtocol,
    negotiated: VecDeque<Stream>,
}

impl ConnectionHandler for TensorInboundHandler {
    type FromBehaviour = std::convert::Infallible;
    type ToBehaviour = Stream;
    type InboundProtocol = ReadyUpgrade<StreamProtocol>;
    type OutboundProtocol = DeniedUpgrade;
    type InboundOpenInfo = ();
    type OutboundOpenInfo = ();

    fn listen_protocol(&self) -> SubstreamProtocol<Self::InboundProtocol> {
        SubstreamProtocol::new(ReadyUpgrade::new(self.protocol.clone()), ())
    }

    fn poll(
        &mut self,
        _: &mut Context<'_>,
    ) -> Poll<ConnectionHandlerEvent<Self::OutboundProtocol, (), Self::ToBehaviour>> {
        match self.negotiated.pop_front() {
            Some(stream) => Poll::Ready(ConnectionHandlerEvent::NotifyBehaviour(stream)),
            None => Poll::Pending,
        }
    }

    fn on_behaviour_event(&mut self, event: Self::FromBehaviour) {
        match event {}
    }

    fn on_connection_event(
        &mut self,
        event: ConnectionEvent<'_, Self::InboundProtocol, Self::OutboundProtocol>,
    ) {
        // Outbound events do not happen (the handler opens nothing), and an inbound upgrade
        // of a protocol already agreed on cannot fail.
        if let ConnectionEvent::FullyNegotiatedInbound(FullyNegotiatedInbound {
            protocol: stream,
            ..
        }) = event
        {
            self.negotiated.push_back(stream);
        }
    }
}

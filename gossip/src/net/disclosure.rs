//! What a connected peer learns from this one before and after it proves its invite.
//!
//! - **Our hello** (which carries our invite) goes first only on a connection this side
//!   dialed: the dialer proves first. On a connection it accepted, this side waits for the
//!   remote's hello, checks it, and only then answers with its own and asks for the
//!   remote's acceptance. A stranger that connects therefore gets no invite; a peer this
//!   side dials (a bootstrap address from the config, or an address a member gave through
//!   the DHT) gets ours, as it must to let us in.
//! - **Kademlia, identify, gossipsub, AutoNAT and DCUtR** streams wait on each connection until the peer is
//!   admitted (the `gate` module), so a stranger gets neither members' ids and addresses,
//!   nor this peer's listen addresses, nor its gossip topic and the members' heartbeats
//!   relayed on it; what a stranger publishes is never read.
//!
//! Everything else a stranger can reach (tensor streams, control requests other than the
//! hello) is refused until admission by the network task itself.

use libp2p::swarm::ConnectionId;

use super::actor::NetActor;

impl NetActor {
    /// A new connection to `peer`: an admitted peer's streams flow on it at once; on a
    /// connection this side dialed, our hello goes out unless one is under way or the peer
    /// already accepted us.
    pub(crate) fn disclose_on_connection(
        &mut self,
        peer: libp2p::PeerId,
        connection: ConnectionId,
        dialed: bool,
    ) {
        let Some(state) = self.peers.get(&peer) else {
            return;
        };
        let admitted = state.admitted.is_some();
        let ask = dialed && state.hello_request.is_none() && !state.accepted_us;
        if admitted {
            self.open_gates(peer, &[connection]);
        }
        if ask {
            self.send_hello(peer);
        }
    }

    /// `peer` has just been admitted: its held Kademlia, identify and gossip streams go through on
    /// every connection, and if it has not seen our hello yet (it dialed us), it gets it now.
    pub(crate) fn disclose_to_admitted(&mut self, peer: libp2p::PeerId) {
        let Some(state) = self.peers.get(&peer) else {
            return;
        };
        let connections = state.connections.clone();
        let ask = state.hello_request.is_none() && !state.accepted_us;
        self.open_gates(peer, &connections);
        if ask {
            self.send_hello(peer);
        }
    }

    fn open_gates(&mut self, peer: libp2p::PeerId, connections: &[ConnectionId]) {
        let behaviour = self.swarm.behaviour_mut();
        behaviour.kad.open(peer, connections);
        behaviour.identify.open(peer, connections);
        behaviour.gossipsub.open(peer, connections);
        behaviour.autonat.open(peer, connections);
        behaviour.dcutr.open(peer, connections);
    }
}

//! One ed25519 identity, seen by murmur and by libp2p.
//!
//! The transport authenticates a connection with the libp2p form of the key; the invite and
//! the heartbeats are signed with murmur's. Both are built from the same secret seed, so the
//! peer id libp2p authenticates is the peer id the invite names.

use std::sync::Arc;

use murmur_protocol::identity::{Keypair, PeerId, SECRET_SEED_LEN};

use super::error::NetError;

/// A peer's key in the two forms the network layer needs.
pub struct NetIdentity {
    keypair: Arc<Keypair>,
    libp2p: libp2p::identity::Keypair,
}

impl NetIdentity {
    /// Both forms of the key with RFC 8032 secret seed `seed`. The caller should wipe its
    /// copy of the seed afterwards.
    pub fn from_seed(seed: [u8; SECRET_SEED_LEN]) -> NetIdentity {
        let keypair = Arc::new(Keypair::from_seed(seed));
        let mut copy = seed;
        // An ed25519 secret of the right length always decodes.
        let libp2p = libp2p::identity::Keypair::ed25519_from_bytes(&mut copy)
            .unwrap_or_else(|_| unreachable!("32-byte ed25519 seeds always decode"));
        copy.fill(0);
        std::hint::black_box(&mut copy);
        NetIdentity { keypair, libp2p }
    }

    /// Both forms of `keypair`, e.g. one loaded from its key file.
    pub fn from_keypair(keypair: &Keypair) -> NetIdentity {
        NetIdentity::from_seed(*keypair.secret_seed())
    }

    /// The murmur form, for signing heartbeats.
    pub fn keypair(&self) -> &Arc<Keypair> {
        &self.keypair
    }

    /// The libp2p form, for the transport.
    pub fn libp2p(&self) -> &libp2p::identity::Keypair {
        &self.libp2p
    }

    /// This peer's id.
    pub fn peer_id(&self) -> PeerId {
        self.keypair.peer_id()
    }
}

impl std::fmt::Debug for NetIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetIdentity")
            .field("peer_id", &self.peer_id())
            .finish_non_exhaustive()
    }
}

/// The libp2p peer id of a murmur peer id (the same bytes).
pub(crate) fn to_libp2p(peer: &PeerId) -> libp2p::PeerId {
    // Our 38-byte encoding is libp2p's identity-multihash of the protobuf-encoded ed25519
    // key, so libp2p always accepts it.
    libp2p::PeerId::from_bytes(&peer.to_bytes())
        .unwrap_or_else(|_| unreachable!("murmur peer ids are valid libp2p peer ids"))
}

/// The murmur peer id of a libp2p peer id, if it is an ed25519 one.
pub(crate) fn from_libp2p(peer: &libp2p::PeerId) -> Result<PeerId, NetError> {
    PeerId::from_bytes(&peer.to_bytes()).map_err(|_| NetError::ForeignPeerId(peer.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_name_the_same_peer() {
        let identity = NetIdentity::from_seed([3; 32]);
        let loaded = NetIdentity::from_keypair(&Keypair::from_seed([3; 32]));
        assert_eq!(loaded.libp2p().public(), identity.libp2p().public());
        let ours = identity.peer_id();
        let theirs = identity.libp2p().public().to_peer_id();
        assert_eq!(to_libp2p(&ours), theirs);
        assert_eq!(from_libp2p(&theirs).ok(), Some(ours));
        assert_eq!(ours.to_string(), theirs.to_string());
    }
}

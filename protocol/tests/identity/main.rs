//! Identity: libp2p-compatible peer ids, the key file's permissions, invites and signed
//! envelopes, each bad input asserted to give its own error.

mod envelope;
mod ids;
mod invite;
mod key_file;

use std::str::FromStr;

use murmur_protocol::identity::{
    ENVELOPE_DOMAIN, INVITE_DOMAIN, Invite, Keypair, PayloadType, PeerId, SignedEnvelope, SwarmId,
};
use proptest::prelude::*;

fn keypair(byte: u8) -> Keypair {
    Keypair::from_seed([byte; 32])
}

fn swarm(name: &str) -> SwarmId {
    SwarmId::new(name).expect("test swarm ids are valid")
}

proptest! {
    /// No input makes the parsers panic.
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = Invite::decode(&bytes);
        let _ = SignedEnvelope::decode(&bytes).map(|view| view.open(PayloadType::HEARTBEAT));
        let _ = PeerId::from_bytes(&bytes);
        let _ = SwarmId::from_bytes(&bytes);
        let _ = PeerId::from_str(&String::from_utf8_lossy(&bytes));
    }

    /// Inputs that carry the right format tag reach every field decoder; none panics.
    #[test]
    fn tagged_decoders_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..400)) {
        let invite = [&INVITE_DOMAIN[..], &tail].concat();
        let _ = Invite::decode(&invite);
        let envelope = [&ENVELOPE_DOMAIN[..], &tail].concat();
        let _ = SignedEnvelope::decode(&envelope).map(|view| view.open(PayloadType::HEARTBEAT));
        let peer_id = [&[0x00, 0x24, 0x08, 0x01, 0x12, 0x20][..], &tail].concat();
        let _ = PeerId::from_bytes(&peer_id);
    }
}

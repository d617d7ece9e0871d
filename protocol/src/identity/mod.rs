//! Who a peer is, and what it may do: ed25519 identities, invites and signed envelopes.
//!
//! - [`Keypair`], [`PublicKey`], [`Signature`]: ed25519 (RFC 8032) through ed25519-dalek,
//!   always verified strictly.
//! - [`PeerId`]: a peer's name, byte-for-byte the same as libp2p's ed25519 peer id, so the
//!   id a peer signs with is the id the transport authenticates.
//! - The key file ([`Keypair::create_file`], [`Keypair::load_file`]): the secret on disk,
//!   created with mode `0600` and refused when others can read it.
//! - [`SwarmId`]: the validated name of a training swarm.
//! - [`Invite`]: the swarm authority's signature over (peer id, swarm id, validity window);
//!   peers without a valid invite are disconnected before any of their data is read.
//! - [`SignedEnvelope`]: small payloads such as heartbeats, signed by their author so they
//!   can be relayed by gossip.
//!
//! Everything that is signed starts with a format tag of its own (`murmur/invite/v1\0`,
//! `murmur/envelope/v1\0`), so a signature made for one kind of message is never valid as
//! another. Nothing here reads a clock: times are parameters, in unix seconds. The key file
//! is the only I/O.

mod base58;
mod envelope;
mod invite;
mod key_file;
mod keypair;
mod peer_id;
mod revocation;
mod swarm_id;

pub use envelope::{
    ENVELOPE_DOMAIN, EnvelopeError, MAX_ENVELOPE_PAYLOAD_LEN, PayloadType, SignedEnvelope,
    SignedEnvelopeView,
};
pub use invite::{
    INVITE_CLOCK_SKEW_S, INVITE_DOMAIN, Invite, InviteDecodeError, InviteError, MAX_INVITE_LEN,
};
pub use key_file::{KEY_FILE_HEADER, KeyFileError};
pub use keypair::{
    EntropyError, InvalidPublicKey, Keypair, PUBLIC_KEY_LEN, PublicKey, SECRET_SEED_LEN,
    SIGNATURE_LEN, Signature, VerifyError,
};
pub use peer_id::{PeerId, PeerIdError};
pub use revocation::{
    MAX_REVOCATIONS_LEN, MAX_REVOKED, REVOCATION_DOMAIN, RevocationDecodeError, RevocationError,
    Revocations,
};
pub use swarm_id::{SwarmId, SwarmIdError};

//! The hello that opens every connection.

use super::fields::{U16_PREFIX_LEN, check_len, decode_with, encode_with};
use super::fields::{read_bytes_u16, write_bytes_u16};
use super::{MessageError, WireMessage};
use crate::frame::FrameKind;

/// Largest encoded invite certificate accepted, in bytes.
pub const MAX_HELLO_INVITE_LEN: usize = 1024;

/// The first frame each side sends on a connection: who it is, what it speaks, and the
/// invite that admits it to the swarm. A peer reads nothing else from a connection until
/// the hello's invite has been verified, and answers a bad one with a
/// [`Reject`](super::Reject).
///
/// Frames carrying a hello use the lowest frame version the sender speaks, so that any
/// peer can read it and pick the highest version both sides share.
///
/// Wire form: `min_version u8 | max_version u8 | public_key [32] | nonce [32] |
/// invite_len u16 | invite`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthHello<'a> {
    /// Lowest protocol version the sender speaks; at least 1.
    pub min_version: u8,
    /// Highest protocol version the sender speaks; at least `min_version`.
    pub max_version: u8,
    /// The sender's ed25519 public key. Must match the key the transport authenticated and
    /// the key the invite was issued to.
    pub public_key: [u8; 32],
    /// Fresh random bytes chosen by the sender for this connection, for the handshake to
    /// include in what it signs, so that a signature made on one connection cannot be
    /// replayed on another.
    pub nonce: [u8; 32],
    /// The sender's invite certificate, signed by the swarm authority, in the encoding of
    /// [`identity`](crate::identity); opaque here. 1 to [`MAX_HELLO_INVITE_LEN`] bytes.
    pub invite: &'a [u8],
}

const FIXED_LEN: usize = 1 + 1 + 32 + 32 + U16_PREFIX_LEN;

impl<'a> WireMessage<'a> for AuthHello<'a> {
    const KIND: FrameKind = FrameKind::AuthHello;

    fn encoded_len(&self) -> usize {
        FIXED_LEN + self.invite.len()
    }

    fn validate(&self) -> Result<(), MessageError> {
        if self.min_version == 0 {
            return Err(MessageError::InvalidField {
                field: "min_version",
                reason: "protocol versions start at 1",
            });
        }
        if self.max_version < self.min_version {
            return Err(MessageError::InvalidField {
                field: "max_version",
                reason: "must not be below min_version",
            });
        }
        if self.invite.is_empty() {
            return Err(MessageError::InvalidField {
                field: "invite",
                reason: "must not be empty",
            });
        }
        check_len("invite", self.invite.len(), MAX_HELLO_INVITE_LEN)
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        self.validate()?;
        encode_with(out, self.encoded_len(), |w| {
            w.u8(self.min_version)?;
            w.u8(self.max_version)?;
            w.bytes(&self.public_key)?;
            w.bytes(&self.nonce)?;
            write_bytes_u16(w, "invite", self.invite)
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        let hello = decode_with(Self::KIND, payload, |r| {
            Ok(AuthHello {
                min_version: r.u8("min_version")?,
                max_version: r.u8("max_version")?,
                public_key: r.array("public_key")?,
                nonce: r.array("nonce")?,
                invite: read_bytes_u16(r, "invite", MAX_HELLO_INVITE_LEN)?,
            })
        })?;
        hello.validate()?;
        Ok(hello)
    }
}

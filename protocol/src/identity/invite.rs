//! Invite certificates: the swarm authority's signed statement that a peer may join a swarm
//! until a given time.
//!
//! A run organizer holds the swarm authority key. For every volunteer it signs an [`Invite`]
//! naming the volunteer's peer id, the swarm and a validity window. Peers present their
//! invite when they connect; a peer whose invite does not [`verify`](Invite::verify) is
//! disconnected before any of its tensors is read.
//!
//! # Wire format
//!
//! Integers are little-endian.
//!
//! ```text
//! "murmur/invite/v1\0"  17 bytes  format tag; doubles as the signature's domain separator
//! peer key              32 bytes  ed25519 key of the invited peer (its peer id is derived)
//! swarm id length        1 byte   1..=64
//! swarm id              n bytes   [a-z0-9._-]
//! issued at              8 bytes  unix seconds
//! expires at             8 bytes  unix seconds, exclusive
//! authority key         32 bytes  ed25519 key of the swarm authority
//! signature             64 bytes  authority's ed25519 signature over all preceding bytes
//! ```
//!
//! Because the signed bytes start with the format tag, an invite signature can never be
//! mistaken for a signature over any other murmur message, whose tags differ.
//!
//! # Time
//!
//! The module reads no clock: callers pass `now` in unix seconds. An invite is valid from
//! `issued_at` (accepted up to [`INVITE_CLOCK_SKEW_S`] early, because an invite is often used
//! the moment it is issued and the verifier's clock may lag the authority's) until just before
//! `expires_at`, which is the authority's hard limit and gets no allowance.

use thiserror::Error;

use super::keypair::{Keypair, PUBLIC_KEY_LEN, PublicKey, SIGNATURE_LEN, Signature};
use super::peer_id::PeerId;
use super::swarm_id::{SwarmId, SwarmIdError};
use crate::wire::{BufferTooSmall, Reader, Truncated, Writer};

/// The format tag every invite starts with, and the domain separator of its signature.
pub const INVITE_DOMAIN: &[u8; 17] = b"murmur/invite/v1\0";
/// How far ahead of the verifier's clock an invite's `issued_at` may be: five minutes.
pub const INVITE_CLOCK_SKEW_S: u64 = 300;
/// The longest encoded invite (one with a swarm id of [`SwarmId::MAX_LEN`] bytes).
pub const MAX_INVITE_LEN: usize = FIXED_LEN + SwarmId::MAX_LEN;
/// Bytes of an invite other than the swarm id.
const FIXED_LEN: usize =
    INVITE_DOMAIN.len() + PUBLIC_KEY_LEN + 1 + 8 + 8 + PUBLIC_KEY_LEN + SIGNATURE_LEN;

/// A swarm authority's signed permission for one peer to join one swarm for a while.
///
/// Built by [`Invite::issue`] or [`Invite::decode`]; neither checks the signature, so call
/// [`Invite::verify`] before trusting a decoded invite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invite {
    peer: PeerId,
    swarm: SwarmId,
    issued_at: u64,
    expires_at: u64,
    authority: PublicKey,
    signature: Signature,
}

/// Why an invite does not admit a peer, or could not be issued.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InviteError {
    /// The invite's validity window has passed.
    #[error(
        "invite expired at {expired_at} (unix seconds) and it is now {now}; \
         ask the run organizer for a new invite"
    )]
    Expired {
        /// The invite's `expires_at`.
        expired_at: u64,
        /// The verifier's time.
        now: u64,
    },
    /// The invite's validity window starts more than [`INVITE_CLOCK_SKEW_S`] from now.
    #[error(
        "invite is valid only from {valid_from} (unix seconds) but it is now {now}; \
         check this host's clock"
    )]
    NotYetValid {
        /// The invite's `issued_at`.
        valid_from: u64,
        /// The verifier's time.
        now: u64,
    },
    /// The window is empty: it ends no later than it starts.
    #[error(
        "invite is never valid: it expires at {expires_at}, not after its issue time {issued_at}"
    )]
    EmptyValidity {
        /// The invite's `issued_at`.
        issued_at: u64,
        /// The invite's `expires_at`.
        expires_at: u64,
    },
    /// The invite admits its peer to another swarm.
    #[error(
        "invite is for swarm `{found}`, not `{expected}`; use the invite issued for this swarm"
    )]
    WrongSwarm {
        /// The swarm the verifier belongs to.
        expected: SwarmId,
        /// The swarm named in the invite.
        found: SwarmId,
    },
    /// The invite was issued to another peer than the one presenting it.
    #[error("invite was issued to peer {found}, but peer {expected} presented it")]
    WrongPeer {
        /// The peer presenting the invite.
        expected: PeerId,
        /// The peer named in the invite.
        found: PeerId,
    },
    /// The invite names another authority than this swarm's.
    #[error(
        "invite was signed by authority {found}, but this swarm's authority is {expected}; \
         check the swarm config's authority key"
    )]
    WrongAuthority {
        /// Peer id of the swarm's authority key.
        expected: PeerId,
        /// Peer id of the key named in the invite.
        found: PeerId,
    },
    /// The signature does not cover these contents: the invite was forged or altered.
    #[error("invite signature does not verify: the invite was altered or forged")]
    BadSignature,
}

/// Why bytes are not an invite.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InviteDecodeError {
    /// The bytes do not start with [`INVITE_DOMAIN`].
    #[error("not a murmur invite: bytes do not start with the `murmur/invite/v1` tag")]
    UnknownFormat,
    /// The bytes end inside a field.
    #[error("invite is truncated: {0}")]
    Truncated(#[from] Truncated),
    /// The peer key is not an ed25519 public key.
    #[error("invite's peer key is not an ed25519 public key")]
    InvalidPeerKey,
    /// The swarm id is not valid.
    #[error("invite's swarm id is invalid: {0}")]
    InvalidSwarmId(#[source] SwarmIdError),
    /// The authority key is not an ed25519 public key.
    #[error("invite's authority key is not an ed25519 public key")]
    InvalidAuthorityKey,
    /// Bytes follow the signature.
    #[error("invite is followed by {count} unexpected bytes")]
    TrailingBytes {
        /// How many bytes follow.
        count: usize,
    },
}

impl Invite {
    /// Signs an invite admitting `peer` to `swarm` from `issued_at` until just before
    /// `expires_at` (unix seconds).
    pub fn issue(
        authority: &Keypair,
        peer: &PeerId,
        swarm: &SwarmId,
        issued_at: u64,
        expires_at: u64,
    ) -> Result<Invite, InviteError> {
        if expires_at <= issued_at {
            return Err(InviteError::EmptyValidity {
                issued_at,
                expires_at,
            });
        }
        let mut invite = Invite {
            peer: *peer,
            swarm: swarm.clone(),
            issued_at,
            expires_at,
            authority: authority.public(),
            signature: Signature::from_bytes(&[0; SIGNATURE_LEN]),
        };
        let mut buf = [0u8; MAX_INVITE_LEN];
        let signed_len = invite
            .write_signed(&mut Writer::new(&mut buf))
            // A SwarmId is at most SwarmId::MAX_LEN bytes, so every invite fits.
            .expect("MAX_INVITE_LEN bounds every invite");
        invite.signature = authority.sign(&buf[..signed_len]);
        Ok(invite)
    }

    /// The peer the invite admits.
    pub fn peer(&self) -> &PeerId {
        &self.peer
    }

    /// The swarm the invite admits the peer to.
    pub fn swarm(&self) -> &SwarmId {
        &self.swarm
    }

    /// Start of the validity window, unix seconds.
    pub fn issued_at(&self) -> u64 {
        self.issued_at
    }

    /// End of the validity window (exclusive), unix seconds.
    pub fn expires_at(&self) -> u64 {
        self.expires_at
    }

    /// The key that signed the invite.
    pub fn authority(&self) -> &PublicKey {
        &self.authority
    }

    /// The authority's signature.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// Checks that this invite admits `expected_peer` to `expected_swarm` at `now_unix_s`,
    /// signed by `authority`.
    ///
    /// Checks run in this order, and the first failure is returned: authority, signature
    /// (so a tampered field is reported as [`InviteError::BadSignature`], never as what the
    /// tampering claims), swarm, peer, validity window.
    pub fn verify(
        &self,
        authority: &PublicKey,
        expected_swarm: &SwarmId,
        expected_peer: &PeerId,
        now_unix_s: u64,
    ) -> Result<(), InviteError> {
        if self.authority != *authority {
            return Err(InviteError::WrongAuthority {
                expected: authority.peer_id(),
                found: self.authority.peer_id(),
            });
        }
        let mut buf = [0u8; MAX_INVITE_LEN];
        // Fail closed: an invite that does not fit cannot carry a valid signature.
        let signed_len = self
            .write_signed(&mut Writer::new(&mut buf))
            .map_err(|_| InviteError::BadSignature)?;
        authority
            .verify(&buf[..signed_len], &self.signature)
            .map_err(|_| InviteError::BadSignature)?;
        if self.swarm != *expected_swarm {
            return Err(InviteError::WrongSwarm {
                expected: expected_swarm.clone(),
                found: self.swarm.clone(),
            });
        }
        if self.peer != *expected_peer {
            return Err(InviteError::WrongPeer {
                expected: *expected_peer,
                found: self.peer,
            });
        }
        let (issued_at, expires_at) = (self.issued_at, self.expires_at);
        if expires_at <= issued_at {
            return Err(InviteError::EmptyValidity {
                issued_at,
                expires_at,
            });
        }
        if now_unix_s.saturating_add(INVITE_CLOCK_SKEW_S) < issued_at {
            return Err(InviteError::NotYetValid {
                valid_from: issued_at,
                now: now_unix_s,
            });
        }
        if now_unix_s >= expires_at {
            return Err(InviteError::Expired {
                expired_at: expires_at,
                now: now_unix_s,
            });
        }
        Ok(())
    }

    /// Length of [`Invite::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        FIXED_LEN + self.swarm.as_bytes().len()
    }

    /// Writes the invite into `out` and returns the number of bytes written.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize, BufferTooSmall> {
        let mut writer = Writer::new(out);
        self.write_signed(&mut writer)?;
        writer.bytes(&self.signature.to_bytes())?;
        Ok(writer.position())
    }

    /// The invite's wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.encoded_len()];
        let written = self.encode_into(&mut out);
        debug_assert_eq!(written, Ok(out.len()), "encoded_len matches encode_into");
        out
    }

    /// Parses an invite, strictly: every length is checked and nothing may follow it.
    ///
    /// The signature is not checked here; see [`Invite::verify`].
    pub fn decode(bytes: &[u8]) -> Result<Invite, InviteDecodeError> {
        let mut reader = Reader::new(bytes);
        if reader.bytes(INVITE_DOMAIN.len(), "invite format tag")? != INVITE_DOMAIN {
            return Err(InviteDecodeError::UnknownFormat);
        }
        let peer = PublicKey::from_bytes(&reader.array("peer key")?)
            .map_err(|_| InviteDecodeError::InvalidPeerKey)?
            .peer_id();
        let swarm_len = usize::from(reader.u8("swarm id length")?);
        // Check the declared length before reading, so the error names the real problem.
        if swarm_len == 0 {
            return Err(InviteDecodeError::InvalidSwarmId(SwarmIdError::Empty));
        }
        if swarm_len > SwarmId::MAX_LEN {
            return Err(InviteDecodeError::InvalidSwarmId(SwarmIdError::TooLong {
                len: swarm_len,
                max: SwarmId::MAX_LEN,
            }));
        }
        let swarm = SwarmId::from_bytes(reader.bytes(swarm_len, "swarm id")?)
            .map_err(InviteDecodeError::InvalidSwarmId)?;
        let issued_at = reader.u64("issued at")?;
        let expires_at = reader.u64("expires at")?;
        let authority = PublicKey::from_bytes(&reader.array("authority key")?)
            .map_err(|_| InviteDecodeError::InvalidAuthorityKey)?;
        let signature = Signature::from_bytes(&reader.array("signature")?);
        if reader.remaining() != 0 {
            return Err(InviteDecodeError::TrailingBytes {
                count: reader.remaining(),
            });
        }
        Ok(Invite {
            peer,
            swarm,
            issued_at,
            expires_at,
            authority,
            signature,
        })
    }

    /// Writes everything the signature covers and returns its length.
    fn write_signed(&self, writer: &mut Writer<'_>) -> Result<usize, BufferTooSmall> {
        let swarm = self.swarm.as_bytes();
        writer.bytes(INVITE_DOMAIN)?;
        writer.bytes(self.peer.key_bytes())?;
        // A SwarmId is at most 64 bytes, so its length fits the u8.
        writer.u8(swarm.len() as u8)?;
        writer.bytes(swarm)?;
        writer.u64(self.issued_at)?;
        writer.u64(self.expires_at)?;
        writer.bytes(self.authority.as_bytes())?;
        Ok(writer.position())
    }
}

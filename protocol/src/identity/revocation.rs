//! Revocation lists: the swarm authority's signed statement that some invited peers no longer
//! belong to the swarm, whatever their invites say.
//!
//! An invite cannot be taken back once sent, and lives for its whole validity window (30
//! days by default). When a volunteer misbehaves or its key leaks, the organizer signs a
//! [`Revocations`] list naming its peer id; peers refuse a revoked peer's hello, drop its
//! heartbeats, and close its connections. Each list carries a `serial`: a peer keeps the
//! list with the highest serial it has verified, so an older list replayed by anyone never
//! undoes a newer one. A list replaces the one before it (it names every peer still
//! revoked), so an organizer can also lift a revocation by leaving a peer out.
//!
//! # Wire format
//!
//! Integers are little-endian.
//!
//! ```text
//! "murmur/revoke/v1\0"  17 bytes  format tag; doubles as the signature's domain separator
//! swarm id length        1 byte   1..=64
//! swarm id              n bytes   [a-z0-9._-]
//! serial                 8 bytes  higher replaces lower
//! revoked count          2 bytes  0..=MAX_REVOKED
//! revoked peer keys   32×c bytes  ed25519 keys, strictly ascending
//! authority key         32 bytes  ed25519 key of the swarm authority
//! signature             64 bytes  authority's ed25519 signature over all preceding bytes
//! ```
//!
//! Keys are strictly ascending so that one set of peers has one encoding, and lookups are a
//! binary search.

use thiserror::Error;

use super::keypair::{Keypair, PUBLIC_KEY_LEN, PublicKey, SIGNATURE_LEN, Signature};
use super::peer_id::PeerId;
use super::swarm_id::{SwarmId, SwarmIdError};
use crate::wire::{Reader, Truncated, Writer};

/// The format tag every revocation list starts with, and its signature's domain separator.
pub const REVOCATION_DOMAIN: &[u8; 17] = b"murmur/revoke/v1\0";
/// The most peers one list may name: enough for every revocation within an invite's
/// lifetime, and small enough (about 32 KiB) for one gossip message.
pub const MAX_REVOKED: usize = 1024;
/// The longest encoded list.
pub const MAX_REVOCATIONS_LEN: usize = FIXED_LEN + SwarmId::MAX_LEN + MAX_REVOKED * PUBLIC_KEY_LEN;
/// Bytes of a list other than the swarm id and the revoked keys.
const FIXED_LEN: usize = REVOCATION_DOMAIN.len() + 1 + 8 + 2 + PUBLIC_KEY_LEN + SIGNATURE_LEN;

/// A swarm authority's signed list of revoked peers.
///
/// Built by [`Revocations::issue`] or [`Revocations::decode`]; neither checks the
/// signature, so call [`Revocations::verify`] before trusting a decoded list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocations {
    swarm: SwarmId,
    serial: u64,
    revoked: Vec<PeerId>,
    authority: PublicKey,
    signature: Signature,
}

/// Why a list cannot be issued or does not hold.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RevocationError {
    /// More peers than [`MAX_REVOKED`].
    #[error("a revocation list names at most {MAX_REVOKED} peers, not {count}")]
    TooMany {
        /// How many were given.
        count: usize,
    },
    /// Signed by another key than the swarm's authority.
    #[error("revocation list signed by {found}, but this swarm's authority is {expected}")]
    WrongAuthority {
        /// The swarm's authority.
        expected: PeerId,
        /// The list's signer.
        found: PeerId,
    },
    /// For another swarm.
    #[error("revocation list is for swarm {found}, not {expected}")]
    WrongSwarm {
        /// This swarm.
        expected: SwarmId,
        /// The list's swarm.
        found: SwarmId,
    },
    /// The signature does not cover the bytes.
    #[error("revocation list signature does not verify: the list was altered or forged")]
    BadSignature,
}

/// Why bytes are not a revocation list.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RevocationDecodeError {
    /// The bytes do not start with [`REVOCATION_DOMAIN`].
    #[error("not a murmur revocation list: bytes do not start with the `murmur/revoke/v1` tag")]
    UnknownFormat,
    /// The bytes end inside a field.
    #[error("revocation list is truncated: {0}")]
    Truncated(#[from] Truncated),
    /// The swarm id is not valid.
    #[error("revocation list's swarm id is invalid: {0}")]
    InvalidSwarmId(#[source] SwarmIdError),
    /// The count is over [`MAX_REVOKED`].
    #[error("revocation list names {count} peers; at most {MAX_REVOKED} are allowed")]
    TooMany {
        /// The declared count.
        count: usize,
    },
    /// A revoked key is not an ed25519 public key.
    #[error("revoked key {index} is not an ed25519 public key")]
    InvalidPeerKey {
        /// Its position in the list.
        index: usize,
    },
    /// The keys are not strictly ascending.
    #[error("revoked keys are not strictly ascending at position {index}")]
    NotAscending {
        /// The first key out of order.
        index: usize,
    },
    /// The authority key is not an ed25519 public key.
    #[error("revocation list's authority key is not an ed25519 public key")]
    InvalidAuthorityKey,
    /// Bytes follow the signature.
    #[error("revocation list is followed by {count} unexpected bytes")]
    TrailingBytes {
        /// How many bytes follow.
        count: usize,
    },
}

impl Revocations {
    /// Signs a list revoking `revoked` (in any order, repeats allowed) in `swarm`.
    pub fn issue(
        authority: &Keypair,
        swarm: &SwarmId,
        serial: u64,
        mut revoked: Vec<PeerId>,
    ) -> Result<Revocations, RevocationError> {
        revoked.sort_unstable_by(|a, b| a.key_bytes().cmp(b.key_bytes()));
        revoked.dedup();
        if revoked.len() > MAX_REVOKED {
            return Err(RevocationError::TooMany {
                count: revoked.len(),
            });
        }
        let mut list = Revocations {
            swarm: swarm.clone(),
            serial,
            revoked,
            authority: authority.public(),
            signature: Signature::from_bytes(&[0; SIGNATURE_LEN]),
        };
        let signed = list.signed_bytes();
        list.signature = authority.sign(&signed);
        Ok(list)
    }

    /// The swarm the list is for.
    pub fn swarm(&self) -> &SwarmId {
        &self.swarm
    }

    /// Higher serials replace lower ones.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// The revoked peers, by ascending key.
    pub fn revoked(&self) -> &[PeerId] {
        &self.revoked
    }

    /// Whether `peer` is revoked.
    pub fn is_revoked(&self, peer: &PeerId) -> bool {
        self.revoked
            .binary_search_by(|p| p.key_bytes().cmp(peer.key_bytes()))
            .is_ok()
    }

    /// Checks that the list is `authority`'s, for `swarm`, and unaltered.
    pub fn verify(&self, authority: &PublicKey, swarm: &SwarmId) -> Result<(), RevocationError> {
        if self.authority != *authority {
            return Err(RevocationError::WrongAuthority {
                expected: authority.peer_id(),
                found: self.authority.peer_id(),
            });
        }
        authority
            .verify(&self.signed_bytes(), &self.signature)
            .map_err(|_| RevocationError::BadSignature)?;
        if self.swarm != *swarm {
            return Err(RevocationError::WrongSwarm {
                expected: swarm.clone(),
                found: self.swarm.clone(),
            });
        }
        Ok(())
    }

    /// The list's wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.signed_bytes();
        out.extend_from_slice(&self.signature.to_bytes());
        out
    }

    /// Parses a list, strictly: every length is checked, keys must ascend, and nothing may
    /// follow it. The signature is not checked here; see [`Revocations::verify`].
    pub fn decode(bytes: &[u8]) -> Result<Revocations, RevocationDecodeError> {
        let mut reader = Reader::new(bytes);
        if reader.bytes(REVOCATION_DOMAIN.len(), "revocation format tag")? != REVOCATION_DOMAIN {
            return Err(RevocationDecodeError::UnknownFormat);
        }
        let swarm_len = usize::from(reader.u8("swarm id length")?);
        let swarm = SwarmId::from_bytes(reader.bytes(swarm_len, "swarm id")?)
            .map_err(RevocationDecodeError::InvalidSwarmId)?;
        let serial = reader.u64("serial")?;
        let count = usize::from(reader.u16("revoked count")?);
        if count > MAX_REVOKED {
            return Err(RevocationDecodeError::TooMany { count });
        }
        let mut revoked: Vec<PeerId> = Vec::with_capacity(count);
        for index in 0..count {
            let peer = PublicKey::from_bytes(&reader.array("revoked key")?)
                .map_err(|_| RevocationDecodeError::InvalidPeerKey { index })?
                .peer_id();
            if revoked
                .last()
                .is_some_and(|last| last.key_bytes() >= peer.key_bytes())
            {
                return Err(RevocationDecodeError::NotAscending { index });
            }
            revoked.push(peer);
        }
        let authority = PublicKey::from_bytes(&reader.array("authority key")?)
            .map_err(|_| RevocationDecodeError::InvalidAuthorityKey)?;
        let signature = Signature::from_bytes(&reader.array("signature")?);
        if reader.remaining() != 0 {
            return Err(RevocationDecodeError::TrailingBytes {
                count: reader.remaining(),
            });
        }
        Ok(Revocations {
            swarm,
            serial,
            revoked,
            authority,
            signature,
        })
    }

    /// Everything the signature covers.
    fn signed_bytes(&self) -> Vec<u8> {
        let swarm = self.swarm.as_bytes();
        let len = FIXED_LEN - SIGNATURE_LEN + swarm.len() + self.revoked.len() * PUBLIC_KEY_LEN;
        let mut out = vec![0u8; len];
        let mut writer = Writer::new(&mut out);
        // The buffer is sized for exactly these fields, so no write can fail; a SwarmId is at
        // most 64 bytes and the count at most MAX_REVOKED, so both fit their fields.
        let written = (|| {
            writer.bytes(REVOCATION_DOMAIN)?;
            writer.u8(swarm.len() as u8)?;
            writer.bytes(swarm)?;
            writer.u64(self.serial)?;
            writer.u16(self.revoked.len() as u16)?;
            for peer in &self.revoked {
                writer.bytes(peer.key_bytes())?;
            }
            writer.bytes(self.authority.as_bytes())
        })();
        debug_assert!(written.is_ok(), "signed_bytes is sized for its fields");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn swarm(id: &str) -> SwarmId {
        SwarmId::new(id.to_owned()).expect("swarm id")
    }

    fn peer(seed: u8) -> PeerId {
        Keypair::from_seed([seed; 32]).peer_id()
    }

    #[test]
    fn a_list_round_trips_and_verifies() {
        let authority = Keypair::from_seed([1; 32]);
        let list = Revocations::issue(&authority, &swarm("s"), 7, vec![peer(3), peer(2), peer(3)])
            .expect("issued");
        assert_eq!(list.revoked().len(), 2, "repeats collapse");
        let decoded = Revocations::decode(&list.encode()).expect("decodes");
        assert_eq!(decoded, list);
        decoded
            .verify(&authority.public(), &swarm("s"))
            .expect("verifies");
        assert!(decoded.is_revoked(&peer(2)) && decoded.is_revoked(&peer(3)));
        assert!(!decoded.is_revoked(&peer(4)));
        assert_eq!(decoded.serial(), 7);
    }

    #[test]
    fn another_authority_another_swarm_or_a_flipped_bit_fail() {
        let authority = Keypair::from_seed([1; 32]);
        let list = Revocations::issue(&authority, &swarm("s"), 1, vec![peer(2)]).expect("issued");
        let other = Keypair::from_seed([9; 32]);
        assert!(matches!(
            list.verify(&other.public(), &swarm("s")),
            Err(RevocationError::WrongAuthority { .. })
        ));
        assert!(matches!(
            list.verify(&authority.public(), &swarm("t")),
            Err(RevocationError::WrongSwarm { .. })
        ));
        let mut bytes = list.encode();
        // The serial's low byte: a replayed list cannot be passed off as newer.
        let serial_at = REVOCATION_DOMAIN.len() + 1 + 1;
        bytes[serial_at] ^= 1;
        let altered = Revocations::decode(&bytes).expect("still decodes");
        assert_eq!(
            altered.verify(&authority.public(), &swarm("s")),
            Err(RevocationError::BadSignature)
        );
    }

    #[test]
    fn malformed_lists_are_refused_with_the_reason() {
        let authority = Keypair::from_seed([1; 32]);
        let list =
            Revocations::issue(&authority, &swarm("s"), 1, vec![peer(2), peer(3)]).expect("issued");
        let bytes = list.encode();
        assert_eq!(
            Revocations::decode(b"murmur/invite/v1\0rest"),
            Err(RevocationDecodeError::UnknownFormat)
        );
        assert!(matches!(
            Revocations::decode(&bytes[..bytes.len() - 1]),
            Err(RevocationDecodeError::Truncated(_))
        ));
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            Revocations::decode(&longer),
            Err(RevocationDecodeError::TrailingBytes { count: 1 })
        );
        // Swap the two keys: same set, but not ascending.
        let first = REVOCATION_DOMAIN.len() + 1 + 1 + 8 + 2;
        let mut swapped = bytes.clone();
        let (a, b) = (first, first + PUBLIC_KEY_LEN);
        let key_a = bytes[a..b].to_vec();
        swapped[a..b].copy_from_slice(&bytes[b..b + PUBLIC_KEY_LEN]);
        swapped[b..b + PUBLIC_KEY_LEN].copy_from_slice(&key_a);
        assert_eq!(
            Revocations::decode(&swapped),
            Err(RevocationDecodeError::NotAscending { index: 1 })
        );
        let mut many = bytes;
        let count_at = first - 2;
        many[count_at..first].copy_from_slice(&(MAX_REVOKED as u16 + 1).to_le_bytes());
        assert_eq!(
            Revocations::decode(&many),
            Err(RevocationDecodeError::TooMany {
                count: MAX_REVOKED + 1
            })
        );
    }

    #[test]
    fn more_than_the_maximum_cannot_be_issued() {
        let authority = Keypair::from_seed([1; 32]);
        let peers: Vec<PeerId> = (0..=MAX_REVOKED as u32)
            .map(|i| {
                let mut seed = [0u8; 32];
                seed[..4].copy_from_slice(&i.to_le_bytes());
                Keypair::from_seed(seed).peer_id()
            })
            .collect();
        assert_eq!(
            Revocations::issue(&authority, &swarm("s"), 1, peers),
            Err(RevocationError::TooMany {
                count: MAX_REVOKED + 1
            })
        );
    }
}

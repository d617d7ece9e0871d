//! Peer ids, byte-for-byte compatible with libp2p's ed25519 peer ids.
//!
//! libp2p names a peer by a multihash of its protobuf-encoded public key; keys of at most
//! 42 encoded bytes, such as ed25519's 36, are inlined with the *identity* multihash (see the
//! libp2p peer-id specification). For an ed25519 key `K` the id is therefore the 38 bytes
//!
//! ```text
//! 00 24          identity multihash (code 0x00), digest length 36
//! 08 01          protobuf field 1 (KeyType), varint 1 = Ed25519
//! 12 20 K[0..32] protobuf field 2 (Data), 32 bytes: the compressed ed25519 key
//! ```
//!
//! written as base58btc, which always starts with `12D3KooW`. Because the key is inside the
//! id, [`PeerId::public_key`] recovers it without any lookup. Only ed25519 ids are accepted;
//! RSA (`Qm…`) and secp256k1 (`16Uiu2…`) ids are refused with a typed error.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use super::base58;
use super::keypair::{PUBLIC_KEY_LEN, PublicKey};

/// The fixed prefix of every ed25519 peer id: multihash header and protobuf field headers.
const PREFIX: [u8; 6] = [MULTIHASH_IDENTITY, 36, 0x08, KEY_TYPE_ED25519, 0x12, 32];
const MULTIHASH_IDENTITY: u8 = 0x00;
const KEY_TYPE_ED25519: u8 = 1;
/// Longest base58 text of an accepted id: 38 bytes need at most 52 digits.
const MAX_TEXT_LEN: usize = 52;

/// The identity of a murmur peer: its ed25519 public key, named as libp2p names it.
///
/// `Display` and `FromStr` use the base58btc text (`12D3KooW…`), the same string libp2p
/// prints. A `PeerId` always holds a valid curve point.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId {
    key: [u8; PUBLIC_KEY_LEN],
}

/// Why bytes or text are not an ed25519 peer id.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PeerIdError {
    /// The text was empty.
    #[error("peer id is empty; expected a base58 id such as `12D3KooW…`")]
    Empty,
    /// The text is longer than any ed25519 peer id.
    #[error("peer id is {len} characters long; ed25519 peer ids have at most {max}")]
    TooLong {
        /// Characters in the text.
        len: usize,
        /// The longest accepted text.
        max: usize,
    },
    /// A character outside the base58btc alphabet.
    #[error(
        "peer id has `{ch}` at character {position}, which is not base58 \
         (base58 has no 0, O, I or l)"
    )]
    InvalidCharacter {
        /// The offending character.
        ch: char,
        /// Its index among the characters of the text.
        position: usize,
    },
    /// The multihash is not the identity multihash, so the key is not inside the id.
    #[error(
        "peer id uses multihash code {code:#x}; murmur accepts only ed25519 peer ids \
         (identity multihash, text starting with `12D3KooW`)"
    )]
    UnsupportedMultihash {
        /// The multihash code found.
        code: u64,
    },
    /// The id names a key of another type than ed25519.
    #[error(
        "peer id holds a key of libp2p key type {key_type}; murmur accepts only ed25519 (type 1)"
    )]
    UnsupportedKeyType {
        /// The protobuf KeyType found.
        key_type: u8,
    },
    /// The bytes do not have the layout of an ed25519 peer id.
    #[error(
        "peer id bytes are malformed: expected 38 bytes starting 00 24 08 01 12 20, \
         found {len} bytes"
    )]
    Malformed {
        /// Length of the bytes given.
        len: usize,
    },
    /// The embedded key is not a valid ed25519 public key.
    #[error("peer id holds 32 bytes that are not an ed25519 public key")]
    InvalidKey,
}

impl PeerId {
    /// Length of the binary form.
    pub const ENCODED_LEN: usize = PREFIX.len() + PUBLIC_KEY_LEN;

    /// The id of `key`.
    pub fn from_public_key(key: &PublicKey) -> PeerId {
        PeerId {
            key: key.to_bytes(),
        }
    }

    /// The ed25519 key this id names.
    pub fn public_key(&self) -> PublicKey {
        // Every constructor stores either a `PublicKey`'s bytes or bytes that
        // `PublicKey::from_bytes` accepted, and decompression is deterministic.
        PublicKey::from_bytes(&self.key).expect("a PeerId only holds valid ed25519 keys")
    }

    /// The compressed ed25519 key inside the id, without decompressing it.
    pub(crate) fn key_bytes(&self) -> &[u8; PUBLIC_KEY_LEN] {
        &self.key
    }

    /// The libp2p binary form (identity multihash of the protobuf-encoded key).
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        let (prefix, key) = out.split_at_mut(PREFIX.len());
        prefix.copy_from_slice(&PREFIX);
        key.copy_from_slice(&self.key);
        out
    }

    /// Parses the libp2p binary form, accepting only ed25519 ids.
    pub fn from_bytes(bytes: &[u8]) -> Result<PeerId, PeerIdError> {
        let malformed = PeerIdError::Malformed { len: bytes.len() };
        let code = multihash_code(bytes).ok_or(malformed.clone())?;
        if code != u64::from(MULTIHASH_IDENTITY) {
            return Err(PeerIdError::UnsupportedMultihash { code });
        }
        // Name a foreign key type before complaining about lengths: secp256k1 ids are
        // identity multihashes too, only a byte longer.
        if let [_, _, 0x08, key_type, ..] = *bytes
            && key_type != KEY_TYPE_ED25519
        {
            return Err(PeerIdError::UnsupportedKeyType { key_type });
        }
        let Some((prefix, key)) = bytes.split_first_chunk::<{ PREFIX.len() }>() else {
            return Err(malformed);
        };
        let Ok(key) = <[u8; PUBLIC_KEY_LEN]>::try_from(key) else {
            return Err(malformed);
        };
        if *prefix != PREFIX {
            return Err(malformed);
        }
        let key = PublicKey::from_bytes(&key).map_err(|_| PeerIdError::InvalidKey)?;
        Ok(PeerId::from_public_key(&key))
    }
}

/// The multihash code at the start of `bytes` (an unsigned LEB128 varint of at most 9 bytes).
fn multihash_code(bytes: &[u8]) -> Option<u64> {
    let mut code = 0u64;
    for (i, &byte) in bytes.iter().take(9).enumerate() {
        code |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(code);
        }
    }
    None
}

impl FromStr for PeerId {
    type Err = PeerIdError;

    fn from_str(text: &str) -> Result<PeerId, PeerIdError> {
        if text.is_empty() {
            return Err(PeerIdError::Empty);
        }
        let len = text.chars().count();
        if len > MAX_TEXT_LEN {
            return Err(PeerIdError::TooLong {
                len,
                max: MAX_TEXT_LEN,
            });
        }
        // 52 base58 digits are below 58^52 < 2^305, so they always fit 39 bytes.
        let mut bytes = [0u8; MAX_TEXT_LEN];
        let n = base58::decode(text, &mut bytes).map_err(|e| match e {
            base58::DecodeError::InvalidChar { ch, position } => {
                PeerIdError::InvalidCharacter { ch, position }
            }
            base58::DecodeError::Overflow => PeerIdError::TooLong {
                len,
                max: MAX_TEXT_LEN,
            },
        })?;
        PeerId::from_bytes(&bytes[..n])
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = [0u8; MAX_TEXT_LEN];
        let n = base58::encode(&self.to_bytes(), &mut text).map_err(|_| fmt::Error)?;
        let text = std::str::from_utf8(&text[..n]).map_err(|_| fmt::Error)?;
        f.write_str(text)
    }
}

impl fmt::Debug for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeerId({self})")
    }
}

impl From<&PublicKey> for PeerId {
    fn from(key: &PublicKey) -> PeerId {
        PeerId::from_public_key(key)
    }
}

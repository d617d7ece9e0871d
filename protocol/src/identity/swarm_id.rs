//! Swarm ids: the name a training swarm goes by in invites, protocol names and topics.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// The name of a training swarm, such as `gpt2-small.run-3`.
///
/// 1 to [`SwarmId::MAX_LEN`] bytes of lowercase ASCII letters, digits, `.`, `_` and `-`,
/// starting with a letter or digit. The restriction keeps the id safe to embed in libp2p
/// protocol names, gossipsub topics, file names and metric labels without escaping.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SwarmId(String);

/// Why a string is not a valid swarm id.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SwarmIdError {
    /// The id was empty.
    #[error("swarm id is empty; use 1 to 64 characters of a-z, 0-9, `.`, `_` and `-`")]
    Empty,
    /// The id is longer than [`SwarmId::MAX_LEN`] bytes.
    #[error("swarm id is {len} bytes long; the limit is {max}")]
    TooLong {
        /// Length found, in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The id contains a character outside `[a-z0-9._-]`.
    #[error(
        "swarm id has `{ch}` at byte {position}; only a-z, 0-9, `.`, `_` and `-` are allowed \
         (uppercase letters must be lowercased)"
    )]
    InvalidCharacter {
        /// The offending character.
        ch: char,
        /// Its byte offset in the id.
        position: usize,
    },
    /// The id starts with `.`, `_` or `-`.
    #[error("swarm id starts with `{ch}`; it must start with a letter a-z or a digit")]
    InvalidStart {
        /// The first character.
        ch: char,
    },
}

impl SwarmId {
    /// The longest swarm id, in bytes.
    pub const MAX_LEN: usize = 64;

    /// Validates `id` as a swarm id.
    pub fn new(id: impl Into<String>) -> Result<SwarmId, SwarmIdError> {
        let id = id.into();
        validate(id.as_bytes())?;
        Ok(SwarmId(id))
    }

    /// Validates raw bytes, e.g. from the wire, without assuming they are UTF-8.
    pub fn from_bytes(bytes: &[u8]) -> Result<SwarmId, SwarmIdError> {
        validate(bytes)?;
        // Every accepted byte is ASCII, so this is the same text.
        Ok(SwarmId(String::from_utf8_lossy(bytes).into_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as bytes (its wire form).
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

fn validate(id: &[u8]) -> Result<(), SwarmIdError> {
    let Some(&first) = id.first() else {
        return Err(SwarmIdError::Empty);
    };
    if id.len() > SwarmId::MAX_LEN {
        return Err(SwarmIdError::TooLong {
            len: id.len(),
            max: SwarmId::MAX_LEN,
        });
    }
    let allowed = |b: &u8| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-');
    if let Some(position) = id.iter().position(|b| !allowed(b)) {
        // Allowed bytes are ASCII, so `position` starts a character (or an invalid
        // UTF-8 sequence, shown as U+FFFD).
        let ch = String::from_utf8_lossy(&id[position..])
            .chars()
            .next()
            .unwrap_or('\u{fffd}');
        return Err(SwarmIdError::InvalidCharacter { ch, position });
    }
    if !first.is_ascii_alphanumeric() {
        return Err(SwarmIdError::InvalidStart {
            ch: char::from(first),
        });
    }
    Ok(())
}

impl FromStr for SwarmId {
    type Err = SwarmIdError;

    fn from_str(id: &str) -> Result<SwarmId, SwarmIdError> {
        SwarmId::new(id)
    }
}

impl TryFrom<&str> for SwarmId {
    type Error = SwarmIdError;

    fn try_from(id: &str) -> Result<SwarmId, SwarmIdError> {
        SwarmId::new(id)
    }
}

impl fmt::Display for SwarmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SwarmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SwarmId({:?})", self.0)
    }
}

impl AsRef<str> for SwarmId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

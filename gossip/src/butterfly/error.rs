//! What can go wrong when setting up or feeding a butterfly all-reduce.

use murmur_protocol::codec::CodecError;
use thiserror::Error;

/// Why a butterfly state machine refused a configuration, a group or an input.
///
/// Errors caused by a message from the network ([`ButterflyError::WrongGroup`],
/// [`ButterflyError::BadChunk`], [`ButterflyError::BadWeight`], [`ButterflyError::Codec`],
/// [`ButterflyError::NotAMember`]) leave the state untouched: drop the message, close the
/// stream it came on, and carry on.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ButterflyError {
    /// A configuration value is out of range.
    #[error("averaging.butterfly.{key} = {value} is out of range: {allowed}")]
    InvalidConfig {
        /// The configuration key.
        key: &'static str,
        /// The value given.
        value: String,
        /// The allowed range.
        allowed: &'static str,
    },
    /// A group or partition is inconsistent with itself or with the vector.
    #[error("invalid group: {reason}")]
    InvalidGroup {
        /// What was wrong.
        reason: &'static str,
    },
    /// No member of the group can accept connections, so nobody can reduce a part.
    #[error("no member of the group accepts connections; at least one reducer is needed")]
    NoReducer,
    /// The local vector does not have as many elements as the group's partition covers.
    #[error("the local vector has {got} elements but the group averages {expected}")]
    LengthMismatch {
        /// Elements the partition covers.
        expected: usize,
        /// Elements the local vector has.
        got: usize,
    },
    /// The local contribution's weight is negative or not finite.
    #[error("local weight {weight} is not a finite, non-negative number of samples")]
    BadLocalWeight {
        /// The weight given.
        weight: f32,
    },
    /// The local vector holds NaN or infinity; the training step diverged.
    #[error("local vector element {index} is not finite; the training step diverged")]
    NonFiniteLocal {
        /// Index of the first non-finite element.
        index: usize,
    },
    /// A message came from a peer that is not in the group.
    #[error("{peer} is not a member of this group; its message was dropped")]
    NotAMember {
        /// The sender, as debug text.
        peer: String,
    },
    /// A chunk belongs to another all-reduce.
    #[error("chunk for group {got} arrived at group {expected}; the sender is in another round")]
    WrongGroup {
        /// This round's group id.
        expected: u64,
        /// The group id the chunk carried.
        got: u64,
    },
    /// A chunk's address does not match the group's partition and chunk size.
    #[error("chunk (part {part}, chunk {chunk}) is malformed: {reason}")]
    BadChunk {
        /// The part the chunk claimed.
        part: u32,
        /// The chunk index it claimed.
        chunk: u32,
        /// What was wrong.
        reason: &'static str,
    },
    /// A contribution's weight was negative or not finite.
    #[error("chunk weight {weight} is not a finite, non-negative number of samples")]
    BadWeight {
        /// The weight the chunk carried.
        weight: f32,
    },
    /// A payload failed to decode or the local vector failed to encode.
    #[error("tensor codec: {0}")]
    Codec(#[from] CodecError),
}

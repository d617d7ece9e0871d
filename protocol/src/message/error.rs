//! What can be wrong with a message.

use thiserror::Error;

use crate::codec::CodecError;
use crate::frame::{FrameError, FrameKind};
use crate::wire::{BufferTooSmall, Truncated};

/// Why a message could not be decoded or encoded.
///
/// Every decoding variant means the peer sent a message this build considers malformed: log
/// it, count it, close the stream and drop what the peer sent on it. Each names the field
/// that was wrong. The encoder runs the same checks, so a message that encodes also decodes.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum MessageError {
    /// The payload ended before a field could be read.
    #[error(
        "message truncated: field `{field}` needs {needed} bytes but {remaining} remain; \
         the peer's message layout differs from ours"
    )]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes that were left.
        remaining: usize,
    },
    /// Bytes were left after the message's last field.
    #[error(
        "{extra} unexpected bytes after the last field of a {kind} message; the peer's \
         message layout differs from ours"
    )]
    TrailingBytes {
        /// The message's kind.
        kind: FrameKind,
        /// How many bytes were left over.
        extra: usize,
    },
    /// A payload was decoded as a message of another kind.
    #[error("expected a {expected} message, got a {found} frame")]
    KindMismatch {
        /// The kind the caller asked for.
        expected: FrameKind,
        /// The frame's kind.
        found: FrameKind,
    },
    /// An enum or boolean field held a value this version does not define.
    #[error(
        "field `{field}` holds {value}, which this version does not define; the peer may \
         run a newer murmur"
    )]
    InvalidEnum {
        /// The field.
        field: &'static str,
        /// The value found.
        value: u8,
    },
    /// A float field was NaN or infinite.
    #[error("field `{field}` is {value}, not a finite number; the sender's state diverged")]
    NonFinite {
        /// The field.
        field: &'static str,
        /// The value found.
        value: f64,
    },
    /// A length or count was larger than its bound. Checked before anything is read or
    /// allocated for the items it counts.
    #[error("field `{field}` has length {len}, over the maximum of {max}")]
    TooLong {
        /// The field.
        field: &'static str,
        /// The length or count found.
        len: usize,
        /// The largest allowed.
        max: usize,
    },
    /// A text field was not valid UTF-8.
    #[error("field `{field}` is not valid UTF-8")]
    InvalidUtf8 {
        /// The field.
        field: &'static str,
    },
    /// A field's value breaks a rule of the message (a range, or agreement with another
    /// field).
    #[error("field `{field}` is invalid: {reason}")]
    InvalidField {
        /// The field.
        field: &'static str,
        /// The rule it broke.
        reason: &'static str,
    },
    /// The codec field names an unknown codec or invalid parameters.
    #[error("field `codec` is invalid: {0}")]
    Codec(#[source] CodecError),
    /// The output buffer is smaller than the message's `encoded_len`.
    #[error("output buffer too small: need {needed} bytes, have {available}")]
    BufferTooSmall {
        /// Bytes the encoding needs.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// The message is too large to frame.
    #[error("cannot frame the message: {0}")]
    Frame(#[source] FrameError),
}

impl From<Truncated> for MessageError {
    fn from(t: Truncated) -> Self {
        MessageError::Truncated {
            field: t.field,
            needed: t.needed,
            remaining: t.remaining,
        }
    }
}

impl From<BufferTooSmall> for MessageError {
    fn from(b: BufferTooSmall) -> Self {
        MessageError::BufferTooSmall {
            needed: b.needed,
            available: b.available,
        }
    }
}

//! The envelope every murmur message travels in.
//!
//! A frame is a fixed 12-byte header followed by a payload:
//!
//! ```text
//! offset  size  field
//!      0     4  magic          b"MRMR"
//!      4     1  version        1
//!      5     1  kind           which message the payload holds (FrameKind)
//!      6     2  flags          FrameFlags bits, little-endian; unknown bits are an error
//!      8     4  payload length little-endian u32, at most the receiver's FrameLimits
//!     12     …  payload
//! ```
//!
//! The receiver reads the header first and checks the magic, version, kind, flags and the
//! payload length against its [`FrameLimits`] before it reserves a single byte for the
//! payload, so a peer cannot make it allocate more than the limit by lying about a length.
//!
//! [`FrameDecoder`] is incremental: it accepts the byte stream split at any point (one byte
//! at a time if need be), keeps at most one frame in one reused buffer, and yields frames
//! that borrow that buffer. Any error poisons it: a stream that has sent one bad frame
//! cannot be resynchronised and must be closed. [`Frame::parse`] reads a frame that is
//! already whole in memory without copying it.
//!
//! Sending is the mirror image: [`FrameHeader::new`] checks the payload length against
//! [`FrameLimits::HARD_MAX_PAYLOAD`] and [`FrameHeader::encode`] writes the 12 bytes; the
//! [`message`](crate::message) module writes a header and a message into one caller buffer.

mod decoder;
mod header;

use thiserror::Error;

pub use decoder::{Frame, FrameDecoder, FrameLimits};
pub use header::{FrameFlags, FrameHeader, FrameKind, encode_header};

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"MRMR";

/// The frame format version this build writes and accepts.
pub const VERSION: u8 = 1;

/// Size in bytes of a frame header.
pub const HEADER_LEN: usize = 12;

/// What was wrong with a frame, or why the decoder stopped.
///
/// From a [`FrameDecoder`] every variant is final: close the stream and drop what the peer
/// sent on it. From [`Frame::parse`], [`FrameError::Truncated`] only means the bytes given
/// end before the frame does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FrameError {
    /// The first four bytes of a header were not [`MAGIC`].
    #[error(
        "frame header starts with {found:02x?}, not murmur's magic {MAGIC:02x?}; the peer \
         does not speak murmur's frame protocol or the stream lost sync: close it"
    )]
    BadMagic {
        /// The four bytes found.
        found: [u8; 4],
    },
    /// The header's version is not one this build speaks.
    #[error(
        "frame version {found} is not supported (this build speaks version {supported}); \
         the peer runs an incompatible murmur: upgrade one side"
    )]
    UnsupportedVersion {
        /// The version in the header.
        found: u8,
        /// The version this build speaks.
        supported: u8,
    },
    /// The header's kind byte names no [`FrameKind`].
    #[error(
        "unknown frame kind {found}; the peer runs a newer murmur or sent garbage: close \
         the stream"
    )]
    UnknownKind {
        /// The kind byte found.
        found: u8,
    },
    /// The header set flag bits this version does not define.
    #[error(
        "frame flags {found:#06x} set undefined bits {unknown:#06x}; the peer runs an \
         incompatible murmur: close the stream"
    )]
    UnknownFlags {
        /// All flag bits found.
        found: u16,
        /// The bits that are not defined.
        unknown: u16,
    },
    /// The payload length is over the limit; nothing was allocated for it.
    #[error(
        "frame payload of {len} bytes is over the limit of {limit} bytes; the peer sends \
         larger chunks than this peer accepts: lower its chunk size or raise the limit"
    )]
    PayloadTooLarge {
        /// The payload length in the header (or asked of the encoder).
        len: u64,
        /// The limit it broke.
        limit: u32,
    },
    /// The input ended in the middle of a frame.
    #[error(
        "stream ended mid-frame: {buffered} of {expected} bytes received; the peer closed \
         or crashed while sending, so drop the partial frame"
    )]
    Truncated {
        /// Bytes of the frame (header included) that arrived.
        buffered: usize,
        /// Bytes known to be needed: the header length until the header is complete, then
        /// the whole frame's length.
        expected: usize,
    },
    /// Bytes arrived after a frame flagged [`FrameFlags::END_OF_STREAM`].
    #[error(
        "{extra} bytes arrived after the peer's end-of-stream frame; the peer broke the \
         protocol: close the stream"
    )]
    DataAfterEnd {
        /// Bytes offered after the end.
        extra: usize,
    },
    /// The decoder failed before and cannot continue.
    #[error(
        "the frame decoder failed earlier and cannot resynchronise; close the stream and \
         open a new one"
    )]
    Poisoned,
}

/// Limits that a frame's header is checked against before its payload is read.
///
/// Kept separate from [`FrameError`] because it is a configuration mistake, not a bad peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error(
    "frame payload limit {requested} bytes is out of range; choose a value in \
     {min}..={max} bytes"
)]
pub struct FrameLimitsError {
    /// The limit asked for.
    pub requested: u32,
    /// The smallest limit allowed.
    pub min: u32,
    /// The largest limit allowed.
    pub max: u32,
}

/// `usize` from a wire `u32`; saturates on targets where `usize` is narrower, which only
/// makes the value fail the length checks that follow.
pub(crate) fn usize_from(value: u32) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

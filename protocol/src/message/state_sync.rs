//! State sync: a joining peer fetching the model state from a peer that has it, one range
//! of bytes at a time.
//!
//! The state is a snapshot serialized by the daemon (and possibly compressed); here it is
//! only bytes. The first request asks from offset 0 with no expected digest; the response
//! names the snapshot's digest and length, and later requests pass that digest, so that
//! every range comes from the same snapshot or the responder refuses.

use super::fields::{decode_with, encode_with, read_bool, write_bool};
use super::{MessageError, WireMessage};
use crate::frame::{FrameKind, FrameLimits};

/// The most snapshot bytes one response carries. A requester reads responses to its
/// state-sync requests up to [`MAX_RESPONSE_PAYLOAD`] whatever its limit for other control
/// frames, and asks for no more than this.
pub const MAX_RANGE_BYTES: u32 = 1 << 20;

/// The largest payload of a state-sync response: [`MAX_RANGE_BYTES`] of the snapshot and
/// the fields before them.
pub const MAX_RESPONSE_PAYLOAD: u32 = MAX_RANGE_BYTES + RESPONSE_FIXED_LEN as u32;

/// The limits a requester reads control responses within: its control `limits`, raised to
/// fit a state-sync response of [`MAX_RANGE_BYTES`]. Only answers to its own requests are
/// read within them, so the most it buffers stays bounded by the requests it has in flight.
pub fn response_limits(limits: FrameLimits) -> FrameLimits {
    FrameLimits::new(limits.max_payload().max(MAX_RESPONSE_PAYLOAD)).unwrap_or(limits)
}

/// Asks for the bytes of the responder's state snapshot from `from_offset` on.
///
/// Wire form, 44 bytes: `from_offset u64 | max_bytes u32 | expected_digest [32]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSyncRequest {
    /// Offset of the first byte wanted.
    pub from_offset: u64,
    /// The most payload bytes wanted in the response; at least 1. The responder may send
    /// fewer, to fit its frame size.
    pub max_bytes: u32,
    /// The digest of the snapshot the earlier responses came from, so the responder
    /// refuses rather than mixing snapshots; all zeros on the first request, to take the
    /// responder's current one.
    pub expected_digest: [u8; 32],
}

impl StateSyncRequest {
    /// Whether the request takes whatever snapshot the responder has.
    pub fn accepts_any_snapshot(&self) -> bool {
        self.expected_digest == [0; 32]
    }
}

impl<'a> WireMessage<'a> for StateSyncRequest {
    const KIND: FrameKind = FrameKind::StateSyncRequest;

    fn encoded_len(&self) -> usize {
        8 + 4 + 32
    }

    fn validate(&self) -> Result<(), MessageError> {
        if self.max_bytes == 0 {
            return Err(MessageError::InvalidField {
                field: "max_bytes",
                reason: "must be at least 1",
            });
        }
        Ok(())
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        WireMessage::validate(self)?;
        encode_with(out, WireMessage::encoded_len(self), |w| {
            w.u64(self.from_offset)?;
            w.u32(self.max_bytes)?;
            Ok(w.bytes(&self.expected_digest)?)
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        let request = decode_with(<Self as WireMessage<'a>>::KIND, payload, |r| {
            Ok(StateSyncRequest {
                from_offset: r.u64("from_offset")?,
                max_bytes: r.u32("max_bytes")?,
                expected_digest: r.array("expected_digest")?,
            })
        })?;
        WireMessage::validate(&request)?;
        Ok(request)
    }
}

/// A range of the responder's state snapshot.
///
/// Wire form: `offset u64 | total_len u64 | digest [32] | last u8 (0 or 1) | payload` (to
/// the end of the frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSyncResponse<'a> {
    /// Offset of the payload's first byte in the snapshot.
    pub offset: u64,
    /// The snapshot's length in bytes; the payload ends at or before it.
    pub total_len: u64,
    /// A 32-byte digest of the whole snapshot, chosen by the daemon: it names the snapshot
    /// in later requests and lets the requester check the bytes it assembled.
    pub digest: [u8; 32],
    /// Whether the payload ends the snapshot. Must agree with `offset`, the payload's
    /// length and `total_len`.
    pub last: bool,
    /// The snapshot's bytes from `offset`; borrowed from the frame.
    pub payload: &'a [u8],
}

const RESPONSE_FIXED_LEN: usize = 8 + 8 + 32 + 1;

impl<'a> WireMessage<'a> for StateSyncResponse<'a> {
    const KIND: FrameKind = FrameKind::StateSyncResponse;

    fn encoded_len(&self) -> usize {
        RESPONSE_FIXED_LEN + self.payload.len()
    }

    fn validate(&self) -> Result<(), MessageError> {
        let end = u64::try_from(self.payload.len())
            .ok()
            .and_then(|len| self.offset.checked_add(len))
            .filter(|end| *end <= self.total_len)
            .ok_or(MessageError::InvalidField {
                field: "payload",
                reason: "runs past total_len",
            })?;
        if self.last != (end == self.total_len) {
            return Err(MessageError::InvalidField {
                field: "last",
                reason: "must be set exactly when the payload reaches total_len",
            });
        }
        Ok(())
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        self.validate()?;
        encode_with(out, self.encoded_len(), |w| {
            w.u64(self.offset)?;
            w.u64(self.total_len)?;
            w.bytes(&self.digest)?;
            write_bool(w, self.last)?;
            Ok(w.bytes(self.payload)?)
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        let response = decode_with(Self::KIND, payload, |r| {
            Ok(StateSyncResponse {
                offset: r.u64("offset")?,
                total_len: r.u64("total_len")?,
                digest: r.array("digest")?,
                last: read_bool(r, "last")?,
                payload: r.rest(),
            })
        })?;
        response.validate()?;
        Ok(response)
    }
}

//! The 12-byte frame header: its fields, and how they are checked and written.

use super::{FrameError, FrameLimits, HEADER_LEN, MAGIC, VERSION};

/// Which message a frame's payload holds. One kind per message type; the byte values are
/// stable, and new messages get new values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// [`AuthHello`](crate::message::AuthHello): the first frame on every connection.
    AuthHello = 1,
    /// [`Heartbeat`](crate::message::Heartbeat): a peer's signed liveness and progress.
    Heartbeat = 2,
    /// [`JoinGroup`](crate::message::JoinGroup): asks to join an all-reduce group.
    JoinGroup = 3,
    /// [`GroupBegin`](crate::message::GroupBegin): a group formed; members and partition.
    GroupBegin = 4,
    /// [`GroupReject`](crate::message::GroupReject): a join was refused.
    GroupReject = 5,
    /// [`TensorPartChunk`](crate::message::TensorPartChunk): one chunk sent to a reducer.
    TensorPartChunk = 6,
    /// [`AveragedChunk`](crate::message::AveragedChunk): one averaged chunk sent back.
    AveragedChunk = 7,
    /// [`PushSumShare`](crate::message::PushSumShare): one chunk of a push-sum share.
    PushSumShare = 8,
    /// [`StateSyncRequest`](crate::message::StateSyncRequest): asks for model state bytes.
    StateSyncRequest = 9,
    /// [`StateSyncResponse`](crate::message::StateSyncResponse): a range of state bytes.
    StateSyncResponse = 10,
    /// [`Reject`](crate::message::Reject): the peer refuses or closes, with a reason.
    Reject = 11,
    /// [`ShareRefused`](crate::message::ShareRefused): a push-sum share its receiver could
    /// not use, for its sender to take back.
    ShareRefused = 12,
    /// [`ShareReceipt`](crate::message::ShareReceipt): whether a push-sum share was applied.
    ShareReceipt = 13,
    /// [`ShareCancel`](crate::message::ShareCancel): asks what became of an unacknowledged
    /// push-sum share.
    ShareCancel = 14,
}

impl FrameKind {
    /// Every kind, in byte order.
    pub const ALL: [FrameKind; 14] = [
        FrameKind::AuthHello,
        FrameKind::Heartbeat,
        FrameKind::JoinGroup,
        FrameKind::GroupBegin,
        FrameKind::GroupReject,
        FrameKind::TensorPartChunk,
        FrameKind::AveragedChunk,
        FrameKind::PushSumShare,
        FrameKind::StateSyncRequest,
        FrameKind::StateSyncResponse,
        FrameKind::Reject,
        FrameKind::ShareRefused,
        FrameKind::ShareReceipt,
        FrameKind::ShareCancel,
    ];

    /// The kind with this byte value, if any.
    pub fn from_byte(byte: u8) -> Option<FrameKind> {
        FrameKind::ALL
            .into_iter()
            .find(|kind| kind.to_byte() == byte)
    }

    /// The kind's byte value on the wire.
    pub fn to_byte(self) -> u8 {
        self as u8
    }

    /// The kind's name, as used in logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            FrameKind::AuthHello => "auth_hello",
            FrameKind::Heartbeat => "heartbeat",
            FrameKind::JoinGroup => "join_group",
            FrameKind::GroupBegin => "group_begin",
            FrameKind::GroupReject => "group_reject",
            FrameKind::TensorPartChunk => "tensor_part_chunk",
            FrameKind::AveragedChunk => "averaged_chunk",
            FrameKind::PushSumShare => "push_sum_share",
            FrameKind::StateSyncRequest => "state_sync_request",
            FrameKind::StateSyncResponse => "state_sync_response",
            FrameKind::Reject => "reject",
            FrameKind::ShareRefused => "share_refused",
            FrameKind::ShareReceipt => "share_receipt",
            FrameKind::ShareCancel => "share_cancel",
        }
    }
}

impl std::fmt::Display for FrameKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The header's flag bits. Version 1 defines only [`FrameFlags::END_OF_STREAM`]; a frame
/// with any other bit set is rejected, so a future flag can change the meaning of a frame
/// without an old peer misreading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FrameFlags(u16);

impl FrameFlags {
    /// No flags.
    pub const EMPTY: FrameFlags = FrameFlags(0);
    /// The sender writes no further frame on this stream. A receiver may close the stream
    /// once it has handled this frame; bytes after it are an error.
    pub const END_OF_STREAM: FrameFlags = FrameFlags(0x0001);
    /// Every bit this version defines.
    pub const KNOWN: FrameFlags = FrameFlags(Self::END_OF_STREAM.0);

    /// The flags with these bits, or `None` if a bit is not defined.
    pub fn from_bits(bits: u16) -> Option<FrameFlags> {
        (bits & !Self::KNOWN.0 == 0).then_some(FrameFlags(bits))
    }

    /// The raw bits.
    pub fn bits(self) -> u16 {
        self.0
    }

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: FrameFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The bits of both.
    #[must_use]
    pub fn union(self, other: FrameFlags) -> FrameFlags {
        FrameFlags(self.0 | other.0)
    }
}

/// A checked frame header.
///
/// Built with [`FrameHeader::new`] (sending) or [`FrameHeader::parse`] (receiving); either
/// way its kind and flags are known and its payload length is within bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    kind: FrameKind,
    flags: FrameFlags,
    payload_len: u32,
}

impl FrameHeader {
    /// A header for a payload of `payload_len` bytes. Fails if the payload is larger than
    /// [`FrameLimits::HARD_MAX_PAYLOAD`], which no receiver accepts.
    pub fn new(
        kind: FrameKind,
        flags: FrameFlags,
        payload_len: usize,
    ) -> Result<FrameHeader, FrameError> {
        let hard_max = FrameLimits::HARD_MAX_PAYLOAD;
        let too_large = FrameError::PayloadTooLarge {
            len: u64::try_from(payload_len).unwrap_or(u64::MAX),
            limit: hard_max,
        };
        let payload_len = u32::try_from(payload_len).map_err(|_| too_large)?;
        if payload_len > hard_max {
            return Err(too_large);
        }
        Ok(FrameHeader {
            kind,
            flags,
            payload_len,
        })
    }

    /// Parses and checks a header received from a peer: magic, version, kind, flags, and
    /// the payload length against `limits`, in that order.
    pub fn parse(
        bytes: &[u8; HEADER_LEN],
        limits: &FrameLimits,
    ) -> Result<FrameHeader, FrameError> {
        let [m0, m1, m2, m3, version, kind, f0, f1, l0, l1, l2, l3] = *bytes;
        let magic = [m0, m1, m2, m3];
        if magic != MAGIC {
            return Err(FrameError::BadMagic { found: magic });
        }
        if version != VERSION {
            return Err(FrameError::UnsupportedVersion {
                found: version,
                supported: VERSION,
            });
        }
        let kind = FrameKind::from_byte(kind).ok_or(FrameError::UnknownKind { found: kind })?;
        let bits = u16::from_le_bytes([f0, f1]);
        let flags = FrameFlags::from_bits(bits).ok_or(FrameError::UnknownFlags {
            found: bits,
            unknown: bits & !FrameFlags::KNOWN.bits(),
        })?;
        let payload_len = u32::from_le_bytes([l0, l1, l2, l3]);
        if payload_len > limits.max_payload() {
            return Err(FrameError::PayloadTooLarge {
                len: u64::from(payload_len),
                limit: limits.max_payload(),
            });
        }
        Ok(FrameHeader {
            kind,
            flags,
            payload_len,
        })
    }

    /// The header's 12 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = self.kind.to_byte();
        out[6..8].copy_from_slice(&self.flags.bits().to_le_bytes());
        out[8..].copy_from_slice(&self.payload_len.to_le_bytes());
        out
    }

    /// Which message the payload holds.
    pub fn kind(&self) -> FrameKind {
        self.kind
    }

    /// The frame's flags.
    pub fn flags(&self) -> FrameFlags {
        self.flags
    }

    /// The payload's length in bytes.
    pub fn payload_len(&self) -> u32 {
        self.payload_len
    }

    /// The whole frame's length in bytes, header included.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + super::usize_from(self.payload_len)
    }
}

/// Writes the header of a frame of `kind` with `flags` and a `payload_len`-byte payload
/// into `out`. Fails, writing nothing, if the payload is over
/// [`FrameLimits::HARD_MAX_PAYLOAD`].
pub fn encode_header(
    kind: FrameKind,
    flags: FrameFlags,
    payload_len: usize,
    out: &mut [u8; HEADER_LEN],
) -> Result<(), FrameError> {
    *out = FrameHeader::new(kind, flags, payload_len)?.encode();
    Ok(())
}

//! The messages murmur peers exchange, one per [`FrameKind`].
//!
//! Every message is a plain struct whose bulk fields (tensor payloads, invites, signed
//! envelopes, text) borrow the frame they were decoded from: decoding copies no payload and
//! allocates nothing, except [`GroupBegin`], whose member list is one bounded `Vec`.
//! Encoding writes into a caller buffer sized from [`WireMessage::encoded_len`] (or
//! [`Message::frame_len`] for header and message together).
//!
//! All numbers are little-endian. Variable-length fields carry a length prefix that is
//! checked against the field's bound before anything is read; a tensor or state payload is
//! the last field and runs to the end of the frame. Decoders reject trailing bytes, enum
//! values this version does not define, non-finite or negative weights, and fields that
//! contradict each other, each with a [`MessageError`] that names the field. Encoders run
//! the same checks, so whatever encodes also decodes, to the same value and from the same
//! bytes.
//!
//! | kind | used by |
//! |---|---|
//! | [`AuthHello`] | every connection, first frame: invite and key |
//! | [`Heartbeat`] ([`HeartbeatBody`]) | membership gossip |
//! | [`JoinGroup`], [`GroupBegin`], [`GroupReject`] | butterfly matchmaking |
//! | [`TensorPartChunk`], [`AveragedChunk`] | butterfly all-reduce |
//! | [`PushSumShare`], [`ShareRefused`], [`ShareReceipt`], [`ShareCancel`] | SGP |
//! | [`StateSyncRequest`], [`StateSyncResponse`] | a joining peer fetching the model state |
//! | [`Reject`] | refusing or closing a stream, with a reason |

mod auth;
mod error;
mod fields;
mod group;
mod heartbeat;
mod push_sum;
mod reject;
mod share_receipt;
mod state_sync;
mod tensor;

pub use auth::{AuthHello, MAX_HELLO_INVITE_LEN};
pub use error::MessageError;
pub use group::{
    GroupBegin, GroupMember, GroupReject, GroupRejectReason, JoinGroup, MAX_GROUP_MEMBERS,
    MAX_PEER_ID_LEN,
};
pub use heartbeat::{
    AveragingMode, Heartbeat, HeartbeatBody, MAX_HEARTBEAT_ENVELOPE_LEN, UnknownMode,
};
pub use push_sum::{PushSumShare, ShareRefused};
pub use reject::{MAX_REJECT_TEXT_LEN, Reject, RejectCode};
pub use share_receipt::{ShareCancel, ShareOutcome, ShareReceipt};
pub use state_sync::{
    MAX_RANGE_BYTES as MAX_STATE_RANGE_BYTES, MAX_RESPONSE_PAYLOAD as MAX_STATE_RESPONSE_PAYLOAD,
    StateSyncRequest, StateSyncResponse, response_limits as state_sync_response_limits,
};
pub use tensor::{AveragedChunk, ChunkAddress, TensorPartChunk};

use crate::frame::{Frame, FrameFlags, FrameHeader, FrameKind, HEADER_LEN};

/// A message type with a wire form.
pub trait WireMessage<'a>: Sized {
    /// The frame kind this message travels in.
    const KIND: FrameKind;

    /// Bytes [`encode_into`](Self::encode_into) writes.
    fn encoded_len(&self) -> usize;

    /// Checks every field against the rules the decoder enforces.
    fn validate(&self) -> Result<(), MessageError>;

    /// Validates the message and writes it to the start of `out`; returns the bytes written,
    /// always [`encoded_len`](Self::encoded_len).
    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError>;

    /// Decodes and validates a message from a frame payload, borrowing its bulk fields.
    fn decode(payload: &'a [u8]) -> Result<Self, MessageError>;

    /// Decodes the message from `frame`, checking that the frame is of its kind.
    fn from_frame(frame: &Frame<'a>) -> Result<Self, MessageError> {
        if frame.kind() != Self::KIND {
            return Err(MessageError::KindMismatch {
                expected: Self::KIND,
                found: frame.kind(),
            });
        }
        Self::decode(frame.payload())
    }
}

/// Any message, as sent or as decoded from a frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Message<'a> {
    /// See [`AuthHello`].
    AuthHello(AuthHello<'a>),
    /// See [`Heartbeat`].
    Heartbeat(Heartbeat<'a>),
    /// See [`JoinGroup`].
    JoinGroup(JoinGroup),
    /// See [`GroupBegin`].
    GroupBegin(GroupBegin<'a>),
    /// See [`GroupReject`].
    GroupReject(GroupReject),
    /// See [`TensorPartChunk`].
    TensorPartChunk(TensorPartChunk<'a>),
    /// See [`AveragedChunk`].
    AveragedChunk(AveragedChunk<'a>),
    /// See [`PushSumShare`].
    PushSumShare(PushSumShare<'a>),
    /// See [`StateSyncRequest`].
    StateSyncRequest(StateSyncRequest),
    /// See [`StateSyncResponse`].
    StateSyncResponse(StateSyncResponse<'a>),
    /// See [`Reject`].
    Reject(Reject<'a>),
    /// See [`ShareRefused`].
    ShareRefused(ShareRefused),
    /// See [`ShareReceipt`].
    ShareReceipt(ShareReceipt),
    /// See [`ShareCancel`].
    ShareCancel(ShareCancel),
}

/// Calls `$body` with `$m` bound to the message inside whichever variant `$message` is.
macro_rules! each_variant {
    ($message:expr, $m:ident => $body:expr) => {
        match $message {
            Message::AuthHello($m) => $body,
            Message::Heartbeat($m) => $body,
            Message::JoinGroup($m) => $body,
            Message::GroupBegin($m) => $body,
            Message::GroupReject($m) => $body,
            Message::TensorPartChunk($m) => $body,
            Message::AveragedChunk($m) => $body,
            Message::PushSumShare($m) => $body,
            Message::StateSyncRequest($m) => $body,
            Message::StateSyncResponse($m) => $body,
            Message::Reject($m) => $body,
            Message::ShareRefused($m) => $body,
            Message::ShareReceipt($m) => $body,
            Message::ShareCancel($m) => $body,
        }
    };
}

/// The kind of a message type, read through a value of it.
fn kind_of<'a, M: WireMessage<'a>>(_: &M) -> FrameKind {
    M::KIND
}

impl<'a> Message<'a> {
    /// The frame kind the message travels in.
    pub fn kind(&self) -> FrameKind {
        each_variant!(self, m => kind_of(m))
    }

    /// Bytes of the message without the frame header.
    pub fn encoded_len(&self) -> usize {
        each_variant!(self, m => m.encoded_len())
    }

    /// Bytes of the whole frame: header and message.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.encoded_len()
    }

    /// Checks every field against the rules the decoder enforces.
    pub fn validate(&self) -> Result<(), MessageError> {
        each_variant!(self, m => m.validate())
    }

    /// Writes the message, without a frame header, to the start of `out`.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        each_variant!(self, m => m.encode_into(out))
    }

    /// Writes a frame header with `flags` and the message to the start of `out`, which
    /// needs [`frame_len`](Self::frame_len) bytes; returns the bytes written.
    pub fn encode_frame(&self, flags: FrameFlags, out: &mut [u8]) -> Result<usize, MessageError> {
        let payload_len = self.encoded_len();
        let header =
            FrameHeader::new(self.kind(), flags, payload_len).map_err(MessageError::Frame)?;
        let needed = HEADER_LEN + payload_len;
        let available = out.len();
        let Some((head, body)) = out
            .get_mut(..needed)
            .and_then(|o| o.split_first_chunk_mut())
        else {
            return Err(MessageError::BufferTooSmall { needed, available });
        };
        let written = self.encode_into(body)?;
        *head = header.encode();
        Ok(HEADER_LEN + written)
    }

    /// Decodes a message of `kind` from a frame payload.
    pub fn decode(kind: FrameKind, payload: &'a [u8]) -> Result<Message<'a>, MessageError> {
        Ok(match kind {
            FrameKind::AuthHello => Message::AuthHello(AuthHello::decode(payload)?),
            FrameKind::Heartbeat => Message::Heartbeat(Heartbeat::decode(payload)?),
            FrameKind::JoinGroup => Message::JoinGroup(JoinGroup::decode(payload)?),
            FrameKind::GroupBegin => Message::GroupBegin(GroupBegin::decode(payload)?),
            FrameKind::GroupReject => Message::GroupReject(GroupReject::decode(payload)?),
            FrameKind::TensorPartChunk => {
                Message::TensorPartChunk(TensorPartChunk::decode(payload)?)
            }
            FrameKind::AveragedChunk => Message::AveragedChunk(AveragedChunk::decode(payload)?),
            FrameKind::PushSumShare => Message::PushSumShare(PushSumShare::decode(payload)?),
            FrameKind::StateSyncRequest => {
                Message::StateSyncRequest(StateSyncRequest::decode(payload)?)
            }
            FrameKind::StateSyncResponse => {
                Message::StateSyncResponse(StateSyncResponse::decode(payload)?)
            }
            FrameKind::Reject => Message::Reject(Reject::decode(payload)?),
            FrameKind::ShareRefused => Message::ShareRefused(ShareRefused::decode(payload)?),
            FrameKind::ShareReceipt => Message::ShareReceipt(ShareReceipt::decode(payload)?),
            FrameKind::ShareCancel => Message::ShareCancel(ShareCancel::decode(payload)?),
        })
    }

    /// Decodes the message a frame holds.
    pub fn from_frame(frame: &Frame<'a>) -> Result<Message<'a>, MessageError> {
        Message::decode(frame.kind(), frame.payload())
    }
}

/// `From<T> for Message` for each message type.
macro_rules! into_message {
    ($($variant:ident $(<$a:lifetime>)?),* $(,)?) => {
        $(
            impl<'a> From<$variant $(<$a>)?> for Message<'a> {
                fn from(m: $variant $(<$a>)?) -> Message<'a> {
                    Message::$variant(m)
                }
            }
        )*
    };
}

into_message!(
    AuthHello<'a>,
    Heartbeat<'a>,
    JoinGroup,
    GroupBegin<'a>,
    GroupReject,
    TensorPartChunk<'a>,
    AveragedChunk<'a>,
    PushSumShare<'a>,
    StateSyncRequest,
    StateSyncResponse<'a>,
    Reject<'a>,
    ShareRefused,
    ShareReceipt,
    ShareCancel,
);

//! Refusals: the last frame a peer sends before it closes a stream it will not serve.

use super::fields::{U16_PREFIX_LEN, check_len, decode_with, encode_with};
use super::fields::{read_bytes_u16, write_bytes_u16};
use super::{MessageError, WireMessage};
use crate::frame::FrameKind;

/// Longest reject text accepted, in bytes of UTF-8.
pub const MAX_REJECT_TEXT_LEN: usize = 256;

/// Why a peer refuses or closes a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RejectCode {
    /// A frame was malformed (see [`FrameError`](crate::frame::FrameError)).
    BadFrame = 1,
    /// A message was malformed (see [`MessageError`]).
    BadMessage = 2,
    /// The peers share no protocol version.
    UnsupportedVersion = 3,
    /// The peer's invite or signature did not verify.
    Unauthorized = 4,
    /// The peer's invite is for another swarm.
    WrongSwarm = 5,
    /// The peer's invite has expired.
    Expired = 6,
    /// The responder is overloaded; try again later or elsewhere.
    Busy = 7,
    /// The responder is shutting down.
    Shutdown = 8,
    /// The responder no longer has what was asked for (such as a state snapshot).
    Unavailable = 9,
    /// The responder failed for a reason of its own.
    Internal = 10,
}

impl RejectCode {
    /// Every code, in byte order.
    pub const ALL: [RejectCode; 10] = [
        RejectCode::BadFrame,
        RejectCode::BadMessage,
        RejectCode::UnsupportedVersion,
        RejectCode::Unauthorized,
        RejectCode::WrongSwarm,
        RejectCode::Expired,
        RejectCode::Busy,
        RejectCode::Shutdown,
        RejectCode::Unavailable,
        RejectCode::Internal,
    ];

    /// The code with this byte value, if any.
    pub fn from_byte(byte: u8) -> Option<RejectCode> {
        RejectCode::ALL.into_iter().find(|code| *code as u8 == byte)
    }

    /// The code's byte value on the wire.
    pub fn to_byte(self) -> u8 {
        self as u8
    }

    /// The code's name, as used in logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            RejectCode::BadFrame => "bad_frame",
            RejectCode::BadMessage => "bad_message",
            RejectCode::UnsupportedVersion => "unsupported_version",
            RejectCode::Unauthorized => "unauthorized",
            RejectCode::WrongSwarm => "wrong_swarm",
            RejectCode::Expired => "expired",
            RejectCode::Busy => "busy",
            RejectCode::Shutdown => "shutdown",
            RejectCode::Unavailable => "unavailable",
            RejectCode::Internal => "internal",
        }
    }
}

/// A refusal with a reason: the code for programs, the text for the operator's log.
///
/// Wire form: `code u8 | text_len u16 | text` (UTF-8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reject<'a> {
    /// Why.
    pub code: RejectCode,
    /// Details for a human, at most [`MAX_REJECT_TEXT_LEN`] bytes; may be empty. Logged
    /// as untrusted text.
    pub text: &'a str,
}

impl<'a> WireMessage<'a> for Reject<'a> {
    const KIND: FrameKind = FrameKind::Reject;

    fn encoded_len(&self) -> usize {
        1 + U16_PREFIX_LEN + self.text.len()
    }

    fn validate(&self) -> Result<(), MessageError> {
        check_len("text", self.text.len(), MAX_REJECT_TEXT_LEN)
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        self.validate()?;
        encode_with(out, self.encoded_len(), |w| {
            w.u8(self.code.to_byte())?;
            write_bytes_u16(w, "text", self.text.as_bytes())
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        decode_with(Self::KIND, payload, |r| {
            let value = r.u8("code")?;
            let code = RejectCode::from_byte(value).ok_or(MessageError::InvalidEnum {
                field: "code",
                value,
            })?;
            let text = read_bytes_u16(r, "text", MAX_REJECT_TEXT_LEN)?;
            let text = std::str::from_utf8(text)
                .map_err(|_| MessageError::InvalidUtf8 { field: "text" })?;
            Ok(Reject { code, text })
        })
    }
}

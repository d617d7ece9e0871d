//! SGP acknowledgements: a receiver's receipt for a push-sum share, and a sender's request
//! to cancel one that was never acknowledged.
//!
//! A transport that has written a share's bytes cannot tell whether its receiver will ever
//! apply them: the connection may close while they sit in a buffer. So a sender keeps the
//! means to take a share back until the receiver says it applied it. When no receipt comes
//! in time, the sender asks to cancel the share; the receiver answers with the receipt it
//! owes (the share was applied) or promises never to apply it (cancelled), and only then
//! does the sender take the mass back. Either way the mass is counted exactly once.

use super::fields::{decode_with, encode_with};
use super::{MessageError, WireMessage};
use crate::frame::FrameKind;

/// What became of a push-sum share at its receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ShareOutcome {
    /// The receiver added the share's mass to its own.
    Applied = 1,
    /// The receiver never applied the share and never will: its sender takes the mass
    /// back.
    Cancelled = 2,
}

impl ShareOutcome {
    /// Every outcome, in byte order.
    pub const ALL: [ShareOutcome; 2] = [ShareOutcome::Applied, ShareOutcome::Cancelled];

    /// The outcome with this byte value, if any.
    pub fn from_byte(byte: u8) -> Option<ShareOutcome> {
        ShareOutcome::ALL
            .into_iter()
            .find(|outcome| *outcome as u8 == byte)
    }

    /// The outcome's byte value on the wire.
    pub fn to_byte(self) -> u8 {
        self as u8
    }
}

/// A receiver's answer about the share its sender sent at `step` (one share per step and
/// edge, so the step names it).
///
/// Wire form, 9 bytes: `step u64 | outcome u8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareReceipt {
    /// The share's `step`.
    pub step: u64,
    /// Whether the receiver applied it.
    pub outcome: ShareOutcome,
}

impl<'a> WireMessage<'a> for ShareReceipt {
    const KIND: FrameKind = FrameKind::ShareReceipt;

    fn encoded_len(&self) -> usize {
        8 + 1
    }

    fn validate(&self) -> Result<(), MessageError> {
        Ok(())
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        encode_with(out, WireMessage::encoded_len(self), |w| {
            w.u64(self.step)?;
            Ok(w.u8(self.outcome.to_byte())?)
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        decode_with(<Self as WireMessage<'a>>::KIND, payload, |r| {
            let step = r.u64("step")?;
            let value = r.u8("outcome")?;
            let outcome = ShareOutcome::from_byte(value).ok_or(MessageError::InvalidEnum {
                field: "outcome",
                value,
            })?;
            Ok(ShareReceipt { step, outcome })
        })
    }
}

/// A sender's request that the receiver of its share of `step`, which has not acknowledged
/// it, say what became of it: the receiver answers with a [`ShareReceipt`].
///
/// Wire form, 8 bytes: `step u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareCancel {
    /// The share's `step`.
    pub step: u64,
}

impl<'a> WireMessage<'a> for ShareCancel {
    const KIND: FrameKind = FrameKind::ShareCancel;

    fn encoded_len(&self) -> usize {
        8
    }

    fn validate(&self) -> Result<(), MessageError> {
        Ok(())
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        encode_with(out, WireMessage::encoded_len(self), |w| {
            Ok(w.u64(self.step)?)
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        decode_with(<Self as WireMessage<'a>>::KIND, payload, |r| {
            Ok(ShareCancel {
                step: r.u64("step")?,
            })
        })
    }
}

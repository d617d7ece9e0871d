//! Stochastic Gradient Push data: a share of a peer's push-sum mass, and the notice that
//! sends one back.

use super::fields::{OPTION_U64_LEN, check_codec, check_finite, decode_with, encode_with};
use super::fields::{read_codec, read_option_u64, write_codec, write_option_u64};
use super::{MessageError, WireMessage};
use crate::codec::{CODEC_SPEC_WIRE_LEN, CodecSpec};
use crate::frame::FrameKind;

/// One chunk of the share of push-sum mass a peer sends to its out-peer after a step
/// (Assran et al., "Stochastic Gradient Push for Distributed Deep Learning", ICML 2019).
///
/// The sender keeps a numerator `x` and a weight `w`, and pushes a fraction of both. The
/// numerator share is large and travels in `chunk_count` chunks; the weight share is a
/// scalar repeated on every chunk, which the receiver adds once, when the share is
/// complete, so that mass is conserved exactly.
///
/// With a lossy codec the payload can encode the deviation of the numerator share from a
/// reference both sides hold (CHOCO-SGD, Koloskova et al. 2019), rather than the share
/// itself; `reference_step` says which.
///
/// Wire form: `step u64 | chunk u32 | chunk_count u32 | offset u64 | elements u32 |
/// weight f64 | reference_present u8 (0 or 1) | reference_step u64 (0 when absent) |
/// codec [5] | payload` (to the end of the frame).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PushSumShare<'a> {
    /// The sender's optimizer step after which the share was taken; the receiver bounds
    /// the staleness it accepts by it.
    pub step: u64,
    /// Index of this chunk within the share, below `chunk_count`.
    pub chunk: u32,
    /// Chunks the share is split into; at least 1.
    pub chunk_count: u32,
    /// Element offset of the chunk's first element in the flat parameter vector.
    pub offset: u64,
    /// Elements in the chunk; `offset + elements` must not pass `u64::MAX`.
    pub elements: u32,
    /// The share of the sender's push-sum weight; finite and greater than zero.
    pub weight: f64,
    /// `None`: the payload is the numerator share itself. `Some(s)`: the payload is its
    /// deviation from the reference both sides agreed on at step `s`; `Some(u64::MAX)`:
    /// from the zero reference, on an edge its sender starts afresh.
    pub reference_step: Option<u64>,
    /// How `payload` is encoded.
    pub codec: CodecSpec,
    /// The `elements` elements of the share (or deviation), encoded with `codec`; borrowed
    /// from the frame.
    pub payload: &'a [u8],
}

const FIXED_LEN: usize = 8 + 4 + 4 + 8 + 4 + 8 + OPTION_U64_LEN + CODEC_SPEC_WIRE_LEN;

impl<'a> WireMessage<'a> for PushSumShare<'a> {
    const KIND: FrameKind = FrameKind::PushSumShare;

    fn encoded_len(&self) -> usize {
        FIXED_LEN + self.payload.len()
    }

    fn validate(&self) -> Result<(), MessageError> {
        if self.chunk_count == 0 {
            return Err(MessageError::InvalidField {
                field: "chunk_count",
                reason: "a share has at least one chunk",
            });
        }
        if self.chunk >= self.chunk_count {
            return Err(MessageError::InvalidField {
                field: "chunk",
                reason: "must be below chunk_count",
            });
        }
        if self.offset.checked_add(u64::from(self.elements)).is_none() {
            return Err(MessageError::InvalidField {
                field: "offset",
                reason: "offset + elements passes u64::MAX",
            });
        }
        check_finite("weight", self.weight)?;
        if self.weight <= 0.0 {
            return Err(MessageError::InvalidField {
                field: "weight",
                reason: "a push-sum weight share must be greater than zero",
            });
        }
        check_codec(self.codec)
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        self.validate()?;
        encode_with(out, self.encoded_len(), |w| {
            w.u64(self.step)?;
            w.u32(self.chunk)?;
            w.u32(self.chunk_count)?;
            w.u64(self.offset)?;
            w.u32(self.elements)?;
            w.f64(self.weight)?;
            write_option_u64(w, self.reference_step)?;
            write_codec(w, self.codec)?;
            Ok(w.bytes(self.payload)?)
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        let share = decode_with(Self::KIND, payload, |r| {
            Ok(PushSumShare {
                step: r.u64("step")?,
                chunk: r.u32("chunk")?,
                chunk_count: r.u32("chunk_count")?,
                offset: r.u64("offset")?,
                elements: r.u32("elements")?,
                weight: r.f64("weight")?,
                reference_step: read_option_u64(r, "reference_step")?,
                codec: read_codec(r)?,
                payload: r.rest(),
            })
        })?;
        share.validate()?;
        Ok(share)
    }
}

/// Tells the sender of a push-sum share that its receiver could not use it, so that the
/// sender takes the share's mass back instead of losing it.
///
/// A receiver refuses a share that is a deviation from a reference it does not hold: it
/// restarted, or dropped that edge's reference, since the sender last shared with it. The
/// sender knows which share is meant by its step (one share per step and edge), takes back
/// the weight and numerator it moved, and sends its next share on that edge exactly.
///
/// Wire form, 16 bytes: `step u64 | reference_step u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareRefused {
    /// The refused share's `step`.
    pub step: u64,
    /// The refused share's `reference_step`: the reference the receiver did not hold.
    pub reference_step: u64,
}

impl<'a> WireMessage<'a> for ShareRefused {
    const KIND: FrameKind = FrameKind::ShareRefused;

    fn encoded_len(&self) -> usize {
        8 + 8
    }

    fn validate(&self) -> Result<(), MessageError> {
        Ok(())
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        encode_with(out, WireMessage::encoded_len(self), |w| {
            w.u64(self.step)?;
            Ok(w.u64(self.reference_step)?)
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        decode_with(<Self as WireMessage<'a>>::KIND, payload, |r| {
            Ok(ShareRefused {
                step: r.u64("step")?,
                reference_step: r.u64("reference_step")?,
            })
        })
    }
}

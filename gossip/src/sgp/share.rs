//! What travels between two SGP peers: a share of push-sum mass.

use murmur_protocol::codec::CodecSpec;
use murmur_protocol::message::PushSumShare;

/// The `reference` of a share built on the zero reference: the first share on a new edge, or
/// on an edge its sender forgot. Never a step (steps count from zero, one per local step).
pub const FRESH_REFERENCE: u64 = u64::MAX;

/// The scalar part of a share; the numerator travels beside it as a payload.
///
/// The fields map onto the wire message `murmur_protocol::message::PushSumShare`, except
/// `seq`, which only the sender and its transport use. On the wire the weight is an exact
/// `f64`: rounding it would let total weight drift, and every peer's `z = x / w` with it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareHeader {
    /// Sequence number, unique per sender; the transport quotes it to confirm delivery.
    pub seq: u64,
    /// The sender's local step when it sent the share.
    pub step: u64,
    /// The push-sum weight moved with the share.
    pub weight: f64,
    /// `None`: the payload is the numerator share itself, as `f32`. `Some(s)`: the payload
    /// is the deviation of the sender's de-biased parameters from the reference this edge
    /// agreed on at the sender's step `s`, encoded with `codec`; `Some(FRESH_REFERENCE)`:
    /// from the zero reference a new edge starts from.
    pub reference: Option<u64>,
    /// How the payload is encoded.
    pub codec: CodecSpec,
}

impl ShareHeader {
    /// The header of a share that arrived (or came back) as `share`; `seq` is the
    /// sender's sequence number where the transport knows it (0 for a received share).
    pub fn from_wire(share: &PushSumShare<'_>, seq: u64) -> ShareHeader {
        ShareHeader {
            seq,
            step: share.step,
            weight: share.weight,
            reference: share.reference_step,
            codec: share.codec,
        }
    }

    /// The wire message of a whole share of `elements` elements in one chunk, its payload
    /// left empty for the caller to attach.
    pub fn to_wire(&self, elements: u32) -> PushSumShare<'static> {
        PushSumShare {
            step: self.step,
            chunk: 0,
            chunk_count: 1,
            offset: 0,
            elements,
            weight: self.weight,
            reference_step: self.reference,
            codec: self.codec,
            payload: &[],
        }
    }
}

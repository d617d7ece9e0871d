//! Butterfly all-reduce data: chunks of a part sent to its reducer, and averaged chunks
//! sent back.

use super::fields::{check_codec, check_weight, decode_with, encode_with, read_codec, write_codec};
use super::{MessageError, WireMessage};
use crate::codec::{CODEC_SPEC_WIRE_LEN, CodecSpec};
use crate::frame::FrameKind;
use crate::wire::{Reader, Writer};

/// Where a chunk's elements lie in a group's flat vector.
///
/// A part (one per group member, see [`GroupBegin`](super::GroupBegin)) is streamed as
/// chunks; chunk `chunk` of part `part` holds `elements` elements starting `offset` elements
/// into the part.
///
/// Wire form, [`ChunkAddress::WIRE_LEN`] bytes: `group_id u64 | part u32 | chunk u32 |
/// offset u64 | elements u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkAddress {
    /// The all-reduce the chunk belongs to ([`GroupBegin::group_id`](super::GroupBegin)).
    pub group_id: u64,
    /// Index of the part, which is also the index of its reducer in the member list.
    pub part: u32,
    /// Index of the chunk within the part, counting from 0 in send order.
    pub chunk: u32,
    /// Element offset of the chunk's first element within the part.
    pub offset: u64,
    /// Elements in the chunk; `offset + elements` must not pass `u64::MAX`.
    pub elements: u32,
}

impl ChunkAddress {
    /// Size of the address on the wire.
    pub const WIRE_LEN: usize = 8 + 4 + 4 + 8 + 4;

    /// Element offset just past the chunk's last element, within the part.
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(u64::from(self.elements))
    }

    fn validate(&self) -> Result<(), MessageError> {
        match self.end() {
            Some(_) => Ok(()),
            None => Err(MessageError::InvalidField {
                field: "offset",
                reason: "offset + elements passes u64::MAX",
            }),
        }
    }

    fn write(&self, w: &mut Writer<'_>) -> Result<(), MessageError> {
        w.u64(self.group_id)?;
        w.u32(self.part)?;
        w.u32(self.chunk)?;
        w.u64(self.offset)?;
        Ok(w.u32(self.elements)?)
    }

    fn read(r: &mut Reader<'_>) -> Result<ChunkAddress, MessageError> {
        Ok(ChunkAddress {
            group_id: r.u64("group_id")?,
            part: r.u32("part")?,
            chunk: r.u32("chunk")?,
            offset: r.u64("offset")?,
            elements: r.u32("elements")?,
        })
    }
}

/// One chunk of a member's copy of a part, sent to the part's reducer, which adds it,
/// weighted, into its running sum.
///
/// Wire form: `address (28 bytes) | weight f32 | codec [5] | payload` (to the end of the
/// frame).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorPartChunk<'a> {
    /// Which elements the chunk holds.
    pub address: ChunkAddress,
    /// The contribution's weight in the average: the samples behind it. Finite, not
    /// negative.
    pub weight: f32,
    /// How `payload` is encoded.
    pub codec: CodecSpec,
    /// The `address.elements` elements, encoded with `codec`; borrowed from the frame.
    pub payload: &'a [u8],
}

const CHUNK_FIXED_LEN: usize = ChunkAddress::WIRE_LEN + 4 + CODEC_SPEC_WIRE_LEN;

impl<'a> WireMessage<'a> for TensorPartChunk<'a> {
    const KIND: FrameKind = FrameKind::TensorPartChunk;

    fn encoded_len(&self) -> usize {
        CHUNK_FIXED_LEN + self.payload.len()
    }

    fn validate(&self) -> Result<(), MessageError> {
        self.address.validate()?;
        check_weight("weight", f64::from(self.weight))?;
        check_codec(self.codec)
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        self.validate()?;
        encode_with(out, self.encoded_len(), |w| {
            self.address.write(w)?;
            w.f32(self.weight)?;
            write_codec(w, self.codec)?;
            Ok(w.bytes(self.payload)?)
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        let chunk = decode_with(Self::KIND, payload, |r| {
            Ok(TensorPartChunk {
                address: ChunkAddress::read(r)?,
                weight: r.f32("weight")?,
                codec: read_codec(r)?,
                payload: r.rest(),
            })
        })?;
        chunk.validate()?;
        Ok(chunk)
    }
}

/// One chunk of an averaged part, sent by the part's reducer back to every member.
///
/// Wire form: `address (28 bytes) | contributors u32 | total_weight f32 | codec [5] |
/// payload` (to the end of the frame).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AveragedChunk<'a> {
    /// Which elements the chunk holds.
    pub address: ChunkAddress,
    /// How many members' contributions the average covers; those whose chunks did not
    /// arrive in time are left out.
    pub contributors: u32,
    /// The sum of the included contributions' weights. Finite, not negative.
    pub total_weight: f32,
    /// How `payload` is encoded.
    pub codec: CodecSpec,
    /// The averaged elements, encoded with `codec`; borrowed from the frame.
    pub payload: &'a [u8],
}

const AVERAGED_FIXED_LEN: usize = ChunkAddress::WIRE_LEN + 4 + 4 + CODEC_SPEC_WIRE_LEN;

impl<'a> WireMessage<'a> for AveragedChunk<'a> {
    const KIND: FrameKind = FrameKind::AveragedChunk;

    fn encoded_len(&self) -> usize {
        AVERAGED_FIXED_LEN + self.payload.len()
    }

    fn validate(&self) -> Result<(), MessageError> {
        self.address.validate()?;
        check_weight("total_weight", f64::from(self.total_weight))?;
        check_codec(self.codec)
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        self.validate()?;
        encode_with(out, self.encoded_len(), |w| {
            self.address.write(w)?;
            w.u32(self.contributors)?;
            w.f32(self.total_weight)?;
            write_codec(w, self.codec)?;
            Ok(w.bytes(self.payload)?)
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        let chunk = decode_with(Self::KIND, payload, |r| {
            Ok(AveragedChunk {
                address: ChunkAddress::read(r)?,
                contributors: r.u32("contributors")?,
                total_weight: r.f32("total_weight")?,
                codec: read_codec(r)?,
                payload: r.rest(),
            })
        })?;
        chunk.validate()?;
        Ok(chunk)
    }
}

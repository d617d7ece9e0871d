//! The largest tensor frame a config's averaging mode sends for its model, checked against
//! `net.max_frame_payload`, so that `config check` refuses a model whose shares or segments
//! cannot travel instead of `run` training alone while every send fails.
//!
//! - An SGP share is the whole parameter vector, and a leaving peer's hand-off is exact
//!   (`f32`) whatever the codec; it travels in pieces of at most a frame, at most
//!   [`MAX_SHARE_PIECES`] of them, so only a frame too small for that many is refused.
//! - A sync-ring segment is a `1/g` part of the vector in one frame, for a group of `g`
//!   peers; groups go ahead from `min_group` members, so the segment can be `1/min_group`.
//! - Butterfly and local SGD send parts in chunks of `chunk_elements`.

use std::fmt;

use murmur_gossip::butterfly::ButterflyConfig;
use murmur_gossip::engine::{MAX_SHARE_PIECES, ModeSettings};
use murmur_protocol::codec::{Codec, CodecSpec};
use murmur_protocol::message::{
    AveragingMode, ChunkAddress, PushSumShare, TensorPartChunk, WireMessage,
};

use super::memory::Bytes;

/// The largest frame `net.max_frame_payload` may allow (`FrameLimits`).
pub(crate) const LARGEST_FRAME_LIMIT: u64 = 64 << 20;

/// What a mode's largest frame carries, and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameNeed {
    /// Bytes of the frame's payload (the message), as `net.max_frame_payload` counts them.
    pub(crate) bytes: u64,
    /// The parameters it carries.
    pub(crate) elements: u64,
    /// What it is.
    pub(crate) what: FrameKind,
}

/// Which of a mode's frames is the largest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// A piece of an exact SGP share (a hand-off), the whole vector cut into at most
    /// [`MAX_SHARE_PIECES`] pieces.
    SgpShare,
    /// A sync-ring segment in a group of `min_group` peers.
    RingSegment {
        /// The smallest group a round goes ahead with.
        min_group: usize,
    },
    /// A butterfly chunk.
    ButterflyChunk,
}

impl FrameNeed {
    /// The key to change, and how, when this frame does not fit in `limit` bytes.
    pub(crate) fn remedy(&self, limit: u64) -> (&'static str, String) {
        let need = self.bytes;
        let raise = format!(
            "raise net.max_frame_payload (now {limit}) to at least {need}, at most {LARGEST_FRAME_LIMIT}"
        );
        match self.what {
            FrameKind::ButterflyChunk if need > LARGEST_FRAME_LIMIT => (
                "averaging.butterfly.chunk_elements",
                "lower averaging.butterfly.chunk_elements".to_owned(),
            ),
            FrameKind::ButterflyChunk => (
                "averaging.butterfly.chunk_elements",
                format!("lower averaging.butterfly.chunk_elements, or {raise}"),
            ),
            _ if need > LARGEST_FRAME_LIMIT => (
                "averaging.mode",
                "use averaging.mode = \"butterfly\" or \"local-sgd\", which send parts in \
                 chunks, or make the model smaller"
                    .to_owned(),
            ),
            _ => (
                "net.max_frame_payload",
                format!(
                    "{raise}; or use averaging.mode = \"butterfly\" or \"local-sgd\", which \
                     send parts in chunks"
                ),
            ),
        }
    }
}

impl fmt::Display for FrameNeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let size = Bytes(self.bytes);
        let elements = self.elements;
        match self.what {
            FrameKind::SgpShare => write!(
                f,
                "an SGP share travels in at most {MAX_SHARE_PIECES} pieces of a frame each, \
                 so frames of at least {size} ({elements} parameters a piece; a leaving peer \
                 hands its share off exactly, as f32)"
            ),
            FrameKind::RingSegment { min_group } => write!(
                f,
                "a sync-ring segment travels in one frame of up to {size} ({elements} \
                 parameters, in a group of min_group = {min_group})"
            ),
            FrameKind::ButterflyChunk => write!(
                f,
                "butterfly chunks travel in frames of up to {size} ({elements} parameters each)"
            ),
        }
    }
}

/// Checks that `need` fits in frames of `limit` bytes; otherwise the key to change and a
/// message that says what does not fit and how to fix it.
pub(crate) fn check(need: Option<FrameNeed>, limit: u32) -> Result<(), (&'static str, String)> {
    let limit = u64::from(limit);
    match need {
        Some(need) if need.bytes > limit => {
            let (key, how) = need.remedy(limit);
            Err((
                key,
                format!("{need}, more than net.max_frame_payload = {limit} allows: {how}"),
            ))
        }
        _ => Ok(()),
    }
}

/// The bytes of a share's payload one SGP parcel carries in frames of `limit` bytes: the
/// frame less the share's header.
pub(crate) fn share_piece_bytes(limit: u32) -> usize {
    (limit as usize).saturating_sub(share_header_len()).max(1)
}

/// The bytes of an SGP share's message before its payload.
fn share_header_len() -> usize {
    let header = PushSumShare {
        step: 0,
        chunk: 0,
        chunk_count: 1,
        offset: 0,
        elements: 0,
        weight: 1.0,
        reference_step: None,
        codec: CodecSpec::F32,
        payload: &[],
    };
    header.encoded_len()
}

/// The largest frame `mode` sends for a model of `params` parameters over `codec`.
pub(crate) fn largest_frame_of(
    mode: &ModeSettings,
    codec: CodecSpec,
    params: usize,
) -> Option<FrameNeed> {
    let butterfly = mode.butterfly().cloned().unwrap_or_default();
    largest_frame(mode.mode(), codec, params, &butterfly)
}

/// The largest frame `mode` sends for a model of `params` parameters; `None` for modes
/// that send no tensors.
pub(crate) fn largest_frame(
    mode: AveragingMode,
    codec: CodecSpec,
    params: usize,
    butterfly: &ButterflyConfig,
) -> Option<FrameNeed> {
    let encoded = |spec: CodecSpec, elements: usize| -> u64 {
        // The spec was validated before this, and every valid spec builds a codec.
        Codec::new(spec).map_or(elements as u64 * 4, |c| c.max_encoded_len(elements) as u64)
    };
    let chunk_frame = |elements: usize| -> u64 {
        let header = TensorPartChunk {
            address: ChunkAddress {
                group_id: 0,
                part: 0,
                chunk: 0,
                offset: 0,
                elements: 0,
            },
            weight: 0.0,
            codec,
            payload: &[],
        };
        header.encoded_len() as u64 + encoded(codec, elements)
    };
    let (bytes, elements, what) = match mode {
        AveragingMode::Solo => return None,
        AveragingMode::Sgp => {
            let piece = params.div_ceil(MAX_SHARE_PIECES as usize);
            let bytes = share_header_len() as u64 + encoded(CodecSpec::F32, piece);
            (bytes, piece, FrameKind::SgpShare)
        }
        AveragingMode::SyncRing => {
            let min_group = butterfly.min_group.max(1);
            let segment = params.div_ceil(min_group);
            (
                chunk_frame(segment),
                segment,
                FrameKind::RingSegment { min_group },
            )
        }
        AveragingMode::Butterfly | AveragingMode::LocalSgd => {
            let chunk = params.min(butterfly.chunk_elements as usize);
            (chunk_frame(chunk), chunk, FrameKind::ButterflyChunk)
        }
    };
    Some(FrameNeed {
        bytes,
        elements: elements as u64,
        what,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(mode: AveragingMode, codec: &str, params: usize) -> FrameNeed {
        let codec = CodecSpec::parse(codec).unwrap();
        largest_frame(mode, codec, params, &ButterflyConfig::default()).unwrap()
    }

    #[test]
    fn an_sgp_share_travels_in_pieces_of_the_whole_vector_in_f32_whatever_the_codec() {
        let int8 = need(AveragingMode::Sgp, "int8:64", 1_000_000);
        let f32 = need(AveragingMode::Sgp, "f32", 1_000_000);
        assert_eq!(int8, f32);
        assert_eq!(int8.elements, 16, "1M parameters in 65,536 pieces");
        // GPT-2 medium's share fits frames of a few KiB; the default 16 MiB frame would
        // carry a share of 274 billion parameters.
        let medium = need(AveragingMode::Sgp, "f32", 354_823_168);
        assert!(medium.bytes < 22_000, "{medium:?}");
        assert_eq!(check(Some(medium), 16 << 20), Ok(()));
        assert!(check(Some(medium), 4096).is_err());
        let piece = share_piece_bytes(16 << 20);
        assert!(piece < 16 << 20 && piece > (16 << 20) - 100, "{piece}");
    }

    #[test]
    fn a_ring_segment_is_a_min_group_part_and_butterfly_a_chunk() {
        let ring = need(AveragingMode::SyncRing, "f32", 1_000_000);
        assert_eq!(ring.elements, 500_000);
        assert_eq!(ring.what, FrameKind::RingSegment { min_group: 2 });
        let int8 = need(AveragingMode::SyncRing, "int8:64", 1_000_000);
        assert!(int8.bytes * 3 < ring.bytes, "{int8:?} {ring:?}");
        let chunk = ButterflyConfig::default().chunk_elements as u64;
        for mode in [AveragingMode::Butterfly, AveragingMode::LocalSgd] {
            assert_eq!(need(mode, "f32", 100_000_000).elements, chunk);
            assert_eq!(need(mode, "f32", 10).elements, 10);
        }
        let none = largest_frame(
            AveragingMode::Solo,
            CodecSpec::F32,
            100,
            &ButterflyConfig::default(),
        );
        assert_eq!(none, None);
    }

    #[test]
    fn the_remedy_names_the_key_that_can_fix_it() {
        let share = need(AveragingMode::SyncRing, "f32", 20_000_000);
        let (key, how) = share.remedy(16 << 20);
        assert_eq!(key, "net.max_frame_payload");
        assert!(how.contains("at least 40000"), "{how}");
        let huge = need(AveragingMode::SyncRing, "f32", 248_000_000);
        assert_eq!(huge.remedy(16 << 20).0, "averaging.mode");
        assert!(huge.to_string().contains("sync-ring segment"), "{huge}");
        assert_eq!(check(Some(share), 40_000_100), Ok(()));
        let (key, message) = check(Some(share), 16 << 20).unwrap_err();
        assert_eq!(key, "net.max_frame_payload");
        assert!(
            message.contains("more than net.max_frame_payload = 16777216"),
            "{message}"
        );
        assert_eq!(check(None, 1), Ok(()));
    }
}

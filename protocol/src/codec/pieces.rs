//! A long vector's encoding, written and read a piece at a time.
//!
//! Every codec but `topk` lays a vector out as its block scales, then its elements, each at
//! a fixed place (floats have no scales). A piece that starts on a block boundary owns one
//! run of scales and one run of element bytes, and encoding that piece alone gives exactly
//! those bytes. So a caller can encode a vector it computes piece by piece, or decode one
//! into a slice of a longer accumulator, holding one piece of scratch instead of a whole
//! vector: SGP's quantized edges encode `z − r` and check `r + Q⁻¹(…)` this way.

use std::ops::Range;

use super::{Codec, CodecError, CodecSpec};

/// Where a piece's bytes lie in its vector's encoding.
struct PieceBytes {
    scales: Range<usize>,
    values: Range<usize>,
}

/// Bits per element and elements per scale (0: no scales) of a fixed layout; `None` for
/// `topk`, whose encoding depends on the whole vector.
fn layout(spec: CodecSpec) -> Option<(usize, usize)> {
    match spec {
        CodecSpec::F32 => Some((32, 0)),
        CodecSpec::F16 | CodecSpec::Bf16 => Some((16, 0)),
        CodecSpec::Int8 { block } => Some((8, block as usize)),
        CodecSpec::Int4 { block } => Some((4, block as usize)),
        CodecSpec::Sign1 { block } => Some((1, block as usize)),
        CodecSpec::TopK { .. } => None,
    }
}

impl Codec {
    /// The element count a piece must start at a multiple of (its last piece may be
    /// shorter), for [`Codec::encode_piece`] and [`Codec::decode_accumulate_piece`]; `None`
    /// for `topk`, which encodes only whole vectors. Block sizes are multiples of 8, so a
    /// piece's packed elements start on a byte.
    pub fn piece_alignment(&self) -> Option<usize> {
        let (_, block) = layout(self.spec)?;
        Some(block.max(1))
    }

    /// Encodes `src`, the elements `start..start + src.len()` of a `total`-element vector,
    /// into their places in `dst`, that vector's encoding ([`Codec::max_encoded_len`] of
    /// `total` bytes). A blockwise codec encodes into `temp` first (one piece long).
    pub fn encode_piece(
        &mut self,
        src: &[f32],
        start: usize,
        total: usize,
        dst: &mut [u8],
        temp: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        let needed = self.max_encoded_len(total);
        if dst.len() < needed {
            return Err(CodecError::BufferTooSmall {
                needed,
                available: dst.len(),
            });
        }
        let bytes = self.piece_bytes(start, src.len(), total)?;
        let result = if bytes.scales.is_empty() {
            self.encode(src, &mut dst[bytes.values]).map(drop)
        } else {
            temp.clear();
            temp.resize(self.max_encoded_len(src.len()), 0);
            self.encode(src, temp).map(|_| {
                let (scales, values) = temp.split_at(bytes.scales.len());
                dst[bytes.scales].copy_from_slice(scales);
                dst[bytes.values].copy_from_slice(values);
            })
        };
        result.map_err(|error| match error {
            CodecError::NonFiniteInput { index } => CodecError::NonFiniteInput {
                index: start + index,
            },
            other => other,
        })
    }

    /// Adds `weight ×` the elements `start..start + acc.len()` decoded from `src`, a
    /// `total`-element vector's encoding, into `acc`. The piece is validated before `acc`
    /// is touched; the rest of `src` is not read. A blockwise codec gathers the piece's
    /// bytes into `temp` first.
    pub fn decode_accumulate_piece(
        &mut self,
        src: &[u8],
        (start, total): (usize, usize),
        weight: f32,
        acc: &mut [f32],
        temp: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        let expected = self.max_encoded_len(total);
        if src.len() != expected {
            return Err(CodecError::EncodedLength {
                codec: self.spec.name(),
                elements: total,
                expected,
                got: src.len(),
            });
        }
        let bytes = self.piece_bytes(start, acc.len(), total)?;
        let result = if bytes.scales.is_empty() {
            self.decode_accumulate(&src[bytes.values], weight, acc)
        } else {
            temp.clear();
            temp.extend_from_slice(&src[bytes.scales]);
            temp.extend_from_slice(&src[bytes.values]);
            self.decode_accumulate(temp, weight, acc)
        };
        result.map_err(|error| match error {
            CodecError::NonFiniteDecoded { index } => CodecError::NonFiniteDecoded {
                index: start + index,
            },
            other => other,
        })
    }

    /// The bytes of elements `start..start + len` of a `total`-element vector.
    fn piece_bytes(
        &self,
        start: usize,
        len: usize,
        total: usize,
    ) -> Result<PieceBytes, CodecError> {
        let misplaced = CodecError::MisplacedPiece { start, len, total };
        let (bits, block) = layout(self.spec).ok_or(misplaced.clone())?;
        let align = block.max(1);
        let end = start.checked_add(len).ok_or(misplaced.clone())?;
        let whole_blocks = len.is_multiple_of(align) || end == total;
        if end > total || !start.is_multiple_of(align) || !whole_blocks {
            return Err(misplaced);
        }
        let scale_bytes = |elements: usize| match block {
            0 => 0,
            block => elements.div_ceil(block) * 4,
        };
        let first_scale = scale_bytes(start);
        let first_value = scale_bytes(total) + start * bits / 8;
        Ok(PieceBytes {
            scales: first_scale..first_scale + scale_bytes(len),
            values: first_value..first_value + (len * bits).div_ceil(8),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as f32) * 0.37).sin() * (1.0 + (i % 97) as f32))
            .collect()
    }

    const SPECS: [CodecSpec; 6] = [
        CodecSpec::F32,
        CodecSpec::F16,
        CodecSpec::Bf16,
        CodecSpec::Int8 { block: 64 },
        CodecSpec::Int4 { block: 32 },
        CodecSpec::Sign1 { block: 128 },
    ];

    #[test]
    fn pieces_encode_to_the_whole_vector_s_bytes_and_decode_to_its_bits() {
        let total = 5_000 + 13;
        let src = values(total);
        for spec in SPECS {
            let mut codec = Codec::new(spec).expect("codec");
            let mut whole = vec![0u8; codec.max_encoded_len(total)];
            codec.encode(&src, &mut whole).expect("encode");
            let mut decoded = vec![0.5f32; total];
            codec
                .decode_accumulate(&whole, 0.25, &mut decoded)
                .expect("decode");
            let align = codec.piece_alignment().expect("fixed layout");
            for piece in [align, 3 * align, 1024usize.next_multiple_of(align)] {
                let mut by_pieces = vec![0xAAu8; whole.len()];
                let mut temp = Vec::new();
                for start in (0..total).step_by(piece) {
                    let end = (start + piece).min(total);
                    codec
                        .encode_piece(&src[start..end], start, total, &mut by_pieces, &mut temp)
                        .expect("encode piece");
                }
                assert!(by_pieces == whole, "{spec}: pieces of {piece}");
                let mut acc = vec![0.5f32; total];
                for start in (0..total).step_by(piece) {
                    let end = (start + piece).min(total);
                    codec
                        .decode_accumulate_piece(
                            &whole,
                            (start, total),
                            0.25,
                            &mut acc[start..end],
                            &mut temp,
                        )
                        .expect("decode piece");
                }
                let same = acc
                    .iter()
                    .zip(&decoded)
                    .all(|(a, d)| a.to_bits() == d.to_bits());
                assert!(same, "{spec}: pieces of {piece}");
            }
        }
    }

    #[test]
    fn a_piece_off_a_block_boundary_or_past_the_end_is_refused() {
        let mut codec = Codec::new(CodecSpec::Int8 { block: 64 }).expect("codec");
        let total = 1000;
        let mut dst = vec![0u8; codec.max_encoded_len(total)];
        let mut temp = Vec::new();
        let src = values(64);
        for (start, len) in [(32, 64), (0, 63), (960, 64)] {
            let error = codec
                .encode_piece(&src[..len], start, total, &mut dst, &mut temp)
                .unwrap_err();
            assert_eq!(error, CodecError::MisplacedPiece { start, len, total });
        }
        // The last piece may be short.
        codec
            .encode_piece(&src[..40], 960, total, &mut dst, &mut temp)
            .expect("the last piece");
        let mut topk = Codec::new(CodecSpec::TopK { keep_ppm: 10_000 }).expect("codec");
        assert_eq!(topk.piece_alignment(), None);
        assert!(topk.encode_piece(&src, 0, 64, &mut dst, &mut temp).is_err());
    }

    #[test]
    fn a_bad_piece_names_its_element_in_the_whole_vector_and_leaves_the_accumulator() {
        let mut codec = Codec::new(CodecSpec::Int8 { block: 64 }).expect("codec");
        let total = 256;
        let mut src = values(total);
        src[200] = f32::NAN;
        let mut dst = vec![0u8; codec.max_encoded_len(total)];
        let mut temp = Vec::new();
        let error = codec
            .encode_piece(&src[128..], 128, total, &mut dst, &mut temp)
            .unwrap_err();
        assert_eq!(error, CodecError::NonFiniteInput { index: 200 });
        // A negative scale in block 3 (elements 192..256): that piece is refused whole.
        let scale = 3 * 4;
        dst[scale..scale + 4].copy_from_slice(&(-1.0f32).to_le_bytes());
        let mut acc = vec![1.0f32; 128];
        let refused = codec.decode_accumulate_piece(&dst, (128, total), 1.0, &mut acc, &mut temp);
        assert!(refused.is_err());
        assert!(acc.iter().all(|&a| a == 1.0));
        let short = codec.decode_accumulate_piece(&dst[1..], (0, total), 1.0, &mut acc, &mut temp);
        assert!(matches!(short, Err(CodecError::EncodedLength { .. })));
    }
}

//! Tensor codecs: how a slice of `f32` becomes bytes on the wire and back.
//!
//! Every codec encodes into a caller-provided buffer whose size [`Codec::max_encoded_len`]
//! gives before encoding, decodes into a caller-provided slice ([`Codec::decode_into`]), and
//! has a fused [`Codec::decode_accumulate`] that adds `weight × decoded` into an accumulator
//! in one pass: the reducer's inner loop in butterfly all-reduce and the receive path of SGP.
//!
//! | codec | bytes per element | error (max abs, per element) |
//! |---|---|---|
//! | `f32` | 4 | exact |
//! | `f16` | 2 | `|x|·2⁻¹¹ + 2⁻²⁵`, saturates at ±65504 |
//! | `bf16` | 2 | `|x|·2⁻⁸` |
//! | `int8:B` | 1 + 4/B | half a step, step = block absmax / 127 |
//! | `int4:B` | ½ + 4/B | half a step, step = block absmax / 7 |
//! | `sign1:B` | ⅛ + 4/B | block absmax (one sign bit, scale = block mean of `|x|`) |
//! | `topk:P` | ≤ 8·P/10⁶ before zstd | the largest magnitude that was dropped |
//!
//! The encoded layouts are fixed so that a CUDA kernel can produce the same bytes:
//! blockwise codecs write all block scales (`f32` LE) first, then the packed elements;
//! rounding is round-to-nearest-even everywhere; sums run in a fixed order. Inputs must be
//! finite ([`CodecError::NonFiniteInput`]); decoders validate the whole input before they
//! touch the output, so a rejected part leaves an accumulator exactly as it was.
//!
//! The hot loops are written for the auto-vectorizer and compiled twice, for the baseline
//! target and for AVX2, chosen at run time.
//!
//! Lossy codecs should be wrapped in [`ErrorFeedback`], which carries each send's
//! quantization error into the next one (Seide et al. 2014, "1-bit SGD"; Karimireddy et
//! al. 2019, "Error Feedback Fixes SignSGD").

mod blockwise;
mod feedback;
mod finite;
mod float16;
pub(crate) mod kernels;
mod pieces;
mod sign1;
mod spec;
mod topk;

use thiserror::Error;

pub use feedback::ErrorFeedback;
pub use spec::{CODEC_SPEC_WIRE_LEN, CodecSpec, MAX_BLOCK, MIN_BLOCK, TOPK_PPM};

/// What went wrong while encoding or decoding a tensor part.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CodecError {
    /// A codec name or parameter is invalid (config, command line or wire).
    #[error("invalid codec: {reason}")]
    InvalidSpec {
        /// What was wrong.
        reason: String,
    },
    /// The wire named a codec id this build does not know; the peer runs a newer version.
    #[error("unknown codec id {id} on the wire; the peer may run a newer murmur")]
    UnknownCodec {
        /// The id that was received.
        id: u8,
    },
    /// The tensor to encode holds NaN or ±Inf; the sender's training step diverged.
    #[error("cannot encode: element {index} is not finite (NaN or Inf)")]
    NonFiniteInput {
        /// Index of the first non-finite element.
        index: usize,
    },
    /// The received part decodes to NaN or ±Inf (or to a scale that would produce them).
    #[error("received part decodes to a non-finite value near element {index}")]
    NonFiniteDecoded {
        /// Index of the first offending element (for blockwise codecs, the block's start).
        index: usize,
    },
    /// The encoded bytes have the wrong length for the element count.
    #[error("{codec} part for {elements} elements must be {expected} bytes, got {got}")]
    EncodedLength {
        /// The codec's name.
        codec: &'static str,
        /// Elements the part should hold.
        elements: usize,
        /// Bytes that many elements take.
        expected: usize,
        /// Bytes that arrived.
        got: usize,
    },
    /// The output buffer is smaller than [`Codec::max_encoded_len`].
    #[error("output buffer too small: need {needed} bytes, have {available}")]
    BufferTooSmall {
        /// Bytes the encoding may need.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// The encoded part is malformed in a codec-specific way.
    #[error("corrupt {codec} part: {reason}")]
    Corrupt {
        /// The codec's name.
        codec: &'static str,
        /// What was malformed.
        reason: &'static str,
    },
    /// A piece of a longer vector does not start on a block boundary, is not whole blocks
    /// long without ending the vector, or runs past it (or the codec, `topk`, encodes only
    /// whole vectors).
    #[error(
        "a piece of {len} elements at {start} does not fit the blocks of a {total}-element vector"
    )]
    MisplacedPiece {
        /// The piece's first element.
        start: usize,
        /// Its elements.
        len: usize,
        /// The vector's elements.
        total: usize,
    },
    /// `decode_accumulate` was given a NaN or infinite weight.
    #[error("accumulation weight {weight} is not finite")]
    InvalidWeight {
        /// The weight given.
        weight: f32,
    },
}

/// A codec ready to encode and decode, holding whatever scratch space it needs so that the
/// steady state allocates nothing.
#[derive(Debug)]
pub struct Codec {
    spec: CodecSpec,
    topk: Option<topk::TopKCodec>,
}

impl Codec {
    /// Makes a codec for `spec` after validating its parameters.
    pub fn new(spec: CodecSpec) -> Result<Codec, CodecError> {
        spec.validate()?;
        let topk = match spec {
            CodecSpec::TopK { keep_ppm } => Some(topk::TopKCodec::new(keep_ppm)),
            _ => None,
        };
        Ok(Codec { spec, topk })
    }

    /// The codec and its parameters.
    pub fn spec(&self) -> CodecSpec {
        self.spec
    }

    /// The largest number of bytes [`Codec::encode`] can write for `elements` elements.
    /// For every codec but `topk` it is also the exact length.
    pub fn max_encoded_len(&self, elements: usize) -> usize {
        match self.spec {
            CodecSpec::F32 => elements * 4,
            CodecSpec::F16 | CodecSpec::Bf16 => elements * 2,
            CodecSpec::Int8 { block } => blockwise::Int8::encoded_len(elements, block),
            CodecSpec::Int4 { block } => blockwise::Int4::encoded_len(elements, block),
            CodecSpec::Sign1 { block } => sign1::encoded_len(elements, block),
            CodecSpec::TopK { keep_ppm } => topk::max_encoded_len(elements, keep_ppm),
        }
    }

    /// Encodes `src` into the front of `dst` and returns how many bytes it wrote.
    pub fn encode(&mut self, src: &[f32], dst: &mut [u8]) -> Result<usize, CodecError> {
        let needed = self.max_encoded_len(src.len());
        if dst.len() < needed {
            return Err(CodecError::BufferTooSmall {
                needed,
                available: dst.len(),
            });
        }
        let dst = &mut dst[..needed];
        match self.spec {
            CodecSpec::F32 => float16::encode_f32(src, dst).map(|()| needed),
            CodecSpec::F16 => float16::encode_f16(src, dst).map(|()| needed),
            CodecSpec::Bf16 => float16::encode_bf16(src, dst).map(|()| needed),
            CodecSpec::Int8 { block } => blockwise::Int8::encode(src, dst, block).map(|()| needed),
            CodecSpec::Int4 { block } => blockwise::Int4::encode(src, dst, block).map(|()| needed),
            CodecSpec::Sign1 { block } => sign1::encode(src, dst, block).map(|()| needed),
            CodecSpec::TopK { .. } => self.topk_mut().encode(src, dst),
        }
    }

    /// Decodes `src` into `dst`, whose length is the element count.
    pub fn decode_into(&mut self, src: &[u8], dst: &mut [f32]) -> Result<(), CodecError> {
        self.decode(src, dst, None)
    }

    /// Adds `weight × decoded(src)` into `acc`, whose length is the element count. The input
    /// is validated completely before `acc` is touched, so on error `acc` is unchanged.
    pub fn decode_accumulate(
        &mut self,
        src: &[u8],
        weight: f32,
        acc: &mut [f32],
    ) -> Result<(), CodecError> {
        if !weight.is_finite() {
            return Err(CodecError::InvalidWeight { weight });
        }
        self.decode(src, acc, Some(weight))
    }

    /// An upper bound on `max |decoded − src|` for this codec and this input: the bound the
    /// table in the module docs gives, evaluated on `src`. Used by tests and by the averaging
    /// layers to state how close a result must be.
    pub fn error_bound(&self, src: &[f32]) -> f32 {
        match self.spec {
            CodecSpec::F32 => 0.0,
            CodecSpec::F16 => float16::f16_error_bound(src),
            CodecSpec::Bf16 => float16::bf16_error_bound(src),
            CodecSpec::Int8 { block } => blockwise::Int8::error_bound(src, block),
            CodecSpec::Int4 { block } => blockwise::Int4::error_bound(src, block),
            CodecSpec::Sign1 { block } => sign1::error_bound(src, block),
            CodecSpec::TopK { keep_ppm } => topk::error_bound(src, keep_ppm),
        }
    }

    fn decode(
        &mut self,
        src: &[u8],
        out: &mut [f32],
        weight: Option<f32>,
    ) -> Result<(), CodecError> {
        let expected = self.max_encoded_len(out.len());
        let exact = !matches!(self.spec, CodecSpec::TopK { .. });
        if (exact && src.len() != expected) || src.len() > expected {
            return Err(CodecError::EncodedLength {
                codec: self.spec.name(),
                elements: out.len(),
                expected,
                got: src.len(),
            });
        }
        match self.spec {
            CodecSpec::F32 => float16::decode_f32(src, out, weight),
            CodecSpec::F16 => float16::decode_f16(src, out, weight),
            CodecSpec::Bf16 => float16::decode_bf16(src, out, weight),
            CodecSpec::Int8 { block } => blockwise::Int8::decode(src, out, block, weight),
            CodecSpec::Int4 { block } => blockwise::Int4::decode(src, out, block, weight),
            CodecSpec::Sign1 { block } => sign1::decode(src, out, block, weight),
            CodecSpec::TopK { .. } => self.topk_mut().decode(src, out, weight),
        }
    }

    fn topk_mut(&mut self) -> &mut topk::TopKCodec {
        // `new` builds the top-k state exactly when the spec is TopK, and the spec never
        // changes afterwards.
        self.topk
            .as_mut()
            .expect("top-k state exists for a top-k codec")
    }
}

//! Which codec a tensor part is encoded with, and how that choice travels on the wire.

use super::CodecError;

/// Smallest block size the blockwise codecs accept.
pub const MIN_BLOCK: u32 = 32;
/// Largest block size the blockwise codecs accept.
pub const MAX_BLOCK: u32 = 4096;
/// Denominator of [`CodecSpec::TopK`]'s keep fraction: parts per million.
pub const TOPK_PPM: u32 = 1_000_000;

/// Size in bytes of a [`CodecSpec`] on the wire: a one-byte codec id and a `u32` parameter.
pub const CODEC_SPEC_WIRE_LEN: usize = 5;

/// A tensor codec and its parameters.
///
/// Block sizes lie in [`MIN_BLOCK`]`..=`[`MAX_BLOCK`] and are multiples of 8, so that the
/// packed bits of `int4` and `sign1` blocks start on a byte boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodecSpec {
    /// Plain little-endian `f32`: exact.
    F32,
    /// IEEE half precision, round to nearest even, saturating at ±65504.
    F16,
    /// bfloat16 (the upper half of an `f32`), round to nearest even.
    Bf16,
    /// Blockwise absmax `int8`: per block an `f32` scale and one signed byte per element.
    Int8 {
        /// Elements per block.
        block: u32,
    },
    /// Blockwise absmax `int4`: per block an `f32` scale and one signed nibble per element.
    Int4 {
        /// Elements per block.
        block: u32,
    },
    /// One sign bit per element and a per-block scale (the block's mean absolute value).
    Sign1 {
        /// Elements per block.
        block: u32,
    },
    /// The largest-magnitude elements as (index, value) pairs, then zstd.
    TopK {
        /// Fraction of elements kept, in parts per million (1 ..= 1,000,000).
        keep_ppm: u32,
    },
}

/// The codec ids on the wire. Stable: new codecs get new ids.
mod id {
    pub(super) const F32: u8 = 1;
    pub(super) const F16: u8 = 2;
    pub(super) const BF16: u8 = 3;
    pub(super) const INT8: u8 = 4;
    pub(super) const INT4: u8 = 5;
    pub(super) const SIGN1: u8 = 6;
    pub(super) const TOPK: u8 = 7;
}

impl CodecSpec {
    /// Every codec with its default parameters, in wire-id order.
    pub const ALL_DEFAULT: [CodecSpec; 7] = [
        CodecSpec::F32,
        CodecSpec::F16,
        CodecSpec::Bf16,
        CodecSpec::Int8 { block: 64 },
        CodecSpec::Int4 { block: 64 },
        CodecSpec::Sign1 { block: 256 },
        CodecSpec::TopK { keep_ppm: 10_000 },
    ];

    /// The codec's short name, as used in configs, metrics and benchmark output.
    pub fn name(&self) -> &'static str {
        match self {
            CodecSpec::F32 => "f32",
            CodecSpec::F16 => "f16",
            CodecSpec::Bf16 => "bf16",
            CodecSpec::Int8 { .. } => "int8",
            CodecSpec::Int4 { .. } => "int4",
            CodecSpec::Sign1 { .. } => "sign1",
            CodecSpec::TopK { .. } => "topk",
        }
    }

    /// The block size of a blockwise codec, `None` for the others.
    pub fn block(&self) -> Option<u32> {
        match *self {
            CodecSpec::Int8 { block } | CodecSpec::Int4 { block } | CodecSpec::Sign1 { block } => {
                Some(block)
            }
            _ => None,
        }
    }

    /// Whether decoding loses information, so that senders should use error feedback.
    pub fn is_lossy(&self) -> bool {
        !matches!(self, CodecSpec::F32)
    }

    /// Parses a codec by name with an optional parameter, as written in configs and on the
    /// command line: `int8`, `int8:128` (block 128), `topk:10000` (keep 1%).
    pub fn parse(text: &str) -> Result<CodecSpec, CodecError> {
        let (name, param) = match text.split_once(':') {
            Some((name, param)) => {
                let value = param.parse::<u32>().map_err(|_| CodecError::InvalidSpec {
                    reason: format!("parameter {param:?} of codec {name:?} is not an integer"),
                })?;
                (name, Some(value))
            }
            None => (text, None),
        };
        let spec = match (name, param) {
            ("f32", None) => CodecSpec::F32,
            ("f16", None) => CodecSpec::F16,
            ("bf16", None) => CodecSpec::Bf16,
            ("int8", block) => CodecSpec::Int8 {
                block: block.unwrap_or(64),
            },
            ("int4", block) => CodecSpec::Int4 {
                block: block.unwrap_or(64),
            },
            ("sign1", block) => CodecSpec::Sign1 {
                block: block.unwrap_or(256),
            },
            ("topk", keep) => CodecSpec::TopK {
                keep_ppm: keep.unwrap_or(10_000),
            },
            ("f32" | "f16" | "bf16", Some(_)) => {
                return Err(CodecError::InvalidSpec {
                    reason: format!("codec {name:?} takes no parameter"),
                });
            }
            _ => {
                return Err(CodecError::InvalidSpec {
                    reason: format!(
                        "unknown codec {name:?}; expected one of f32, f16, bf16, int8[:block], \
                         int4[:block], sign1[:block], topk[:keep_ppm]"
                    ),
                });
            }
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Checks the parameters: block sizes in range and multiples of 8, keep fraction in range.
    pub fn validate(&self) -> Result<(), CodecError> {
        if let Some(block) = self.block()
            && (!(MIN_BLOCK..=MAX_BLOCK).contains(&block) || !block.is_multiple_of(8))
        {
            return Err(CodecError::InvalidSpec {
                reason: format!(
                    "{} block size {block} must be a multiple of 8 in {MIN_BLOCK}..={MAX_BLOCK}",
                    self.name()
                ),
            });
        }
        if let CodecSpec::TopK { keep_ppm } = *self
            && !(1..=TOPK_PPM).contains(&keep_ppm)
        {
            return Err(CodecError::InvalidSpec {
                reason: format!("topk keep fraction {keep_ppm} ppm must be in 1..={TOPK_PPM}"),
            });
        }
        Ok(())
    }

    /// The spec's wire form: codec id, then its parameter as little-endian `u32`.
    pub fn to_wire(&self) -> [u8; CODEC_SPEC_WIRE_LEN] {
        let (id, param) = match *self {
            CodecSpec::F32 => (id::F32, 0),
            CodecSpec::F16 => (id::F16, 0),
            CodecSpec::Bf16 => (id::BF16, 0),
            CodecSpec::Int8 { block } => (id::INT8, block),
            CodecSpec::Int4 { block } => (id::INT4, block),
            CodecSpec::Sign1 { block } => (id::SIGN1, block),
            CodecSpec::TopK { keep_ppm } => (id::TOPK, keep_ppm),
        };
        let p = param.to_le_bytes();
        [id, p[0], p[1], p[2], p[3]]
    }

    /// Parses and validates a spec's wire form.
    pub fn from_wire(bytes: [u8; CODEC_SPEC_WIRE_LEN]) -> Result<CodecSpec, CodecError> {
        let param = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        let spec = match (bytes[0], param) {
            (id::F32, 0) => CodecSpec::F32,
            (id::F16, 0) => CodecSpec::F16,
            (id::BF16, 0) => CodecSpec::Bf16,
            (id::INT8, block) => CodecSpec::Int8 { block },
            (id::INT4, block) => CodecSpec::Int4 { block },
            (id::SIGN1, block) => CodecSpec::Sign1 { block },
            (id::TOPK, keep_ppm) => CodecSpec::TopK { keep_ppm },
            (id::F32 | id::F16 | id::BF16, p) => {
                return Err(CodecError::InvalidSpec {
                    reason: format!("codec id {} carries parameter {p}, expected 0", bytes[0]),
                });
            }
            (other, _) => return Err(CodecError::UnknownCodec { id: other }),
        };
        spec.validate()?;
        Ok(spec)
    }
}

impl std::fmt::Display for CodecSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            CodecSpec::Int8 { block } | CodecSpec::Int4 { block } | CodecSpec::Sign1 { block } => {
                write!(f, "{}:{block}", self.name())
            }
            CodecSpec::TopK { keep_ppm } => write!(f, "topk:{keep_ppm}"),
            _ => f.write_str(self.name()),
        }
    }
}

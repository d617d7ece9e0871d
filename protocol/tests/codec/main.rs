//! Codec properties: round trips within the documented bounds, agreement with plain scalar
//! references, error feedback, and rejection of bad input.

mod bad_input;
mod error_feedback;
mod reference;
mod roundtrip;
mod spec;

use murmur_protocol::codec::{Codec, CodecSpec};
use proptest::prelude::*;

/// Every codec, with block sizes and keep fractions drawn from their valid ranges.
pub(crate) fn any_spec() -> impl Strategy<Value = CodecSpec> {
    let block = (4u32..=512).prop_map(|b| b * 8);
    prop_oneof![
        Just(CodecSpec::F32),
        Just(CodecSpec::F16),
        Just(CodecSpec::Bf16),
        block.clone().prop_map(|block| CodecSpec::Int8 { block }),
        block.clone().prop_map(|block| CodecSpec::Int4 { block }),
        block.prop_map(|block| CodecSpec::Sign1 { block }),
        (1u32..=1_000_000).prop_map(|keep_ppm| CodecSpec::TopK { keep_ppm }),
    ]
}

/// Finite tensors of up to `max_len` elements mixing scales from 1e-6 to 1e4, with zeros,
/// tiny subnormals and constant runs, which are where quantizers go wrong.
pub(crate) fn any_tensor(max_len: usize) -> impl Strategy<Value = Vec<f32>> {
    let element = prop_oneof![
        6 => -1.0f32..1.0,
        2 => (-1.0f32..1.0, -6i32..5).prop_map(|(m, e)| m * 10f32.powi(e)),
        1 => Just(0.0f32),
        1 => (-1000i32..1000).prop_map(|m| m as f32 * 1e-40),
    ];
    prop::collection::vec(element, 0..max_len)
}

/// Encodes `x` with `spec` and decodes it back.
pub(crate) fn roundtrip(spec: CodecSpec, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut codec = Codec::new(spec).expect("valid spec");
    let mut bytes = vec![0u8; codec.max_encoded_len(x.len())];
    let written = codec.encode(x, &mut bytes).expect("finite input encodes");
    bytes.truncate(written);
    let mut out = vec![f32::NAN; x.len()];
    codec
        .decode_into(&bytes, &mut out)
        .expect("own encoding decodes");
    (bytes, out)
}

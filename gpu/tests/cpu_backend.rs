//! The CPU backend against the protocol crate's reference codecs and scalar formulas.
//!
//! Run these under `--release` as well: only optimized builds use the vectorized loops,
//! and those must give the same bits as the scalar formulas.

mod conformance;

use conformance::{
    MAX_PART, any_element, any_factor, any_layout, any_spec, axpby_matches_scalar,
    axpy_matches_scalar, bad_requests_change_nothing, decode_accumulate_matches_reference,
    decode_matches_reference, encode_matches_reference, feedback_matches_reference,
    layout_with_source, moves_touch_only_their_range, scale_matches_scalar,
};
use murmur_gpu::{Backend, CpuBackend, GpuError};
use murmur_protocol::codec::{Codec, CodecSpec};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Encoding a part through the backend gives the reference codec's bytes.
    #[test]
    fn encode_equals_codec(spec in any_spec(), src in any_layout(MAX_PART)) {
        encode_matches_reference(&mut CpuBackend::new(), spec, &src)?;
    }

    /// Decode-accumulate into a part equals the codec's, bit for bit, and nothing outside
    /// the part changes.
    #[test]
    fn decode_accumulate_equals_codec(
        spec in any_spec(),
        (acc, sent, _) in layout_with_source(),
        weight in any_factor(),
    ) {
        decode_accumulate_matches_reference(&mut CpuBackend::new(), spec, &sent, weight, &acc)?;
    }

    /// Decoding into a part equals the codec's, bit for bit, and nothing outside the part
    /// changes.
    #[test]
    fn decode_equals_codec(spec in any_spec(), (dst, sent, _) in layout_with_source()) {
        decode_matches_reference(&mut CpuBackend::new(), spec, &sent, &dst)?;
    }

    /// Error feedback through the backend equals `ErrorFeedback` over a run of sends.
    #[test]
    fn feedback_equals_error_feedback(
        spec in any_spec(),
        layout in any_layout(MAX_PART),
        sends in prop::collection::vec(prop::collection::vec(any_element(), MAX_PART), 1..4),
    ) {
        feedback_matches_reference(&mut CpuBackend::new(), spec, &layout, &sends)?;
    }

    /// `scale` equals `alpha * y` element by element, bit for bit.
    #[test]
    fn scale_equals_scalar(alpha in any_factor(), y in any_layout(MAX_PART)) {
        scale_matches_scalar(&mut CpuBackend::new(), alpha, &y)?;
    }

    /// `axpy` equals `y + alpha * x` element by element, bit for bit.
    #[test]
    fn axpy_equals_scalar(alpha in any_factor(), (y, x, offset) in layout_with_source()) {
        axpy_matches_scalar(&mut CpuBackend::new(), alpha, &x, offset, &y)?;
    }

    /// `axpby` equals `alpha * x + beta * y` element by element, bit for bit.
    #[test]
    fn axpby_equals_scalar(
        alpha in any_factor(),
        beta in any_factor(),
        (y, x, offset) in layout_with_source(),
    ) {
        axpby_matches_scalar(&mut CpuBackend::new(), (alpha, beta), &x, offset, &y)?;
    }

    /// Copies, fills, uploads and downloads touch only their range.
    #[test]
    fn moves_touch_only_the_range(
        (dst, src, offset) in layout_with_source(),
        value in any_element(),
    ) {
        moves_touch_only_their_range(&mut CpuBackend::new(), &src, offset, &dst, value)?;
    }

    /// Bad ranges, mismatched lengths, non-finite factors and malformed parts are refused
    /// and change nothing.
    #[test]
    fn bad_requests_are_refused(layout in any_layout(MAX_PART)) {
        bad_requests_change_nothing(&mut CpuBackend::new(), &layout)?;
    }
}

/// One backend reused across parts of different sizes, in both orders, gives the same
/// results as fresh ones: the feedback scratch it keeps carries nothing between calls.
#[test]
fn reused_backend_matches_fresh_backends() {
    let spec = CodecSpec::Int4 { block: 32 };
    let values: Vec<f32> = (0..1000)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect();
    let parts = [0..1000, 100..164, 500..999, 3..4];
    let mut reused = CpuBackend::new();
    let mut codec = Codec::new(spec).unwrap();
    let mut residual_reused = reused.alloc(values.len()).unwrap();
    let mut residual_fresh = residual_reused.clone();
    let mut wire_reused = vec![0u8; codec.max_encoded_len(values.len())];
    let mut wire_fresh = wire_reused.clone();
    for part in parts.iter().chain(parts.iter().rev()) {
        let n_reused = reused
            .encode_with_feedback(
                &mut codec,
                &values,
                &mut residual_reused,
                part.clone(),
                &mut wire_reused,
            )
            .unwrap();
        let n_fresh = CpuBackend::new()
            .encode_with_feedback(
                &mut codec,
                &values,
                &mut residual_fresh,
                part.clone(),
                &mut wire_fresh,
            )
            .unwrap();
        assert_eq!(
            wire_reused[..n_reused],
            wire_fresh[..n_fresh],
            "part {part:?}"
        );
        assert_eq!(
            residual_reused
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            residual_fresh
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            "part {part:?}"
        );
    }
    assert!(
        residual_reused.iter().any(|&e| e != 0.0),
        "int4 must leave some residual"
    );
}

/// Allocation reports a buffer too large to exist instead of aborting the process.
#[test]
fn impossible_alloc_is_an_error() {
    let mut backend = CpuBackend::new();
    assert!(matches!(
        backend.alloc(usize::MAX),
        Err(GpuError::OutOfMemory {
            elements: usize::MAX,
            bytes: usize::MAX
        })
    ));
    let buf = backend.alloc(1000).unwrap();
    assert_eq!(buf.len(), 1000);
    assert!(buf.iter().all(|v| v.to_bits() == 0));
}

/// The reducer's whole job on one part, through the backend: a weighted mean of three
/// contributions with f32 encoding equals the mean computed directly.
#[test]
fn weighted_mean_of_exact_parts() {
    let mut backend = CpuBackend::new();
    let mut codec = Codec::new(CodecSpec::F32).unwrap();
    let contributions: [(f32, Vec<f32>); 3] = [
        (1.0, (0..64).map(|i| i as f32).collect()),
        (2.0, (0..64).map(|i| -(i as f32)).collect()),
        (1.0, vec![4.0; 64]),
    ];
    let mut sum = backend.alloc(64).unwrap();
    let mut wire = vec![0u8; codec.max_encoded_len(64)];
    let mut total = 0.0;
    for (weight, part) in &contributions {
        let n = backend.encode(&mut codec, part, 0..64, &mut wire).unwrap();
        backend
            .decode_accumulate(&mut codec, &wire[..n], *weight, &mut sum, 0..64)
            .unwrap();
        total += weight;
    }
    backend.scale(&mut sum, 0..64, 1.0 / total).unwrap();
    for (i, v) in sum.iter().enumerate() {
        // (i − 2i + 4) / 4, exact in f32 for these small integers.
        assert_eq!(*v, (4.0 - i as f32) / 4.0, "element {i}");
    }
}

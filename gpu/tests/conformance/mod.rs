//! Checks every backend must pass, written against the `Backend` trait so each backend runs
//! the same ones: results equal the protocol crate's reference codecs and plain scalar
//! formulas bit for bit, and operations touch exactly the range they are given.

use std::ops::Range;

use murmur_gpu::{Backend, DeviceBuffer, GpuError};
use murmur_protocol::codec::{Codec, CodecError, CodecSpec, ErrorFeedback};
use proptest::prelude::*;

/// Every codec, with block sizes and keep fractions drawn from their valid ranges.
pub(crate) fn any_spec() -> impl Strategy<Value = CodecSpec> {
    let block = (4u32..=64).prop_map(|b| b * 8);
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

/// A finite element mixing scales, with zeros and subnormals.
pub(crate) fn any_element() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -1.0f32..1.0,
        2 => (-1.0f32..1.0, -6i32..5).prop_map(|(m, e)| m * 10f32.powi(e)),
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
        1 => (-1000i32..1000).prop_map(|m| m as f32 * 1e-40),
    ]
}

/// A finite mixing factor, including the values mixing code uses most.
pub(crate) fn any_factor() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -4.0f32..4.0,
        1 => Just(0.0f32),
        1 => Just(0.5f32),
        1 => Just(1.0f32),
        1 => Just(-1.0f32),
    ]
}

/// A buffer of `before + part + after` elements and the range of the part in it.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) values: Vec<f32>,
    pub(crate) part: Range<usize>,
}

/// A buffer whose part sits anywhere inside it, with up to `max_part` elements.
pub(crate) fn any_layout(max_part: usize) -> impl Strategy<Value = Layout> {
    (0usize..40, 0..max_part, 0usize..40).prop_flat_map(|(before, part, after)| {
        prop::collection::vec(any_element(), before + part + after).prop_map(move |values| Layout {
            values,
            part: before..before + part,
        })
    })
}

/// Up to this many elements in a part: several SIMD widths plus remainders, more than one
/// block of every blockwise codec, and more than one warp's worth on a GPU.
pub(crate) const MAX_PART: usize = 600;

/// A layout, a vector at least as long as its part (`sent` data for it), and an offset
/// that places the part's length inside a second buffer `x`.
pub(crate) fn layout_with_source() -> impl Strategy<Value = (Layout, Vec<f32>, usize)> {
    any_layout(MAX_PART).prop_flat_map(|layout| {
        let part = layout.part.len();
        (0usize..32).prop_flat_map(move |offset| {
            let layout = layout.clone();
            prop::collection::vec(any_element(), part + offset + 16)
                .prop_map(move |x| (layout.clone(), x, offset))
        })
    })
}

/// The bit patterns of `xs`, so that comparisons tell `-0.0` from `0.0` and NaN from NaN.
pub(crate) fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

/// A backend buffer holding `values`.
pub(crate) fn buffer<B: Backend>(backend: &mut B, values: &[f32]) -> B::Buffer {
    let mut buf = backend.alloc(values.len()).expect("alloc");
    backend
        .upload(values, &mut buf, 0..values.len())
        .expect("upload");
    buf
}

/// The whole of a backend buffer, in host memory.
pub(crate) fn contents<B: Backend>(backend: &mut B, buf: &B::Buffer) -> Vec<f32> {
    let mut out = vec![f32::NAN; buf.len()];
    backend
        .download(buf, 0..buf.len(), &mut out)
        .expect("download");
    out
}

/// The reference encoding of `x`.
fn reference_encode(spec: CodecSpec, x: &[f32]) -> Vec<u8> {
    let mut codec = Codec::new(spec).expect("valid spec");
    let mut bytes = vec![0u8; codec.max_encoded_len(x.len())];
    let written = codec.encode(x, &mut bytes).expect("finite input encodes");
    bytes.truncate(written);
    bytes
}

/// Encoding a part of a backend buffer gives the reference codec's bytes for that part.
pub(crate) fn encode_matches_reference<B: Backend>(
    backend: &mut B,
    spec: CodecSpec,
    src: &Layout,
) -> Result<(), TestCaseError> {
    let buf = buffer(backend, &src.values);
    let mut codec = Codec::new(spec).expect("valid spec");
    let mut wire = vec![0xAA; codec.max_encoded_len(src.part.len())];
    let written = backend.encode(&mut codec, &buf, src.part.clone(), &mut wire)?;
    prop_assert_eq!(
        &wire[..written],
        &reference_encode(spec, &src.values[src.part.clone()])[..]
    );
    prop_assert_eq!(bits(&contents(backend, &buf)), bits(&src.values));
    Ok(())
}

/// Decode-accumulating into a part of a buffer equals the reference codec's
/// `decode_accumulate` on that part, and leaves the rest of the buffer alone.
pub(crate) fn decode_accumulate_matches_reference<B: Backend>(
    backend: &mut B,
    spec: CodecSpec,
    sent: &[f32],
    weight: f32,
    acc: &Layout,
) -> Result<(), TestCaseError> {
    let sent = &sent[..acc.part.len()];
    let wire = reference_encode(spec, sent);
    let mut expected = acc.values.clone();
    let mut codec = Codec::new(spec).expect("valid spec");
    codec.decode_accumulate(&wire, weight, &mut expected[acc.part.clone()])?;

    let mut buf = buffer(backend, &acc.values);
    backend.decode_accumulate(&mut codec, &wire, weight, &mut buf, acc.part.clone())?;
    prop_assert_eq!(bits(&contents(backend, &buf)), bits(&expected));
    Ok(())
}

/// Decoding into a part of a buffer equals the reference codec's `decode_into` on that
/// part, and leaves the rest of the buffer alone.
pub(crate) fn decode_matches_reference<B: Backend>(
    backend: &mut B,
    spec: CodecSpec,
    sent: &[f32],
    dst: &Layout,
) -> Result<(), TestCaseError> {
    let sent = &sent[..dst.part.len()];
    let wire = reference_encode(spec, sent);
    let mut expected = dst.values.clone();
    let mut codec = Codec::new(spec).expect("valid spec");
    codec.decode_into(&wire, &mut expected[dst.part.clone()])?;

    let mut buf = buffer(backend, &dst.values);
    backend.decode(&mut codec, &wire, &mut buf, dst.part.clone())?;
    prop_assert_eq!(bits(&contents(backend, &buf)), bits(&expected));
    Ok(())
}

/// A run of sends with error feedback through the backend gives the same bytes and the same
/// residual as `ErrorFeedback`, keeps the residual outside the part untouched, and a send
/// that fails leaves the residual as it was.
pub(crate) fn feedback_matches_reference<B: Backend>(
    backend: &mut B,
    spec: CodecSpec,
    layout: &Layout,
    sends: &[Vec<f32>],
) -> Result<(), TestCaseError> {
    let part = layout.part.clone();
    let mut codec = Codec::new(spec).expect("valid spec");
    let mut reference_codec = Codec::new(spec).expect("valid spec");
    let mut reference = ErrorFeedback::new(part.len());
    // Outside the part, the residual holds values that must survive; inside it starts at
    // zero, as `ErrorFeedback::new` does.
    let mut residual_start = layout.values.clone();
    residual_start[part.clone()].fill(0.0);
    let mut residual = buffer(backend, &residual_start);
    let mut src_values = layout.values.clone();
    let mut wire = vec![0u8; codec.max_encoded_len(part.len())];
    let mut expected_wire = wire.clone();

    for send in sends {
        src_values[part.clone()].copy_from_slice(&send[..part.len()]);
        let src = buffer(backend, &src_values);
        let written = backend.encode_with_feedback(
            &mut codec,
            &src,
            &mut residual,
            part.clone(),
            &mut wire,
        )?;
        let expected_written = reference.encode(
            &mut reference_codec,
            &send[..part.len()],
            &mut expected_wire,
        )?;
        prop_assert_eq!(&wire[..written], &expected_wire[..expected_written]);
        let mut expected_residual = residual_start.clone();
        expected_residual[part.clone()].copy_from_slice(reference.residual());
        prop_assert_eq!(
            bits(&contents(backend, &residual)),
            bits(&expected_residual)
        );
    }

    if !part.is_empty() {
        let before = contents(backend, &residual);
        src_values[part.start] = f32::NAN;
        let src = buffer(backend, &src_values);
        let failed =
            backend.encode_with_feedback(&mut codec, &src, &mut residual, part.clone(), &mut wire);
        prop_assert!(
            matches!(
                failed,
                Err(GpuError::Codec(CodecError::NonFiniteInput { index: 0 }))
            ),
            "NaN input gave {failed:?}"
        );
        prop_assert_eq!(bits(&contents(backend, &residual)), bits(&before));
    }
    Ok(())
}

/// `scale` computes `alpha * y` on the part and nothing elsewhere.
pub(crate) fn scale_matches_scalar<B: Backend>(
    backend: &mut B,
    alpha: f32,
    y: &Layout,
) -> Result<(), TestCaseError> {
    let mut expected = y.values.clone();
    for v in &mut expected[y.part.clone()] {
        *v *= alpha;
    }
    let mut buf = buffer(backend, &y.values);
    backend.scale(&mut buf, y.part.clone(), alpha)?;
    prop_assert_eq!(bits(&contents(backend, &buf)), bits(&expected));
    Ok(())
}

/// `axpy` computes `y + alpha * x` on the part of `y`, reading `x` at its own offset.
pub(crate) fn axpy_matches_scalar<B: Backend>(
    backend: &mut B,
    alpha: f32,
    x: &[f32],
    x_offset: usize,
    y: &Layout,
) -> Result<(), TestCaseError> {
    let x_range = x_offset..x_offset + y.part.len();
    let mut expected = y.values.clone();
    for (v, &xv) in expected[y.part.clone()].iter_mut().zip(&x[x_range.clone()]) {
        *v += alpha * xv;
    }
    let x_buf = buffer(backend, x);
    let mut y_buf = buffer(backend, &y.values);
    backend.axpy(alpha, &x_buf, x_range, &mut y_buf, y.part.clone())?;
    prop_assert_eq!(bits(&contents(backend, &y_buf)), bits(&expected));
    prop_assert_eq!(bits(&contents(backend, &x_buf)), bits(x));
    Ok(())
}

/// `axpby` computes `alpha * x + beta * y` on the part of `y`, reading `x` at its own
/// offset.
pub(crate) fn axpby_matches_scalar<B: Backend>(
    backend: &mut B,
    (alpha, beta): (f32, f32),
    x: &[f32],
    x_offset: usize,
    y: &Layout,
) -> Result<(), TestCaseError> {
    let x_range = x_offset..x_offset + y.part.len();
    let mut expected = y.values.clone();
    for (v, &xv) in expected[y.part.clone()].iter_mut().zip(&x[x_range.clone()]) {
        *v = alpha * xv + beta * *v;
    }
    let x_buf = buffer(backend, x);
    let mut y_buf = buffer(backend, &y.values);
    backend.axpby(alpha, &x_buf, x_range, beta, &mut y_buf, y.part.clone())?;
    prop_assert_eq!(bits(&contents(backend, &y_buf)), bits(&expected));
    Ok(())
}

/// `copy`, `fill`, `upload` and `download` move exactly the addressed elements.
pub(crate) fn moves_touch_only_their_range<B: Backend>(
    backend: &mut B,
    src: &[f32],
    src_offset: usize,
    dst: &Layout,
    value: f32,
) -> Result<(), TestCaseError> {
    let part = dst.part.clone();
    let src_range = src_offset..src_offset + part.len();

    let src_buf = buffer(backend, src);
    let mut dst_buf = buffer(backend, &dst.values);
    backend.copy(&src_buf, src_range.clone(), &mut dst_buf, part.clone())?;
    let mut expected = dst.values.clone();
    expected[part.clone()].copy_from_slice(&src[src_range.clone()]);
    prop_assert_eq!(bits(&contents(backend, &dst_buf)), bits(&expected));

    backend.fill(&mut dst_buf, part.clone(), value)?;
    expected[part.clone()].fill(value);
    prop_assert_eq!(bits(&contents(backend, &dst_buf)), bits(&expected));

    backend.upload(&src[src_range.clone()], &mut dst_buf, part.clone())?;
    expected[part.clone()].copy_from_slice(&src[src_range.clone()]);
    prop_assert_eq!(bits(&contents(backend, &dst_buf)), bits(&expected));

    let mut host = vec![f32::NAN; part.len()];
    backend.download(&dst_buf, part.clone(), &mut host)?;
    prop_assert_eq!(bits(&host), bits(&src[src_range]));
    Ok(())
}

/// Fails unless `result` is an error that `expected` accepts.
fn refused<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, GpuError>,
    expected: fn(&GpuError) -> bool,
) -> Result<(), TestCaseError> {
    match result {
        Err(e) if expected(&e) => Ok(()),
        other => Err(TestCaseError::fail(format!("{what}: got {other:?}"))),
    }
}

/// Ranges past the end, reversed ranges, mismatched lengths, non-finite factors and
/// malformed parts are all refused with the matching error, and change nothing.
pub(crate) fn bad_requests_change_nothing<B: Backend>(
    backend: &mut B,
    layout: &Layout,
) -> Result<(), TestCaseError> {
    let len = layout.values.len();
    let mut buf = buffer(backend, &layout.values);
    let other = buffer(backend, &layout.values);
    let mut codec = Codec::new(CodecSpec::Int8 { block: 64 }).expect("valid spec");
    let past_end = len.saturating_sub(1)..len + 1;
    #[allow(clippy::reversed_empty_ranges)] // the point of the check
    let reversed = len..len.saturating_sub(1);

    let out_of_bounds = |e: &GpuError| matches!(e, GpuError::RangeOutOfBounds { .. });
    for r in [past_end, reversed] {
        let n = r.len();
        refused(
            "scale",
            backend.scale(&mut buf, r.clone(), 2.0),
            out_of_bounds,
        )?;
        refused(
            "fill",
            backend.fill(&mut buf, r.clone(), 2.0),
            out_of_bounds,
        )?;
        refused(
            "axpy x",
            backend.axpy(1.0, &other, r.clone(), &mut buf, 0..n),
            out_of_bounds,
        )?;
        refused(
            "axpy y",
            backend.axpy(1.0, &other, 0..n, &mut buf, r.clone()),
            out_of_bounds,
        )?;
        refused(
            "copy",
            backend.copy(&other, 0..n, &mut buf, r.clone()),
            out_of_bounds,
        )?;
        let mut wire = vec![0u8; codec.max_encoded_len(n)];
        let encoded = backend.encode(&mut codec, &buf, r.clone(), &mut wire);
        refused("encode", encoded, out_of_bounds)?;
    }

    if len > 0 {
        let mismatch = |e: &GpuError| matches!(e, GpuError::LengthMismatch { .. });
        let values = &layout.values;
        refused(
            "axpy",
            backend.axpy(1.0, &other, 0..len, &mut buf, 1..len),
            mismatch,
        )?;
        let mixed = backend.axpby(1.0, &other, 1..len, 0.5, &mut buf, 0..len);
        refused("axpby", mixed, mismatch)?;
        refused(
            "copy",
            backend.copy(&other, 0..len - 1, &mut buf, 0..len),
            mismatch,
        )?;
        refused(
            "upload",
            backend.upload(&values[1..], &mut buf, 0..len),
            mismatch,
        )?;
    }

    let non_finite = |e: &GpuError| matches!(e, GpuError::NonFiniteFactor { .. });
    let bad_weight = |e: &GpuError| matches!(e, GpuError::Codec(CodecError::InvalidWeight { .. }));
    for f in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        refused("scale", backend.scale(&mut buf, 0..len, f), non_finite)?;
        refused(
            "axpy",
            backend.axpy(f, &other, 0..len, &mut buf, 0..len),
            non_finite,
        )?;
        let mixed = backend.axpby(f, &other, 0..len, 1.0, &mut buf, 0..len);
        refused("axpby alpha", mixed, non_finite)?;
        let mixed = backend.axpby(1.0, &other, 0..len, f, &mut buf, 0..len);
        refused("axpby beta", mixed, non_finite)?;
        let added = backend.decode_accumulate(&mut codec, &[], f, &mut buf, 0..0);
        refused("decode_accumulate", added, bad_weight)?;
    }

    // A part one byte short of what the range needs, as a truncated or hostile peer sends.
    let wrong_length =
        |e: &GpuError| matches!(e, GpuError::Codec(CodecError::EncodedLength { .. }));
    let good = reference_encode(CodecSpec::Int8 { block: 64 }, &layout.values);
    if let Some((_, short)) = good.split_last() {
        let added = backend.decode_accumulate(&mut codec, short, 1.0, &mut buf, 0..len);
        refused("decode_accumulate", added, wrong_length)?;
        refused(
            "decode",
            backend.decode(&mut codec, short, &mut buf, 0..len),
            wrong_length,
        )?;
    }

    prop_assert_eq!(bits(&contents(backend, &buf)), bits(&layout.values));
    Ok(())
}

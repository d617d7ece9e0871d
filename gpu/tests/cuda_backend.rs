//! The CUDA backend against the CPU reference, bit for bit: the same conformance checks
//! the CPU backend passes, then the shared adversarial vectors, corrupted parts, and parts
//! larger than the staging buffers. Every test needs a GPU, so each is ignored unless asked
//! for (see `cuda_support`). Run on a GPU host with
//! `cargo nextest run -p murmur-gpu --release --test cuda_backend --run-ignored all`.

mod conformance;
mod cuda_support;
mod vectors;

use std::cell::RefCell;
use std::fmt::Debug;

use conformance::{
    MAX_PART, any_element, any_factor, any_layout, any_spec, axpby_matches_scalar,
    axpy_matches_scalar, bad_requests_change_nothing, bits, buffer, contents,
    decode_accumulate_matches_reference, decode_matches_reference, encode_matches_reference,
    feedback_matches_reference, layout_with_source, moves_touch_only_their_range,
    scale_matches_scalar,
};
use cuda_support::backend;
use murmur_gpu::{Backend, CpuBackend, CudaBackend, GpuError};
use murmur_protocol::codec::{Codec, CodecSpec};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Runs `check` on `cases` values of `strategy` against one backend (compiling the kernels
/// once), failing with proptest's minimal case.
fn for_all<S: Strategy>(
    cases: u32,
    strategy: S,
    check: impl Fn(&mut CudaBackend, S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: Debug,
{
    let backend = RefCell::new(backend());
    let mut runner = TestRunner::new(Config::with_cases(cases));
    if let Err(e) = runner.run(&strategy, |value| check(&mut backend.borrow_mut(), value)) {
        panic!("{e}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn encode_equals_codec() {
    for_all(256, (any_spec(), any_layout(MAX_PART)), |b, (spec, src)| {
        encode_matches_reference(b, spec, &src)
    });
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn decode_accumulate_equals_codec() {
    let strategy = (any_spec(), layout_with_source(), any_factor());
    for_all(256, strategy, |b, (spec, (acc, sent, _), weight)| {
        decode_accumulate_matches_reference(b, spec, &sent, weight, &acc)
    });
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn decode_equals_codec() {
    for_all(
        128,
        (any_spec(), layout_with_source()),
        |b, (spec, (dst, sent, _))| decode_matches_reference(b, spec, &sent, &dst),
    );
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn feedback_equals_error_feedback() {
    let sends = prop::collection::vec(prop::collection::vec(any_element(), MAX_PART), 1..4);
    for_all(
        128,
        (any_spec(), any_layout(MAX_PART), sends),
        |b, (spec, layout, sends)| feedback_matches_reference(b, spec, &layout, &sends),
    );
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn mixing_equals_scalar_formulas() {
    for_all(
        128,
        (any_factor(), any_layout(MAX_PART)),
        |b, (alpha, y)| scale_matches_scalar(b, alpha, &y),
    );
    for_all(
        128,
        (any_factor(), layout_with_source()),
        |b, (alpha, (y, x, offset))| axpy_matches_scalar(b, alpha, &x, offset, &y),
    );
    let strategy = (any_factor(), any_factor(), layout_with_source());
    for_all(128, strategy, |b, (alpha, beta, (y, x, offset))| {
        axpby_matches_scalar(b, (alpha, beta), &x, offset, &y)
    });
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn moves_touch_only_the_range() {
    for_all(
        128,
        (layout_with_source(), any_element()),
        |b, ((dst, src, offset), value)| moves_touch_only_their_range(b, &src, offset, &dst, value),
    );
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn bad_requests_are_refused() {
    for_all(64, any_layout(MAX_PART), |b, layout| {
        bad_requests_change_nothing(b, &layout)
    });
}

/// Both backends' results of one operation: the same value, or the same error.
fn same<T: PartialEq + Debug>(what: &str, cpu: Result<T, GpuError>, gpu: Result<T, GpuError>) {
    assert_eq!(cpu, gpu, "{what}: CPU vs GPU");
}

/// Runs one operation on both backends from the same starting buffer and checks that the
/// results and the buffers after it are identical.
fn compare_decode(
    gpu: &mut CudaBackend,
    what: &str,
    spec: CodecSpec,
    wire: &[u8],
    start: &[f32],
    weight: Option<f32>,
) {
    let mut cpu = CpuBackend::new();
    let mut cpu_buf = start.to_vec();
    let mut gpu_buf = buffer(gpu, start);
    let range = 0..start.len();
    let mut codec = Codec::new(spec).unwrap();
    let (cpu_result, gpu_result) = match weight {
        Some(w) => (
            cpu.decode_accumulate(&mut codec, wire, w, &mut cpu_buf, range.clone()),
            gpu.decode_accumulate(&mut codec, wire, w, &mut gpu_buf, range),
        ),
        None => (
            cpu.decode(&mut codec, wire, &mut cpu_buf, range.clone()),
            gpu.decode(&mut codec, wire, &mut gpu_buf, range),
        ),
    };
    same(what, cpu_result, gpu_result);
    assert_eq!(
        bits(&cpu_buf),
        bits(&contents(gpu, &gpu_buf)),
        "{what}: buffer after"
    );
}

/// Every shared vector through every codec: encoding, decoding, decode-accumulating with
/// several weights, and three sends with error feedback give the CPU's bytes, values and
/// errors exactly.
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn shared_vectors_are_byte_identical() {
    let mut gpu = backend();
    let mut cpu = CpuBackend::new();
    for vector in vectors::all() {
        let x = &vector.values;
        let n = x.len();
        let x_gpu = buffer(&mut gpu, x);
        for spec in vectors::specs() {
            let what = format!("{} ({n} elements) with {spec}", vector.name);
            let mut codec = Codec::new(spec).unwrap();
            let len = codec.max_encoded_len(n);
            let (mut cpu_wire, mut gpu_wire) = (vec![0u8; len], vec![0u8; len]);
            let cpu_encoded = cpu.encode(&mut codec, x, 0..n, &mut cpu_wire);
            let gpu_encoded = gpu.encode(&mut codec, &x_gpu, 0..n, &mut gpu_wire);
            same(&format!("{what}: encode"), cpu_encoded.clone(), gpu_encoded);
            let Ok(written) = cpu_encoded else { continue };
            assert_eq!(
                cpu_wire[..written],
                gpu_wire[..written],
                "{what}: encoded bytes"
            );
            let wire = &cpu_wire[..written];
            compare_decode(&mut gpu, &format!("{what}: decode"), spec, wire, x, None);
            for w in [1.0, -0.5, 3.0, 0.0] {
                let label = format!("{what}: decode_accumulate w={w}");
                compare_decode(&mut gpu, &label, spec, wire, x, Some(w));
            }

            // Error feedback over three sends of the vector, reversed and scaled.
            let mut cpu_residual = vec![0.0; n];
            let mut gpu_residual = gpu.alloc(n).unwrap();
            let sends = [
                x.clone(),
                x.iter().rev().copied().collect(),
                x.iter().map(|v| v * 0.25).collect(),
            ];
            for (k, send) in sends.iter().enumerate() {
                let label = format!("{what}: feedback send {k}");
                let send_gpu = buffer(&mut gpu, send);
                let cpu_sent = cpu.encode_with_feedback(
                    &mut codec,
                    send,
                    &mut cpu_residual,
                    0..n,
                    &mut cpu_wire,
                );
                let gpu_sent = gpu.encode_with_feedback(
                    &mut codec,
                    &send_gpu,
                    &mut gpu_residual,
                    0..n,
                    &mut gpu_wire,
                );
                same(&label, cpu_sent.clone(), gpu_sent);
                if let Ok(written) = cpu_sent {
                    assert_eq!(cpu_wire[..written], gpu_wire[..written], "{label}: bytes");
                }
                let residual = contents(&mut gpu, &gpu_residual);
                assert_eq!(bits(&cpu_residual), bits(&residual), "{label}: residual");
            }
        }
    }
}

/// Parts damaged the ways a faulty or hostile peer could damage them are rejected with the
/// CPU's error and leave the accumulator untouched.
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn corrupted_parts_are_rejected_like_the_cpu() {
    let mut gpu = backend();
    let x: Vec<f32> = (0..1001)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0)
        .collect();
    let n = x.len();
    let bad_scales = [
        f32::NAN,
        f32::INFINITY,
        -1.0,
        f32::MAX,
        1e37,
        -0.0,
        f32::from_bits(1),
    ];
    for spec in vectors::specs().into_iter().filter(|s| s.block().is_some()) {
        let mut codec = Codec::new(spec).unwrap();
        let mut wire = vec![0u8; codec.max_encoded_len(n)];
        codec.encode(&x, &mut wire).unwrap();
        let blocks = n.div_ceil(spec.block().unwrap() as usize);
        for (k, scale) in bad_scales.iter().enumerate() {
            let mut damaged = wire.clone();
            let at = (k * 7 % blocks) * 4;
            damaged[at..at + 4].copy_from_slice(&scale.to_le_bytes());
            let what = format!("{spec}: scale {scale:e} in block {}", at / 4);
            compare_decode(&mut gpu, &what, spec, &damaged, &x, Some(0.5));
        }
        // Nonzero padding in the last byte (odd int4 parts, sign1 parts not a multiple
        // of 8), alone and together with a bad scale.
        let mut padded = wire.clone();
        *padded.last_mut().unwrap() |= 0x80;
        compare_decode(
            &mut gpu,
            &format!("{spec}: padding"),
            spec,
            &padded,
            &x,
            Some(1.0),
        );
        padded[0..4].copy_from_slice(&f32::NAN.to_le_bytes());
        compare_decode(
            &mut gpu,
            &format!("{spec}: padding+NaN"),
            spec,
            &padded,
            &x,
            None,
        );
    }
    for (spec, patterns) in [
        (
            CodecSpec::F32,
            vec![
                f32::NAN.to_le_bytes().to_vec(),
                f32::NEG_INFINITY.to_le_bytes().to_vec(),
            ],
        ),
        (CodecSpec::F16, vec![vec![0x00, 0x7c], vec![0x01, 0xfe]]),
        (CodecSpec::Bf16, vec![vec![0x80, 0x7f], vec![0xc1, 0xff]]),
    ] {
        let mut codec = Codec::new(spec).unwrap();
        let mut wire = vec![0u8; codec.max_encoded_len(n)];
        codec.encode(&x, &mut wire).unwrap();
        let width = wire.len() / n;
        for (k, pattern) in patterns.iter().enumerate() {
            let mut damaged = wire.clone();
            for at in [n - 1, 500 + k, 3] {
                damaged[at * width..(at + 1) * width].copy_from_slice(pattern);
            }
            let what = format!("{spec}: pattern {pattern:02x?}");
            compare_decode(&mut gpu, &what, spec, &damaged, &x, Some(2.0));
        }
    }
}

/// Parts several times larger than a staging buffer, starting at an odd offset: uploads
/// and downloads round-trip, and every device codec still gives the reference's bytes and
/// sums.
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn large_parts_cross_staging_boundaries() {
    let mut gpu = backend();
    let n = 3_000_017;
    let values: Vec<f32> = (0..n + 5)
        .map(|i| ((i as u64 * 2_654_435_761 % 1_000_003) as f32 - 500_000.0) * 1e-6)
        .collect();
    let buf = buffer(&mut gpu, &values);
    assert_eq!(bits(&contents(&mut gpu, &buf)), bits(&values), "round trip");
    let part = 5..n + 5;
    let mut cpu = CpuBackend::new();
    for spec in vectors::specs()
        .into_iter()
        .filter(|s| !matches!(s, CodecSpec::TopK { .. }))
    {
        let mut codec = Codec::new(spec).unwrap();
        let len = codec.max_encoded_len(n);
        let (mut cpu_wire, mut gpu_wire) = (vec![0u8; len], vec![0u8; len]);
        let written = cpu
            .encode(&mut codec, &values, part.clone(), &mut cpu_wire)
            .unwrap();
        assert_eq!(
            gpu.encode(&mut codec, &buf, part.clone(), &mut gpu_wire),
            Ok(written)
        );
        assert!(cpu_wire == gpu_wire, "{spec}: encoded bytes differ");
        let start = &values[part.clone()];
        compare_decode(
            &mut gpu,
            &format!("{spec}: large"),
            spec,
            &cpu_wire,
            start,
            Some(0.75),
        );
    }
}

//! Each bad input gets its own specific error, and never a changed accumulator.

use murmur_protocol::codec::{Codec, CodecError, CodecSpec};

use crate::roundtrip;

fn sample(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect()
}

#[test]
fn nan_or_inf_in_a_tensor_is_refused_by_every_encoder() {
    for spec in CodecSpec::ALL_DEFAULT {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = sample(300);
            x[133] = bad;
            let mut codec = Codec::new(spec).unwrap();
            let mut out = vec![0u8; codec.max_encoded_len(x.len())];
            assert_eq!(
                codec.encode(&x, &mut out),
                Err(CodecError::NonFiniteInput { index: 133 }),
                "{spec} with {bad}"
            );
        }
    }
}

fn assert_rejected(spec: CodecSpec, bytes: &[u8], n: usize, expected: CodecError) {
    let mut codec = Codec::new(spec).unwrap();
    let mut out = vec![0f32; n];
    assert_eq!(
        codec.decode_into(bytes, &mut out),
        Err(expected.clone()),
        "{spec}"
    );
    let mut acc = sample(n);
    let before = acc.clone();
    assert_eq!(
        codec.decode_accumulate(bytes, 0.5, &mut acc),
        Err(expected),
        "{spec}"
    );
    assert_eq!(acc, before, "{spec}: rejected part changed the accumulator");
}

#[test]
fn nan_in_a_received_tensor_is_refused() {
    let x = sample(300);
    let (mut bytes, _) = roundtrip(CodecSpec::F32, &x);
    bytes[4 * 250..4 * 251].copy_from_slice(&f32::NAN.to_le_bytes());
    assert_rejected(
        CodecSpec::F32,
        &bytes,
        300,
        CodecError::NonFiniteDecoded { index: 250 },
    );

    for (spec, pattern) in [(CodecSpec::F16, 0x7e00u16), (CodecSpec::Bf16, 0xff80)] {
        let (mut bytes, _) = roundtrip(spec, &x);
        bytes[2 * 251..2 * 252].copy_from_slice(&pattern.to_le_bytes());
        assert_rejected(
            spec,
            &bytes,
            300,
            CodecError::NonFiniteDecoded { index: 251 },
        );
    }

    // Blockwise: a NaN scale, an infinite scale, and a finite scale that would overflow.
    for spec in [
        CodecSpec::Int8 { block: 64 },
        CodecSpec::Int4 { block: 64 },
        CodecSpec::Sign1 { block: 64 },
    ] {
        for scale in [f32::NAN, f32::INFINITY, f32::MAX] {
            let (mut bytes, _) = roundtrip(spec, &x);
            bytes[8..12].copy_from_slice(&scale.to_le_bytes());
            if spec.name() == "sign1" && scale == f32::MAX {
                continue; // ±f32::MAX is a finite sign1 value.
            }
            assert_rejected(
                spec,
                &bytes,
                300,
                CodecError::NonFiniteDecoded { index: 128 },
            );
        }
    }
}

#[test]
fn wrong_length_is_refused() {
    let x = sample(300);
    for spec in CodecSpec::ALL_DEFAULT
        .into_iter()
        .filter(|s| s.name() != "topk")
    {
        let (bytes, _) = roundtrip(spec, &x);
        let expected = bytes.len();
        for got in [expected - 1, expected + 1] {
            let mut b = bytes.clone();
            b.resize(got, 0);
            let err = CodecError::EncodedLength {
                codec: spec.name(),
                elements: 300,
                expected,
                got,
            };
            assert_rejected(spec, &b, 300, err);
        }
    }
}

#[test]
fn corrupt_padding_and_negative_scales_are_refused() {
    let x = sample(301);
    let (mut bytes, _) = roundtrip(CodecSpec::Int4 { block: 64 }, &x);
    *bytes.last_mut().unwrap() |= 0x30;
    let err = CodecError::Corrupt {
        codec: "int4",
        reason: "padding nibble is not zero",
    };
    assert_rejected(CodecSpec::Int4 { block: 64 }, &bytes, 301, err);

    let (mut bytes, _) = roundtrip(CodecSpec::Sign1 { block: 64 }, &x);
    *bytes.last_mut().unwrap() |= 0x80;
    let err = CodecError::Corrupt {
        codec: "sign1",
        reason: "padding bits are not zero",
    };
    assert_rejected(CodecSpec::Sign1 { block: 64 }, &bytes, 301, err);

    let (mut bytes, _) = roundtrip(CodecSpec::Int8 { block: 64 }, &x);
    bytes[0..4].copy_from_slice(&(-1.0f32).to_le_bytes());
    let err = CodecError::Corrupt {
        codec: "int8",
        reason: "negative block scale",
    };
    assert_rejected(CodecSpec::Int8 { block: 64 }, &bytes, 301, err);
}

#[test]
fn corrupt_topk_parts_are_refused() {
    let spec = CodecSpec::TopK { keep_ppm: 100_000 };
    let x = sample(400);
    let (bytes, _) = roundtrip(spec, &x);
    // Not zstd at all.
    let mut garbage = bytes.clone();
    garbage[0] ^= 0xff;
    let mut codec = Codec::new(spec).unwrap();
    let mut acc = sample(400);
    let before = acc.clone();
    assert!(matches!(
        codec.decode_accumulate(&garbage, 1.0, &mut acc),
        Err(CodecError::Corrupt { .. })
    ));
    assert_eq!(acc, before);
    // Valid zstd holding an index past the end.
    let k = 40u32;
    let mut raw = k.to_le_bytes().to_vec();
    for j in 0..k {
        raw.extend_from_slice(&(if j == 0 { 399u32 } else { 1 }).to_le_bytes());
    }
    raw.extend(std::iter::repeat_n(0u8, 4 * k as usize));
    let evil = zstd_frame(&raw);
    let err = CodecError::Corrupt {
        codec: "topk",
        reason: "index past the end of the part",
    };
    assert_rejected(spec, &evil, 400, err);
    // Repeated index.
    let mut raw = k.to_le_bytes().to_vec();
    for _ in 0..k {
        raw.extend_from_slice(&0u32.to_le_bytes());
    }
    raw.extend(std::iter::repeat_n(0u8, 4 * k as usize));
    let err = CodecError::Corrupt {
        codec: "topk",
        reason: "indices are not strictly increasing",
    };
    assert_rejected(spec, &zstd_frame(&raw), 400, err);
}

fn zstd_frame(raw: &[u8]) -> Vec<u8> {
    // A hand-built zstd frame with one raw (uncompressed) block, so the test needs no
    // compressor: magic, frame header with single-segment flag and 2-byte content size,
    // then a last raw block.
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd, 0x60];
    f.extend_from_slice(&((raw.len() - 256) as u16).to_le_bytes());
    let header = ((raw.len() as u32) << 3) | 1;
    f.extend_from_slice(&header.to_le_bytes()[..3]);
    f.extend_from_slice(raw);
    f
}

#[test]
fn non_finite_weight_is_refused() {
    let (bytes, _) = roundtrip(CodecSpec::F32, &sample(10));
    let mut codec = Codec::new(CodecSpec::F32).unwrap();
    let mut acc = vec![0f32; 10];
    assert!(matches!(
        codec.decode_accumulate(&bytes, f32::NAN, &mut acc),
        Err(CodecError::InvalidWeight { .. })
    ));
}

/// Found by fuzzing: a scale whose product with 127 is finite, but with −128 (a byte the
/// encoder never writes, but a peer can send) is not. It must be refused, not decoded to
/// −Inf.
#[test]
fn int8_scale_that_overflows_at_minus_128_is_refused() {
    let spec = CodecSpec::Int8 { block: 32 };
    let scale = f32::from_bits(0x7c00_0000);
    assert!((scale * 127.0).is_finite() && !(scale * 128.0).is_finite());
    let mut bytes = scale.to_le_bytes().to_vec();
    bytes.extend_from_slice(&[0x29, 0x80, 0x04]);
    assert_rejected(spec, &bytes, 3, CodecError::NonFiniteDecoded { index: 0 });
}

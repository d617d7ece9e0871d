//! The vectorized kernels against plain scalar references written from the definitions.

use half::{bf16, f16};
use murmur_protocol::codec::CodecSpec;
use proptest::prelude::*;

use crate::{any_tensor, roundtrip};

fn scales_and_payload(bytes: &[u8], blocks: usize) -> (Vec<f32>, &[u8]) {
    let (s, rest) = bytes.split_at(blocks * 4);
    (
        s.chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        rest,
    )
}

fn reference_levels(block: &[f32], levels: f32) -> (f32, Vec<i32>) {
    let m = block.iter().fold(0f32, |m, x| m.max(x.abs()));
    if m < 2f32.powi(-100) {
        return (0.0, vec![0; block.len()]);
    }
    let m = m.min(2f32.powi(127));
    let inv = levels / m;
    let l = levels as i32;
    (
        m / levels,
        block
            .iter()
            .map(|x| ((x * inv).round_ties_even() as i32).clamp(-l, l))
            .collect(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn f16_matches_ieee_round_to_nearest_even(x in any_tensor(2000)) {
        let (bytes, decoded) = roundtrip(CodecSpec::F16, &x);
        for (i, v) in x.iter().enumerate() {
            let want = f16::from_f32(*v).to_bits();
            let got = u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
            prop_assert_eq!(got, want, "f16 of {}", v);
            prop_assert_eq!(decoded[i].to_bits(), f16::from_bits(want).to_f32().to_bits());
        }
    }

    #[test]
    fn bf16_matches_ieee_round_to_nearest_even(x in any_tensor(2000)) {
        let (bytes, _) = roundtrip(CodecSpec::Bf16, &x);
        for (i, v) in x.iter().enumerate() {
            let got = u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
            prop_assert_eq!(got, bf16::from_f32(*v).to_bits(), "bf16 of {}", v);
        }
    }

    #[test]
    fn int8_matches_scalar_reference(x in any_tensor(1500), b in 4u32..=64) {
        let block = b * 8;
        let (bytes, _) = roundtrip(CodecSpec::Int8 { block }, &x);
        let blocks = x.len().div_ceil(block as usize);
        let (scales, q) = scales_and_payload(&bytes, blocks);
        for (j, chunk) in x.chunks(block as usize).enumerate() {
            let (scale, levels) = reference_levels(chunk, 127.0);
            prop_assert_eq!(scales[j].to_bits(), scale.to_bits());
            for (k, l) in levels.iter().enumerate() {
                prop_assert_eq!(i32::from(q[j * block as usize + k] as i8), *l);
            }
        }
    }

    #[test]
    fn int4_matches_scalar_reference(x in any_tensor(1500), b in 4u32..=64) {
        let block = b * 8;
        let (bytes, _) = roundtrip(CodecSpec::Int4 { block }, &x);
        let blocks = x.len().div_ceil(block as usize);
        let (scales, q) = scales_and_payload(&bytes, blocks);
        for (j, chunk) in x.chunks(block as usize).enumerate() {
            let (scale, levels) = reference_levels(chunk, 7.0);
            prop_assert_eq!(scales[j].to_bits(), scale.to_bits());
            for (k, l) in levels.iter().enumerate() {
                let i = j * block as usize + k;
                let nibble = if i.is_multiple_of(2) { q[i / 2] & 0xf } else { q[i / 2] >> 4 };
                prop_assert_eq!(i32::from(((nibble << 4) as i8) >> 4), *l);
            }
        }
    }

    #[test]
    fn sign1_matches_scalar_reference(x in any_tensor(1500), b in 4u32..=64) {
        let block = b * 8;
        let (bytes, _) = roundtrip(CodecSpec::Sign1 { block }, &x);
        let blocks = x.len().div_ceil(block as usize);
        let (scales, bits) = scales_and_payload(&bytes, blocks);
        for (j, chunk) in x.chunks(block as usize).enumerate() {
            let mut lanes = [0f32; 8];
            for (k, v) in chunk.iter().enumerate() {
                lanes[k % 8] += v.abs();
            }
            let sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
                + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
            prop_assert_eq!(scales[j].to_bits(), (sum / chunk.len() as f32).to_bits());
        }
        for (i, v) in x.iter().enumerate() {
            prop_assert_eq!((bits[i / 8] >> (i % 8)) & 1 == 1, v.is_sign_negative());
        }
    }
}

/// Every one of the 63,488 finite f16 patterns decodes exactly as IEEE says, and encodes
/// back to itself.
#[test]
fn every_finite_f16_roundtrips() {
    let halves: Vec<u16> = (0..=u16::MAX).filter(|h| h & 0x7c00 != 0x7c00).collect();
    let values: Vec<f32> = halves.iter().map(|&h| f16::from_bits(h).to_f32()).collect();
    let (bytes, decoded) = roundtrip(CodecSpec::F16, &values);
    for (i, h) in halves.iter().enumerate() {
        assert_eq!(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]), *h);
        assert_eq!(decoded[i].to_bits(), values[i].to_bits());
    }
}

/// Values past a half format's range saturate to its largest finite value.
#[test]
fn half_formats_saturate() {
    let x = [1e6f32, -1e6, 65519.0, 65520.0, f32::MAX, -f32::MAX];
    let (_, f16_out) = roundtrip(CodecSpec::F16, &x);
    assert_eq!(
        f16_out,
        [65504.0, -65504.0, 65504.0, 65504.0, 65504.0, -65504.0]
    );
    let (_, bf16_out) = roundtrip(CodecSpec::Bf16, &x[4..]);
    let bf16_max = f32::from_bits(0x7f7f_0000);
    assert_eq!(bf16_out, [bf16_max, -bf16_max]);
}

/// Elements up to ±f32::MAX encode and decode to finite values within the bound: block
/// maxima are capped at 2^127 so that even the byte -128 decodes finitely.
#[test]
fn blockwise_codecs_survive_the_largest_floats() {
    let x = [
        f32::MAX,
        -f32::MAX,
        3e38,
        -1e38,
        1.0,
        0.0,
        -2f32.powi(127),
        1e30,
    ];
    for spec in [
        CodecSpec::Int8 { block: 32 },
        CodecSpec::Int4 { block: 32 },
        CodecSpec::Sign1 { block: 32 },
    ] {
        let (_, decoded) = roundtrip(spec, &x);
        let bound = murmur_protocol::codec::Codec::new(spec)
            .unwrap()
            .error_bound(&x);
        for (d, v) in decoded.iter().zip(&x) {
            assert!(d.is_finite(), "{spec}: {v} decoded to {d}");
            assert!(
                (d - v).abs() <= bound,
                "{spec}: {v} decoded to {d}, bound {bound}"
            );
        }
    }
}

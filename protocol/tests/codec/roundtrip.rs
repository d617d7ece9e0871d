use murmur_protocol::codec::{Codec, CodecSpec};
use proptest::prelude::*;

use crate::{any_spec, any_tensor, roundtrip};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every codec decodes within the bound it documents; f32 is exact to the bit.
    #[test]
    fn decodes_within_documented_bound(spec in any_spec(), x in any_tensor(1200)) {
        let (bytes, decoded) = roundtrip(spec, &x);
        let codec = Codec::new(spec).unwrap();
        prop_assert!(bytes.len() <= codec.max_encoded_len(x.len()));
        let bound = codec.error_bound(&x);
        for (i, (d, x)) in decoded.iter().zip(&x).enumerate() {
            prop_assert!(d.is_finite());
            prop_assert!((d - x).abs() <= bound, "{spec}: element {i}: {x} decoded as {d}, bound {bound}");
        }
        if spec == CodecSpec::F32 {
            prop_assert_eq!(
                decoded.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                x.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    /// The fused reducer loop adds exactly `weight × decode_into(..)`.
    #[test]
    fn decode_accumulate_is_fused_weighted_add(
        spec in any_spec(),
        x in any_tensor(700),
        weight in -8.0f32..8.0,
        start in -3.0f32..3.0,
    ) {
        let (bytes, decoded) = roundtrip(spec, &x);
        let mut codec = Codec::new(spec).unwrap();
        let mut acc: Vec<f32> = (0..x.len()).map(|i| start + i as f32 * 0.125).collect();
        let expected: Vec<u32> = acc.iter().zip(&decoded).map(|(a, d)| (a + weight * d).to_bits()).collect();
        codec.decode_accumulate(&bytes, weight, &mut acc).unwrap();
        prop_assert_eq!(acc.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), expected);
    }

    /// Encoding is a pure function of the input: the same tensor gives the same bytes, even
    /// through a codec that has encoded other tensors in between (top-k reuses scratch).
    #[test]
    fn encoding_is_deterministic(spec in any_spec(), x in any_tensor(600), other in any_tensor(600)) {
        let mut codec = Codec::new(spec).unwrap();
        let mut first = vec![0u8; codec.max_encoded_len(x.len())];
        let n1 = codec.encode(&x, &mut first).unwrap();
        let mut scratch = vec![0u8; codec.max_encoded_len(other.len())];
        codec.encode(&other, &mut scratch).unwrap();
        let mut second = vec![0u8; codec.max_encoded_len(x.len())];
        let n2 = codec.encode(&x, &mut second).unwrap();
        prop_assert_eq!(&first[..n1], &second[..n2]);
    }
}

/// The quality target: int8 at block 64 has MSE/variance at most 1e-4 on N(0,1) data.
#[test]
fn int8_block64_mse_over_variance_on_gaussian() {
    use rand::SeedableRng;
    use rand_distr::{Distribution, StandardNormal};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let x: Vec<f32> = (0..1 << 16)
        .map(|_| StandardNormal.sample(&mut rng))
        .collect();
    let (_, decoded) = roundtrip(CodecSpec::Int8 { block: 64 }, &x);
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / x.len() as f64;
    let var = x
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / x.len() as f64;
    let mse = x
        .iter()
        .zip(&decoded)
        .map(|(&a, &b)| f64::from(a - b).powi(2))
        .sum::<f64>()
        / x.len() as f64;
    assert!(mse / var <= 1e-4, "int8:64 MSE/var = {}", mse / var);
    // And the quantizer is not trivially exact: a test that cannot fail proves nothing.
    assert!(mse > 0.0);
}

/// Encoded sizes are what the module docs promise.
#[test]
fn encoded_sizes() {
    let n = 1000;
    let len = |spec| Codec::new(spec).unwrap().max_encoded_len(n);
    assert_eq!(len(CodecSpec::F32), 4000);
    assert_eq!(len(CodecSpec::F16), 2000);
    assert_eq!(len(CodecSpec::Bf16), 2000);
    assert_eq!(len(CodecSpec::Int8 { block: 64 }), 16 * 4 + 1000);
    assert_eq!(len(CodecSpec::Int4 { block: 64 }), 16 * 4 + 500);
    assert_eq!(len(CodecSpec::Sign1 { block: 256 }), 4 * 4 + 125);
    assert!(len(CodecSpec::TopK { keep_ppm: 10_000 }) < 4 + 8 * 10 + 64);
}

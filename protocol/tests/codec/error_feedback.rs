//! Error feedback keeps the decoded running sum within one quantization step of the truth.

use murmur_protocol::codec::{Codec, CodecSpec, ErrorFeedback};
use rand::SeedableRng;
use rand_distr::{Distribution, StudentT};

/// One quantization step of `spec` at each element of `x`.
fn step(spec: CodecSpec, x: &[f32]) -> Vec<f32> {
    let per_block = |block: u32, levels: f32| -> Vec<f32> {
        x.chunks(block as usize)
            .flat_map(|b| {
                let m = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                std::iter::repeat_n(m / levels, b.len())
            })
            .collect()
    };
    match spec {
        CodecSpec::F16 => x
            .iter()
            .map(|v| v.abs() * 2f32.powi(-10) + 2f32.powi(-24))
            .collect(),
        CodecSpec::Bf16 => x.iter().map(|v| v.abs() * 2f32.powi(-7)).collect(),
        CodecSpec::Int8 { block } => per_block(block, 127.0),
        CodecSpec::Int4 { block } => per_block(block, 7.0),
        other => panic!("no quantization step for {other}"),
    }
}

fn gradient_like(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let t = StudentT::new(3.0).unwrap();
    (0..n).map(|_| t.sample(&mut rng) as f32 * 1e-3).collect()
}

/// Sends `x` 100 times and returns `max_i |Σ decoded_i − 100·x_i| / step_i`, with and
/// without feedback.
fn drift_in_steps(spec: CodecSpec, x: &[f32], feedback: bool) -> f64 {
    let mut codec = Codec::new(spec).unwrap();
    let mut ef = ErrorFeedback::new(x.len());
    let mut bytes = vec![0u8; codec.max_encoded_len(x.len())];
    let mut decoded = vec![0f32; x.len()];
    let mut sum = vec![0f64; x.len()];
    for _ in 0..100 {
        let n = if feedback {
            ef.encode(&mut codec, x, &mut bytes).unwrap()
        } else {
            codec.encode(x, &mut bytes).unwrap()
        };
        codec.decode_into(&bytes[..n], &mut decoded).unwrap();
        for (s, d) in sum.iter_mut().zip(&decoded) {
            *s += f64::from(*d);
        }
    }
    let steps = step(spec, x);
    sum.iter()
        .zip(x)
        .zip(&steps)
        .map(|((s, v), st)| (s - 100.0 * f64::from(*v)).abs() / f64::from(*st))
        .fold(0.0, f64::max)
}

#[test]
fn running_sum_stays_within_one_step() {
    let x = gradient_like(4096, 1);
    for spec in [
        CodecSpec::F16,
        CodecSpec::Bf16,
        CodecSpec::Int8 { block: 64 },
        CodecSpec::Int8 { block: 1024 },
        CodecSpec::Int4 { block: 64 },
    ] {
        let with = drift_in_steps(spec, &x, true);
        assert!(
            with <= 1.0,
            "{spec}: with feedback the sum drifted {with} steps"
        );
        // Without feedback the bias of repeated rounding adds up: the test would notice if
        // feedback did nothing.
        let without = drift_in_steps(spec, &x, false);
        assert!(
            without > 10.0,
            "{spec}: without feedback drift was only {without} steps"
        );
    }
}

/// For sign1 and top-k there is no fixed step, but feedback still makes the average of the
/// decoded sends converge to `x`: the sum is off by exactly the residual, which stays
/// bounded (both are contractive compressors; Karimireddy et al. 2019), so the average's
/// error shrinks like 1/T. Without feedback it would stay at the one-send error forever.
#[test]
fn sparse_and_sign_codecs_average_converges() {
    let x = gradient_like(512, 2);
    for spec in [
        CodecSpec::Sign1 { block: 256 },
        CodecSpec::TopK { keep_ppm: 50_000 },
    ] {
        let mut codec = Codec::new(spec).unwrap();
        let mut ef = ErrorFeedback::new(x.len());
        let mut bytes = vec![0u8; codec.max_encoded_len(x.len())];
        let mut decoded = vec![0f32; x.len()];
        let mut sum = vec![0f64; x.len()];
        let mut error_of_average = Vec::new();
        for send in 1..=2000 {
            let n = ef.encode(&mut codec, &x, &mut bytes).unwrap();
            codec.decode_into(&bytes[..n], &mut decoded).unwrap();
            for (s, d) in sum.iter_mut().zip(&decoded) {
                *s += f64::from(*d);
            }
            let drift = sum
                .iter()
                .zip(&x)
                .map(|(s, v)| (s - send as f64 * f64::from(*v)).abs())
                .fold(0.0, f64::max);
            error_of_average.push(drift / send as f64);
            if send == 2000 {
                // The drift is the residual, up to f32 rounding of the running values.
                let residual = ef.residual().iter().fold(0f32, |m, v| m.max(v.abs()));
                assert!(
                    (drift - f64::from(residual)).abs() <= 1e-3 * drift.max(1e-6),
                    "{spec}"
                );
            }
        }
        let (first, at_100, at_2000) = (
            error_of_average[0],
            error_of_average[99],
            error_of_average[1999],
        );
        assert!(
            at_2000 <= 0.25 * at_100,
            "{spec}: {first} -> {at_100} -> {at_2000}"
        );
        assert!(
            at_2000 <= 0.1 * first,
            "{spec}: {first} -> {at_100} -> {at_2000}"
        );
    }
}

#[test]
fn feedback_rejects_wrong_length_and_keeps_residual() {
    let mut codec = Codec::new(CodecSpec::Int8 { block: 64 }).unwrap();
    let mut ef = ErrorFeedback::new(100);
    let mut bytes = vec![0u8; codec.max_encoded_len(100)];
    let x = gradient_like(100, 3);
    ef.encode(&mut codec, &x, &mut bytes).unwrap();
    let before = ef.residual().to_vec();
    assert!(ef.encode(&mut codec, &x[..50], &mut bytes).is_err());
    let mut bad = x.clone();
    bad[7] = f32::NAN;
    assert!(ef.encode(&mut codec, &bad, &mut bytes).is_err());
    assert_eq!(ef.residual(), &before[..]);
}

//! Butterfly all-reduce without faults: every member ends with the weighted mean.

mod butterfly_support;

use std::time::Duration;

use butterfly_support::{MemberSpec, optimal_group, run_round, vectors, weighted_mean};
use murmur_gossip::butterfly::{ButterflyConfig, PartOutcome};
use murmur_protocol::codec::{Codec, CodecSpec};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

fn members(seed: u64, count: usize, len: usize) -> Vec<MemberSpec> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x5eed);
    vectors(seed, count, len)
        .into_iter()
        .enumerate()
        .map(|(i, local)| MemberSpec {
            bandwidth: rng.random_range(1e6..8e6),
            // Every fifth member is behind NAT and reduces nothing.
            accepts_connections: i % 5 != 4,
            weight: rng.random_range(1..=100) as f32,
            local,
            fault: None,
        })
        .collect()
}

fn config() -> ButterflyConfig {
    ButterflyConfig {
        chunk_elements: 128,
        chunks_in_flight: 4,
        chunk_timeout_ms: 200,
        reducer_timeout_ms: 300,
        // Arbitrary weights, each counted as declared: the exact weighted mean is checked.
        max_weight_ratio: 0.0,
        ..ButterflyConfig::default()
    }
}

/// With the exact f32 codec, every member's every element equals the weighted mean of all
/// contributions within 1e-6 relative to the mean of their magnitudes (f32 summation), the
/// report says every chunk averages all members with their total weight, and members that
/// accept no connections reduce nothing.
#[test]
fn every_member_gets_the_weighted_mean_with_f32() {
    for (seed, count, len) in [(1, 16, 4096), (2, 5, 3000), (3, 2, 1000), (4, 9, 777)] {
        let specs = members(seed, count, len);
        let group = optimal_group(&specs, len, 128);
        for (j, spec) in specs.iter().enumerate() {
            if !spec.accepts_connections {
                assert!(
                    group.partition().range(j).is_empty(),
                    "member {j} behind NAT got a part"
                );
            }
        }
        let outcome = run_round(
            &specs,
            group,
            CodecSpec::F32,
            &config(),
            Duration::from_millis(2),
        );
        let everyone: Vec<usize> = (0..count).collect();
        let total_weight: f32 = specs.iter().map(|s| s.weight).sum();
        for (m, result) in outcome.results.iter().enumerate() {
            let (values, report) = result.as_ref().expect("every member finishes");
            for (e, value) in values.iter().enumerate() {
                let (mean, scale) = weighted_mean(&specs, &everyone, e);
                assert!(
                    (f64::from(*value) - mean).abs() <= 1e-6 * scale.max(1e-30),
                    "seed {seed}: member {m} element {e}: {value} vs {mean}"
                );
            }
            assert!(report.fallback_reducers().is_empty());
            assert!(report.dropped_senders.is_empty());
            for range in report.ranges() {
                assert_eq!(range.contributors as usize, count, "seed {seed}: {range:?}");
                assert!((range.total_weight - total_weight).abs() <= 1e-3 * total_weight);
            }
            assert!(
                report
                    .parts
                    .iter()
                    .all(|p| p.outcome != PartOutcome::LocalFallback)
            );
            assert_eq!(report.fraction_covered_by(count as u32), 1.0);
        }
    }
}

/// With a lossy codec the error per element stays within what the codec may lose twice:
/// on the way to the reducer (the weighted mean of each sender's bound) and on the way
/// back (the bound on the averaged chunk).
#[test]
fn a_lossy_codec_stays_within_its_error_bound() {
    let (count, len, chunk) = (8, 4096, 128);
    let specs = members(11, count, len);
    let codec_spec = CodecSpec::Int8 { block: 64 };
    let group = optimal_group(&specs, len, chunk);
    let outcome = run_round(
        &specs,
        group,
        codec_spec,
        &config(),
        Duration::from_millis(2),
    );
    let codec = Codec::new(codec_spec).expect("valid codec");
    let everyone: Vec<usize> = (0..count).collect();
    let total: f64 = specs.iter().map(|s| f64::from(s.weight)).sum();
    let mut worst = 0.0f64;
    for (values, _) in outcome
        .results
        .iter()
        .map(|r| r.as_ref().expect("finishes"))
    {
        for start in (0..len).step_by(chunk) {
            let range = start..(start + chunk).min(len);
            let inbound: f64 = specs
                .iter()
                .map(|s| {
                    f64::from(s.weight) * f64::from(codec.error_bound(&s.local[range.clone()]))
                })
                .sum::<f64>()
                / total;
            let means: Vec<f32> = range
                .clone()
                .map(|e| weighted_mean(&specs, &everyone, e).0 as f32)
                .collect();
            // The reducer encodes its average, which lies within `inbound` of the true mean.
            let outbound = f64::from(codec.error_bound(&means)) + inbound / 127.0 + 1e-6;
            for (e, mean) in range.clone().zip(&means) {
                let error = (f64::from(values[e]) - f64::from(*mean)).abs();
                worst = worst.max(error / (inbound + outbound));
                assert!(
                    error <= inbound + outbound,
                    "element {e}: error {error} beyond {}",
                    inbound + outbound
                );
            }
        }
    }
    assert!(worst > 0.0, "int8 should lose something");
}

/// With a lossy codec every member ends with the same bits: a reducer applies the decoded
/// average of its own part, as every other member does, rather than its exact average.
/// Replicas that average gradients stay identical only if their updates are; a reducer
/// keeping its exact values would drift from the others by the codec's error every round,
/// and nothing in gradient averaging would ever pull it back.
#[test]
fn a_lossy_codec_leaves_every_member_with_identical_results() {
    for (seed, count, len) in [(21, 8, 4096), (22, 3, 1000)] {
        let specs = members(seed, count, len);
        let group = optimal_group(&specs, len, 128);
        let outcome = run_round(
            &specs,
            group,
            CodecSpec::Int8 { block: 64 },
            &config(),
            Duration::from_millis(2),
        );
        let results: Vec<&Vec<f32>> = outcome
            .results
            .iter()
            .map(|r| &r.as_ref().expect("every member finishes").0)
            .collect();
        for (m, values) in results.iter().enumerate().skip(1) {
            let differ = values
                .iter()
                .zip(results[0].iter())
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                differ, 0,
                "seed {seed}: member {m} differs from member 0 in {differ} elements"
            );
        }
    }
}

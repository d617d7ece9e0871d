//! Parts sized by bandwidth: the round takes as long as the cost model's optimum says, and
//! beats equal parts.

mod butterfly_support;

use std::time::Duration;

use butterfly_support::{FRAME_OVERHEAD, MemberSpec, optimal_group, run_round, vectors};
use murmur_gossip::butterfly::{
    ButterflyConfig, Group, MemberLink, Partition, optimal_fractions, round_time,
};
use murmur_protocol::codec::CodecSpec;

const LEN: usize = 65_536;
const CHUNK: usize = 128;
const MB: f64 = 1e6;

fn config() -> ButterflyConfig {
    ButterflyConfig {
        chunk_elements: CHUNK as u32,
        chunks_in_flight: 2,
        chunk_timeout_ms: 2_000,
        reducer_timeout_ms: 3_000,
        ..ButterflyConfig::default()
    }
}

fn members(bandwidths: &[f64]) -> Vec<MemberSpec> {
    vectors(5, bandwidths.len(), LEN)
        .into_iter()
        .zip(bandwidths)
        .map(|(local, &bandwidth)| MemberSpec {
            bandwidth,
            accepts_connections: true,
            weight: 1.0,
            local,
            fault: None,
        })
        .collect()
}

fn measured(specs: &[MemberSpec], group: Group<u32>) -> f64 {
    let outcome = run_round(
        specs,
        group,
        CodecSpec::F32,
        &config(),
        Duration::from_micros(100),
    );
    assert!(
        outcome.results.iter().all(Option::is_some),
        "every member finishes"
    );
    outcome.round_time.as_secs_f64()
}

/// Members at 1, 2, 4 and 8 MB/s (once, and four times each): the measured round time is
/// within 5% of the optimum of `max_i S(1 + (N − 2) f_i) / B_i`, and equal parts are at
/// least 1.5× slower where the cost model says they are (with `N = 4` the model's ratio is
/// exactly 1.5, so there the measured ratio must be within 5% of it).
#[test]
fn bandwidth_sized_parts_reach_the_optimum_and_beat_equal_parts() {
    for repeat in [1usize, 4] {
        let bandwidths: Vec<f64> = [1.0, 2.0, 4.0, 8.0]
            .iter()
            .flat_map(|&b| std::iter::repeat_n(b * MB, repeat))
            .collect();
        let n = bandwidths.len();
        let specs = members(&bandwidths);
        let links: Vec<MemberLink> = bandwidths
            .iter()
            .map(|&bandwidth| MemberLink {
                bandwidth,
                accepts_connections: true,
            })
            .collect();
        // S is what the links carry: payload plus each chunk's framing.
        let bytes = (LEN * 4 + LEN.div_ceil(CHUNK) * FRAME_OVERHEAD) as f64;
        let optimum = round_time(bytes, &links, &optimal_fractions(&links).expect("reducers"));
        let equal_model = round_time(bytes, &links, &vec![1.0 / n as f64; n]);

        let sized = measured(&specs, optimal_group(&specs, LEN, CHUNK));
        let equal_group = Group::new(
            1,
            7,
            (0..n as u32).collect(),
            Partition::equal(LEN, n, CHUNK).expect("valid"),
        )
        .expect("valid group");
        let equal = measured(&specs, equal_group);
        eprintln!(
            "N = {n}: optimum {:.2} ms, measured {:.2} ms ({:+.1}%), equal parts {:.2} ms \
             (model {:.2} ms), speed-up {:.2}× (model {:.2}×)",
            optimum * 1e3,
            sized * 1e3,
            (sized / optimum - 1.0) * 100.0,
            equal * 1e3,
            equal_model * 1e3,
            equal / sized,
            equal_model / optimum
        );
        assert!(
            (sized - optimum).abs() <= 0.05 * optimum,
            "N = {n}: {sized} s is not within 5% of the optimum {optimum} s"
        );
        let model_ratio = equal_model / optimum;
        assert!(
            equal / sized >= (1.5f64).min(0.95 * model_ratio),
            "N = {n}: equal parts took {equal} s, sized parts {sized} s"
        );
        if model_ratio > 1.6 {
            assert!(equal / sized >= 1.5, "N = {n}: speed-up {}", equal / sized);
        }
    }
}

//! Byzantine senders: CenteredClip at the reducers keeps three sign-flipped ×1000
//! contributions out of sixteen from dragging the average.

mod butterfly_support;

use std::time::Duration;

use butterfly_support::{MemberSpec, optimal_group, run_round, vectors};
use murmur_gossip::butterfly::{ButterflyConfig, ClipConfig};
use murmur_protocol::codec::CodecSpec;

const MEMBERS: usize = 16;
const BYZANTINE: [usize; 3] = [2, 7, 11];
const LEN: usize = 2048;
const CHUNK: usize = 128;

fn config(clip: Option<ClipConfig>) -> ButterflyConfig {
    ButterflyConfig {
        chunk_elements: CHUNK as u32,
        chunk_timeout_ms: 500,
        reducer_timeout_ms: 750,
        clip,
        min_group: 3,
        ..ButterflyConfig::default()
    }
}

struct Measured {
    distance: f64,
    spread: f64,
}

/// Runs a round in which the members in `BYZANTINE` (if `attack`) send their vector
/// sign-flipped and scaled by 1000, and measures the honest members' worst distance from
/// the honest mean against the honest spread.
fn run(seed: u64, clip: Option<ClipConfig>, attack: bool) -> Measured {
    let honest_vectors = vectors(seed, MEMBERS, LEN);
    let specs: Vec<MemberSpec> = honest_vectors
        .iter()
        .enumerate()
        .map(|(i, v)| MemberSpec {
            bandwidth: 4e6,
            accepts_connections: true,
            weight: 1.0,
            local: if attack && BYZANTINE.contains(&i) {
                v.iter().map(|x| -1000.0 * x).collect()
            } else {
                v.clone()
            },
            fault: None,
        })
        .collect();
    let honest: Vec<usize> = (0..MEMBERS)
        .filter(|i| !attack || !BYZANTINE.contains(i))
        .collect();
    let mean: Vec<f64> = (0..LEN)
        .map(|e| {
            honest
                .iter()
                .map(|&h| f64::from(honest_vectors[h][e]))
                .sum::<f64>()
                / honest.len() as f64
        })
        .collect();
    let distance = |v: &[f32]| {
        v.iter()
            .zip(&mean)
            .map(|(x, m)| (f64::from(*x) - m).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let spread = (honest
        .iter()
        .map(|&h| distance(&honest_vectors[h]).powi(2))
        .sum::<f64>()
        / honest.len() as f64)
        .sqrt();
    let group = optimal_group(&specs, LEN, CHUNK);
    let outcome = run_round(
        &specs,
        group,
        CodecSpec::F32,
        &config(clip),
        Duration::from_millis(1),
    );
    let worst = honest
        .iter()
        .map(|&h| distance(&outcome.results[h].as_ref().expect("finishes").0))
        .fold(0.0, f64::max);
    Measured {
        distance: worst,
        spread,
    }
}

const CLIP: ClipConfig = ClipConfig {
    tau: 0.1,
    iterations: 20,
    reject_factor: ClipConfig::DEFAULT_REJECT_FACTOR,
};

/// Clipping alone, without setting far contributions aside.
const CLIP_ONLY: ClipConfig = ClipConfig {
    reject_factor: 0.0,
    ..CLIP
};

/// With CenteredClip at every reducer, three sign-flipped ×1000 senders out of sixteen
/// move the honest members' result at most a tenth of the honest spread (the RMS distance
/// of honest vectors from their mean) from the honest mean.
#[test]
fn centered_clip_holds_three_byzantine_senders_of_sixteen_near_the_honest_mean() {
    for seed in 1..=3 {
        let clipped = run(seed, Some(CLIP), true);
        let ratio = clipped.distance / clipped.spread;
        eprintln!(
            "seed {seed}: clipped result is {ratio:.4} of the honest spread from the honest mean"
        );
        assert!(ratio <= 0.10, "seed {seed}: {ratio}");
    }
}

/// Clipping alone is held at its fixed point: each far contribution pulls with force τ
/// and each honest one, at distance ≈ σ, with force τ·δ/σ, so `b` Byzantine among `n`
/// hold the result at `δ ≈ b·σ / √((n − b)² − b²)` = `3σ/√160 ≈ 0.237σ` here, whatever τ
/// and however many iterations. That is why far contributions are set aside after
/// clipping; this test pins the bound without that step.
#[test]
fn clipping_alone_is_held_at_its_fixed_point() {
    let clipped = run(1, Some(CLIP_ONLY), true);
    let ratio = clipped.distance / clipped.spread;
    eprintln!("clipping alone: {ratio:.3} of the honest spread from the honest mean");
    assert!((0.15..=0.25).contains(&ratio), "{ratio}");
}

/// The same attack without clipping drags the average hundreds of spreads away: the
/// damage clipping prevents.
#[test]
fn without_clipping_byzantine_senders_drag_the_average_away() {
    let plain = run(1, None, true);
    let ratio = plain.distance / plain.spread;
    eprintln!("plain mean is {ratio:.1} honest spreads from the honest mean");
    assert!(ratio >= 100.0, "{ratio}");
}

/// Without Byzantine senders, clipping costs little: the result stays within 5% of the
/// spread from the plain mean.
#[test]
fn clipping_honest_contributions_stays_near_their_mean() {
    let clipped = run(4, Some(CLIP), false);
    let ratio = clipped.distance / clipped.spread;
    eprintln!("clipped honest result is {ratio:.3} of the spread from the mean");
    assert!(ratio <= 0.05, "{ratio}");
}

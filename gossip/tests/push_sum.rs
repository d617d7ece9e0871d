//! Push-sum exactness and mass conservation of SGP, in the simulator.
//!
//! Errors are relative to the initial disagreement `D₀` (see `RoundRecord`): the test
//! vectors are centred on zero with unit spread, and an error of 1e-6 means the peers are a
//! million times closer to the true average than they started.

use murmur_gossip::sgp::{OutDegree, SgpConfig};
use murmur_gossip::sim::{AlgorithmSpec, RandomChurn, Scenario, SgpSwarm};

/// `max_i ‖z_i − x̄(0)‖₂ / D₀` over the live peers: distance from the exact average of the
/// founders' initial vectors.
fn error_against_initial_average(swarm: &SgpSwarm) -> f64 {
    let average = swarm.initial_average();
    let mut z = vec![0.0f32; average.len()];
    let mut worst: f64 = 0.0;
    for peer in swarm.live_peers() {
        peer.debiased_into(&mut z).expect("founders hold mass");
        let squared: f64 = z
            .iter()
            .zip(average)
            .map(|(&z, &mean)| (f64::from(z) - mean).powi(2))
            .sum();
        worst = worst.max(squared.sqrt());
    }
    worst / swarm.initial_spread()
}

fn lockstep_scenario(peers: usize, seed: u64) -> Scenario {
    let mut scenario = Scenario::new(peers, 16, peers.ilog2() as u64);
    scenario.seed = seed;
    scenario
}

/// With `N` a power of two, peers in lock-step and a lossless network, the exponential
/// graph is a hypercube: `log₂ N` steps average exactly, up to `f32` rounding.
#[test]
fn exponential_schedule_averages_exactly_in_log2_n_rounds() {
    for exponent in 3..=10 {
        let peers = 1usize << exponent;
        let scenario = lockstep_scenario(peers, exponent);
        let config = SgpConfig::default();
        let mut swarm = SgpSwarm::new(&scenario, &config).expect("valid scenario");

        // One round short, each peer has averaged only half the swarm: far from exact.
        swarm.run_until(swarm.round_end(exponent - 1)).expect("run");
        let early = error_against_initial_average(&swarm);
        assert!(
            early > 1e-2,
            "N={peers}: error {early:e} after log2 N − 1 rounds"
        );

        swarm.run_until(swarm.round_end(exponent)).expect("run");
        let error = error_against_initial_average(&swarm);
        assert!(
            error <= 1e-6,
            "N={peers}: error {error:e} after log2 N rounds"
        );
        for peer in swarm.live_peers() {
            assert_eq!(
                peer.state().weight(),
                1.0,
                "N={peers}: weights stay exactly 1"
            );
        }
    }
}

/// The same holds with more than one out-peer per step, and with τ = 0.
#[test]
fn exactness_does_not_depend_on_overlap() {
    let scenario = lockstep_scenario(64, 3);
    let config = SgpConfig {
        staleness: 0,
        ..SgpConfig::default()
    };
    let mut swarm = SgpSwarm::new(&scenario, &config).expect("valid scenario");
    swarm.run_until(swarm.round_end(6)).expect("run");
    assert!(error_against_initial_average(&swarm) <= 1e-6);
}

#[test]
fn two_out_peers_converge_too() {
    let scenario = lockstep_scenario(64, 4);
    let config = SgpConfig {
        out_degree: OutDegree::Fixed(2),
        ..SgpConfig::default()
    };
    let mut swarm = SgpSwarm::new(&scenario, &config).expect("valid scenario");
    swarm.run_until(swarm.round_end(30)).expect("run");
    let error = error_against_initial_average(&swarm);
    assert!(error <= 1e-5, "error {error:e}");
}

/// Joins bring no mass and graceful leaves hand all of it on, so over 10,000 rounds of
/// churn on a jittery, lossy network the total weight (held plus in flight) never moves by
/// more than 1e-9 of itself, and the swarm still agrees on the founders' average.
#[test]
fn total_weight_is_conserved_through_graceful_churn() {
    let peers = 16;
    let rounds = 10_000;
    let mut scenario = Scenario::new(peers, 2, rounds);
    scenario.seed = 11;
    scenario.record_every = 100;
    scenario.compute.jitter = 0.5;
    scenario.link.latency_ms = 3.0;
    scenario.link.loss = 0.05;
    // The swarm hears of a change late, so shares go to departed peers and come back.
    scenario.link.detect_ms = 250.0;
    scenario.random_churn = Some(RandomChurn {
        from_ms: 1_000.0,
        to_ms: 900_000.0,
        joins: 12,
        leaves: 12,
        crashes: 0,
        restarts: 0,
    });
    scenario.algorithm = AlgorithmSpec::Sgp(SgpConfig::default());
    let report = murmur_gossip::sim::run(&scenario).expect("valid scenario");

    assert_eq!(report.rounds.len() as u64, rounds / 100 + 1);
    assert_eq!(report.summary.crashed_weight, 0.0);
    assert_eq!(report.summary.peers_end, peers);
    for record in &report.rounds {
        let drift = (record.total_weight - peers as f64).abs() / peers as f64;
        assert!(
            drift <= 1e-9,
            "round {}: weight drift {drift:e}",
            record.round
        );
        assert!(record.min_weight > 0.0, "round {}", record.round);
    }
    // Mass moved exactly, so the survivors agree on the founders' average.
    let last = report.rounds.last().expect("records");
    assert!(last.average_error <= 1e-5, "{last:?}");
}

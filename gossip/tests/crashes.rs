//! SGP survives crashes: weights stay positive and the survivors agree again quickly.

use murmur_gossip::sgp::SgpConfig;
use murmur_gossip::sim::{ChurnEvent, RandomChurn, Scenario, SgpSwarm};

/// 10% of the peers crash at random times during the first `2·log₂ N` rounds. At every
/// round every survivor's weight stays positive, and within `4·log₂ N` rounds of the last
/// crash the survivors' consensus error (distance from the average of the mass they hold,
/// relative to the initial disagreement) is below 1e-4.
#[test]
fn survivors_agree_within_4_log2_n_rounds_of_the_last_crash() {
    for (exponent, seed) in [(4u64, 1u64), (6, 2), (8, 3), (10, 4)] {
        let peers = 1usize << exponent;
        let step_ms = 100.0;
        let window_rounds = 2 * exponent;
        let settle_rounds = 4 * exponent;
        let mut scenario = Scenario::new(peers, 8, window_rounds + settle_rounds + 1);
        scenario.seed = seed;
        scenario.compute.step_ms = step_ms;
        scenario.compute.jitter = 0.1;
        scenario.link.latency_ms = 2.0;
        scenario.link.detect_ms = 30.0;
        scenario.random_churn = Some(RandomChurn {
            from_ms: step_ms,
            to_ms: window_rounds as f64 * step_ms,
            joins: 0,
            leaves: 0,
            crashes: (peers / 10).max(1),
            restarts: 0,
        });
        let mut swarm = SgpSwarm::new(&scenario, &SgpConfig::default()).expect("valid scenario");
        let last_crash_ms = swarm
            .churn()
            .iter()
            .filter(|event| matches!(event, ChurnEvent::Crash { .. }))
            .map(ChurnEvent::at_ms)
            .fold(0.0, f64::max);
        let deadline = (last_crash_ms / step_ms).ceil() as u64 + settle_rounds;

        for round in 1..=deadline {
            swarm.run_until(swarm.round_end(round)).expect("run");
            let record = swarm.measure(round);
            assert!(
                record.min_weight > 0.0,
                "N={peers} round {round}: a survivor's weight reached {}",
                record.min_weight
            );
        }
        let record = swarm.measure(deadline);
        assert_eq!(record.live_peers, peers - (peers / 10).max(1), "N={peers}");
        assert!(
            swarm.crashed_weight() > 0.0,
            "N={peers}: the crashes took mass"
        );
        assert!(
            record.consensus_error < 1e-4,
            "N={peers}: consensus error {:e} at round {deadline}, {settle_rounds} rounds after the last crash",
            record.consensus_error
        );
    }
}

/// A churn soak: 8 peers through 900 crashes, each crashed peer replaced by a joiner half a
/// second later, every 2 s for 30 virtual minutes. Every crash loses mass, so the swarm's
/// total weight shrinks geometrically; without renormalization the numerators underflow
/// `f32` and the peers' parameters collapse (consensus error 3.6e7 at the end of this run).
/// With it they still agree, on a mean of the founding values.
#[test]
fn peers_still_agree_after_900_crashes_take_the_mass_below_f32() {
    let step_ms = 100.0;
    let cycles = 900;
    let mut scenario = Scenario::new(8, 16, 20_000);
    scenario.seed = 5;
    scenario.compute.step_ms = step_ms;
    scenario.compute.jitter = 0.2;
    scenario.link.latency_ms = 3.0;
    scenario.link.detect_ms = 300.0;
    let mut live: Vec<u32> = (0..8).collect();
    // Joiners take the next unused index: 8, 9, ...
    for (k, next) in (0..cycles).zip(8u32..) {
        let at_ms = 1000.0 + 2000.0 * k as f64;
        // Peer 0 never crashes; the others take turns.
        let victim = live.remove(1 + k % (live.len() - 1));
        scenario.churn.push(ChurnEvent::Crash {
            at_ms,
            peer: victim,
        });
        scenario.churn.push(ChurnEvent::Join {
            at_ms: at_ms + 500.0,
        });
        live.push(next);
    }
    let mut swarm = SgpSwarm::new(&scenario, &SgpConfig::default()).expect("valid scenario");
    let last = scenario.rounds;
    swarm.run_until(swarm.round_end(last)).expect("run");
    // The mass lost in crashes is more than the swarm ever held: weights were scaled up.
    assert!(swarm.crashed_weight() > 8.0, "{}", swarm.crashed_weight());
    let record = swarm.measure(last);
    assert_eq!(record.live_peers, 8);
    assert!(record.min_weight > 0.0, "{record:?}");
    assert!(record.consensus_error < 1e-4, "{record:?}");
    assert!(record.average_error < 1e-2, "{record:?}");
}

//! A straggler costs SGP its own contribution only; it stalls a synchronous ring.

use murmur_gossip::sim::{self, AlgorithmSpec, Collective, Scenario, Straggler};

const PEERS: usize = 16;

fn training(algorithm: AlgorithmSpec, straggler: bool) -> f64 {
    let mut scenario = Scenario::new(PEERS, 1024, 200);
    scenario.seed = 7;
    scenario.algorithm = algorithm;
    scenario.compute.step_ms = 100.0;
    scenario.compute.jitter = 0.05;
    scenario.compute.samples_per_step = 64;
    // A LAN: the ring's all-reduce is short next to a step, as in a data centre.
    scenario.link.latency_ms = 0.2;
    scenario.link.uplink_mbps = Some(10_000.0);
    scenario.link.downlink_mbps = Some(10_000.0);
    if straggler {
        scenario.compute.stragglers = vec![Straggler {
            peer: 5,
            slowdown: 4.0,
        }];
    }
    sim::run(&scenario)
        .expect("valid scenario")
        .summary
        .samples_per_sec
}

/// With one peer 4× slower, the best any algorithm can keep is `((N − 1) + ¼) / N` of the
/// samples/s: the straggler's own lost work. SGP keeps at least 90% of that; a synchronous
/// ring waits for the straggler every step and keeps at most 30% of the total.
#[test]
fn sgp_keeps_its_throughput_with_a_straggler_and_sync_ring_does_not() {
    let ideal = ((PEERS as f64 - 1.0) + 0.25) / PEERS as f64;

    let sgp = AlgorithmSpec::default();
    let kept = training(sgp.clone(), true) / training(sgp, false);
    assert!(kept >= 0.9 * ideal, "sgp kept {kept:.3} of its samples/s");
    assert!(kept <= 1.0, "a straggler cannot speed SGP up: {kept}");

    let ring = AlgorithmSpec::SyncAllReduce {
        collective: Collective::Ring,
    };
    let kept = training(ring.clone(), true) / training(ring, false);
    assert!(kept <= 0.3, "sync ring kept {kept:.3} of its samples/s");
}

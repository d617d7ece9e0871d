//! Simulated runs depend on their seed and nothing else.

use murmur_gossip::sim::{self, RandomChurn, Scenario};

fn scenario(seed: u64) -> Scenario {
    let mut scenario = Scenario::new(48, 32, 40);
    scenario.seed = seed;
    scenario.compute.jitter = 0.3;
    scenario.link.latency_ms = 4.0;
    scenario.link.loss = 0.1;
    scenario.link.uplink_mbps = Some(50.0);
    scenario.link.detect_ms = 50.0;
    scenario.random_churn = Some(RandomChurn {
        from_ms: 200.0,
        to_ms: 3_000.0,
        joins: 3,
        leaves: 3,
        crashes: 3,
        restarts: 3,
    });
    scenario
}

#[test]
fn the_same_seed_gives_the_same_run_and_another_seed_another() {
    let first = sim::run(&scenario(21)).expect("valid scenario");
    let again = sim::run(&scenario(21)).expect("valid scenario");
    assert_eq!(first, again);
    let other = sim::run(&scenario(22)).expect("valid scenario");
    assert_ne!(first.rounds, other.rounds);
}

//! Synchronous ring training in the simulator: every step waits for every peer, every
//! peer applies the same update, and a crash stalls the ring until its deadline.

mod sim_support;

use std::collections::BTreeMap;

use murmur_gossip::sim::Straggler;
use murmur_gossip::sim::{self, AlgorithmSpec, ChurnEvent, RingSwarm, RingTraining, Scenario};

const PEERS: usize = 8;
const TIMEOUT_MS: u64 = 2_000;

fn training() -> RingTraining {
    RingTraining {
        round_timeout_ms: TIMEOUT_MS,
        ..RingTraining::default()
    }
}

fn scenario(seed: u64, rounds: u64) -> Scenario {
    let algorithm = AlgorithmSpec::SyncRing(training());
    let mut scenario =
        sim_support::quadratic(PEERS, 256, rounds, seed, algorithm, sim_support::TABLE_LINK);
    scenario.compute.jitter = 0.05;
    scenario
}

/// Peers at the same step hold the same parameters, bit for bit.
fn assert_same_update(swarm: &RingSwarm, peers: u32) {
    let mut by_step: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for id in 0..peers {
        if let Some(step) = swarm.step(id) {
            by_step.entry(step).or_default().push(id);
        }
    }
    for (step, ids) in &by_step {
        let first = swarm.parameters(ids[0]).expect("live peer");
        for &id in &ids[1..] {
            assert_eq!(
                swarm.parameters(id).expect("live peer"),
                first,
                "step {step}"
            );
        }
    }
}

/// With one peer 4× slower every step lasts as long as the straggler's, for everyone.
#[test]
fn every_step_waits_for_the_slowest_peer_and_all_apply_the_same_update() {
    let mut scenario = scenario(1, 50);
    scenario.compute.stragglers = vec![Straggler {
        peer: 2,
        slowdown: 4.0,
    }];
    let mut swarm = RingSwarm::new(&scenario, &training()).expect("valid scenario");
    for round in (5..=50).step_by(5) {
        swarm.run_until(swarm.round_end(round)).expect("run");
        assert_same_update(&swarm, PEERS as u32);
    }
    let summary = swarm.report().summary;
    // 5 s of steps of about 400 ms: at most 13 steps each, all peers in lock-step.
    let steps = summary.samples_per_sec * summary.virtual_secs / 32.0;
    assert!(steps <= 13.0 * PEERS as f64, "{steps} steps");
    assert!(steps >= 11.0 * PEERS as f64, "{steps} steps");
    let averaging = summary.averaging.expect("the ring reports its rounds");
    assert_eq!(averaging.rounds_local, 0);
    assert_eq!(averaging.mean_group_size, PEERS as f64);
}

/// A crash stalls every member until the shared deadline; then they keep their local
/// updates once, and the ring goes on without the dead peer. A joiner enters at a step
/// boundary without failing a step.
#[test]
fn a_crash_stalls_the_ring_until_its_deadline_and_a_join_costs_no_step() {
    let mut scenario = scenario(2, 100);
    scenario.churn = vec![
        ChurnEvent::Crash {
            at_ms: 3_050.0,
            peer: 5,
        },
        ChurnEvent::Join { at_ms: 6_020.0 },
    ];
    let report = sim::run(&scenario).expect("valid scenario");
    // The longest stretch without a finished step.
    let mut longest = 0.0f64;
    let mut last_progress = 0.0;
    for pair in report.rounds.windows(2) {
        if pair[1].steps > pair[0].steps {
            longest = longest.max(pair[1].time_s - last_progress);
            last_progress = pair[1].time_s;
        }
    }
    let timeout = TIMEOUT_MS as f64 * 1e-3;
    assert!(
        longest >= timeout - 0.2 && longest <= timeout + 0.4,
        "the ring stalled for {longest} s"
    );
    let averaging = report.summary.averaging.expect("rounds");
    assert_eq!(
        averaging.rounds_local,
        PEERS as u64 - 1,
        "one failed step for each survivor"
    );
    assert_eq!(report.summary.peers_end, PEERS);
    let last = report.rounds.last().expect("records");
    assert_eq!(
        last.consensus_error, 0.0,
        "everyone applies the same update"
    );
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let mut scenario = scenario(3, 40);
    scenario.random_churn = Some(sim_support::early_churn());
    let first = sim::run(&scenario).expect("valid");
    assert_eq!(first, sim::run(&scenario).expect("valid"));
    scenario.seed = 4;
    assert_ne!(first.rounds, sim::run(&scenario).expect("valid").rounds);
}

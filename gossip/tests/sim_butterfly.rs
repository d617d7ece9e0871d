//! Butterfly training in the simulator: the real matchmaking and round state machines,
//! driven over simulated links, through stragglers, crashes and joins.

mod sim_support;

use std::collections::BTreeMap;

use murmur_gossip::Time;
use murmur_gossip::sim::{
    self, AlgorithmSpec, ButterflySwarm, ButterflyTraining, ChurnEvent, Scenario,
};
use sim_support::Link;

const PEERS: usize = 8;

fn training() -> ButterflyTraining {
    sim_support::butterfly(1024, 256, 2)
}

/// Eight peers on 20 Mbit/s links: a round of 16 kB vectors takes tens of milliseconds.
fn scenario(seed: u64, rounds: u64) -> Scenario {
    let link = Link {
        latency_ms: 2.0,
        mbps: 20.0,
        detect_ms: 300.0,
    };
    let algorithm = AlgorithmSpec::Butterfly(training());
    let mut scenario = sim_support::quadratic(PEERS, 4096, rounds, seed, algorithm, link);
    scenario.compute.jitter = 0.1;
    scenario
}

/// Peers that have applied the same number of updates hold the same parameters, bit for
/// bit: every member of a group applies the same averaged update.
fn assert_same_update(swarm: &ButterflySwarm, peers: u32) -> usize {
    let mut by_epoch: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for id in 0..peers {
        if let Some(epoch) = swarm.epoch(id)
            && !swarm.is_averaging(id)
        {
            by_epoch.entry(epoch).or_default().push(id);
        }
    }
    let mut compared = 0;
    for (epoch, ids) in &by_epoch {
        let first = swarm.parameters(ids[0]).expect("live peer");
        for &id in &ids[1..] {
            assert_eq!(
                swarm.parameters(id).expect("live peer"),
                first,
                "peers {} and {id} at batch {epoch} disagree",
                ids[0]
            );
            compared += 1;
        }
    }
    compared
}

#[test]
fn every_member_applies_the_same_update_and_nobody_waits_for_a_straggler() {
    let mut scenario = scenario(3, 120);
    scenario.compute.stragglers = vec![murmur_gossip::sim::Straggler {
        peer: 4,
        slowdown: 4.0,
    }];
    let mut swarm = ButterflySwarm::new(&scenario, &training()).expect("valid scenario");
    let mut compared = 0;
    for round in (10..=120).step_by(10) {
        swarm.run_until(swarm.round_end(round)).expect("run");
        compared += assert_same_update(&swarm, PEERS as u32);
    }
    assert!(compared > 0, "no two peers were ever compared");
    let summary = swarm.report().summary;
    let averaging = summary.averaging.expect("butterfly reports its rounds");
    assert_eq!(averaging.rounds_local, 0, "every batch found a group");
    assert_eq!(averaging.mean_group_size, PEERS as f64);
    assert_eq!(averaging.mean_fraction_averaged, 1.0);
    // 12 s of 7 peers at 10 steps/s and one at 2.5, 32 samples a step: the straggler costs
    // only its own steps, and rounds cost the others little.
    let ideal = (7.0 * 10.0 + 2.5) * 32.0;
    assert!(
        summary.samples_per_sec >= 0.95 * ideal,
        "{} samples/s of an ideal {ideal}",
        summary.samples_per_sec
    );
}

/// The first time, after `from`, at which `peer` is in a butterfly round.
fn first_round_of(seed: u64, peer: u32, from: Time) -> Time {
    let mut swarm = ButterflySwarm::new(&scenario(seed, 100), &training()).expect("valid");
    let mut now = from;
    for _ in 0..100_000 {
        swarm.run_until(now).expect("run");
        if swarm.is_averaging(peer) {
            return now;
        }
        now = now + std::time::Duration::from_micros(200);
    }
    panic!("peer {peer} never averaged");
}

/// A peer that crashes in the middle of a round costs the others at most a timeout: the
/// survivors finish the round (its part falls back to local values), and the next batches
/// are averaged without it. With `detect_ms` short the transport reports the member lost;
/// with it long the sender and reducer timeouts end the waits.
#[test]
fn a_crash_mid_round_is_survived_through_member_lost_and_through_timeouts() {
    let (seed, victim) = (5, 3);
    let crash_at = first_round_of(seed, victim, Time::from_secs_f64(2.0))
        + std::time::Duration::from_micros(200);
    for detect_ms in [300.0, 20_000.0] {
        let mut scenario = scenario(seed, 100);
        scenario.link.detect_ms = detect_ms;
        scenario.churn = vec![ChurnEvent::Crash {
            at_ms: crash_at.as_secs_f64() * 1e3,
            peer: victim,
        }];
        let mut swarm = ButterflySwarm::new(&scenario, &training()).expect("valid");
        swarm.run_until(crash_at).expect("run");
        let survivors: Vec<u32> = (0..PEERS as u32).filter(|&p| p != victim).collect();
        let epochs: Vec<u64> = survivors
            .iter()
            .map(|&p| swarm.epoch(p).expect("survivor"))
            .collect();
        // The waits end by the reducer timeout (1.5 s) at the latest.
        let bound = crash_at + std::time::Duration::from_millis(1_600);
        swarm.run_until(bound).expect("run");
        for (&peer, &epoch) in survivors.iter().zip(&epochs) {
            let now = swarm.epoch(peer).expect("survivor");
            assert!(
                now > epoch,
                "detect {detect_ms} ms: peer {peer} still at batch {epoch}"
            );
        }
        let summary = swarm.report().summary;
        let averaging = summary.averaging.expect("butterfly reports its rounds");
        assert!(
            averaging.mean_fraction_averaged < 1.0,
            "detect {detect_ms} ms: the crashed reducer's part should have fallen back"
        );
        // Afterwards the survivors keep averaging without it.
        let before = averaging.rounds_averaged;
        swarm.run_until(swarm.round_end(100)).expect("run");
        let after = swarm.report().summary.averaging.expect("rounds");
        assert!(
            after.rounds_averaged >= before + 5 * survivors.len() as u64,
            "detect {detect_ms} ms: {} member-rounds after the crash",
            after.rounds_averaged - before
        );
        assert_same_update(&swarm, PEERS as u32);
    }
}

/// A joiner downloads the parameters, trains from the next batch on, and joins the groups.
#[test]
fn a_joiner_catches_up_and_averages_with_the_others() {
    let mut scenario = scenario(7, 100);
    scenario.churn = vec![ChurnEvent::Join { at_ms: 3_000.0 }];
    let mut swarm = ButterflySwarm::new(&scenario, &training()).expect("valid");
    swarm.run_until(swarm.round_end(100)).expect("run");
    let joiner = PEERS as u32;
    let epoch = swarm.epoch(joiner).expect("the joiner trains");
    let others = swarm.epoch(0).expect("peer 0 trains");
    assert!(
        epoch.abs_diff(others) <= 1,
        "joiner at batch {epoch}, peer 0 at {others}"
    );
    let summary = swarm.report().summary;
    assert_eq!(summary.peers_end, PEERS + 1);
    let averaging = summary.averaging.expect("rounds");
    assert!(
        averaging.mean_group_size > PEERS as f64,
        "the joiner should be in most groups: {}",
        averaging.mean_group_size
    );
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let mut scenario = scenario(11, 40);
    scenario.vector_len = 1024;
    scenario.random_churn = Some(sim_support::early_churn());
    let first = sim::run(&scenario).expect("valid");
    let again = sim::run(&scenario).expect("valid");
    assert_eq!(first, again);
    scenario.seed = 12;
    let other = sim::run(&scenario).expect("valid");
    assert_ne!(first.rounds, other.rounds);
}

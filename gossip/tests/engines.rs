//! The daemon's averaging engines in the simulator ([`EngineSwarm`]): every mode trains the
//! quadratic workload to its optimum, groups form by matchmaking and respect their bounds,
//! parts are sized by bandwidth, a crash mid-round leaves the survivors averaging
//! together, and butterfly's parameter rounds bring replicas that differ back together.

use std::time::Duration;

use murmur_gossip::Time;
use murmur_gossip::butterfly::ButterflyConfig;
use murmur_gossip::engine::{Engine, EngineSetup, LocalSgdSettings, ModeSettings};
use murmur_gossip::sgp::SgpConfig;
use murmur_gossip::sim::{ChurnEvent, EngineSwarm, EngineSwarmConfig, Scenario, Workload};
use murmur_protocol::codec::CodecSpec;

const LEN: usize = 4096;

fn butterfly_config(target_group: usize) -> ButterflyConfig {
    ButterflyConfig {
        min_group: 2,
        target_group,
        max_wait_ms: 1000,
        begin_margin_ms: 200,
        chunk_elements: 512,
        chunks_in_flight: 4,
        chunk_timeout_ms: 1000,
        reducer_timeout_ms: 1500,
        ..ButterflyConfig::default()
    }
}

fn scenario(peers: usize, seed: u64) -> Scenario {
    let mut scenario = Scenario::new(peers, LEN, 100);
    scenario.seed = seed;
    scenario.workload = Workload::Quadratic { learning_rate: 0.1 };
    scenario.link.latency_ms = 1.0;
    scenario.link.uplink_mbps = Some(1000.0);
    scenario.link.downlink_mbps = Some(1000.0);
    scenario.link.detect_ms = 300.0;
    scenario.compute.step_ms = 50.0;
    scenario
}

fn config(mode: ModeSettings, codec: CodecSpec) -> EngineSwarmConfig {
    EngineSwarmConfig {
        mode,
        setup: EngineSetup {
            codec,
            error_feedback: true,
            size_parts_by_bandwidth: true,
            batch_size: 32,
            upload_cap: 0,
            accepts_connections: true,
            wall_ms_at_zero: 0,
            seed: 7,
            max_share_piece: 0,
        },
        heartbeat_ms: 200,
        gossip_ms: 5.0,
        upload_caps: Vec::new(),
        unreachable: Vec::new(),
    }
}

/// `‖x − x*‖ / ‖x*‖`.
fn error(x: &[f32], optimum: &[f32]) -> f64 {
    let norm: f64 = optimum.iter().map(|&o| f64::from(o).powi(2)).sum::<f64>();
    let diff: f64 = x
        .iter()
        .zip(optimum)
        .map(|(&x, &o)| (f64::from(x) - f64::from(o)).powi(2))
        .sum();
    (diff / norm).sqrt()
}

/// The error of every live peer against the live peers' optimum, the worst of them.
fn worst_error(swarm: &EngineSwarm, peers: u32) -> f64 {
    let optimum = swarm.optimum();
    (0..peers)
        .filter_map(|id| swarm.parameters(id))
        .map(|p| error(p, &optimum))
        .fold(0.0, f64::max)
}

/// The control: where the peers would end training alone, each at its own optimum; the
/// best of them. Averaging must end well below it.
fn solo_error(swarm: &EngineSwarm, peers: u32) -> f64 {
    let optimum = swarm.optimum();
    (0..peers)
        .map(|id| error(swarm.target(id), &optimum))
        .fold(f64::INFINITY, f64::min)
}

/// Asks every peer to finish and lets them hand over their final parameters.
fn finish_all(swarm: &mut EngineSwarm, peers: u32) {
    for id in 0..peers {
        swarm.finish(id).expect("finish");
    }
    let end = swarm.now().as_secs_f64() + 5.0;
    run(swarm, end);
}

fn run(swarm: &mut EngineSwarm, secs: f64) {
    swarm
        .run_until(Time::from_secs_f64(secs))
        .expect("the swarm runs");
}

#[test]
fn butterfly_trains_every_peer_to_the_swarm_optimum() {
    let mode = ModeSettings::Butterfly {
        target_batch: 4 * 32,
        butterfly: butterfly_config(16),
    };
    let mut swarm = EngineSwarm::new(&scenario(4, 1), config(mode, CodecSpec::F32)).unwrap();
    run(&mut swarm, 20.0);
    finish_all(&mut swarm, 4);
    let (after, solo) = (worst_error(&swarm, 4), solo_error(&swarm, 4));
    let reports = swarm.round_reports();
    assert!(reports.len() >= 4 * 20, "{} round reports", reports.len());
    assert!(
        reports
            .iter()
            .all(|(_, r)| r.group_size == 4 && r.coverage >= 1.0),
        "every round averages all four peers completely"
    );
    assert_eq!(swarm.rounds_alone(), 0);
    assert!(
        after < 0.01 * solo,
        "error {after:.4}, alone {solo:.3}: the swarm did not reach its optimum"
    );
}

/// Butterfly without overlap, peers of equal speed, a target of one step from each: a
/// round averages one step of every peer, as the sync ring does. A peer that has taken its
/// step waits for the others' steps in progress instead of starting another, which the
/// round would then wait for (two steps a round).
#[test]
fn butterfly_rounds_come_every_step_when_the_target_is_one_step_each() {
    let mode = ModeSettings::Butterfly {
        target_batch: 4 * 32,
        butterfly: butterfly_config(16),
    };
    let mut swarm = EngineSwarm::new(&scenario(4, 3), config(mode, CodecSpec::F32)).unwrap();
    run(&mut swarm, 10.0);
    for peer in 0..4u32 {
        let rounds = swarm
            .round_reports()
            .iter()
            .filter(|(p, _)| *p == peer)
            .count() as f64;
        let steps = swarm.samples(peer) as f64 / 32.0;
        assert!(
            rounds >= 0.9 * steps,
            "peer {peer}: {rounds} rounds in {steps} steps"
        );
    }
}

#[test]
fn sync_ring_and_local_sgd_train_to_the_optimum_too() {
    let ring = ModeSettings::SyncRing {
        timeout: Duration::from_secs(5),
        butterfly: butterfly_config(16),
    };
    let local = ModeSettings::LocalSgd {
        local: LocalSgdSettings {
            local_steps: 4,
            outer_lr: 0.7,
            outer_momentum: 0.5,
        },
        butterfly: butterfly_config(16),
    };
    for (name, mode) in [("sync-ring", ring), ("local-sgd", local)] {
        let mut swarm =
            EngineSwarm::new(&scenario(4, 2), config(mode, CodecSpec::Int8 { block: 64 })).unwrap();
        run(&mut swarm, 30.0);
        finish_all(&mut swarm, 4);
        let (after, solo) = (worst_error(&swarm, 4), solo_error(&swarm, 4));
        assert!(
            !swarm.round_reports().is_empty(),
            "{name}: no round finished"
        );
        // Error feedback is on: every round's sends carry what int8 lost into the next.
        let carried: Vec<_> = swarm
            .round_reports()
            .iter()
            .map(|(_, r)| r.feedback_carried)
            .collect();
        assert!(
            carried
                .iter()
                .all(|c| c.is_some_and(|c| c > 0.0 && c < 0.05)),
            "{name}: {carried:?}"
        );
        assert!(
            after < 0.05 * solo,
            "{name}: error {after:.4}, alone {solo:.3}"
        );
    }
}

#[test]
fn sgp_trains_every_peer_to_the_swarm_optimum() {
    let mode = ModeSettings::Sgp(SgpConfig::default());
    let mut swarm =
        EngineSwarm::new(&scenario(8, 3), config(mode, CodecSpec::Int8 { block: 64 })).unwrap();
    run(&mut swarm, 30.0);
    finish_all(&mut swarm, 8);
    // Decentralized SGD at a constant rate keeps peers apart by O(rate × heterogeneity);
    // what averaging must do is end far closer to the swarm's optimum than any peer alone.
    let (after, solo) = (worst_error(&swarm, 8), solo_error(&swarm, 8));
    assert!(after < 0.3 * solo, "error {after:.3}, alone {solo:.3}");
}

/// Shares larger than a parcel may carry travel in pieces (here 1,000 bytes: an `f32` share
/// of 4,096 elements in 17, an `int8` one in 5) and train as whole shares do, every piece
/// put back together: no parcel is refused as malformed.
#[test]
fn sgp_shares_in_pieces_train_every_peer_to_the_swarm_optimum() {
    for codec in [CodecSpec::F32, CodecSpec::Int8 { block: 64 }] {
        let mode = ModeSettings::Sgp(SgpConfig::default());
        let mut config = config(mode, codec);
        config.setup.max_share_piece = 1000;
        let mut swarm = EngineSwarm::new(&scenario(8, 3), config).unwrap();
        run(&mut swarm, 30.0);
        assert_eq!(swarm.bad_parcels(), 0, "{codec:?}");
        let received: u64 = (0..8)
            .map(|id| swarm.engine(id).status().shares_received)
            .sum();
        assert!(received > 8 * 100, "{codec:?}: {received} shares received");
        finish_all(&mut swarm, 8);
        let (after, solo) = (worst_error(&swarm, 8), solo_error(&swarm, 8));
        assert!(
            after < 0.3 * solo,
            "{codec:?}: error {after:.3}, alone {solo:.3}"
        );
    }
}

/// Sixteen peers with `target_group = 4` average in groups of at most four, and no peer
/// waits for its group longer than `max_wait_ms`.
#[test]
fn groups_respect_the_target_size_and_the_matchmaking_bound() {
    let mut butterfly = butterfly_config(4);
    butterfly.max_wait_ms = 800;
    let mode = ModeSettings::Butterfly {
        target_batch: 16 * 32,
        butterfly,
    };
    let mut swarm = EngineSwarm::new(&scenario(16, 4), config(mode, CodecSpec::F32)).unwrap();
    run(&mut swarm, 20.0);
    let reports = swarm.round_reports();
    assert!(reports.len() >= 16 * 10, "{} round reports", reports.len());
    assert!(reports.iter().all(|(_, r)| r.group_size <= 4));
    assert!(
        reports.iter().filter(|(_, r)| r.group_size == 4).count() * 2 > reports.len(),
        "most groups reach the target size"
    );
    let bound = Duration::from_millis(801);
    assert!(reports.iter().all(|(_, r)| r.matchmaking <= bound));
}

/// A peer that crashes leaves the others averaging together: every later round is one
/// group of the three survivors, never a split.
#[test]
fn a_crash_leaves_the_survivors_in_one_group() {
    let mut s = scenario(4, 5);
    s.churn = vec![ChurnEvent::Crash {
        at_ms: 2_010.0,
        peer: 2,
    }];
    let mode = ModeSettings::Butterfly {
        target_batch: 4 * 32,
        butterfly: butterfly_config(16),
    };
    let mut swarm = EngineSwarm::new(&s, config(mode, CodecSpec::Int8 { block: 64 })).unwrap();
    run(&mut swarm, 15.0);
    let reports = swarm.round_reports();
    let late: Vec<_> = reports
        .iter()
        .filter(|(_, r)| r.round >= 60)
        .map(|(p, r)| (*p, r.round, r.group_size))
        .collect();
    assert!(!late.is_empty(), "rounds go on after the crash");
    assert!(
        late.iter().all(|&(_, _, size)| size == 3),
        "after the crash every round is the three survivors: {late:?}"
    );
    finish_all(&mut swarm, 4);
    let (after, solo) = (worst_error(&swarm, 4), solo_error(&swarm, 4));
    assert!(after < 0.05 * solo, "error {after:.4}, alone {solo:.3}");
}

/// A target of one step from each of four peers, and one of them crashes: the three
/// survivors' 96 samples are nearer the target of 128 than two steps' 192 are, so rounds
/// still come every step instead of every second step, which would halve the updates.
#[test]
fn survivors_one_short_of_the_target_still_average_every_step() {
    survivors_average_every_step(4, &[2], false);
}

/// Six peers computing while rounds run (`overlap`, as in the churn soak), a target of one
/// step from each, and two crash: the four survivors' 128 samples fall as far short of 192
/// as two steps' 256 overshoot it (64 each way). The round begins now: an update every step
/// rather than one every second step, at the same samples per second. The churn soak (six
/// peers, one killed every 2 to 5 s and back about 5 s later) spends much of its time two
/// down; before, its survivors then took half the updates (20 rounds in 40 steps here,
/// against 40 in 40 with one down).
#[test]
fn survivors_two_short_of_the_target_still_average_every_step() {
    survivors_average_every_step(6, &[2, 3], true);
}

/// `peers` peers of batch 32 with a target of one step from each, computing while rounds
/// run if `overlap`; `crashed` crash at 2 s; from 4 s to 14 s every survivor takes 100
/// steps or more and a round at least every 1.25 steps.
fn survivors_average_every_step(peers: u32, crashed: &[u32], overlap: bool) {
    let mut s = scenario(peers as usize, 8);
    s.churn = crashed
        .iter()
        .map(|&peer| ChurnEvent::Crash {
            at_ms: 2_010.0,
            peer,
        })
        .collect();
    let mode = ModeSettings::Butterfly {
        target_batch: u64::from(peers) * 32,
        butterfly: ButterflyConfig {
            overlap,
            ..butterfly_config(16)
        },
    };
    let mut swarm = EngineSwarm::new(&s, config(mode, CodecSpec::F32)).unwrap();
    run(&mut swarm, 4.0);
    let survivors: Vec<u32> = (0..peers).filter(|p| !crashed.contains(p)).collect();
    let before: Vec<(usize, u64)> = survivors
        .iter()
        .map(|&peer| (rounds_of(&swarm, peer), swarm.samples(peer)))
        .collect();
    run(&mut swarm, 14.0);
    for (&peer, (rounds, samples)) in survivors.iter().zip(before) {
        let rounds = (rounds_of(&swarm, peer) - rounds) as f64;
        let steps = (swarm.samples(peer) - samples) as f64 / 32.0;
        assert!(steps >= 100.0, "peer {peer} took {steps} steps in 10 s");
        assert!(
            rounds >= 0.8 * steps,
            "peer {peer}: {rounds} rounds in {steps} steps after the crash"
        );
    }
}

fn rounds_of(swarm: &EngineSwarm, peer: u32) -> usize {
    swarm
        .round_reports()
        .iter()
        .filter(|(p, _)| *p == peer)
        .count()
}

/// Heartbeats once a second, steps of 50 ms computed while rounds form and run (`overlap`),
/// and a crash the transport does not report (a `kill -9` leaves a QUIC connection open
/// until its idle timeout): a member whose last heartbeat said it was stepping towards the
/// round, or finishing the round before, silent for three of its steps, is not waited for,
/// whether it gathers, looks for a group, leads one, or reduces a part of a running round.
/// At 16 crash moments no survivor's gathering nor round takes 500 ms; before the rule
/// covered looking members, members at the round before and running rounds, 4 of 16 cost a
/// gathering its bound (800 ms) and one held a running round for 1.29 s (the heartbeat
/// interval and a quarter).
#[test]
fn a_member_silent_for_three_of_its_steps_is_not_waited_for() {
    assert_no_survivor_held("crash", |at_ms| ChurnEvent::Crash { at_ms, peer: 2 });
}

/// A member killed and started again under the same key before anyone noticed its silence
/// (`murmur local --churn` restarts a peer 2 s after `kill -9`; on a loaded host the others
/// may not have judged it quiet by then) heartbeats again at the round its old process last
/// announced, as `murmur run` starts a restarted peer at the swarm's round: its new process
/// holds nothing of the round or group the old one was in. Its heartbeats name a new
/// incarnation, which tells the others so, and nobody waits for it. At 16 restart moments no
/// survivor's gathering nor round takes 500 ms. Before, only heartbeats going back in rounds
/// told of a restart: at the same round the restarted member was still waited for, and 2 of
/// the 16 rounds ran to the reducer timeout (1.5 s).
#[test]
fn a_member_restarted_under_the_same_key_is_not_waited_for_in_the_old_ones_round() {
    assert_no_survivor_held("restart", |at_ms| ChurnEvent::Restart { at_ms, peer: 2 });
}

/// Four peers with `overlap`, heartbeats once a second, and peer 2 hit by `event(at_ms)` at
/// one of 16 moments from 2 s on, which the transport never reports: no survivor's gathering
/// nor round may take 500 ms at any of them.
fn assert_no_survivor_held(what: &str, event: impl Fn(f64) -> ChurnEvent) {
    let mut slowest = Vec::new();
    for seed in 0..16u64 {
        let mut s = scenario(4, seed);
        s.link.detect_ms = 60_000.0;
        s.churn = vec![event(2_000.0 + seed as f64 * 23.0)];
        let mode = ModeSettings::Butterfly {
            target_batch: 3 * 32,
            butterfly: ButterflyConfig {
                overlap: true,
                ..butterfly_config(16)
            },
        };
        let mut config = config(mode, CodecSpec::F32);
        config.heartbeat_ms = 1000;
        let mut swarm = EngineSwarm::new(&s, config).unwrap();
        run(&mut swarm, 6.0);
        let survivors = || swarm.round_reports().iter().filter(|(p, _)| *p != 2);
        let gathering = survivors().map(|(_, r)| r.matchmaking).max();
        let round = survivors().map(|(_, r)| r.finished_after).max();
        slowest.push((
            gathering.expect("rounds").as_millis(),
            round.expect("rounds").as_millis(),
        ));
    }
    let held = slowest
        .iter()
        .filter(|&&(gathering, round)| gathering >= 500 || round >= 500)
        .count();
    assert_eq!(
        held, 0,
        "{held} of 16 {what} moments held a survivor 500 ms or more; the slowest gathering \
         and round per seed, ms: {slowest:?}"
    );
}

/// The leader sizes parts by the bandwidth each member declares: with upload caps in the
/// ratio 1 : 2 : 4 : 8 parts never shrink as bandwidth grows (members too slow to help
/// reduce nothing, see `butterfly::partition`), the fastest reduces the most, and a member
/// that accepts no connections reduces none.
#[test]
fn parts_follow_the_declared_bandwidth_and_unreachable_members_reduce_none() {
    let mode = ModeSettings::Butterfly {
        target_batch: 5 * 32,
        butterfly: butterfly_config(16),
    };
    let mut config = config(mode, CodecSpec::F32);
    config.upload_caps = vec![1_000_000, 2_000_000, 4_000_000, 8_000_000, 8_000_000];
    config.unreachable = vec![4];
    let mut swarm = EngineSwarm::new(&scenario(5, 6), config).unwrap();
    run(&mut swarm, 5.0);
    let reports = swarm.round_reports();
    assert!(!reports.is_empty());
    let part = |peer: u32| {
        reports
            .iter()
            .filter(|(p, r)| *p == peer && r.group_size == 5)
            .map(|(_, r)| r.part_elements)
            .max()
            .expect("a round of all five")
    };
    let parts: Vec<usize> = (0..5).map(part).collect();
    assert_eq!(
        parts[4], 0,
        "the unreachable member reduces nothing: {parts:?}"
    );
    assert!(
        parts[0] <= parts[1] && parts[1] <= parts[2] && parts[2] < parts[3],
        "parts grow with bandwidth: {parts:?}"
    );
    assert_eq!(parts.iter().sum::<usize>(), LEN);
}

/// A member that AutoNAT finds private (`Engine::set_unreachable`) reduces nothing from
/// its next round on, and one found reachable again takes a part again.
#[test]
fn a_member_found_unreachable_mid_run_is_given_no_part_until_it_is_reachable_again() {
    let mode = ModeSettings::Butterfly {
        target_batch: 4 * 32,
        butterfly: butterfly_config(16),
    };
    let mut swarm = EngineSwarm::new(&scenario(4, 6), config(mode, CodecSpec::F32)).unwrap();
    let parts_of_3 = |swarm: &EngineSwarm, from: usize| -> Vec<usize> {
        swarm.round_reports()[from..]
            .iter()
            .filter(|(p, r)| *p == 3 && r.group_size == 4)
            .map(|(_, r)| r.part_elements)
            .collect()
    };
    run(&mut swarm, 2.0);
    let reachable = parts_of_3(&swarm, 0);
    assert!(reachable.iter().any(|&p| p > 0), "{reachable:?}");
    swarm.engine_mut(3).set_unreachable(true);
    // The round under way when the verdict came may still give it a part.
    run(&mut swarm, 3.0);
    let settle = swarm.round_reports().len();
    run(&mut swarm, 5.0);
    let unreachable = parts_of_3(&swarm, settle);
    assert!(!unreachable.is_empty(), "rounds of all four went on");
    assert!(unreachable.iter().all(|&p| p == 0), "{unreachable:?}");
    swarm.engine_mut(3).set_unreachable(false);
    run(&mut swarm, 6.0);
    let mark = swarm.round_reports().len();
    run(&mut swarm, 8.0);
    let again = parts_of_3(&swarm, mark);
    assert!(again.iter().any(|&p| p > 0), "{again:?}");
}

/// Crashes at many moments of the round cycle, each a pair: a peer whose leader waits for
/// it (until the crash is noticed), then, within that wait, often the leader itself. No
/// survivor waits out its `max_wait` and averages alone: a follower leaves a crashed leader
/// as soon as the crash is noticed (`link.detect_ms`), and a peer left gathering at a
/// round the others have moved past joins theirs.
#[test]
fn crashed_leaders_cost_no_survivor_a_round_alone() {
    let mut alone = Vec::new();
    for seed in 0..12u64 {
        let mut s = scenario(8, seed);
        let offset = seed as f64 * 37.0;
        s.churn = [(1u32, 1_500.0), (0, 1_620.0), (3, 4_000.0), (2, 4_120.0)]
            .into_iter()
            .map(|(peer, at_ms)| ChurnEvent::Crash {
                at_ms: at_ms + offset,
                peer,
            })
            .collect();
        let mode = ModeSettings::Butterfly {
            target_batch: 8 * 32,
            butterfly: butterfly_config(16),
        };
        let mut swarm = EngineSwarm::new(&s, config(mode, CodecSpec::Int8 { block: 64 })).unwrap();
        run(&mut swarm, 8.0);
        let survivors_rounds = swarm
            .round_reports()
            .iter()
            .filter(|(p, r)| *p >= 4 && r.round > 5)
            .count();
        assert!(
            survivors_rounds > 100,
            "seed {seed}: {survivors_rounds} rounds"
        );
        alone.push(swarm.rounds_alone());
    }
    assert!(
        alone.iter().all(|&a| a == 0),
        "rounds alone per seed: {alone:?}"
    );
}

/// The member with the fastest uplink reduces every element (the others are too slow to
/// help, see `butterfly::partition`): its result is complete as soon as its own part is,
/// with most of its averages still waiting for room in its send windows (32 chunks, 4 in
/// flight per destination). A finished round still sends them: no member gives up on a
/// live reducer, through a crash of one of them at many moments of the round cycle too.
#[test]
fn a_member_that_finishes_first_still_sends_all_its_averages() {
    let mut given_up = Vec::new();
    for seed in 0..12u64 {
        let mut s = scenario(4, seed);
        s.churn = vec![ChurnEvent::Crash {
            at_ms: 1_500.0 + seed as f64 * 13.0,
            peer: 2,
        }];
        let mode = ModeSettings::Butterfly {
            target_batch: 4 * 32,
            butterfly: ButterflyConfig {
                chunk_elements: 128,
                ..butterfly_config(16)
            },
        };
        let mut config = config(mode, CodecSpec::F32);
        config.upload_caps = vec![2_000_000, 2_000_000, 2_000_000, 8_000_000];
        let mut swarm = EngineSwarm::new(&s, config).unwrap();
        run(&mut swarm, 5.0);
        let reports = swarm.round_reports();
        let survivors_rounds = reports
            .iter()
            .filter(|(p, r)| *p != 2 && r.round > 20)
            .count();
        assert!(
            survivors_rounds > 60,
            "seed {seed}: {survivors_rounds} rounds"
        );
        given_up.extend(
            reports
                .iter()
                .flat_map(|(p, r)| {
                    r.silent_reducers
                        .iter()
                        .map(move |s| (seed, *p, r.round, *s))
                })
                .filter(|&(_, _, _, silent)| silent != 2),
        );
    }
    assert!(
        given_up.is_empty(),
        "(seed, peer, round, live reducer given up): {given_up:?}"
    );
}

/// Four butterfly peers on pure consensus (each starts from its own parameters, every
/// gradient is zero, so only parameter rounds can move them), averaging parameters every
/// `every` rounds.
fn consensus_swarm(every: u64, codec: CodecSpec) -> EngineSwarm {
    let mut s = scenario(4, 3);
    s.workload = Workload::Consensus;
    let mut butterfly = butterfly_config(16);
    butterfly.average_params_every = every;
    let mode = ModeSettings::Butterfly {
        target_batch: 4 * 32,
        butterfly,
    };
    EngineSwarm::new(&s, config(mode, codec)).unwrap()
}

/// The spread of the parameters at the start, and after 10 s and every peer's finish.
fn spread(swarm: &mut EngineSwarm) -> (f64, f64) {
    let before = swarm.consensus_distance().expect("four peers");
    run(swarm, 10.0);
    finish_all(swarm, 4);
    (before, swarm.consensus_distance().expect("four peers"))
}

fn parameter_rounds(swarm: &EngineSwarm) -> (usize, usize) {
    let reports = swarm.round_reports();
    let params = reports.iter().filter(|(_, r)| r.parameters).count();
    (params, reports.len())
}

/// `average_params_every`: averaging gradients alone keeps any difference between two
/// replicas as it is, so the control, the same swarm with the rounds off, ends as far
/// apart as it began; with them the replicas meet.
#[test]
fn parameter_rounds_bring_differing_replicas_together() {
    let mut control = consensus_swarm(0, CodecSpec::F32);
    let (before, after) = spread(&mut control);
    assert!(before > 0.5, "the peers start apart: {before}");
    assert!(
        (after - before).abs() < 1e-6 * before,
        "averaging zero gradients moves no replica: {before} then {after}"
    );
    assert_eq!(parameter_rounds(&control).0, 0);

    let mut synced = consensus_swarm(4, CodecSpec::F32);
    let (before, after) = spread(&mut synced);
    assert!(after < 1e-6, "the replicas meet: {before} then {after}");
    let (params, all) = parameter_rounds(&synced);
    assert!(all >= 40, "{all} rounds");
    // One round in four, give or take the rounds running at the end.
    assert!(
        params * 4 >= all - 8 && params * 4 <= all + 8,
        "{params} of {all} rounds averaged parameters"
    );
}

#[test]
fn quantized_parameter_rounds_bring_replicas_together_too() {
    let int8 = CodecSpec::Int8 { block: 64 };
    let mut control = consensus_swarm(0, int8);
    let (before, control_after) = spread(&mut control);
    assert!((control_after - before).abs() < 1e-6 * before);
    let mut synced = consensus_swarm(4, int8);
    let (_, after) = spread(&mut synced);
    // Every member, the part's reducer too, takes the averages as encoded: the codec's
    // error moves the consensus, but not the replicas apart.
    assert!(
        after < 1e-6,
        "int8 parameter rounds: spread {before} then {after}"
    );
}

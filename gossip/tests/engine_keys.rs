//! Each of the matchmaking keys of `[averaging.butterfly]` changes what the engines do:
//! `min_group`, `target_group`, `max_wait_ms`, `begin_margin_ms` and `max_candidates`; and
//! `overlap`, whether a peer computes while its round forms and runs.
//! The first four are shown on engine swarms (the engines `murmur run` builds); the last on
//! the matchmaker, where its effect is visible message by message.

use murmur_gossip::Time;
use murmur_gossip::butterfly::{
    ButterflyConfig, MatchInput, MatchOutput, Matchmaker, MemberProfile,
};
use murmur_gossip::engine::{EngineSetup, ModeSettings};
use murmur_gossip::sim::{EngineSwarm, EngineSwarmConfig, Scenario, Workload};
use murmur_protocol::codec::CodecSpec;

fn butterfly(
    min_group: usize,
    target_group: usize,
    max_wait_ms: u64,
    margin: u64,
) -> ButterflyConfig {
    ButterflyConfig {
        min_group,
        target_group,
        max_wait_ms,
        begin_margin_ms: margin,
        chunk_elements: 256,
        chunk_timeout_ms: 1000,
        reducer_timeout_ms: 1500,
        ..ButterflyConfig::default()
    }
}

fn swarm(peers: usize, config: ButterflyConfig) -> EngineSwarm {
    let mut scenario = Scenario::new(peers, 1024, 100);
    scenario.seed = 9;
    scenario.workload = Workload::Quadratic { learning_rate: 0.1 };
    scenario.link.latency_ms = 1.0;
    scenario.compute.step_ms = 20.0;
    let config = EngineSwarmConfig {
        mode: ModeSettings::Butterfly {
            target_batch: peers as u64 * 32,
            butterfly: config,
        },
        setup: EngineSetup {
            codec: CodecSpec::F32,
            error_feedback: false,
            size_parts_by_bandwidth: true,
            batch_size: 32,
            upload_cap: 0,
            accepts_connections: true,
            wall_ms_at_zero: 0,
            seed: 3,
            max_share_piece: 0,
        },
        heartbeat_ms: 200,
        gossip_ms: 2.0,
        upload_caps: Vec::new(),
        unreachable: Vec::new(),
    };
    EngineSwarm::new(&scenario, config).expect("a valid swarm")
}

fn run(swarm: &mut EngineSwarm, secs: f64) {
    swarm
        .run_until(Time::from_secs_f64(secs))
        .expect("the swarm runs");
}

/// `min_group`: four peers group at `min_group = 4`, and never at `min_group = 5`, where
/// every round is averaged alone.
#[test]
fn min_group_decides_whether_a_group_is_worth_forming() {
    let mut formed = swarm(4, butterfly(4, 16, 500, 100));
    run(&mut formed, 5.0);
    assert!(!formed.round_reports().is_empty());
    assert_eq!(formed.rounds_alone(), 0);
    let mut alone = swarm(4, butterfly(5, 16, 500, 100));
    run(&mut alone, 5.0);
    assert!(alone.round_reports().is_empty(), "no group of 5 among 4");
    assert!(alone.rounds_alone() > 0);
}

/// `target_group`: the largest group a leader gathers.
#[test]
fn target_group_caps_the_groups() {
    for target in [2, 3, 8] {
        let mut s = swarm(8, butterfly(2, target, 500, 100));
        run(&mut s, 5.0);
        let largest = s.round_reports().iter().map(|(_, r)| r.group_size).max();
        assert_eq!(largest, Some(target), "target_group = {target}");
    }
}

/// `max_wait_ms` and `begin_margin_ms`: where no group can form, a peer gives up at its
/// leader's decision time, `max_wait_ms − begin_margin_ms` after it was ready; the rounds
/// it averages alone come that far apart.
#[test]
fn max_wait_and_begin_margin_set_when_a_peer_gives_up() {
    let pace = |max_wait: u64, margin: u64| {
        let mut s = swarm(3, butterfly(4, 16, max_wait, margin));
        run(&mut s, 20.0);
        20.0 / s.rounds_alone() as f64 * 3.0
    };
    let base = pace(1000, 200);
    let longer_wait = pace(2000, 200);
    let longer_margin = pace(1000, 600);
    // One round alone takes the decision time, plus up to a few steps of compute (20 ms)
    // before the next round is due.
    assert!((0.8..1.05).contains(&base), "{base:.3} s per round");
    assert!(
        (1.8..2.1).contains(&longer_wait),
        "{longer_wait:.3} s per round"
    );
    assert!(
        (0.4..0.65).contains(&longer_margin),
        "{longer_margin:.3} s per round"
    );
}

/// `overlap`: where no group can form, each round waits out the matchmaking deadline
/// (0.8 s). With overlap a peer computes its 20 ms steps all that time; without, it
/// computes only until its next round is due, then waits for the round's update.
#[test]
fn overlap_decides_whether_a_peer_computes_while_its_round_forms() {
    let samples = |overlap: bool| {
        let mut s = swarm(
            3,
            ButterflyConfig {
                overlap,
                ..butterfly(4, 16, 1000, 200)
            },
        );
        run(&mut s, 10.0);
        assert!(s.rounds_alone() > 0);
        (0..3).map(|id| s.samples(id)).sum::<u64>()
    };
    let (on, off) = (samples(true), samples(false));
    assert!(on > 5 * off, "overlap on: {on} samples, off: {off}");
}

/// `max_candidates`: a peer remembers only the earliest looking peers. With room for one,
/// a peer of round 5 that heard first of an earlier-deadline peer of round 7 forgets the
/// round-5 leader it hears of next, and gathers alone; with room for two it asks it.
#[test]
fn max_candidates_bounds_the_looking_peers_remembered() {
    let asks = |max_candidates: usize| {
        let config = ButterflyConfig {
            max_candidates,
            ..butterfly(2, 16, 10_000, 1000)
        };
        let mut me = Matchmaker::new(10u32, 1024, config).expect("valid");
        let at = |ms| Time::from_millis(ms);
        me.handle(
            at(0),
            MatchInput::PeerLooking {
                peer: 1,
                round: 7,
                deadline: at(5_000),
            },
        );
        me.handle(
            at(0),
            MatchInput::PeerLooking {
                peer: 2,
                round: 5,
                deadline: at(6_000),
            },
        );
        me.handle(
            at(100),
            MatchInput::Ready {
                round: 5,
                group_id: 1,
                profile: MemberProfile {
                    bandwidth_bytes_per_s: 0,
                    accepts_connections: true,
                    samples: 1,
                },
            },
        );
        std::iter::from_fn(|| me.poll_output())
            .any(|o| matches!(o, MatchOutput::SendJoin { to: 2, .. }))
    };
    assert!(!asks(1), "the round-5 leader was not remembered");
    assert!(asks(2), "with room for two it is asked");
}

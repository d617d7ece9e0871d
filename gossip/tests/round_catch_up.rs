//! A butterfly peer one round behind the swarm (a joiner whose downloaded state is a round
//! old, or one cut off for a while) moves to the swarm's round with its first samples, so
//! the others, who count it as about to join them, do not wait for it to gather a whole
//! target batch alone at its old round. The engine is driven by hand here.

use std::time::Duration;

use murmur_gossip::Time;
use murmur_gossip::butterfly::{ButterflyConfig, RoundBuffers};
use murmur_gossip::engine::{
    Beat, Engine, EngineEvent, EngineInput, EngineOutput, EngineSetup, MemberEvent, Membership,
    ModeEngine, ModeSettings, Start, Work, WorkDone,
};
use murmur_protocol::codec::CodecSpec;

const LEN: usize = 64;

fn engine(round: u64) -> ModeEngine<u32> {
    engine_averaging_params_every(round, ButterflyConfig::default().average_params_every)
}

fn engine_averaging_params_every(round: u64, every: u64) -> ModeEngine<u32> {
    let mode = ModeSettings::Butterfly {
        target_batch: 3 * 32,
        butterfly: ButterflyConfig {
            average_params_every: every,
            ..ButterflyConfig::default()
        },
    };
    let setup = EngineSetup {
        codec: CodecSpec::F32,
        error_feedback: false,
        size_parts_by_bandwidth: true,
        batch_size: 32,
        upload_cap: 0,
        accepts_connections: true,
        wall_ms_at_zero: 0,
        seed: 1,
        max_share_piece: 0,
    };
    let membership = Membership::new(0u32, Duration::from_secs(1), Time::ZERO);
    let start = Start {
        params: Some(vec![0.0; LEN]),
        len: LEN,
        round,
        local_steps: 0,
        round_memory: RoundBuffers::default(),
    };
    ModeEngine::new(&mode, &setup, membership, start).expect("an engine")
}

/// Peers 1 and 2 heartbeat at round `step`, 32 samples gathered each.
fn hear_two_peers_at(engine: &mut ModeEngine<u32>, step: u64, at: Time) {
    for peer in [1u32, 2] {
        let beat = Beat {
            step,
            samples_accumulated: 32,
            samples_per_s: 320.0,
            ..Beat::EMPTY
        };
        engine
            .handle(at, EngineInput::Member(MemberEvent::Heartbeat(peer, beat)))
            .unwrap();
    }
}

/// Drains the outputs: the work asked for, and whether the engine caught up to `to`.
fn drain(engine: &mut ModeEngine<u32>, to: u64) -> (Option<Work>, bool) {
    let (mut work, mut caught_up) = (None, false);
    while let Some(output) = engine.poll_output() {
        match output {
            EngineOutput::Work(w) => work = Some(w),
            EngineOutput::Event(EngineEvent::CaughtUp { to: t, .. }) => caught_up |= t == to,
            _ => {}
        }
    }
    (work, caught_up)
}

#[test]
fn a_peer_a_round_behind_moves_to_the_swarms_round_with_its_first_samples() {
    let mut engine = engine(4);
    let t = |ms: u64| Time::ZERO + Duration::from_millis(ms);
    hear_two_peers_at(&mut engine, 5, t(10));
    engine.handle(t(10), EngineInput::Tick).unwrap();
    let (work, caught_up) = drain(&mut engine, 5);
    assert!(
        !caught_up,
        "nothing gathered yet: it stays where it started"
    );
    let Some(Work::Gradient { params, .. }) = work else {
        panic!("a butterfly peer computes a gradient first: {work:?}");
    };
    let done = WorkDone::Gradient {
        params,
        grad: vec![0.1; LEN],
        samples: 32,
        took: Duration::from_millis(100),
    };
    engine.handle(t(110), EngineInput::WorkDone(done)).unwrap();
    let (_, caught_up) = drain(&mut engine, 5);
    assert!(
        caught_up,
        "its first samples take it to the swarm's round 5"
    );
    let own = engine.membership().own();
    assert_eq!(own.step, 5);
    assert_eq!(own.samples_accumulated, 32, "it keeps what it gathered");
    assert!(
        own.looking.is_some_and(|l| l.round == 5),
        "the others' 64 samples and its 32 make round 5 due: it looks for a group there"
    );
}

/// A peer at a parameter round the swarm has left holds no gradient to wait with: it moves
/// to the swarm's round at once, without samples. It once stayed, looking alone, giving up
/// and looking again on every heartbeat it heard, which flooded a swarm of sixteen.
#[test]
fn a_peer_behind_at_a_parameter_round_moves_to_the_swarms_round_at_once() {
    // Every second round averages parameters: round 1 is one.
    let mut engine = engine_averaging_params_every(1, 2);
    let t = |ms: u64| Time::ZERO + Duration::from_millis(ms);
    hear_two_peers_at(&mut engine, 4, t(10));
    engine.handle(t(10), EngineInput::Tick).unwrap();
    let (_, caught_up) = drain(&mut engine, 4);
    assert!(caught_up, "it moves to the swarm's round 4");
    let own = engine.membership().own();
    assert_eq!((own.step, own.samples_accumulated), (4, 0));
}

//! Butterfly's parameter rounds (`average_params_every`): replicas that differ come back
//! together. Averaging gradients alone keeps any difference between two replicas as it
//! is, so the control, the same swarm with the rounds off, must end as far apart as it
//! began. The workload is pure consensus: every peer starts from its own parameters and
//! every gradient is zero, so nothing but the parameter rounds can move them.

use murmur_gossip::Time;
use murmur_gossip::butterfly::ButterflyConfig;
use murmur_gossip::engine::{EngineSetup, ModeSettings};
use murmur_gossip::sim::{EngineSwarm, EngineSwarmConfig, Scenario, Workload};
use murmur_protocol::codec::CodecSpec;

const PEERS: u32 = 4;
const LEN: usize = 4096;

fn swarm(average_params_every: u64, codec: CodecSpec) -> EngineSwarm {
    let mut scenario = Scenario::new(PEERS as usize, LEN, 100);
    scenario.seed = 3;
    scenario.workload = Workload::Consensus;
    scenario.link.latency_ms = 1.0;
    scenario.link.uplink_mbps = Some(1000.0);
    scenario.link.downlink_mbps = Some(1000.0);
    scenario.link.detect_ms = 300.0;
    scenario.compute.step_ms = 50.0;
    let butterfly = ButterflyConfig {
        max_wait_ms: 1000,
        begin_margin_ms: 200,
        chunk_elements: 512,
        chunk_timeout_ms: 1000,
        reducer_timeout_ms: 1500,
        average_params_every,
        ..ButterflyConfig::default()
    };
    let config = EngineSwarmConfig {
        mode: ModeSettings::Butterfly {
            target_batch: u64::from(PEERS) * 32,
            butterfly,
        },
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
    };
    EngineSwarm::new(&scenario, config).expect("a swarm")
}

/// Runs `secs`, then lets every peer finish and hand over its parameters; returns the
/// spread of the parameters at the start and at the end.
fn spread(swarm: &mut EngineSwarm, secs: f64) -> (f64, f64) {
    let before = swarm.consensus_distance().expect("four peers");
    swarm.run_until(Time::from_secs_f64(secs)).expect("runs");
    for id in 0..PEERS {
        swarm.finish(id).expect("finish");
    }
    swarm
        .run_until(Time::from_secs_f64(secs + 5.0))
        .expect("finishes");
    (before, swarm.consensus_distance().expect("four peers"))
}

fn parameter_rounds(swarm: &EngineSwarm) -> (usize, usize) {
    let reports = swarm.round_reports();
    let params = reports.iter().filter(|(_, r)| r.parameters).count();
    (params, reports.len())
}

#[test]
fn parameter_rounds_bring_differing_replicas_together() {
    let mut control = swarm(0, CodecSpec::F32);
    let (before, after) = spread(&mut control, 10.0);
    assert!(before > 0.5, "the peers start apart: {before}");
    assert!(
        (after - before).abs() < 1e-6 * before,
        "averaging zero gradients moves no replica: {before} then {after}"
    );
    assert_eq!(parameter_rounds(&control).0, 0);

    let mut synced = swarm(4, CodecSpec::F32);
    let (before, after) = spread(&mut synced, 10.0);
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
    let mut control = swarm(0, int8);
    let (before, control_after) = spread(&mut control, 10.0);
    assert!((control_after - before).abs() < 1e-6 * before);
    let mut synced = swarm(4, int8);
    let (_, after) = spread(&mut synced, 10.0);
    // Every member, the part's reducer too, takes the averages as encoded: the codec's
    // error moves the consensus, but not the replicas apart.
    assert!(
        after < 1e-6,
        "int8 parameter rounds: spread {before} then {after}"
    );
}

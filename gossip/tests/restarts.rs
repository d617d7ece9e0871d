//! Restarts under the same identity: in SGP a restarted peer refuses the quantized shares
//! built on references it lost, and their senders take them back; in the synchronous modes
//! a restart is a crash followed at once by a join.

mod sim_support;

use std::time::Duration;

use murmur_gossip::Time;
use murmur_gossip::sgp::SgpConfig;
use murmur_gossip::sim::{
    self, AlgorithmSpec, ChurnEvent, RingTraining, Scenario, SgpSwarm, SimReport,
};
use murmur_protocol::codec::CodecSpec;

const PEERS: usize = 16;
const STEP_MS: f64 = 100.0;
const RESTARTS: u32 = 100;
/// Restarts are four steps apart, so that no two overlap: a share from one restarted
/// peer's old process refused by another restarted peer would be lost, as for real, and
/// this test counts only what the restarted peers held.
const RESTART_EVERY_MS: f64 = 4.0 * STEP_MS;
const SETTLE_ROUNDS: u64 = 40;

/// 16 peers sharing int8 deviations from per-edge references, with one restart every four
/// steps, 100 in all, each of a peer in turn, nobody told.
fn int8_swarm_with_restarts() -> (Scenario, SgpConfig) {
    let first_ms = 10.0 * STEP_MS;
    let last_ms = first_ms + f64::from(RESTARTS - 1) * RESTART_EVERY_MS;
    let rounds = (last_ms / STEP_MS).ceil() as u64 + SETTLE_ROUNDS;
    let mut scenario = Scenario::new(PEERS, 64, rounds);
    scenario.seed = 7;
    scenario.compute.step_ms = STEP_MS;
    scenario.compute.jitter = 0.2;
    scenario.link.latency_ms = 2.0;
    scenario.link.detect_ms = 30.0;
    // Peers 3, 8, 13, 2, ...: a stride prime to 16 visits every peer before any repeats.
    scenario.churn = (0..RESTARTS)
        .map(|k| ChurnEvent::Restart {
            at_ms: first_ms + f64::from(k) * RESTART_EVERY_MS,
            peer: (3 + 5 * k) % PEERS as u32,
        })
        .collect();
    let config = SgpConfig {
        share_codec: CodecSpec::Int8 { block: 64 },
        ..SgpConfig::default()
    };
    (scenario, config)
}

/// A restarted peer's neighbours go on sending it int8 shares built on references it lost.
/// It refuses each one and its sender takes the share back, so the swarm's total weight at
/// the end is the total at the start minus exactly what the restarted peers held when they
/// restarted, and every refusal is taken back. Were refused shares dropped instead, every
/// restart would also lose a share from each of its in-neighbours.
#[test]
fn mass_sent_to_a_restarted_peer_comes_back_to_its_sender() {
    let (scenario, config) = int8_swarm_with_restarts();
    let mut swarm = SgpSwarm::new(&scenario, &config).expect("valid scenario");
    let before = swarm.total_weight();
    let restarts: Vec<(f64, u32)> = swarm
        .churn()
        .iter()
        .filter_map(|event| match *event {
            ChurnEvent::Restart { at_ms, peer } => Some((at_ms, peer)),
            _ => None,
        })
        .collect();
    assert_eq!(restarts.len(), RESTARTS as usize);

    // What each peer holds the instant before it restarts. Churn is queued before anything
    // else, so nothing else due at that instant runs before the restart.
    let mut held = 0.0;
    for (at_ms, peer) in restarts {
        let at = Time::from_secs_f64(at_ms * 1e-3);
        swarm
            .run_until(at - Duration::from_nanos(1))
            .expect("run to the restart");
        let machine = swarm.peer(peer).expect("a restarted peer is live");
        held += machine.state().weight();
    }
    let end = swarm.round_end(scenario.rounds);
    swarm.run_until(end).expect("run to the end");
    let after = swarm.total_weight();

    let tolerance = 1e-9 * before;
    let lost = before - after;
    assert!(held > 0.0, "the restarted peers held mass");
    assert!(
        (lost - held).abs() <= tolerance,
        "weight lost {lost}, held by the restarted peers {held}: {:e} more went missing",
        lost - held
    );
    assert!(
        (swarm.crashed_weight() - held).abs() <= tolerance,
        "the swarm counts {} lost to restarts, the peers held {held}",
        swarm.crashed_weight()
    );
    assert_eq!(swarm.dropped_weight(), 0.0);

    let refusals = swarm.share_refusals();
    assert!(
        refusals.refused >= u64::from(RESTARTS),
        "at least one share refused per restart: {refusals:?}"
    );
    assert_eq!(refusals.taken_back, refusals.refused, "{refusals:?}");
    assert_eq!(refusals.lost, 0, "{refusals:?}");
    // Refused shares are folded back in by their senders, whose counters say so too.
    let returned: u64 = swarm
        .live_peers()
        .map(|peer| peer.stats().shares_returned)
        .sum();
    assert!(
        returned > 0,
        "the senders counted the shares they took back"
    );

    // And the swarm still agrees, on the mass that remains.
    let record = swarm.measure(scenario.rounds);
    assert_eq!(record.live_peers, PEERS);
    assert!(record.consensus_error < 1e-4, "{record:?}");
    let summary = swarm.report().summary;
    assert_eq!(summary.share_refusals, Some(refusals));
}

/// `action = "restart"` in a scenario file is a restart.
#[test]
fn a_restart_is_written_as_action_restart() {
    let event: ChurnEvent =
        serde_json::from_str(r#"{ "action": "restart", "at_ms": 1500.0, "peer": 3 }"#)
            .expect("a restart event");
    assert_eq!(
        event,
        ChurnEvent::Restart {
            at_ms: 1500.0,
            peer: 3
        }
    );
}

/// The run of a synchronous-mode scenario with `churn`.
fn sync_run(algorithm: AlgorithmSpec, churn: Vec<ChurnEvent>) -> SimReport {
    let mut scenario = sim_support::quadratic(8, 256, 60, 9, algorithm, sim_support::TABLE_LINK);
    scenario.compute.jitter = 0.05;
    scenario.churn = churn;
    sim::run(&scenario).expect("valid scenario")
}

/// Butterfly and sync-ring peers keep no identity a restarted process could come back
/// under: a restart runs exactly as a crash followed at the same instant by a join.
#[test]
fn a_synchronous_restart_is_a_crash_and_a_join() {
    let (at_ms, peer) = (2_050.0, 5);
    let butterfly = AlgorithmSpec::Butterfly(sim_support::butterfly(1024, 256, 2));
    let ring = AlgorithmSpec::SyncRing(RingTraining::default());
    for algorithm in [butterfly, ring] {
        let restart = sync_run(algorithm.clone(), vec![ChurnEvent::Restart { at_ms, peer }]);
        let crash_and_join = sync_run(
            algorithm,
            vec![
                ChurnEvent::Crash { at_ms, peer },
                ChurnEvent::Join { at_ms },
            ],
        );
        let summary = &restart.summary;
        assert_eq!(
            restart.rounds, crash_and_join.rounds,
            "{}",
            summary.algorithm
        );
        assert_eq!(summary.peers_end, 8, "{}", summary.algorithm);
        assert_eq!(
            summary.averaging, crash_and_join.summary.averaging,
            "{}",
            summary.algorithm
        );
    }
}

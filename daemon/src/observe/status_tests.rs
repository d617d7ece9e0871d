use std::time::Duration;

use murmur_gossip::net::{BandwidthEstimator, Direction};
use murmur_protocol::message::AveragingMode;

use super::*;
use crate::observe::averaging::RoundOutcome;
use crate::observe::network::tests::peer;

fn board() -> StatusBoard {
    StatusBoard::new(StatusIdentity {
        peer_id: peer(0).to_string(),
        swarm: "tiny-lm".to_owned(),
        mode: "butterfly".to_owned(),
        codec: "int8".to_owned(),
        device: "cuda:0".to_owned(),
    })
}

fn heartbeat(step: u64) -> HeartbeatBody {
    HeartbeatBody {
        step,
        timestamp_ms: 1_700_000_000_000,
        samples_per_s: 96.0,
        upload_bytes_per_s: 10_000_000,
        download_bytes_per_s: 20_000_000,
        mode: AveragingMode::Butterfly,
        samples_accumulated: 0,
        looking_round: 0,
        looking_until_ms: 0,
        incarnation: 1,
    }
}

fn round(group_size: u32) -> RoundSummary {
    RoundSummary {
        mode: AveragingMode::Butterfly,
        outcome: RoundOutcome::Partial,
        duration: Duration::from_millis(1500),
        coverage: 0.5,
        group_size,
        out_peer: Some(peer(9)),
        stragglers_dropped: 1,
        parts_timed_out: 0,
    }
}

#[test]
fn a_report_round_trips_through_json() {
    let board = board();
    board.record_step(42, 4200, 1.75, 320.0);
    board.set_eval_loss(1.9);
    board.record_heartbeat(peer(1), &heartbeat(41));
    board.record_round(&round(3));
    board.set_paused(true);
    let bandwidth = BandwidthEstimator::new(1.0, 1);
    bandwidth.record(
        peer(1),
        Direction::Download,
        5_000_000,
        Duration::from_secs(1),
    );
    let net = NetMetricsSnapshot {
        tensor_bytes_sent: 123,
        tensor_bytes_received: 456,
        ..NetMetricsSnapshot::default()
    };
    let report = board.report(Some(net), &bandwidth.all(), Vec::new());

    let json = serde_json::to_string(&report).expect("serializes");
    let back: StatusReport = serde_json::from_str(&json).expect("parses");
    assert_eq!(back, report);

    assert_eq!(report.device, "cuda:0");
    assert_eq!((report.step, report.samples), (42, 4200));
    assert_eq!((report.loss, report.eval_loss), (Some(1.75), Some(1.9)));
    assert!(report.paused);
    assert_eq!((report.bytes_sent, report.bytes_received), (123, 456));
    assert_eq!(report.peers.len(), 1);
    let p = &report.peers[0];
    assert_eq!(p.peer_id, peer(1).to_string());
    assert_eq!(p.last_heartbeat_step, 41);
    assert_eq!(p.reported_upload_bytes_per_s, 10_000_000);
    assert_eq!(p.measured_download_bytes_per_s, Some(5_000_000.0));
    assert_eq!(p.measured_upload_bytes_per_s, None);
    let r = &report.last_rounds[0];
    assert_eq!(
        (r.mode.as_str(), r.outcome.as_str()),
        ("butterfly", "partial")
    );
    assert_eq!((r.duration_s, r.coverage, r.group_size), (1.5, 0.5, 3));
    assert_eq!(r.out_peer, Some(peer(9).to_string()));
}

#[test]
fn a_diverged_loss_reads_as_null_and_the_json_still_parses() {
    let board = board();
    board.record_step(1, 8, f64::NAN, f64::INFINITY);
    board.set_eval_loss(f64::NEG_INFINITY);
    let report = board.report(None, &[], Vec::new());
    let json = serde_json::to_value(&report).expect("serializes");
    assert!(json["loss"].is_null(), "{json}");
    assert!(json["eval_loss"].is_null(), "{json}");
    assert_eq!(json["samples_per_s"], 0.0);
    let back: StatusReport = serde_json::from_value(json).expect("parses");
    assert_eq!(back, report);
}

#[test]
fn only_the_last_rounds_are_kept_newest_first() {
    let board = board();
    let total = u32::try_from(LAST_ROUNDS).expect("small") + 5;
    for group_size in 1..=total {
        board.record_round(&round(group_size));
    }
    let rounds = board.report(None, &[], Vec::new()).last_rounds;
    assert_eq!(rounds.len(), LAST_ROUNDS);
    let sizes: Vec<u32> = rounds.iter().map(|r| r.group_size).collect();
    let expected: Vec<u32> = (6..=total).rev().collect();
    assert_eq!(sizes, expected);
}

#[test]
fn peers_are_updated_in_place_forgotten_and_bounded() {
    let board = board();
    board.record_heartbeat(peer(1), &heartbeat(1));
    board.record_heartbeat(peer(1), &heartbeat(2));
    board.record_heartbeat(peer(2), &heartbeat(7));
    let peers = board.report(None, &[], Vec::new()).peers;
    assert_eq!(peers.len(), 2);
    let first = peers.iter().find(|p| p.peer_id == peer(1).to_string());
    assert_eq!(first.map(|p| p.last_heartbeat_step), Some(2));
    board.forget_peer(&peer(1));
    assert_eq!(board.report(None, &[], Vec::new()).peers.len(), 1);

    let listed = u16::try_from(MAX_LISTED_PEERS).expect("small");
    for n in 10..listed + 20 {
        board.record_heartbeat(peer(n), &heartbeat(3));
    }
    assert_eq!(
        board.report(None, &[], Vec::new()).peers.len(),
        MAX_LISTED_PEERS
    );
}

#[tokio::test]
async fn pausing_flips_the_flag_and_wakes_a_waiting_run_loop() {
    let board = board();
    let mut watch = board.paused_watch();
    assert!(!board.is_paused());
    assert!(
        board.set_paused(true),
        "pausing a running daemon changes it"
    );
    assert!(!board.set_paused(true), "pausing twice changes nothing");
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("woken within 5 s")
        .expect("board alive");
    assert!(*watch.borrow_and_update());
    assert!(board.clone().set_paused(false), "a clone shares the flag");
    assert!(!board.is_paused());
    assert!(!board.report(None, &[], Vec::new()).paused);
}

fn sgp_board() -> StatusBoard {
    StatusBoard::new(StatusIdentity {
        mode: "sgp".to_owned(),
        ..board().identity()
    })
}

fn sgp_heartbeat(step: u64) -> HeartbeatBody {
    HeartbeatBody {
        mode: AveragingMode::Sgp,
        ..heartbeat(step)
    }
}

/// One minute of an SGP swarm where two peers heartbeat every second, stepping 9 times a
/// second, and this one steps `own_per_second` times a second.
fn a_minute_of_sgp(board: &StatusBoard, own_per_second: u64) -> std::time::Instant {
    let start = std::time::Instant::now();
    for s in 0..=60u32 {
        let at = start + Duration::from_secs(u64::from(s));
        let step = u64::from(s);
        board.record_step_at(step * own_per_second, step * 32, 2.0, 30.0, at);
        board.record_heartbeat_at(peer(1), &sgp_heartbeat(step * 9), at);
        board.record_heartbeat_at(peer(2), &sgp_heartbeat(step * 9), at);
    }
    start + Duration::from_secs(60)
}

#[test]
fn an_sgp_peer_at_a_third_of_its_peers_speed_reads_as_a_straggler() {
    let board = sgp_board();
    let now = a_minute_of_sgp(&board, 3);
    let reading = board.stragglers(now).expect("rates known after a minute");
    let ratio = reading.ratio.expect("a ratio");
    assert!((ratio - 1.0 / 3.0).abs() < 1e-9, "{ratio}");
    assert_eq!(reading.slow_peers, 1);

    let even = sgp_board();
    let now = a_minute_of_sgp(&even, 9);
    let reading = even.stragglers(now).expect("rates known after a minute");
    assert_eq!(reading.slow_peers, 0);
    assert!((reading.ratio.expect("a ratio") - 1.0).abs() < 1e-9);
}

#[test]
fn straggler_readings_need_sgp_and_forget_departed_peers() {
    let round_mode = board();
    let start = std::time::Instant::now();
    for s in 0..=60u32 {
        let at = start + Duration::from_secs(u64::from(s));
        round_mode.record_step_at(u64::from(s), 0, 2.0, 30.0, at);
        round_mode.record_heartbeat_at(peer(1), &heartbeat(u64::from(s) * 9), at);
    }
    assert_eq!(
        round_mode.stragglers(start + Duration::from_secs(60)),
        None,
        "heartbeat steps are rounds outside SGP"
    );

    let board = sgp_board();
    let now = a_minute_of_sgp(&board, 3);
    board.forget_peer(&peer(1));
    board.forget_peer(&peer(2));
    assert_eq!(board.stragglers(now), None, "no peer left to compare with");
}

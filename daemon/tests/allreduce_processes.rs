//! Averaging between real processes over QUIC, through `murmur bench allreduce`: the
//! butterfly, the ring and push-sum gossip give the weighted mean the simulator proved
//! they give (exactly for `f32`, within the codec's bound for `int8`), and a member killed
//! with `kill -9` mid-round costs the survivors at most the chunk timeouts.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Runs `murmur bench allreduce ... --json` and returns its summary.
fn bench(args: &[&str]) -> Value {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .args(["bench", "allreduce", "--json"])
        .args(args)
        .output()
        .expect("murmur runs");
    assert!(
        output.status.success(),
        "bench allreduce {args:?} failed after {:?}: {}",
        started.elapsed(),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().expect("a summary line");
    serde_json::from_str(line).expect("the summary is JSON")
}

fn rounds(summary: &Value) -> Vec<Value> {
    summary["rounds"].as_array().expect("rounds").clone()
}

fn field(round: &Value, key: &str) -> f64 {
    round[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} in {round}"))
}

#[test]
fn butterfly_and_ring_give_the_exact_weighted_mean_with_f32() {
    for algo in ["butterfly", "ring"] {
        let summary = bench(&[
            "--peers",
            "3",
            "--elements",
            "20000",
            "--algo",
            algo,
            "--rounds",
            "2",
        ]);
        let rounds = rounds(&summary);
        assert_eq!(rounds.len(), 2, "{algo}");
        for round in &rounds {
            assert_eq!(field(round, "coverage"), 1.0, "{algo}: {round}");
            // f32 sums in a different order than the f64 reference: rounding only.
            assert!(field(round, "rel_error") < 1e-6, "{algo}: {round}");
        }
    }
}

#[test]
fn butterfly_with_int8_stays_within_the_codec_bound() {
    // int8 with blocks of 64: each element is off by at most its block's |max| / 254 per
    // quantization, and a value is quantized twice (to its reducer and back), so at most
    // max|x| / 127 per element; for these sinusoids (max/rms ≤ √2 per peer and in the mean)
    // the relative error of the vector is at most √2 / 127 ≈ 0.0111.
    let summary = bench(&[
        "--peers",
        "3",
        "--elements",
        "20000",
        "--codec",
        "int8:64",
        "--rounds",
        "2",
    ]);
    for round in rounds(&summary) {
        assert_eq!(field(&round, "coverage"), 1.0, "{round}");
        let error = field(&round, "rel_error");
        assert!(error > 0.0 && error < 0.0112, "{round}");
    }
}

#[test]
fn push_sum_gossip_converges_to_the_mean() {
    let summary = bench(&[
        "--peers",
        "4",
        "--elements",
        "5000",
        "--algo",
        "sgp",
        "--rounds",
        "6",
    ]);
    let rounds = rounds(&summary);
    let first = field(&rounds[0], "rel_error");
    let last = field(&rounds[rounds.len() - 1], "rel_error");
    assert!(
        last < first / 4.0,
        "the error fell from {first} to only {last} in {} rounds",
        rounds.len()
    );
}

#[test]
fn a_member_killed_mid_round_costs_the_survivors_at_most_the_chunk_timeouts() {
    let summary = bench(&[
        "--peers",
        "4",
        "--elements",
        "40000",
        "--rounds",
        "5",
        "--kill-peer",
        "2",
        "--kill-at-round",
        "2",
        "--keep-logs",
    ]);
    // The peers' folder, named in every failure below (with each peer's round lines in
    // `rounds.jsonl`), removed at the end.
    let logs = summary["logs"]
        .as_str()
        .expect("--keep-logs names the folder");
    let rounds = rounds(&summary);
    // The victim dies as the first peer finishes round 1: in round 2, or at the end of
    // round 1 for peers still finishing it.
    let no_fault = field(&rounds[0], "time_s");
    // The butterfly defaults: chunk timeout 10 s.
    let bound = no_fault + 2.0 * Duration::from_secs(10).as_secs_f64();
    // Periods count the waits between rounds too: matchmaking, where a dead peer never
    // asks to join, and its silence is noticed within 1.6 heartbeat intervals.
    for round in &rounds[1..] {
        for key in ["time_s", "period_s"] {
            let time = field(round, key);
            assert!(
                time <= bound,
                "{key} {time} s; bound {bound} s: {round}; logs in {logs}"
            );
        }
    }
    // Round 2 either still had the victim as a member (then the survivors report that its
    // part could not be whole) or formed without it (the survivors' group, complete).
    let (group, coverage_all) = (
        field(&rounds[2], "group_max"),
        field(&rounds[2], "coverage_all"),
    );
    assert!(
        (group == 4.0 && coverage_all < 1.0) || (group == 3.0 && coverage_all == 1.0),
        "round 2: {}; logs in {logs}",
        rounds[2]
    );
    // From then on the three survivors average as one group: never split, never alone.
    for round in &rounds[3..] {
        for (key, want) in [
            ("group_min", 3.0),
            ("group_max", 3.0),
            ("coverage", 1.0),
            ("coverage_all", 1.0),
        ] {
            assert_eq!(field(round, key), want, "{key}: {round}; logs in {logs}");
        }
    }
    let _ = std::fs::remove_dir_all(logs);
}

#[test]
fn eight_processes_find_each_other_from_one_bootstrap_address_within_10_s() {
    // Every peer is given only peer 0's address; each waits until it is connected to all
    // seven others, which it can only learn through Kademlia.
    let summary = bench(&["--peers", "8", "--elements", "1000", "--rounds", "1"]);
    let discovery = summary["discovery_s"].as_f64().expect("discovery_s");
    assert!(discovery > 0.0 && discovery <= 10.0, "{discovery} s");
    assert_eq!(field(&rounds(&summary)[0], "coverage"), 1.0);
}

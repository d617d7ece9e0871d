//! Churn soak, short version: six `murmur run` peers training with SGP, and again with
//! butterfly all-reduce, in network namespaces for about two minutes while `murmur local --churn --churn-every 2-5`
//! kills one with `kill -9` every 2 to 5 s and restarts it 2 s later, against a churn-free
//! run of the same steps.
//!
//! On the survivors (peer 0 is never killed): no 10 s without a completed averaging round,
//! no hung process, resident memory at most 10% above its level after the warm-up, and the
//! final eval loss within 5% of the churn-free run's after as long (wall time from peer
//! 0's start; see `churn`'s docs).
//!
//! Needs root, iproute2 and the `murmur` binary of the same profile (`cargo build -p
//! murmur`). `murmur-scenario churn --long` runs the 30-minute version.

use murmur_netns::scenario::churn;

mod common;

#[test]
fn survivors_keep_averaging_without_leaking_through_two_minutes_of_churn() {
    soak("churn", "sgp");
}

#[test]
fn butterfly_survivors_keep_averaging_without_leaking_through_two_minutes_of_churn() {
    soak("churn-butterfly", "butterfly");
}

/// One soak in `mode`, its output under `name`; the bounds are checked by the scenario.
fn soak(name: &str, mode: &'static str) {
    let options = common::options(name);
    let out = &options.out;
    let report = churn::run_mode(&options, mode).unwrap_or_else(|error| panic!("{error:#}"));
    let json = common::passing_json(&report, &options);
    assert!(
        report.survivors.iter().any(|s| s.peer == 0),
        "peer 0 is never killed, so it survives: {json}"
    );
    assert!(out.join("churn-rss.png").is_file());
    let _ = std::fs::remove_dir_all(out);
}

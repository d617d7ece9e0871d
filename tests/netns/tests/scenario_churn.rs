//! Churn soak, short version: six `murmur run` peers training with SGP and six training
//! with butterfly all-reduce, each swarm in its own network namespaces, both at once, for
//! about two minutes while `murmur local --churn --churn-every 2-5` kills one peer of each
//! with `kill -9` every 2 to 5 s and restarts it 2 s later, against a churn-free run of the
//! same steps (the two churn-free runs also at once).
//!
//! On the survivors (peer 0 is never killed): no 10 s without a completed averaging round,
//! no hung process, resident memory at most 10% above its level after the warm-up, and the
//! final eval loss at most 5% above the churn-free run's after as long (wall time from
//! peer 0's start; see `churn`'s docs).
//!
//! The two soaks pace their steps (200 ms each) and want about one core each, so running
//! them side by side halves the wall time; each churn run competes with the other mode's
//! churn run and each churn-free run with the other's churn-free run, so the pair compared
//! shares the same load. The suite runs this test with no other beside it
//! (`.config/nextest.toml`).
//!
//! Needs root, iproute2 and the `murmur` binary of the same profile (`cargo build -p
//! murmur`). `murmur-scenario churn --long` runs the 30-minute version.

use murmur_netns::scenario::churn;

mod common;

#[test]
fn survivors_of_sgp_and_butterfly_keep_averaging_without_leaking_through_two_minutes_of_churn() {
    // Each soak's panic message is printed by the panic hook as it happens.
    let failed: Vec<&str> = std::thread::scope(|scope| {
        [("churn", "sgp"), ("churn-butterfly", "butterfly")]
            .map(|(name, mode)| (mode, scope.spawn(move || soak(name, mode))))
            .into_iter()
            .filter_map(|(mode, soak)| soak.join().is_err().then_some(mode))
            .collect()
    });
    assert!(
        failed.is_empty(),
        "the {failed:?} soak failed: see its panic above"
    );
}

/// One soak in `mode`, its output under `name`; the bounds are checked by the scenario.
fn soak(name: &str, mode: &'static str) {
    let options = common::options(name);
    let out = &options.out;
    let report =
        churn::run_mode(&options, mode).unwrap_or_else(|error| panic!("{mode}: {error:#}"));
    let json = common::passing_json(&report, &options);
    assert!(
        report.survivors.iter().any(|s| s.peer == 0),
        "{mode}: peer 0 is never killed, so it survives: {json}"
    );
    assert!(out.join("churn-rss.png").is_file());
    let _ = std::fs::remove_dir_all(out);
}

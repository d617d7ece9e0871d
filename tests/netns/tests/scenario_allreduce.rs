//! The averaging scenarios' short versions: real `murmur bench allreduce` peers in network
//! namespaces, on shaped links.
//!
//! - the butterfly moves a 4 MiB vector among 4 peers on 50 Mbit/s, 20 ms links at a bus
//!   bandwidth of at least 0.35 of the link rate with f32, and with int8 beats the f32
//!   bound itself (bus bandwidth counted in f32 bytes above the link rate);
//! - among 8 peers with 50 ms round trips, the butterfly averages a 4 KiB vector within
//!   4 round trips, faster than the ring.
//!
//! The bars leave room for a debug build on two shared cores; `murmur-scenario NAME --long`
//! in release measures against the issue's own. They need root, iproute2 and the `murmur`
//! binary of the same profile (`cargo build -p murmur`). They run one at a time.

use std::sync::{Mutex, MutexGuard};

use murmur_netns::scenario::allreduce;

mod common;

/// One harness at a time: the measurements share two cores with everything else.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    // A test that failed while holding the lock leaves nothing shared behind.
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn butterfly_moves_a_vector_near_the_link_rate() {
    let _serial = serial();
    let options = common::options("butterfly-efficiency");
    let report =
        allreduce::butterfly_efficiency(&options).unwrap_or_else(|error| panic!("{error:#}"));
    let json = common::passing_json(&report, &options);
    let cases = json["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 2, "f32 and int8: {json}");
    for case in cases {
        // f32 sums in a different order than the f64 reference; int8 within its bound.
        let bound = if case["codec"] == "f32" { 1e-6 } else { 2e-2 };
        let error = case["max_rel_error"].as_f64().expect("max_rel_error");
        assert!(error < bound, "relative error {error} past {bound}: {case}");
    }
    assert!(options.out.join("butterfly-efficiency.png").is_file());
    let _ = std::fs::remove_dir_all(&options.out);
}

#[test]
fn butterfly_averages_a_small_vector_within_a_few_round_trips() {
    let _serial = serial();
    let options = common::options("latency");
    let report = allreduce::latency(&options).unwrap_or_else(|error| panic!("{error:#}"));
    let json = common::passing_json(&report, &options);
    assert!(
        json["butterfly"]["max_rel_error"].as_f64().expect("error") < 1e-6,
        "{json}"
    );
    assert!(options.out.join("latency.png").is_file());
    let _ = std::fs::remove_dir_all(&options.out);
}

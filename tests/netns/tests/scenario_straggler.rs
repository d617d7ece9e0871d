//! The straggler scenario's short version: 4 real `murmur local` peers in network namespaces
//! on 100 Mbit/s links with 20 ms round trips, 1 s synthetic steps, run for 16 s after every
//! peer is ready, without and with one peer 4 times slower.
//!
//! `sgp` keeps at least 85% of its samples/s scaled by `((N−1) + ¼)/N`, and `sync-ring`
//! drops to at most 30%: the bounds, which synthetic steps make independent of the
//! machine's speed. It needs root, iproute2 and the `murmur` binary of the same profile
//! (`cargo build -p murmur`).

use murmur_netns::scenario::straggler;

mod common;

#[test]
fn sgp_loses_only_the_stragglers_share_and_the_sync_ring_waits_for_it() {
    let options = common::options("straggler");
    let out = &options.out;
    let report = straggler::run(&options).unwrap_or_else(|error| panic!("{error:#}"));
    let json = common::passing_json(&report, &options);
    let modes = json["modes"].as_array().expect("modes");
    let names: Vec<&str> = modes.iter().filter_map(|m| m["mode"].as_str()).collect();
    assert_eq!(names, ["sgp", "sync-ring"], "{json}");
    // The synthetic step sets the straggler's pace: 16 samples every 4 s at most. Its
    // steps are timed by the progress lines that report them, each up to one progress
    // period (0.5 s) late, and the 16 s window holds as few as two of them, so two steps
    // may measure as 32 samples in 7.5 s; 2% more for a scheduler's delay on two cores.
    let straggler_pace_bound = 2.0 * 16.0 / (2.0 * 4.0 - 0.5) * 1.02;
    for mode in modes {
        let per_peer: Vec<f64> = mode["straggled"]["per_peer_samples_per_s"]
            .as_array()
            .expect("per-peer rates")
            .iter()
            .filter_map(serde_json::Value::as_f64)
            .collect();
        assert_eq!(per_peer.len(), 4, "{mode}");
        assert!(per_peer[3] <= straggler_pace_bound, "{mode}");
    }
    // sgp's other peers do not wait for the straggler: it steps at about a quarter of their
    // pace. The ring's peers all step at its pace, a quarter or less of their own.
    let rate = |mode: &serde_json::Value, key: &str| mode[key].as_f64().expect(key);
    let sgp_pace =
        rate(&modes[0], "straggler_samples_per_s") / rate(&modes[0], "fast_peer_samples_per_s");
    assert!((0.15..=0.35).contains(&sgp_pace), "{sgp_pace}: {json}");
    let ring_pace = rate(&modes[1], "fast_peer_samples_per_s")
        / (modes[1]["baseline"]["samples_per_s"]
            .as_f64()
            .expect("rate")
            / 4.0);
    assert!(ring_pace <= 0.4, "{ring_pace}: {json}");
    for file in ["straggler.csv", "throughput-stragglers.png"] {
        assert!(out.join(file).is_file(), "{file} was not written");
    }
    // A run that passed leaves nothing behind; one that failed keeps its folder.
    let _ = std::fs::remove_dir_all(out);
}

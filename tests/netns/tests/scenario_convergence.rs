//! The convergence scenario's short version: for each of `sgp`, `butterfly`, `local-sgd` and
//! `sync-ring`, 4 real `murmur local` peers in network namespaces train 30 synthetic steps of
//! 200 ms on 100 Mbit/s links with 20 ms round trips. Every peer finishes, every mode's mean
//! eval loss goes at least 30% of the way to the task's floor, and the loss-over-time plot
//! is written. It needs root, iproute2 and the `murmur` binary of the same profile
//! (`cargo build -p murmur`).

use murmur_netns::scenario::convergence;

mod common;

#[test]
fn every_mode_learns_on_shaped_links_and_its_loss_is_plotted_over_time() {
    let options = common::options("convergence");
    let out = &options.out;
    let report = convergence::run(&options).unwrap_or_else(|error| panic!("{error:#}"));
    let json = common::passing_json(&report, &options);
    let modes = json["modes"].as_array().expect("modes");
    let names: Vec<&str> = modes.iter().filter_map(|m| m["mode"].as_str()).collect();
    assert_eq!(
        names,
        ["sgp", "butterfly", "local-sgd", "sync-ring"],
        "{json}"
    );
    for mode in modes {
        // 30 steps of 200 ms take 6 s at the least; the run also starts and averages.
        let wall_s = mode["wall_s"].as_f64().expect("wall_s");
        assert!(wall_s >= 6.0, "{mode}");
        assert!(
            mode["bytes_sent_per_peer"].as_f64().expect("bytes") > 0.0,
            "{mode}"
        );
    }
    for file in ["convergence.csv", "loss-over-time.png"] {
        assert!(out.join(file).is_file(), "{file} was not written");
    }
    let csv = std::fs::read_to_string(out.join("convergence.csv")).expect("convergence.csv");
    for name in names {
        let points = csv
            .lines()
            .filter(|l| l.starts_with(&format!("{name},")))
            .count();
        assert!(points >= 3, "{name} has {points} points on its curve");
    }
    // A run that passed leaves nothing behind; one that failed keeps its folder.
    let _ = std::fs::remove_dir_all(out);
}

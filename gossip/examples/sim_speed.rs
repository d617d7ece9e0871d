//! How fast the simulator runs SGP: 1,024 peers × 1,000 rounds on 1,000-element vectors.
//!
//! Run with `cargo run --release -p murmur-gossip --example sim_speed`; the target is under
//! a minute on one core. Prints the summary and the wall-clock time.

use std::time::Instant;

use murmur_gossip::sim::{self, Scenario};

fn main() -> Result<(), sim::SimError> {
    let mut scenario = Scenario::new(1024, 1000, 1000);
    scenario.name = "sim-speed".into();
    scenario.seed = 1;
    scenario.compute.jitter = 0.1;
    scenario.link.latency_ms = 5.0;
    scenario.link.uplink_mbps = Some(1000.0);
    scenario.link.downlink_mbps = Some(1000.0);

    let started = Instant::now();
    let report = sim::run(&scenario)?;
    let wall = started.elapsed();

    print!("{}", report.summary);
    println!("{:<28} {:.2} s", "wall-clock time", wall.as_secs_f64());
    let steps = report.rounds.last().map_or(0, |record| record.steps);
    println!(
        "{:<28} {:.0}",
        "peer-steps per second",
        steps as f64 / wall.as_secs_f64()
    );
    Ok(())
}

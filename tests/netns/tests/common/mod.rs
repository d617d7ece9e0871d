//! What every scenario test does the same way: options for the short version with its
//! output in a folder of its own, and a report that must pass.

use std::path::PathBuf;

use murmur_netns::scenario::{Report, ScenarioOptions};

/// The short version of scenario `name`, writing into a temporary folder named after it
/// and this process.
pub(crate) fn options(name: &str) -> ScenarioOptions {
    let out = std::env::temp_dir().join(format!("murmur-scenario-{name}-{}", std::process::id()));
    ScenarioOptions::beside_netem(
        false,
        out,
        PathBuf::from(env!("CARGO_BIN_EXE_murmur-netem")),
    )
    .unwrap_or_else(|error| panic!("{error:#}"))
}

/// Prints `report` and fails unless every bound held; returns its JSON. A failure names
/// `options.out`, where the peers' folders stay.
pub(crate) fn passing_json(report: &dyn Report, options: &ScenarioOptions) -> serde_json::Value {
    let json = report.to_json();
    eprintln!("{json}");
    if let Err(missed) = report.check() {
        panic!(
            "{missed}\n{json}\n(the run's files are in {})",
            options.out.display()
        );
    }
    json
}

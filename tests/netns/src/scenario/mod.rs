//! The fault and performance scenarios: real `murmur` processes in the harness's namespaces,
//! on shaped links.
//!
//! Each scenario has a short version, which the tests in `tests/netns/tests/scenario_*.rs` run
//! in CI and hold to its acceptance bounds, and a long version, which
//! `murmur-scenario NAME --long` runs to produce the numbers, tables and plots recorded in
//! BENCHMARKS.md. A scenario returns a report: its measurements as JSON, and a check that
//! says which bound, if any, it missed.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use crate::Harness;

pub mod allreduce;
mod chart;
pub mod churn;
pub mod convergence;
mod fault_plot;
mod font;
mod local_swarm;
mod log_window;
pub mod partition;
mod peer_lines;
pub mod straggler;

/// How a scenario runs.
#[derive(Debug, Clone)]
pub struct ScenarioOptions {
    /// The long version (the benchmark) instead of the short one (the CI test).
    pub long: bool,
    /// Where the scenario writes its hosts file, peers' folders, CSV tables and PNG plots.
    pub out: PathBuf,
    /// The `murmur` binary the peers run.
    pub murmur: PathBuf,
    /// The `murmur-netem` binary of the harness's delay stage.
    pub netem: PathBuf,
    /// Run only the cases whose names hold this text (`butterfly-efficiency`, `quic-window`
    /// and `stage-offloads`; a case's name is what its report's table and log lines give,
    /// such as `N=8 int8:64 200 Mbit/s window 500000 B`). `None` runs them all.
    pub cases: Option<String>,
}

impl ScenarioOptions {
    /// Options for `out`, with `murmur` and `murmur-netem` found beside `netem` (the binaries
    /// of one cargo build share a folder).
    pub fn beside_netem(long: bool, out: PathBuf, netem: PathBuf) -> anyhow::Result<Self> {
        let murmur = netem.with_file_name("murmur");
        if !murmur.is_file() {
            bail!(
                "no murmur binary at {}: build it in the same profile first \
                 (`cargo build -p murmur`, or `--release` for the long versions)",
                murmur.display()
            );
        }
        std::fs::create_dir_all(&out)
            .with_context(|| format!("cannot create the output folder {}", out.display()))?;
        Ok(Self {
            long,
            out,
            murmur,
            netem,
            cases: None,
        })
    }
}

/// What a scenario measured.
pub trait Report {
    /// The measurements, as one JSON object.
    fn to_json(&self) -> serde_json::Value;
    /// `Ok` when every acceptance bound of this version of the scenario holds; otherwise
    /// which one failed, with the measured and the bound values.
    fn check(&self) -> Result<(), String>;
}

/// A [`Report::check`]'s answer from the bounds it found missed: `Ok` when none was.
pub(crate) fn verdict(missed: &[String]) -> Result<(), String> {
    if missed.is_empty() {
        Ok(())
    } else {
        Err(missed.join("; "))
    }
}

/// Writes the hosts file that `murmur local --hosts` and `murmur bench allreduce --hosts`
/// read: peer `i` runs in the harness's namespace `i` and listens on its address.
pub fn write_hosts_file(harness: &Harness, path: &Path) -> anyhow::Result<()> {
    let mut text = String::new();
    for peer in 0..harness.peer_count() {
        text.push_str(&format!(
            "[[peer]]\nlaunch = [\"ip\", \"netns\", \"exec\", \"{}\"]\nlisten_ip = \"{}\"\n\n",
            harness.peer_namespace(peer),
            harness.peer_address(peer)
        ));
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

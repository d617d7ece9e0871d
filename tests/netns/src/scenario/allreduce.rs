//! How fast real processes average over shaped links: `murmur bench allreduce --hosts` in the
//! harness's namespaces.
//!
//! - **`butterfly-efficiency`**: N peers each hold an `S`-byte f32 vector and average it with
//!   the butterfly all-reduce over links of rate `B`. Every peer sends and receives
//!   `2(N−1)/N·S` bytes, so a round takes at least `2(N−1)/N·S/B`; the report gives the bus
//!   bandwidth `busbw = (S/t)·2(N−1)/N` over `B`, the fraction of that bound a round reaches
//!   (the measure of NCCL's tests). With `int8` the bytes on the wire shrink about 3.8 times
//!   while `S` stays the f32 size, so busbw/B may exceed 1.
//! - **`latency`**: a 4 KiB vector, where bandwidth costs nothing and round trips are all
//!   that count. The butterfly needs two one-way trips (parts to their reducers, averages
//!   back); the ring needs `2(N−1)` of them, one per step. The report gives round times in
//!   round trips for both.
//! - **`quic-window`**: the butterfly with QUIC's default receive window and with a small
//!   one, on links slow enough that the peers' CPU is not the limit.
//!
//! Round times and periods are the benchmark's own: a round's time is the latest time any
//! peer had its whole averaged vector, counted from when that peer began the round; its
//! period is the time from the previous round's last result to this one's, waits between
//! rounds included. Bus bandwidth is reckoned from periods, what back-to-back rounds really
//! cost; the latency bar is on round times. Peers begin each round together, when its group
//! forms by matchmaking. The first round also opens streams and grows congestion windows,
//! so the medians are over the rounds after it.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

use self::cpu::{CpuMonitor, CpuUse};
use self::uplinks::{UplinkMonitor, UplinkSummary};
use super::{ScenarioOptions, write_hosts_file};
use crate::{Harness, LinkShape, Topology, run_bounded};

mod cpu;
mod efficiency;
mod latency;
mod offloads;
mod plot;
mod tcp_probe;
mod uplinks;
mod window;

pub use self::efficiency::{EfficiencyReport, butterfly_efficiency};
pub use self::latency::{LatencyReport, latency};
pub use self::offloads::stage_offloads;
pub use self::window::quic_window;

/// Bytes of an f32 element.
const F32_BYTES: f64 = 4.0;

/// One `murmur bench allreduce` run: the swarm and what it averages.
#[derive(Debug, Clone)]
struct BenchSpec {
    algo: &'static str,
    peers: usize,
    elements: usize,
    codec: &'static str,
    rounds: u32,
    /// The butterfly's sender and reducer timeouts, when not the defaults.
    timeouts: Option<(Duration, Duration)>,
    /// Every peer's QUIC receive window in bytes, when not the default.
    quic_window: Option<u32>,
    /// How long the whole run may take before it is killed.
    limit: Duration,
}

/// What one run measured.
#[derive(Debug, Clone)]
struct BenchRun {
    spec: BenchSpec,
    /// Per round: the time until every peer had its result, seconds.
    round_times_s: Vec<f64>,
    /// Per round: from the previous round's last result to this one's, seconds.
    round_periods_s: Vec<f64>,
    /// The largest relative error against the exact mean over all rounds.
    max_rel_error: f64,
    /// The smallest fraction of the vector averaged over every member, over all rounds.
    min_coverage: f64,
    /// Mean encoded bytes one peer sent per round.
    bytes_sent_per_peer: f64,
    /// CPU use while the run ran.
    cpu: CpuUse,
    /// How fully the peers' uplinks ran.
    uplinks: UplinkSummary,
}

impl BenchRun {
    /// The median round time over the rounds after the first (all rounds when there is
    /// only one).
    fn warm_median_s(&self) -> f64 {
        warm_median(&self.round_times_s)
    }

    /// The median period over the rounds after the first.
    fn warm_median_period_s(&self) -> f64 {
        warm_median(&self.round_periods_s)
    }
}

/// The median over all values but the first (all of them when there is only one).
fn warm_median(values: &[f64]) -> f64 {
    let warm = values.get(1..).filter(|w| !w.is_empty());
    median(warm.unwrap_or(values))
}

/// The middle value (upper middle for an even count); NaN for none.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs `spec` on `harness`, whose hosts file is `hosts`.
fn run_bench(
    options: &ScenarioOptions,
    harness: &Harness,
    hosts: &Path,
    spec: &BenchSpec,
) -> anyhow::Result<BenchRun> {
    let mut command = std::process::Command::new(&options.murmur);
    command
        .args(["bench", "allreduce", "--json", "--hosts"])
        .arg(hosts)
        .args(["--algo", spec.algo, "--codec", spec.codec])
        .args(["--peers", &spec.peers.to_string()])
        .args(["--elements", &spec.elements.to_string()])
        .args(["--rounds", &spec.rounds.to_string()]);
    if let Some((chunk, reducer)) = spec.timeouts {
        command
            .args(["--chunk-timeout-ms", &chunk.as_millis().to_string()])
            .args(["--reducer-timeout-ms", &reducer.as_millis().to_string()]);
    }
    if let Some(window) = spec.quic_window {
        command.args(["--quic-receive-window", &window.to_string()]);
    }
    crate::end_with_parent(&mut command);
    let monitor = CpuMonitor::start(harness);
    let uplink_monitor = UplinkMonitor::start(harness);
    let output = run_bounded(command, spec.limit);
    let cpu = monitor.stop();
    let uplinks = uplink_monitor.stop().summary();
    let output = output.with_context(|| format!("{spec:?}"))?;
    if !output.status.success() {
        bail!(
            "murmur bench allreduce ({spec:?}) failed with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary: Value = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|v| v.get("rounds").is_some())
        .with_context(|| format!("no summary line in the benchmark's output: {stdout}"))?;
    // Every run's summary, per-round details included, for whoever reads the numbers later.
    let mut runs = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(options.out.join("bench-runs.jsonl"))?;
    writeln!(runs, "{summary}")?;
    let rounds = summary["rounds"]
        .as_array()
        .context("the summary has no rounds")?;
    let field = |round: &Value, key: &str| {
        round[key]
            .as_f64()
            .with_context(|| format!("round without {key}: {round}"))
    };
    let mut run = BenchRun {
        spec: spec.clone(),
        round_times_s: Vec::new(),
        round_periods_s: Vec::new(),
        max_rel_error: 0.0,
        min_coverage: 1.0,
        bytes_sent_per_peer: 0.0,
        cpu,
        uplinks,
    };
    for round in rounds {
        run.round_times_s.push(field(round, "time_s")?);
        run.round_periods_s.push(field(round, "period_s")?);
        run.max_rel_error = run.max_rel_error.max(field(round, "rel_error")?);
        run.min_coverage = run.min_coverage.min(field(round, "coverage_all")?);
        run.bytes_sent_per_peer += field(round, "bytes_sent_per_peer")? / rounds.len() as f64;
    }
    if run.round_times_s.len() != spec.rounds as usize {
        bail!(
            "{} rounds reported, {} run",
            run.round_times_s.len(),
            spec.rounds
        );
    }
    Ok(run)
}

/// Builds a harness of `peers` peers on `link`, its delay stage with or without segment
/// offloads, with its hosts file in `out`.
fn build_harness(
    options: &ScenarioOptions,
    peers: usize,
    link: LinkShape,
    offloads: bool,
) -> anyhow::Result<(Harness, PathBuf)> {
    let mut topology = Topology::uniform(peers, link);
    topology.segment_offloads = offloads;
    // At full rate a link holds rate × (its delay + the other's) in the delay stage; give
    // every link room for twice that, so the stage never drops for want of slots.
    topology.queue_packets = topology.queue_packets.max(peers * 2048);
    let harness = Harness::build(topology, &options.netem)?;
    let hosts = options.out.join(format!("hosts-{peers}.toml"));
    write_hosts_file(&harness, &hosts)?;
    Ok((harness, hosts))
}

/// A link of `rate` bits per second whose round trip between two peers is `rtt`: a packet
/// crosses two links each way.
fn link_for_round_trip(rate: u64, rtt: Duration) -> LinkShape {
    LinkShape {
        rate_bits_per_sec: Some(rate),
        delay: rtt / 4,
        loss: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_medians_leave_out_the_first_round() {
        let spec = BenchSpec {
            algo: "butterfly",
            peers: 4,
            elements: 16 << 20,
            codec: "f32",
            rounds: 4,
            timeouts: None,
            quic_window: None,
            limit: Duration::from_secs(1),
        };
        let run = BenchRun {
            spec,
            round_times_s: vec![9.0, 4.0, 5.0, 3.0],
            round_periods_s: vec![9.5, 4.5, 5.5, 3.5],
            max_rel_error: 0.0,
            min_coverage: 1.0,
            bytes_sent_per_peer: 0.0,
            cpu: CpuUse::default(),
            uplinks: UplinkSummary::default(),
        };
        assert_eq!(run.warm_median_s(), 4.0);
        assert_eq!(run.warm_median_period_s(), 4.5);
    }

    #[test]
    fn a_round_trip_is_four_link_delays() {
        let link = link_for_round_trip(1, Duration::from_millis(20));
        let topology = Topology::uniform(2, link);
        assert_eq!(topology.round_trip(0, 1), Duration::from_millis(20));
    }
}

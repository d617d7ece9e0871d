//! `latency`: a 4 KiB vector among 8 peers with 50 ms round trips, where only round trips
//! count; the butterfly against the ring.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use super::plot::{self, LatencySeries};
use super::{BenchRun, BenchSpec, F32_BYTES, build_harness, link_for_round_trip, run_bench};
use crate::scenario::{Report, ScenarioOptions};

/// What `latency` measured: the butterfly's and the ring's rounds of a small vector.
#[derive(Debug)]
pub struct LatencyReport {
    long: bool,
    rtt: Duration,
    rate_bits_per_sec: u64,
    butterfly: BenchRun,
    ring: BenchRun,
    /// The most round trips a warm butterfly round may take in this version.
    butterfly_bound_rtt: f64,
    plot: Option<PathBuf>,
}

/// `latency`: 4 KiB vectors among 8 peers with 50 ms round trips; the butterfly's round must
/// finish within 3 round trips (long; 4 in the short version, for a debug build on two
/// shared cores), and faster than the ring's, whose floor is `2(N−1)` one-way trips.
pub fn latency(options: &ScenarioOptions) -> anyhow::Result<LatencyReport> {
    let peers = 8;
    let rtt = Duration::from_millis(50);
    let rate = 200_000_000;
    let elements = 1024;
    let rounds = if options.long { 20 } else { 5 };
    let limit = Duration::from_secs(if options.long { 300 } else { 120 });
    let (harness, hosts) = build_harness(options, peers, link_for_round_trip(rate, rtt), true)?;
    let spec = |algo| BenchSpec {
        algo,
        peers,
        elements,
        codec: "f32",
        rounds,
        timeouts: None,
        quic_window: None,
        limit,
    };
    let butterfly = run_bench(options, &harness, &hosts, &spec("butterfly"))?;
    let ring = run_bench(options, &harness, &hosts, &spec("ring"))?;
    drop(harness);
    let mut report = LatencyReport {
        long: options.long,
        rtt,
        rate_bits_per_sec: rate,
        butterfly,
        ring,
        butterfly_bound_rtt: if options.long { 3.0 } else { 4.0 },
        plot: None,
    };
    let plot = options.out.join("latency.png");
    let series = [&report.butterfly, &report.ring].map(|run| LatencySeries {
        label: run.spec.algo.to_owned(),
        round_times_s: run.round_times_s.clone(),
    });
    let note = plot::latency(
        &plot,
        &series,
        rtt,
        &[
            (report.butterfly_bound_rtt, "butterfly bar"),
            ((peers - 1) as f64, "ring floor 2(N−1)·RTT/2"),
        ],
        report.bandwidth_bound_s(),
    )?;
    if let Some(note) = note {
        eprintln!("latency: {note}");
    }
    report.plot = Some(plot);
    std::fs::write(options.out.join("latency.md"), report.table())?;
    eprintln!(
        "latency: butterfly {:.2} RTT, ring {:.2} RTT (medians after the first round)",
        report.in_rtt(&report.butterfly),
        report.in_rtt(&report.ring)
    );
    Ok(report)
}

impl LatencyReport {
    /// A run's median warm round, in round trips.
    fn in_rtt(&self, run: &BenchRun) -> f64 {
        run.warm_median_s() / self.rtt.as_secs_f64()
    }

    /// `2(N−1)/N·S/B`, the bandwidth bound, in seconds.
    fn bandwidth_bound_s(&self) -> f64 {
        let n = self.butterfly.spec.peers as f64;
        let bytes = self.butterfly.spec.elements as f64 * F32_BYTES;
        2.0 * (n - 1.0) / n * bytes * 8.0 / self.rate_bits_per_sec as f64
    }

    /// The results as a Markdown table.
    pub fn table(&self) -> String {
        let mut t = String::from(
            "| collective | N | S (KiB) | RTT (ms) | first round (ms) | median after the first (ms) | in RTT | slowest after the first (ms) | floor (RTT) |\n|---|---|---|---|---|---|---|---|---|\n",
        );
        // The butterfly's floor is two one-way trips, the ring's 2(N−1).
        let ring_floor = (self.ring.spec.peers - 1) as f64;
        for (run, floor) in [(&self.butterfly, 1.0), (&self.ring, ring_floor)] {
            let slowest = run
                .round_times_s
                .iter()
                .skip(1)
                .copied()
                .fold(0.0, f64::max);
            t.push_str(&format!(
                "| {} | {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {floor} |\n",
                run.spec.algo,
                run.spec.peers,
                run.spec.elements * 4 / 1024,
                self.rtt.as_millis(),
                run.round_times_s.first().copied().unwrap_or(f64::NAN) * 1e3,
                run.warm_median_s() * 1e3,
                self.in_rtt(run),
                slowest * 1e3,
            ));
        }
        t
    }
}

impl Report for LatencyReport {
    fn to_json(&self) -> Value {
        let run = |r: &BenchRun| {
            json!({
                "round_times_s": r.round_times_s,
                "median_round_after_first_s": r.warm_median_s(),
                "median_round_after_first_rtt": self.in_rtt(r),
                "max_rel_error": r.max_rel_error,
                "min_coverage": r.min_coverage,
                "cpu": r.cpu.to_json(),
            })
        };
        json!({
            "scenario": "latency",
            "long": self.long,
            "peers": self.butterfly.spec.peers,
            "vector_bytes": self.butterfly.spec.elements as f64 * F32_BYTES,
            "rtt_s": self.rtt.as_secs_f64(),
            "rate_bits_per_sec": self.rate_bits_per_sec,
            "bandwidth_bound_s": self.bandwidth_bound_s(),
            "butterfly": run(&self.butterfly),
            "ring": run(&self.ring),
            "butterfly_bound_rtt": self.butterfly_bound_rtt,
            "plot": self.plot.as_ref().map(|p| p.display().to_string()),
        })
    }

    fn check(&self) -> Result<(), String> {
        let butterfly = self.in_rtt(&self.butterfly);
        let ring = self.in_rtt(&self.ring);
        let mut missed = Vec::new();
        for run in [&self.butterfly, &self.ring] {
            if run.min_coverage < 1.0 {
                missed.push(format!(
                    "{}: a round averaged only {:.3} of the vector",
                    run.spec.algo, run.min_coverage
                ));
            }
        }
        if butterfly > self.butterfly_bound_rtt {
            missed.push(format!(
                "butterfly rounds take {butterfly:.2} RTT (median after the first), more than {}",
                self.butterfly_bound_rtt
            ));
        }
        if butterfly >= ring {
            missed.push(format!(
                "butterfly rounds ({butterfly:.2} RTT) are not faster than the ring's ({ring:.2} RTT)"
            ));
        }
        crate::scenario::verdict(&missed)
    }
}

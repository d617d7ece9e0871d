//! The end-of-run summary: per peer and for the swarm, how far the eval loss fell toward the
//! task's floor, what it cost in bytes and time, and which peers failed and where their logs
//! are. Printed as a table, or as one JSON object with `--json`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::args::LocalPlan;
use super::record::{Outcome, PeerRecord};

/// The whole run.
#[derive(Debug, Serialize)]
pub(crate) struct Summary {
    pub(crate) peers: usize,
    /// The built-in task (`--task`).
    pub(crate) task: &'static str,
    pub(crate) mode: &'static str,
    pub(crate) codec: String,
    pub(crate) steps: u64,
    pub(crate) churn: bool,
    /// Whether each peer drew from its own data shard (`--non-iid`).
    pub(crate) non_iid: bool,
    /// The working folder.
    pub(crate) out: String,
    /// Mean over peers of their starting eval loss.
    pub(crate) initial_eval_loss: Option<f64>,
    /// Mean over peers of their final eval loss.
    pub(crate) final_eval_loss: Option<f64>,
    pub(crate) final_eval_loss_min: Option<f64>,
    pub(crate) final_eval_loss_max: Option<f64>,
    pub(crate) loss_floor: Option<f64>,
    /// (initial - final) / (initial - floor): 1 means the swarm reached the floor.
    pub(crate) fraction_to_floor: Option<f64>,
    pub(crate) wall_s: f64,
    /// Mean over peers of the encoded tensor bytes each sent.
    pub(crate) bytes_sent_per_peer: f64,
    pub(crate) bytes_sent_total: u64,
    /// raw f32 bytes / bytes sent, over the whole swarm.
    pub(crate) compression_ratio: Option<f64>,
    pub(crate) samples: u64,
    /// Samples over the whole run's wall time, start-up and the last peers' tail included.
    pub(crate) samples_per_s: f64,
    /// The swarm's samples per second while every peer trained: from the moment the last
    /// peer reported its first samples to the moment the first peer finished (see
    /// [`steady_samples_per_s`]); what `murmur sim` predicts.
    pub(crate) steady_samples_per_s: Option<f64>,
    pub(crate) finished: usize,
    pub(crate) failed: usize,
    /// Peers stopped before their last step (Ctrl-C, the run's bound, `--stop-after`).
    pub(crate) stopped: usize,
    /// Ctrl-C or the overall time bound stopped the run.
    pub(crate) interrupted: bool,
    pub(crate) peer_results: Vec<PeerSummary>,
    /// Things that happened along the way (churn kills, malformed lines).
    pub(crate) notes: Vec<String>,
}

/// One peer.
#[derive(Debug, Serialize)]
pub(crate) struct PeerSummary {
    pub(crate) peer: usize,
    pub(crate) peer_id: String,
    /// `finished`, `stopped` or `failed`.
    pub(crate) status: &'static str,
    pub(crate) error: Option<String>,
    pub(crate) log: String,
    /// Where it trained: `cpu` or `cuda:N`.
    pub(crate) device: Option<String>,
    pub(crate) slowdown: f64,
    pub(crate) steps: u64,
    pub(crate) samples: u64,
    pub(crate) initial_eval_loss: Option<f64>,
    pub(crate) final_eval_loss: Option<f64>,
    pub(crate) loss_floor: Option<f64>,
    pub(crate) fraction_to_floor: Option<f64>,
    /// Seconds from the start of `murmur local` to the peer's `done`.
    pub(crate) wall_s: Option<f64>,
    pub(crate) bytes_sent: u64,
    pub(crate) bytes_received: u64,
    pub(crate) raw_bytes: u64,
    pub(crate) compression_ratio: Option<f64>,
    pub(crate) rounds: u64,
    pub(crate) restarts: u32,
    /// Peak resident memory of its last process (`VmHWM`), from its `done` line.
    pub(crate) peak_rss_bytes: Option<u64>,
}

/// What the summary is built from besides the records.
#[derive(Debug)]
pub(crate) struct RunFacts<'a> {
    pub(crate) plan: &'a LocalPlan,
    pub(crate) out: &'a Path,
    pub(crate) peer_ids: Vec<String>,
    pub(crate) logs: Vec<PathBuf>,
    pub(crate) wall_s: f64,
    pub(crate) interrupted: bool,
    pub(crate) notes: Vec<String>,
}

/// How far `final` fell from `initial` toward `floor`, as a fraction of the way.
pub(crate) fn fraction_to_floor(initial: f64, final_loss: f64, floor: f64) -> Option<f64> {
    let span = initial - floor;
    (span > 0.0 && final_loss.is_finite()).then(|| (initial - final_loss) / span)
}

/// The swarm's samples per second while every peer trained: the window runs from the
/// last peer's first progress with samples to the first peer's end, and each peer's rate
/// over it comes from its progress lines nearest each edge (at or before it). `None`
/// when the window is empty or a peer has no line in it.
pub(crate) fn steady_samples_per_s(records: &[PeerRecord]) -> Option<f64> {
    let first_samples = |r: &PeerRecord| {
        r.samples_seen
            .iter()
            .find(|&&(_, samples)| samples > 0)
            .map(|&(at, _)| at)
    };
    let mut start = f64::NEG_INFINITY;
    let mut end = f64::INFINITY;
    for r in records {
        start = start.max(first_samples(r)?);
        end = end.min(r.samples_seen.last()?.0);
    }
    let at = |r: &PeerRecord, t: f64| {
        r.samples_seen
            .iter()
            .rev()
            .find(|&&(at, _)| at <= t)
            .copied()
    };
    let mut total = 0.0;
    for r in records {
        let ((t0, s0), (t1, s1)) = (at(r, start)?, at(r, end)?);
        if t1 <= t0 {
            return None;
        }
        total += s1.saturating_sub(s0) as f64 / (t1 - t0);
    }
    (end > start).then_some(total)
}

fn ratio(raw: u64, sent: u64) -> Option<f64> {
    (raw > 0 && sent > 0).then(|| raw as f64 / sent as f64)
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0u32), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / f64::from(n))
}

impl Summary {
    pub(crate) fn build(facts: RunFacts<'_>, records: &[PeerRecord]) -> Summary {
        let plan = facts.plan;
        let peer_results: Vec<PeerSummary> = records
            .iter()
            .map(|r| {
                let totals = r.totals();
                let final_eval_loss = r.done.as_ref().and_then(|d| d.final_eval_loss);
                let (status, error) = match &r.outcome {
                    Some(Outcome::Finished) => ("finished", None),
                    Some(Outcome::Stopped) => ("stopped", None),
                    Some(Outcome::Failed(why)) => ("failed", Some(why.clone())),
                    None => ("failed", Some("never ended".to_owned())),
                };
                PeerSummary {
                    peer: r.index,
                    peer_id: facts.peer_ids.get(r.index).cloned().unwrap_or_default(),
                    status,
                    error,
                    log: facts
                        .logs
                        .get(r.index)
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    device: r.device.clone(),
                    slowdown: plan.slowdown(r.index),
                    steps: r.step,
                    samples: totals.samples,
                    initial_eval_loss: r.initial_eval_loss,
                    final_eval_loss,
                    loss_floor: r.loss_floor,
                    fraction_to_floor: match (r.initial_eval_loss, final_eval_loss, r.loss_floor) {
                        (Some(i), Some(f), Some(floor)) => fraction_to_floor(i, f, floor),
                        _ => None,
                    },
                    wall_s: r.done_wall_s,
                    bytes_sent: totals.bytes_sent,
                    bytes_received: totals.bytes_received,
                    raw_bytes: totals.raw_bytes,
                    compression_ratio: ratio(totals.raw_bytes, totals.bytes_sent),
                    rounds: r.rounds,
                    restarts: r.restarts,
                    peak_rss_bytes: r.done.as_ref().and_then(|d| d.peak_rss_bytes),
                }
            })
            .collect();

        let finals = || peer_results.iter().filter_map(|p| p.final_eval_loss);
        let initial_eval_loss = mean(peer_results.iter().filter_map(|p| p.initial_eval_loss));
        let final_eval_loss = mean(finals());
        let loss_floor = peer_results.iter().find_map(|p| p.loss_floor);
        let bytes_sent_total: u64 = peer_results.iter().map(|p| p.bytes_sent).sum();
        let raw_total: u64 = peer_results.iter().map(|p| p.raw_bytes).sum();
        let samples: u64 = peer_results.iter().map(|p| p.samples).sum();
        let finished = peer_results
            .iter()
            .filter(|p| p.status == "finished")
            .count();
        Summary {
            peers: plan.peers,
            task: plan.task.name(),
            mode: plan.mode.name(),
            codec: plan.codec.to_string(),
            steps: plan.steps,
            churn: plan.churn,
            non_iid: plan.non_iid,
            out: facts.out.display().to_string(),
            initial_eval_loss,
            final_eval_loss,
            final_eval_loss_min: finals().reduce(f64::min),
            final_eval_loss_max: finals().reduce(f64::max),
            loss_floor,
            fraction_to_floor: match (initial_eval_loss, final_eval_loss, loss_floor) {
                (Some(i), Some(f), Some(floor)) => fraction_to_floor(i, f, floor),
                _ => None,
            },
            wall_s: facts.wall_s,
            bytes_sent_per_peer: bytes_sent_total as f64 / plan.peers.max(1) as f64,
            bytes_sent_total,
            compression_ratio: ratio(raw_total, bytes_sent_total),
            samples,
            samples_per_s: if facts.wall_s > 0.0 {
                samples as f64 / facts.wall_s
            } else {
                0.0
            },
            steady_samples_per_s: steady_samples_per_s(records),
            finished,
            failed: peer_results.iter().filter(|p| p.status == "failed").count(),
            stopped: peer_results
                .iter()
                .filter(|p| p.status == "stopped")
                .count(),
            interrupted: facts.interrupted,
            peer_results,
            notes: facts.notes,
        }
    }

    /// Whether every peer ran all its steps.
    pub(crate) fn all_finished(&self) -> bool {
        self.finished == self.peers
    }

    /// Whether the run went as planned: every peer finished, or `--stop-after` stopped
    /// those that had not, and none failed.
    pub(crate) fn as_planned(&self, stop_after: bool) -> bool {
        self.all_finished()
            || (stop_after
                && !self.interrupted
                && self.failed == 0
                && self.finished + self.stopped == self.peers)
    }

    /// The summary as a table and a few lines of text.
    pub(crate) fn to_text(&self) -> String {
        let mut t = String::with_capacity(2048);
        // `write!` into a String cannot fail.
        let _ = writeln!(
            t,
            "murmur local: {} peers, {}, {}, {}, {} steps{}{}, {:.1} s",
            self.peers,
            self.task,
            self.mode,
            self.codec,
            self.steps,
            if self.churn { ", churn" } else { "" },
            if self.non_iid { ", non-IID" } else { "" },
            self.wall_s
        );
        let _ = writeln!(
            t,
            "{:<5} {:<9} {:>6} {:>17} {:>7} {:>10} {:>7} {:>9} {:>8}",
            "peer", "status", "steps", "eval loss", "toward", "sent", "ratio", "samples", "wall"
        );
        for p in &self.peer_results {
            let losses = format!(
                "{} -> {}",
                opt(p.initial_eval_loss, 3),
                opt(p.final_eval_loss, 3)
            );
            let _ = writeln!(
                t,
                "{:<5} {:<9} {:>6} {:>17} {:>7} {:>10} {:>7} {:>9} {:>8}",
                p.peer,
                p.status,
                p.steps,
                losses,
                percent(p.fraction_to_floor),
                bytes(p.bytes_sent as f64),
                times(p.compression_ratio),
                p.samples,
                p.wall_s.map_or("-".into(), |w| format!("{w:.1} s")),
            );
        }
        let _ = writeln!(
            t,
            "swarm: eval loss {} -> {} (min {}, max {}), floor {}: {} of the way",
            opt(self.initial_eval_loss, 3),
            opt(self.final_eval_loss, 3),
            opt(self.final_eval_loss_min, 3),
            opt(self.final_eval_loss_max, 3),
            opt(self.loss_floor, 4),
            percent(self.fraction_to_floor),
        );
        let _ = writeln!(
            t,
            "       {} sent per peer, {} compression, {} samples ({:.0}/s; {}/s while all trained)",
            bytes(self.bytes_sent_per_peer),
            times(self.compression_ratio),
            self.samples,
            self.samples_per_s,
            opt(self.steady_samples_per_s, 0)
        );
        for p in self.peer_results.iter().filter(|p| p.status == "failed") {
            let _ = writeln!(
                t,
                "failed: peer {}: {} (log: {})",
                p.peer,
                p.error.as_deref().unwrap_or("unknown"),
                p.log
            );
        }
        for note in &self.notes {
            let _ = writeln!(t, "note: {note}");
        }
        if self.interrupted {
            let _ = writeln!(t, "the run was stopped before every peer finished");
        }
        t
    }
}

fn opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or("-".into(), |v| format!("{v:.decimals$}"))
}

fn percent(fraction: Option<f64>) -> String {
    fraction.map_or("-".into(), |f| format!("{:.0}%", f * 100.0))
}

fn times(ratio: Option<f64>) -> String {
    ratio.map_or("-".into(), |r| format!("{r:.1}x"))
}

/// Bytes in decimal units, e.g. `81.2 MB`.
pub(crate) fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = n;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::args::LocalArgs;
    use crate::local::events::parse_line;

    fn plan(peers: usize) -> LocalPlan {
        LocalPlan::from_args(&LocalArgs {
            steps: Some(100),
            straggler: vec!["1:2".into()],
            json: true,
            ..LocalArgs::with_peers(peers)
        })
        .unwrap()
    }

    fn finished_peer(index: usize, initial: f64, final_loss: f64, sent: u64) -> PeerRecord {
        let mut r = PeerRecord::new(index);
        let ready = format!(
            r#"{{"event":"ready","peer":"p","listen":[],"initial_eval_loss":{initial},"loss_floor":1.0}}"#
        );
        let done = format!(
            r#"{{"event":"done","step":100,"samples":1600,"initial_eval_loss":{initial},"final_eval_loss":{final_loss},"loss_floor":1.0,"bytes_sent":{sent},"raw_bytes":{},"exit":"finished"}}"#,
            sent * 4
        );
        r.apply(0.1, &parse_line(&ready).unwrap().unwrap());
        r.apply(20.0, &parse_line(&done).unwrap().unwrap());
        r.conclude("exit status: 0", false);
        r
    }

    fn facts(plan: &LocalPlan) -> RunFacts<'_> {
        RunFacts {
            plan,
            out: Path::new("/tmp/x"),
            peer_ids: vec!["a".into(), "b".into()],
            logs: vec![
                "/tmp/x/peer-0/murmur.log".into(),
                "/tmp/x/peer-1/murmur.log".into(),
            ],
            wall_s: 40.0,
            interrupted: false,
            notes: Vec::new(),
        }
    }

    #[test]
    fn fraction_to_floor_measures_the_way_down() {
        assert_eq!(fraction_to_floor(3.0, 1.0, 1.0), Some(1.0));
        assert_eq!(fraction_to_floor(3.0, 2.0, 1.0), Some(0.5));
        assert_eq!(fraction_to_floor(3.0, 3.5, 1.0), Some(-0.25));
        assert_eq!(fraction_to_floor(1.0, 0.9, 1.0), None, "no way to go");
        assert_eq!(fraction_to_floor(3.0, f64::NAN, 1.0), None);
    }

    #[test]
    fn swarm_figures_are_means_and_sums_over_peers() {
        let plan = plan(2);
        let records = [
            finished_peer(0, 3.0, 1.5, 1_000),
            finished_peer(1, 3.0, 2.5, 3_000),
        ];
        let s = Summary::build(facts(&plan), &records);
        assert!(s.all_finished());
        assert_eq!(s.initial_eval_loss, Some(3.0));
        assert_eq!(s.final_eval_loss, Some(2.0));
        assert_eq!(s.final_eval_loss_min, Some(1.5));
        assert_eq!(s.final_eval_loss_max, Some(2.5));
        assert_eq!(s.fraction_to_floor, Some(0.5));
        assert_eq!(s.bytes_sent_per_peer, 2_000.0);
        assert_eq!(s.bytes_sent_total, 4_000);
        assert_eq!(s.compression_ratio, Some(4.0));
        assert_eq!(s.samples, 3_200);
        assert_eq!(s.samples_per_s, 80.0);
        assert_eq!(s.peer_results[1].slowdown, 2.0);
        assert_eq!(s.peer_results[0].fraction_to_floor, Some(0.75));
        assert_eq!(s.peer_results[0].wall_s, Some(20.0));

        let json: serde_json::Value = serde_json::to_value(&s).unwrap();
        for key in [
            "peers",
            "mode",
            "codec",
            "initial_eval_loss",
            "final_eval_loss",
            "loss_floor",
            "wall_s",
            "bytes_sent_per_peer",
        ] {
            assert!(!json[key].is_null(), "{key}");
        }
        assert_eq!(json["mode"], "sgp");
        assert_eq!(json["codec"], "int8:64");
    }

    #[test]
    fn a_failed_peer_is_named_with_its_log() {
        let plan = plan(2);
        let mut failed = PeerRecord::new(1);
        failed.conclude("exit status: 3", false);
        let records = [finished_peer(0, 3.0, 1.5, 1_000), failed];
        let s = Summary::build(facts(&plan), &records);
        assert!(!s.all_finished());
        assert_eq!((s.finished, s.failed), (1, 1));
        assert_eq!(s.final_eval_loss, Some(1.5), "from the peers that have one");
        let text = s.to_text();
        let line = text.lines().find(|l| l.starts_with("failed:")).unwrap();
        assert!(
            line.contains("peer 1")
                && line.contains("exit status: 3")
                && line.contains("/tmp/x/peer-1/murmur.log"),
            "{line}"
        );
    }

    fn progress(r: &mut PeerRecord, wall_s: f64, samples: u64) {
        let line = format!(
            r#"{{"event":"progress","peer":"p","step":1,"samples":{samples},"loss":2.0,"samples_per_s":0.0,"bytes_sent":0}}"#
        );
        r.apply(wall_s, &parse_line(&line).unwrap().unwrap());
    }

    /// Peer 0 trains 100 samples/s from 1 s; peer 1 starts at 4 s with 40/s and peer 0
    /// finishes at 10 s: only [4 s, 10 s] counts, where both train, 140 samples/s.
    #[test]
    fn the_steady_rate_counts_only_while_every_peer_trains() {
        let mut fast = PeerRecord::new(0);
        for t in 1..=10u32 {
            progress(&mut fast, f64::from(t), u64::from(t - 1) * 100);
        }
        let mut slow = PeerRecord::new(1);
        progress(&mut slow, 2.0, 0);
        for t in 4..=14u32 {
            progress(&mut slow, f64::from(t), u64::from(t - 3) * 40);
        }
        let rate = steady_samples_per_s(&[fast.clone(), slow.clone()]).unwrap();
        assert!((rate - 140.0).abs() < 1e-9, "{rate}");
        // The whole-run figure (what `samples_per_s` says) is lower: start-up and tail.
        let whole = (900 + 440) as f64 / 14.0;
        assert!(whole < 100.0);
        assert_eq!(steady_samples_per_s(&[fast, PeerRecord::new(1)]), None);
    }

    #[test]
    fn bytes_are_shown_in_decimal_units() {
        assert_eq!(bytes(999.0), "999 B");
        assert_eq!(bytes(81_234_567.0), "81.2 MB");
        assert_eq!(bytes(1.5e15), "1500.0 TB");
    }
}

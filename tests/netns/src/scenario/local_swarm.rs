//! A training swarm in the harness's namespaces: one `murmur local --hosts` run, bounded in
//! time, and what it left behind (its JSON summary and `progress.csv`) read back.
//!
//! `murmur local` itself runs in this process's namespace and starts each peer with
//! `ip netns exec`, so every peer's traffic crosses the shaped links. A run either ends on
//! its own (every peer ran its steps) or is stopped with SIGINT a set time after every peer
//! is ready (which start-up on a busy machine cannot shorten); `murmur local` forwards the
//! signal to its peers and then writes its summary, CSV and plot.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::ScenarioOptions;
use crate::KillOnDrop;

pub(crate) mod plot;

/// What `murmur run` logs once it is ready to train.
const READY_LOG: &str = "murmur::run: ready";
/// How often a waiting run checks whether `murmur local` has exited.
const POLL: Duration = Duration::from_millis(100);
/// Per peer, progress rows that must show a step before a throughput window opens: the
/// first step also waits for the other peers and opens streams.
const WARMUP_STEPS: f64 = 1.0;

/// One `murmur local` run.
#[derive(Debug, Clone)]
pub(crate) struct SwarmSpec {
    /// The run's name: its folder under the scenario's output folder.
    pub(crate) name: String,
    /// `--mode`.
    pub(crate) mode: &'static str,
    /// `--peers`.
    pub(crate) peers: usize,
    /// `--steps`.
    pub(crate) steps: u64,
    /// `--synthetic-step-ms`.
    pub(crate) synthetic_step_ms: u64,
    /// `--straggler PEER:FACTOR`, when one peer is slowed down.
    pub(crate) straggler: Option<(usize, f64)>,
    /// Stop the run with SIGINT this long after every peer is ready; `None`: let it finish.
    pub(crate) stop_after: Option<Duration>,
    /// Kill the run when it takes longer than this.
    pub(crate) limit: Duration,
}

/// One row of `progress.csv`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProgressRow {
    /// Seconds since `murmur local` started.
    pub(crate) wall_s: f64,
    /// The peer's index.
    pub(crate) peer: usize,
    /// `ready`, `progress`, `eval` or `done`.
    pub(crate) event: String,
    /// The peer's local step.
    pub(crate) step: Option<u64>,
    /// Eval loss, on `ready`, `eval` and `done` rows.
    pub(crate) eval_loss: Option<f64>,
}

/// What a run left behind.
#[derive(Debug, Clone)]
pub(crate) struct SwarmRun {
    /// `murmur local --json`'s summary.
    pub(crate) summary: Value,
    /// `progress.csv`.
    pub(crate) rows: Vec<ProgressRow>,
    /// The run's folder.
    pub(crate) folder: PathBuf,
}

/// Runs `spec` with the hosts file `hosts`; fails when `murmur local` left no summary, or
/// when a peer failed (rather than finished, or stopped when asked to).
pub(crate) fn run_swarm(
    options: &ScenarioOptions,
    hosts: &Path,
    spec: &SwarmSpec,
) -> anyhow::Result<SwarmRun> {
    let folder = options.out.join(&spec.name);
    if folder.exists() {
        // `murmur local` wants a new or empty folder; this one is ours, from an earlier run.
        std::fs::remove_dir_all(&folder)
            .with_context(|| format!("cannot clear {}", folder.display()))?;
    }
    let summary_path = options.out.join(format!("{}.summary.json", spec.name));
    let stderr_path = options.out.join(format!("{}.stderr", spec.name));
    let mut command = Command::new(&options.murmur);
    command
        .args(["local", "--json", "--hosts"])
        .arg(hosts)
        .arg("--out")
        .arg(&folder)
        .args(["--mode", spec.mode, "--codec", "int8:64"])
        .args(["--peers", &spec.peers.to_string()])
        .args(["--steps", &spec.steps.to_string()])
        .args(["--synthetic-step-ms", &spec.synthetic_step_ms.to_string()]);
    if let Some((peer, factor)) = spec.straggler {
        command.arg("--straggler").arg(format!("{peer}:{factor}"));
    }
    let stdout = File::create(&summary_path)
        .with_context(|| format!("cannot create {}", summary_path.display()))?;
    let stderr = File::create(&stderr_path)
        .with_context(|| format!("cannot create {}", stderr_path.display()))?;
    command.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
    crate::end_with_parent(&mut command);
    let started = Instant::now();
    let mut child = KillOnDrop(
        command
            .spawn()
            .with_context(|| format!("cannot start {}", options.murmur.display()))?,
    );
    let mut interrupted = false;
    let mut all_ready: Option<Instant> = None;
    let status = loop {
        if let Some(status) = child.0.try_wait().context("waiting for murmur local")? {
            break status;
        }
        let elapsed = started.elapsed();
        if elapsed >= spec.limit {
            bail!(
                "{}: murmur local ran past its limit of {:.0} s; see {}",
                spec.name,
                spec.limit.as_secs_f64(),
                stderr_path.display()
            );
        }
        if all_ready.is_none() && every_peer_ready(&folder, spec.peers) {
            all_ready = Some(Instant::now());
        }
        let stop_now = match (spec.stop_after, all_ready) {
            (Some(after), Some(ready)) => ready.elapsed() >= after,
            _ => false,
        };
        if !interrupted && stop_now {
            interrupted = true;
            let pid = i32::try_from(child.id()).context("process id out of range")?;
            // SAFETY: `kill` has no memory preconditions; `pid` is our own child, not yet
            // reaped (try_wait returned None above), so the id cannot have been reused.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
        std::thread::sleep(POLL);
    };
    let text = std::fs::read_to_string(&summary_path)
        .with_context(|| format!("cannot read {}", summary_path.display()))?;
    let summary: Value = text
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str::<Value>(line).ok())
        .with_context(|| {
            format!(
                "{}: murmur local exited with {status} and printed no summary; see {}",
                spec.name,
                stderr_path.display()
            )
        })?;
    check_peers(spec, &summary, interrupted)?;
    let csv_path = folder.join("progress.csv");
    let csv = std::fs::read_to_string(&csv_path)
        .with_context(|| format!("cannot read {}", csv_path.display()))?;
    let rows = parse_progress_csv(&csv).with_context(|| csv_path.display().to_string())?;
    Ok(SwarmRun {
        summary,
        rows,
        folder,
    })
}

/// Whether every peer's log says it is ready (listening, its starting eval done): the
/// line `murmur run` logs just before it starts training.
fn every_peer_ready(folder: &Path, peers: usize) -> bool {
    (0..peers).all(|peer| {
        std::fs::read_to_string(folder.join(format!("peer-{peer}")).join("murmur.log"))
            .is_ok_and(|log| log.contains(READY_LOG))
    })
}

/// Every peer finished, or stopped because the run was interrupted on purpose.
fn check_peers(spec: &SwarmSpec, summary: &Value, interrupted: bool) -> anyhow::Result<()> {
    let results = summary["peer_results"]
        .as_array()
        .context("the summary has no peer_results")?;
    if results.len() != spec.peers {
        bail!(
            "{}: the summary lists {} peers, not {}",
            spec.name,
            results.len(),
            spec.peers
        );
    }
    for peer in results {
        let status = peer["status"].as_str().unwrap_or("unknown");
        let error = peer["error"].as_str().unwrap_or("");
        // Stopped mid-step, a peer may finish its step and a round whose members have left
        // before it exits; past the grace period `murmur local` kills it. It trained, and
        // its rows up to then count.
        let slow_to_exit = interrupted && error.contains("did not exit within");
        let fine = status == "finished" || (interrupted && status == "stopped") || slow_to_exit;
        if !fine {
            bail!(
                "{}: peer {} {status}: {} (log: {})",
                spec.name,
                peer["peer"],
                peer["error"].as_str().unwrap_or("no reason given"),
                peer["log"].as_str().unwrap_or("?")
            );
        }
    }
    Ok(())
}

/// Parses `progress.csv` (`wall_s,peer,event,step,loss,eval_loss,samples_per_s,bytes_sent`).
pub(crate) fn parse_progress_csv(text: &str) -> anyhow::Result<Vec<ProgressRow>> {
    let mut lines = text.lines();
    let header = lines.next().context("the CSV is empty")?;
    let columns: Vec<&str> = header.split(',').collect();
    let at = |name: &str| {
        columns
            .iter()
            .position(|c| *c == name)
            .with_context(|| format!("the CSV has no {name} column: {header}"))
    };
    let (wall, peer, event, step, eval) = (
        at("wall_s")?,
        at("peer")?,
        at("event")?,
        at("step")?,
        at("eval_loss")?,
    );
    let mut rows = Vec::new();
    for (number, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split(',').collect();
        let cell = |index: usize| {
            cells
                .get(index)
                .copied()
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
        };
        let bad = || format!("row {}: {line}", number + 2);
        rows.push(ProgressRow {
            wall_s: cell(wall).with_context(bad)?.parse().with_context(bad)?,
            peer: cell(peer).with_context(bad)?.parse().with_context(bad)?,
            event: cell(event).with_context(bad)?,
            step: cell(step)
                .map(|s| s.parse())
                .transpose()
                .with_context(bad)?,
            eval_loss: cell(eval)
                .map(|s| s.parse())
                .transpose()
                .with_context(bad)?,
        });
    }
    Ok(rows)
}

/// Aggregate training throughput over the window in which every peer was training.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Throughput {
    /// The window: from when the last peer had taken its first step to when the first peer
    /// reported its last progress, in seconds on `murmur local`'s clock.
    pub(crate) window: (f64, f64),
    /// Samples per second of the whole swarm in the window: the sum of the peers'.
    pub(crate) samples_per_s: f64,
    /// Samples per second of each peer in the window.
    pub(crate) per_peer: Vec<f64>,
}

/// Throughput of `peers` peers whose steps each hold `samples_per_step` samples, from their
/// progress rows.
///
/// A peer's rate is measured between the first and the last row inside the window at which
/// its step count went up: steps over the time between those rows. Measured from step to
/// step, a peer that takes few slow steps in the window is timed as exactly as a fast one;
/// counting steps over the whole window would be off by up to a step at each end.
pub(crate) fn throughput(
    rows: &[ProgressRow],
    peers: usize,
    samples_per_step: f64,
) -> anyhow::Result<Throughput> {
    let mut tracks = Vec::with_capacity(peers);
    for peer in 0..peers {
        let track = step_changes(rows, peer);
        let Some(first) = track.iter().find(|(_, step)| *step >= WARMUP_STEPS) else {
            bail!("peer {peer} reported no step");
        };
        let last_report = rows
            .iter()
            .filter(|r| r.peer == peer && r.event == "progress")
            .map(|r| r.wall_s)
            .fold(f64::MIN, f64::max);
        tracks.push((first.0, last_report, track));
    }
    let start = tracks.iter().map(|t| t.0).fold(f64::MIN, f64::max);
    let end = tracks.iter().map(|t| t.1).fold(f64::MAX, f64::min);
    let mut per_peer = Vec::with_capacity(peers);
    for (peer, (_, _, track)) in tracks.iter().enumerate() {
        let inside: Vec<&(f64, f64)> = track
            .iter()
            .filter(|(t, _)| *t >= start && *t <= end)
            .collect();
        let (Some(a), Some(b)) = (inside.first(), inside.last()) else {
            bail!("peer {peer} took no step between {start:.1} s and {end:.1} s");
        };
        if b.0 - a.0 < 1.0 {
            bail!(
                "peer {peer} took steps over only {:.1} s of the window {start:.1} s to \
                 {end:.1} s; run longer",
                b.0 - a.0
            );
        }
        per_peer.push((b.1 - a.1) * samples_per_step / (b.0 - a.0));
    }
    Ok(Throughput {
        window: (start, end),
        samples_per_s: per_peer.iter().sum(),
        per_peer,
    })
}

/// `(time, step)` of each progress row of `peer` at which its step count went up.
fn step_changes(rows: &[ProgressRow], peer: usize) -> Vec<(f64, f64)> {
    let mut last = None;
    let mut changes = Vec::new();
    for row in rows
        .iter()
        .filter(|r| r.peer == peer && r.event == "progress")
    {
        let Some(step) = row.step else { continue };
        if last.is_some_and(|l| step > l) {
            changes.push((row.wall_s, step as f64));
        }
        last = Some(step);
    }
    changes
}

/// Samples in one step of a peer, from the summary: a peer's samples over its steps.
pub(crate) fn samples_per_step(summary: &Value) -> anyhow::Result<f64> {
    summary["peer_results"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|p| {
            let steps = p["steps"].as_f64().filter(|s| *s > 0.0)?;
            Some(p["samples"].as_f64()? / steps)
        })
        .context("no peer of the summary took a step")
}

/// The swarm's mean eval loss over time: at each eval (and the starting and final evals),
/// the mean over peers of each peer's latest eval loss so far, once every peer has one.
pub(crate) fn mean_eval_loss(rows: &[ProgressRow], peers: usize) -> Vec<(f64, f64)> {
    let mut latest: Vec<Option<f64>> = vec![None; peers];
    let mut points = Vec::new();
    for row in rows {
        let (Some(loss), Some(slot)) = (row.eval_loss, latest.get_mut(row.peer)) else {
            continue;
        };
        *slot = Some(loss);
        if latest.iter().all(Option::is_some) {
            let mean = latest.iter().flatten().sum::<f64>() / peers as f64;
            points.push((row.wall_s, mean));
        }
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(wall_s: f64, peer: usize, step: u64) -> ProgressRow {
        ProgressRow {
            wall_s,
            peer,
            event: "progress".into(),
            step: Some(step),
            eval_loss: None,
        }
    }

    #[test]
    fn the_csv_is_read_by_its_header() {
        let text = "wall_s,peer,event,step,loss,eval_loss,samples_per_s,bytes_sent\n\
                    0.595,0,ready,,,3.39,,\n\
                    3.808,1,progress,2,3.38,,78.9,833660\n";
        let rows = parse_progress_csv(text).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].event, "ready");
        assert_eq!((rows[0].step, rows[0].eval_loss), (None, Some(3.39)));
        assert_eq!((rows[1].wall_s, rows[1].peer), (3.808, 1));
        assert_eq!(rows[1].step, Some(2));
        assert!(parse_progress_csv("wall_s,peer\n1,2\n").is_err());
        assert!(parse_progress_csv(&text.replace("3.808", "soon")).is_err());
    }

    #[test]
    fn throughput_times_each_peer_from_step_to_step_inside_the_common_window() {
        // Peer 0 reports and steps every 0.5 s (16 samples a step: 32/s) from t=1 to t=10.5;
        // peer 1 steps every 2 s (8/s) from t=3 and reports last at t=9.5.
        let mut rows = vec![progress(0.5, 0, 0), progress(0.7, 1, 0)];
        for i in 1..=20u32 {
            rows.push(progress(0.5 + f64::from(i) * 0.5, 0, u64::from(i)));
        }
        for i in 0..=13u32 {
            let t = 3.0 + f64::from(i) * 0.5;
            rows.push(progress(t, 1, 1 + u64::from(i / 4)));
        }
        rows.sort_by(|a, b| a.wall_s.total_cmp(&b.wall_s));
        let got = throughput(&rows, 2, 16.0).unwrap();
        assert_eq!(got.window, (3.0, 9.5));
        assert!((got.per_peer[0] - 32.0).abs() < 1e-9, "{got:?}");
        // Step changes of peer 1 at 3, 5, 7 and 9 s: three steps in 6 s.
        assert!((got.per_peer[1] - 8.0).abs() < 1e-9, "{got:?}");
        assert!((got.samples_per_s - 40.0).abs() < 1e-9);
    }

    #[test]
    fn a_peer_that_never_stepped_or_too_short_a_window_is_an_error() {
        let rows = vec![progress(1.0, 0, 0), progress(2.0, 0, 3)];
        assert!(throughput(&rows, 2, 16.0).is_err(), "peer 1 has no rows");
        let rows = vec![
            progress(1.0, 0, 0),
            progress(1.5, 0, 1),
            progress(2.0, 0, 3),
        ];
        assert!(throughput(&rows, 1, 16.0).is_err(), "half a second");
        let rows = vec![
            progress(0.0, 0, 0),
            progress(1.0, 0, 1),
            progress(9.0, 0, 1),
        ];
        assert!(throughput(&rows, 1, 16.0).is_err(), "one step change only");
    }

    #[test]
    fn the_mean_eval_loss_waits_for_every_peer() {
        let eval = |wall_s, peer, loss| ProgressRow {
            wall_s,
            peer,
            event: "eval".into(),
            step: None,
            eval_loss: Some(loss),
        };
        let rows = [eval(1.0, 0, 3.0), eval(1.5, 1, 2.0), eval(2.0, 0, 1.0)];
        assert_eq!(mean_eval_loss(&rows, 2), [(1.5, 2.5), (2.0, 1.5)]);
    }

    #[test]
    fn samples_per_step_comes_from_a_peer_that_stepped() {
        let summary: Value = serde_json::json!({"peer_results": [
            {"steps": 0, "samples": 0},
            {"steps": 10, "samples": 160},
        ]});
        assert_eq!(samples_per_step(&summary).unwrap(), 16.0);
        assert!(samples_per_step(&serde_json::json!({})).is_err());
    }
}

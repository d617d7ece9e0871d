//! `murmur bench quality`: does averaging make the swarm learn better than its peers would
//! alone? Runs the quality task (`--task quality`) with real local swarms in every mode
//! and against the solo control (`none`), and reports each mode's gap closure:
//!
//! ```text
//! gap_closure(mode) = (L_none − L_mode) / (L_none − L_sync-ring)
//! ```
//!
//! where `L` is the median over seeds of the swarm's mean final eval loss at equal samples
//! per peer: 0 is no better than training alone, 1 as good as synchronous all-reduce.
//! Steps are padded to a fixed time (`--step-ms`), so that peers sharing a few cores do
//! not turn CPU contention into a difference between modes. Writes `quality.csv` (one row
//! per run), `curves.csv` (the mean eval loss of every run against samples and wall time)
//! and `quality.png` (those curves for the first seed) into the output folder.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use murmur_protocol::message::AveragingMode;
use murmur_trainer::TaskPreset;
use serde_json::json;

use crate::cli::QualityArgs;
use crate::input_error::BadInput;
use crate::local::{LocalArgs, LocalPlan, LocalSummary, Reading, run_quietly};

use super::quality_plot;

/// The modes compared, with their codecs: the control, the synchronous reference, then
/// the asynchronous modes.
const MATRIX: [(AveragingMode, &str); 6] = [
    (AveragingMode::Solo, "f32"),
    (AveragingMode::SyncRing, "f32"),
    (AveragingMode::Sgp, "f32"),
    (AveragingMode::Sgp, "int8:64"),
    (AveragingMode::Butterfly, "int8:64"),
    (AveragingMode::LocalSgd, "int8:64"),
];

/// `--quick`: the control, the reference and butterfly with int8, four peers, one seed.
/// Butterfly's bar (0.95) sits furthest from what one seed's noise can reach; SGP's
/// (0.90) is within a few hundredths of its measured closure, so a CI run of it alone
/// would fail on noise.
const QUICK: [(AveragingMode, &str); 3] = [
    (AveragingMode::Solo, "f32"),
    (AveragingMode::SyncRing, "f32"),
    (AveragingMode::Butterfly, "int8:64"),
];

/// One run of the matrix.
#[derive(Debug, Clone)]
pub(crate) struct RunResult {
    pub(crate) mode: AveragingMode,
    pub(crate) codec: &'static str,
    pub(crate) peers: usize,
    pub(crate) seed: u32,
    pub(crate) final_eval_loss: f64,
    pub(crate) wall_s: f64,
    pub(crate) bytes_sent_per_peer: f64,
    /// Mean eval loss over the peers at each eval step: (samples per peer, wall s, loss).
    pub(crate) curve: Vec<(u64, f64, f64)>,
}

/// One mode at one swarm size, over its seeds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModeResult {
    pub(crate) mode: AveragingMode,
    pub(crate) codec: &'static str,
    pub(crate) peers: usize,
    pub(crate) losses: Vec<f64>,
    pub(crate) median: f64,
    /// `None` where the control and the reference are missing or equal.
    pub(crate) gap_closure: Option<f64>,
}

pub(crate) fn run(args: &QualityArgs) -> anyhow::Result<()> {
    let (modes, sizes, seeds): (&[(AveragingMode, &str)], Vec<usize>, u32) = if args.quick {
        (&QUICK, vec![4], 1)
    } else {
        (&MATRIX, args.peer_counts()?, args.seeds)
    };
    if seeds == 0 || seeds > 20 {
        return Err(BadInput(format!("--seeds {seeds}: expected 1 to 20")).into());
    }
    let out = match &args.out {
        Some(out) => out.clone(),
        None => std::env::temp_dir().join(format!("murmur-quality-{}", std::process::id())),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut runs = Vec::new();
    for seed in 1..=seeds {
        for &peers in &sizes {
            for &(mode, codec) in modes {
                let result = run_one(args, &out, mode, codec, peers, seed)?;
                if !args.json {
                    eprintln!(
                        "{peers} peers, {mode} {codec}, seed {seed}: final eval loss {:.4} ({:.0} s)",
                        result.final_eval_loss, result.wall_s
                    );
                }
                runs.push(result);
            }
        }
    }
    write_runs(&out.join("quality.csv"), &runs)?;
    write_curves(&out.join("curves.csv"), &runs)?;
    let plot_note = quality_plot::write(&out.join("quality.png"), &runs)?;
    let results = summarize(&runs);
    if args.json {
        for r in &results {
            println!(
                "{}",
                json!({
                    "mode": r.mode.name(),
                    "codec": r.codec,
                    "peers": r.peers,
                    "seeds": r.losses.len(),
                    "final_eval_loss": r.median,
                    "final_eval_losses": r.losses,
                    "gap_closure": r.gap_closure,
                })
            );
        }
    } else {
        print!("{}", table(&results));
        println!(
            "folder: {} (quality.csv, curves.csv, quality.png)",
            out.display()
        );
    }
    if let Some(note) = plot_note {
        eprintln!("{note}");
    }
    Ok(())
}

/// Runs one swarm of the matrix in `out/<peers>-<mode>-<codec>-<seed>`.
fn run_one(
    args: &QualityArgs,
    out: &Path,
    mode: AveragingMode,
    codec: &'static str,
    peers: usize,
    seed: u32,
) -> anyhow::Result<RunResult> {
    let folder = out.join(format!(
        "{peers}-{}-{}-{seed}",
        mode.name(),
        codec.replace(':', "_")
    ));
    let local = LocalArgs {
        peers,
        mode,
        codec: codec.to_owned(),
        task: TaskPreset::Quality,
        steps: None,
        straggler: Vec::new(),
        churn: false,
        churn_every: None,
        json: true,
        out: Some(folder.clone()),
        hosts: None,
        synthetic_step_ms: args.step_ms,
        no_error_feedback: false,
        clip: None,
        fault: Vec::new(),
        set: Vec::new(),
        set_peer: Vec::new(),
    };
    let plan = LocalPlan::from_args(&local)?;
    let (summary, readings) = run_quietly(&plan)?;
    let final_eval_loss = finished_loss(&summary)
        .with_context(|| format!("the run in {} did not finish", folder.display()))?;
    let batch = TaskPreset::Quality.config().data.batch_size as u64;
    Ok(RunResult {
        mode,
        codec,
        peers,
        seed,
        final_eval_loss,
        wall_s: summary.wall_s,
        bytes_sent_per_peer: summary.bytes_sent_per_peer,
        curve: curve(&readings, peers, batch),
    })
}

/// The swarm's mean final eval loss, if every peer finished.
fn finished_loss(summary: &LocalSummary) -> Option<f64> {
    if summary.failed > 0 || summary.finished != summary.peers {
        return None;
    }
    summary.final_eval_loss
}

/// The mean eval loss over the peers at each step every peer evaluated at: (samples per
/// peer, mean wall time, mean loss), by step.
pub(crate) fn curve(readings: &[Reading], peers: usize, batch: u64) -> Vec<(u64, f64, f64)> {
    let mut by_step: std::collections::BTreeMap<u64, Vec<(f64, f64)>> = Default::default();
    for r in readings {
        if let (Some(step), Some(loss)) = (r.step, r.eval_loss) {
            by_step.entry(step).or_default().push((r.wall_s, loss));
        }
    }
    by_step
        .into_iter()
        .filter(|(_, points)| points.len() >= peers)
        .map(|(step, points)| {
            let n = points.len() as f64;
            let wall = points.iter().map(|p| p.0).sum::<f64>() / n;
            let loss = points.iter().map(|p| p.1).sum::<f64>() / n;
            (step * batch, wall, loss)
        })
        .collect()
}

/// Medians over seeds and gap closures, in the matrix's order.
pub(crate) fn summarize(runs: &[RunResult]) -> Vec<ModeResult> {
    let mut results: Vec<ModeResult> = Vec::new();
    for run in runs {
        match results
            .iter_mut()
            .find(|r| r.mode == run.mode && r.codec == run.codec && r.peers == run.peers)
        {
            Some(r) => r.losses.push(run.final_eval_loss),
            None => results.push(ModeResult {
                mode: run.mode,
                codec: run.codec,
                peers: run.peers,
                losses: vec![run.final_eval_loss],
                median: 0.0,
                gap_closure: None,
            }),
        }
    }
    for r in &mut results {
        r.median = median(&r.losses);
    }
    let reference = |mode: AveragingMode, peers: usize| {
        results
            .iter()
            .find(|r| r.mode == mode && r.peers == peers)
            .map(|r| r.median)
    };
    let closures: Vec<Option<f64>> = results
        .iter()
        .map(|r| {
            let none = reference(AveragingMode::Solo, r.peers)?;
            let ring = reference(AveragingMode::SyncRing, r.peers)?;
            let gap = none - ring;
            (gap.abs() > f64::EPSILON).then(|| (none - r.median) / gap)
        })
        .collect();
    for (r, closure) in results.iter_mut().zip(closures) {
        r.gap_closure = closure;
    }
    results
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn table(results: &[ModeResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>5}  {:<10} {:<8} {:>6} {:>12} {:>11}",
        "peers", "mode", "codec", "seeds", "median loss", "gap closure"
    );
    for r in results {
        let closure = r.gap_closure.map_or("-".to_owned(), |c| format!("{c:.3}"));
        let _ = writeln!(
            out,
            "{:>5}  {:<10} {:<8} {:>6} {:>12.4} {:>11}",
            r.peers,
            r.mode.name(),
            r.codec,
            r.losses.len(),
            r.median,
            closure
        );
    }
    out
}

fn write_runs(path: &Path, runs: &[RunResult]) -> anyhow::Result<()> {
    let mut text =
        String::from("mode,codec,peers,seed,final_eval_loss,wall_s,bytes_sent_per_peer\n");
    for r in runs {
        let _ = writeln!(
            text,
            "{},{},{},{},{},{:.3},{:.0}",
            r.mode.name(),
            r.codec,
            r.peers,
            r.seed,
            r.final_eval_loss,
            r.wall_s,
            r.bytes_sent_per_peer
        );
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn write_curves(path: &Path, runs: &[RunResult]) -> anyhow::Result<()> {
    let mut text = String::from("mode,codec,peers,seed,samples_per_peer,wall_s,eval_loss\n");
    for r in runs {
        for &(samples, wall, loss) in &r.curve {
            let _ = writeln!(
                text,
                "{},{},{},{},{samples},{wall:.3},{loss}",
                r.mode.name(),
                r.codec,
                r.peers,
                r.seed
            );
        }
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(mode: AveragingMode, codec: &'static str, seed: u32, loss: f64) -> RunResult {
        RunResult {
            mode,
            codec,
            peers: 4,
            seed,
            final_eval_loss: loss,
            wall_s: 1.0,
            bytes_sent_per_peer: 0.0,
            curve: Vec::new(),
        }
    }

    #[test]
    fn gap_closure_puts_the_control_at_0_and_the_reference_at_1() {
        let runs = [
            run(AveragingMode::Solo, "f32", 1, 3.0),
            run(AveragingMode::Solo, "f32", 2, 3.2),
            run(AveragingMode::Solo, "f32", 3, 3.1),
            run(AveragingMode::SyncRing, "f32", 1, 2.1),
            run(AveragingMode::SyncRing, "f32", 2, 2.0),
            run(AveragingMode::Sgp, "int8:64", 1, 2.3),
        ];
        let results = summarize(&runs);
        let closure = |mode| {
            results
                .iter()
                .find(|r| r.mode == mode)
                .and_then(|r| r.gap_closure)
                .unwrap()
        };
        assert!((closure(AveragingMode::Solo) - 0.0).abs() < 1e-9);
        assert!((closure(AveragingMode::SyncRing) - 1.0).abs() < 1e-9);
        // Medians: none 3.1, ring 2.05; (3.1 - 2.3) / (3.1 - 2.05).
        assert!((closure(AveragingMode::Sgp) - 0.8 / 1.05).abs() < 1e-9);
        assert_eq!(results[0].losses, vec![3.0, 3.2, 3.1]);
    }

    #[test]
    fn the_curve_averages_the_peers_at_the_steps_all_of_them_evaluated() {
        let reading = |peer, step, wall_s, loss| Reading {
            wall_s,
            peer,
            kind: crate::local::ReadingKind::Eval,
            step: Some(step),
            loss: None,
            eval_loss: Some(loss),
            samples_per_s: None,
            bytes_sent: None,
        };
        let readings = [
            reading(0, 10, 1.0, 3.0),
            reading(1, 10, 3.0, 2.0),
            reading(0, 20, 5.0, 1.0),
        ];
        assert_eq!(curve(&readings, 2, 8), vec![(80, 2.0, 2.5)]);
    }

    #[test]
    fn swarm_sizes_are_checked() {
        let args = |peers: &str| QualityArgs {
            quick: false,
            peers: peers.to_owned(),
            seeds: 1,
            step_ms: 100,
            json: false,
            out: None,
        };
        assert_eq!(args("4, 8").peer_counts().unwrap(), vec![4, 8]);
        for bad in ["1", "17", "four", "4,,8"] {
            assert!(args(bad).peer_counts().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn without_a_control_there_is_no_gap_closure() {
        let results = summarize(&[run(AveragingMode::Sgp, "f32", 1, 2.0)]);
        assert_eq!(results[0].gap_closure, None);
    }
}

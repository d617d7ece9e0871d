//! Partition and heal: eight peers training with local SGD are split into two halves for
//! 30 s, then the network heals.
//!
//! Acceptance: both halves keep training through the split (every peer keeps stepping, and
//! keeps averaging with its own half and nobody else), and within 20 averaging rounds after
//! the heal every peer averages with the whole swarm again and its consensus drift is back
//! to its level before the split.
//!
//! The swarm runs local SGD (`--mode local-sgd`), which averages parameters, so a round's
//! `drift` (docs/progress.md) is how far the peer's parameters were from its group's mean:
//! the consensus distance. Halves that train apart drift apart; after the heal the first
//! whole-swarm rounds see that distance, and the outer steps pull it back in. The level
//! before the split is the median drift of every peer's last 3 whole-swarm
//! rounds before it; "back" means at most 1.5 times that level.
//!
//! The short version stops once every peer is back (or 20 rounds after the heal); the long
//! one runs 40 rounds past the heal on slower links and plots the whole run.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::fault_plot::{self, Band, Series};
use super::peer_lines::{BackgroundSwarm, PeerLines, RoundLine, unix_ms};
use super::{Report, ScenarioOptions, write_hosts_file};
use crate::{Harness, LinkShape, Topology};

/// Peers in the swarm; the halves are the first and the second four.
const PEERS: usize = 8;
/// How long the halves stay apart.
const SPLIT: Duration = Duration::from_secs(30);
/// Averaging rounds after the heal within which the drift must be back.
const RECOVERY_ROUNDS: usize = 20;
/// "Back to the level before the split": at most this many times it.
const RECOVERED_FACTOR: f64 = 1.5;
/// Each peer's last whole-swarm rounds before the split that set the level.
const LEVEL_ROUNDS: usize = 3;
/// Each peer must average with its half at least this many times during the split. Few are
/// asked for: a round under way when the network splits, or begun before every member has
/// given up on the other half, runs to its bound (15 s) because its members disagree on the
/// group.
const MIN_SPLIT_ROUNDS: usize = 1;
/// And take at least this many steps: one local-SGD period (`local_steps` is 8).
const MIN_SPLIT_STEPS: u64 = 8;

/// How one version runs.
#[derive(Debug, Clone, Copy)]
struct Plan {
    link: LinkShape,
    synthetic_step_ms: u64,
    /// Whole-swarm rounds every peer completes before the split.
    warm_rounds: usize,
    /// Rounds every peer completes after the heal before the run is stopped; the short
    /// version stops earlier, once every peer is back.
    rounds_after: usize,
    long: bool,
}

impl Plan {
    fn new(long: bool) -> Plan {
        Plan {
            link: LinkShape {
                rate_bits_per_sec: Some(100_000_000),
                delay: Duration::from_millis(if long { 10 } else { 5 }),
                loss: 0.0,
            },
            synthetic_step_ms: 100,
            warm_rounds: if long { 20 } else { 4 },
            rounds_after: if long { 40 } else { RECOVERY_ROUNDS },
            long,
        }
    }
}

/// What one peer did around the split.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerOutcome {
    /// 0 for the first half, 1 for the second.
    pub half: usize,
    /// Steps per second in the 30 s before the split.
    pub pace_before: f64,
    /// Steps per second during the split.
    pub pace_split: f64,
    /// Steps taken during the split.
    pub steps_split: u64,
    /// Rounds begun and ended during the split in which it averaged with others.
    pub rounds_split: usize,
    /// The largest group of those rounds that averaged the whole vector over every member
    /// it began with: more than a half would mean the partition leaked. (A round begun
    /// before a peer gave up on the other half counts it as a member, but cannot average
    /// with it.)
    pub largest_complete_group_split: u64,
    /// Its median drift in its last whole-swarm rounds before the split.
    pub drift_before: Option<f64>,
    /// The largest drift after the heal.
    pub peak_drift_after: Option<f64>,
    /// Which round after the heal (from 1) was its first averaged over the whole swarm.
    pub merged_at_round: Option<usize>,
    /// Which round after the heal (from 1) was its first averaged over the whole swarm with
    /// a drift back within bound.
    pub recovered_at_round: Option<usize>,
    /// Seconds from the heal to the end of that round.
    pub recovered_after_s: Option<f64>,
    /// Rounds it saw after the heal.
    pub rounds_after: usize,
}

/// What the scenario measured.
#[derive(Debug, Clone)]
pub struct PartitionReport {
    long: bool,
    /// The drift level before the split, over every peer.
    pub drift_before: f64,
    /// The drift a peer must be back within.
    pub bound: f64,
    /// When the split began and ended, in seconds since the first peer was ready.
    pub split_window_s: (f64, f64),
    /// Per peer.
    pub peers: Vec<PeerOutcome>,
}

/// Runs the scenario: builds the network, trains, splits, heals, reads the peers' lines.
pub fn run(options: &ScenarioOptions) -> anyhow::Result<PartitionReport> {
    let plan = Plan::new(options.long);
    let mut harness = Harness::build(Topology::uniform(PEERS, plan.link), &options.netem)
        .context("cannot build the network")?;
    let hosts = options.out.join("partition-hosts.toml");
    write_hosts_file(&harness, &hosts)?;
    let args: Vec<String> = [
        "--mode",
        "local-sgd",
        "--codec",
        "f32",
        "--steps",
        "100000",
        "--synthetic-step-ms",
        &plan.synthetic_step_ms.to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut swarm = BackgroundSwarm::start(options, &hosts, "partition", PEERS, &args)?;
    let warm = plan.warm_rounds;
    swarm.wait_for(
        &format!("{warm} whole-swarm rounds on every peer"),
        Duration::from_secs(240),
        |lines| {
            lines
                .iter()
                .all(|l| l.rounds.iter().filter(|r| r.group == PEERS as u64).count() >= warm)
        },
    )?;

    let halves: Vec<usize> = (0..PEERS).collect();
    let (first, second) = halves.split_at(PEERS / 2);
    let split_at = unix_ms();
    harness.partition(&[first, second])?;
    std::thread::sleep(SPLIT);
    harness.heal()?;
    let healed_at = unix_ms();

    let after = plan.rounds_after;
    let waited = swarm.wait_for(
        &format!("{after} rounds after the heal on every peer"),
        Duration::from_secs(300),
        |lines| {
            let report = analyse(plan.long, lines, split_at, healed_at);
            report
                .peers
                .iter()
                .all(|p| p.rounds_after >= after || (!plan.long && p.recovered_at_round.is_some()))
        },
    );
    swarm.interrupt()?;
    let end = swarm.finish(Duration::from_secs(60))?;
    waited?;
    let report = analyse(options.long, &end.lines, split_at, healed_at);
    write_outputs(&options.out, &end.lines, split_at, healed_at, &report)?;
    Ok(report)
}

/// Reads the split and the recovery out of the peers' lines.
fn analyse(long: bool, lines: &[PeerLines], split_at: u64, healed_at: u64) -> PartitionReport {
    let whole = lines.len() as u64;
    let pace_from = split_at.saturating_sub(SPLIT.as_millis() as u64);
    let mut before: Vec<f64> = Vec::new();
    let mut peers = Vec::with_capacity(lines.len());
    for (index, peer) in lines.iter().enumerate() {
        let whole_rounds: Vec<f64> = peer
            .rounds
            .iter()
            .filter(|r| r.group == whole && r.at_ms < split_at)
            .filter_map(|r| r.drift)
            .collect();
        let mut own = whole_rounds[whole_rounds.len().saturating_sub(LEVEL_ROUNDS)..].to_vec();
        before.extend(&own);
        let split: Vec<&RoundLine> = peer
            .rounds
            .iter()
            .filter(|r| r.started_ms() >= split_at && r.at_ms < healed_at && r.averaged())
            .collect();
        peers.push(PeerOutcome {
            half: usize::from(index >= lines.len() / 2),
            pace_before: pace(peer, pace_from, split_at).0,
            pace_split: pace(peer, split_at, healed_at).0,
            steps_split: pace(peer, split_at, healed_at).1,
            rounds_split: split.len(),
            largest_complete_group_split: split
                .iter()
                .filter(|r| r.coverage_all.is_some_and(|c| c >= 1.0))
                .map(|r| r.group)
                .max()
                .unwrap_or(0),
            drift_before: median(&mut own),
            peak_drift_after: None,
            merged_at_round: None,
            recovered_at_round: None,
            recovered_after_s: None,
            rounds_after: 0,
        });
    }
    let drift_before = median(&mut before).unwrap_or(f64::NAN);
    let bound = drift_before * RECOVERED_FACTOR;
    for (outcome, peer) in peers.iter_mut().zip(lines) {
        let after: Vec<&RoundLine> = peer.rounds.iter().filter(|r| r.at_ms > healed_at).collect();
        outcome.rounds_after = after.len();
        outcome.peak_drift_after = after.iter().filter_map(|r| r.drift).reduce(f64::max);
        // Merged: a round that began with every peer and averaged over all of them (one that
        // began with all but dropped the other half measures only the peer's own half).
        let merged = |r: &RoundLine| r.group == whole && r.coverage_all.is_some_and(|c| c >= 1.0);
        outcome.merged_at_round = after.iter().position(|r| merged(r)).map(|i| i + 1);
        let recovered = after
            .iter()
            .position(|r| merged(r) && r.drift.is_some_and(|d| d <= bound));
        outcome.recovered_at_round = recovered.map(|i| i + 1);
        outcome.recovered_after_s = recovered.map(|i| (after[i].at_ms - healed_at) as f64 / 1000.0);
    }
    let origin = origin_ms(lines, split_at);
    PartitionReport {
        long,
        drift_before,
        bound,
        split_window_s: (
            (split_at - origin) as f64 / 1000.0,
            (healed_at - origin) as f64 / 1000.0,
        ),
        peers,
    }
}

/// When the first peer was ready (or `fallback`, before any was): the plots' zero.
fn origin_ms(lines: &[PeerLines], fallback: u64) -> u64 {
    lines
        .iter()
        .filter_map(|l| l.readies.first().map(|r| r.at_ms))
        .min()
        .unwrap_or(fallback)
        .min(fallback)
}

/// Steps per second between two instants, and steps taken, from the progress lines.
fn pace(peer: &PeerLines, from_ms: u64, to_ms: u64) -> (f64, u64) {
    let inside: Vec<_> = peer
        .progress
        .iter()
        .filter(|p| (from_ms..to_ms).contains(&p.at_ms))
        .collect();
    match (inside.first(), inside.last()) {
        (Some(a), Some(b)) if b.at_ms > a.at_ms => {
            let steps = b.step.saturating_sub(a.step);
            (steps as f64 * 1000.0 / (b.at_ms - a.at_ms) as f64, steps)
        }
        _ => (0.0, 0),
    }
}

fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

impl Report for PartitionReport {
    fn to_json(&self) -> Value {
        let peers: Vec<Value> = self
            .peers
            .iter()
            .enumerate()
            .map(|(index, p)| {
                json!({
                    "peer": index,
                    "half": p.half,
                    "pace_before_steps_per_s": p.pace_before,
                    "pace_split_steps_per_s": p.pace_split,
                    "steps_split": p.steps_split,
                    "rounds_split": p.rounds_split,
                    "largest_complete_group_split": p.largest_complete_group_split,
                    "drift_before": p.drift_before,
                    "peak_drift_after": p.peak_drift_after,
                    "merged_at_round": p.merged_at_round,
                    "recovered_at_round": p.recovered_at_round,
                    "recovered_after_s": p.recovered_after_s,
                    "rounds_after": p.rounds_after,
                })
            })
            .collect();
        json!({
            "scenario": "partition",
            "version": if self.long { "long" } else { "ci" },
            "split_window_s": [self.split_window_s.0, self.split_window_s.1],
            "drift_before": self.drift_before,
            "recovered_bound": self.bound,
            "recovery_rounds_allowed": RECOVERY_ROUNDS,
            "peers": peers,
        })
    }

    fn check(&self) -> Result<(), String> {
        if !self.drift_before.is_finite() {
            return Err("no whole-swarm round with a drift before the split".into());
        }
        for (index, p) in self.peers.iter().enumerate() {
            if p.rounds_split < MIN_SPLIT_ROUNDS {
                return Err(format!(
                    "peer {index} averaged {} times during the split; at least \
                     {MIN_SPLIT_ROUNDS} expected",
                    p.rounds_split
                ));
            }
            if p.largest_complete_group_split as usize > PEERS / 2 {
                return Err(format!(
                    "peer {index} completed a round with {} peers during the split; its half \
                     has {}",
                    p.largest_complete_group_split,
                    PEERS / 2
                ));
            }
            if p.steps_split < MIN_SPLIT_STEPS {
                return Err(format!(
                    "peer {index} took {} steps during the split; at least {MIN_SPLIT_STEPS} \
                     expected",
                    p.steps_split
                ));
            }
            match p.recovered_at_round {
                Some(round) if round <= RECOVERY_ROUNDS => {}
                other => {
                    return Err(format!(
                        "peer {index}: drift not back within {:.4} ({RECOVERED_FACTOR} x the \
                         {:.4} before the split) in {RECOVERY_ROUNDS} rounds after the heal \
                         (first whole-swarm round: {:?}; recovered at: {other:?}; peak drift \
                         {:?})",
                        self.bound, self.drift_before, p.merged_at_round, p.peak_drift_after
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `partition-rounds.csv` (every round of every peer) and `partition-drift.png`.
fn write_outputs(
    out: &Path,
    lines: &[PeerLines],
    split_at: u64,
    healed_at: u64,
    report: &PartitionReport,
) -> anyhow::Result<()> {
    let origin = origin_ms(lines, split_at);
    let seconds = |at: u64| (at as f64 - origin as f64) / 1000.0;
    let mut csv = String::from("peer,half,t_s,outcome,group,coverage,drift\n");
    let mut series = Vec::new();
    for (index, peer) in lines.iter().enumerate() {
        let half = usize::from(index >= lines.len() / 2);
        for r in &peer.rounds {
            csv.push_str(&format!(
                "{index},{half},{:.3},{},{},{},{}\n",
                seconds(r.at_ms),
                r.outcome,
                r.group,
                r.coverage,
                r.drift.map_or(String::new(), |d| d.to_string())
            ));
        }
        series.push(Series {
            label: format!(
                "half {half} (peers {}-{})",
                half * lines.len() / 2,
                (half + 1) * lines.len() / 2 - 1
            ),
            group: half,
            points: peer
                .rounds
                .iter()
                .filter_map(|r| Some((seconds(r.at_ms), r.drift?)))
                .collect(),
        });
    }
    let csv_path = out.join("partition-rounds.csv");
    std::fs::write(&csv_path, csv)
        .with_context(|| format!("cannot write {}", csv_path.display()))?;
    let note = fault_plot::lines_over_time(
        &out.join("partition-drift.png"),
        "consensus drift per round (local SGD, 8 peers, split into halves)",
        "drift |x - mean| / |mean|",
        &series,
        &[Band {
            from: seconds(split_at),
            to: seconds(healed_at),
            label: "partitioned".into(),
        }],
        Some(report.bound),
        true,
    )?;
    if let Some(note) = note {
        eprintln!("partition: {note}");
    }
    Ok(())
}

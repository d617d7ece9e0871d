//! Churn soak: a swarm training with SGP (the default mode, made for churn), or with
//! butterfly all-reduce ([`run_mode`]), while `murmur local --churn` kills a random peer
//! (`kill -9`) every 2 to 5 s and restarts it 2 s later, against a churn-free run of the
//! same steps on the same network.
//!
//! Acceptance, on the survivors (peers never killed; peer 0 never is): no 10 s without a
//! completed averaging round, from their first round to their end; no hung process (`murmur
//! local` ends within its bound and every peer ends finished, none killed for silence; the
//! churn run is ended once peer 0 and the survivors have finished, and the restarted peers
//! still making up lost steps must then leave on SIGINT within the grace);
//! resident memory at the end at most 10% above its level after the warm-up (means over
//! 30 s); and peer 0's final eval loss at most 5% above the churn-free run's after as long.
//!
//! *As long* is wall time from peer 0's start: the churn-free run's eval loss when it had
//! trained as long as the churn run did (interpolated between its evals; its final loss
//! when the churn run took longer). At equal steps the comparison measured the two cores
//! rather than churn when six peers trained the small GPT: they want more CPU than two
//! cores have, so with a peer or two down peer 0 stepped faster (240 against 320 ms a step
//! in one butterfly run) while rounds came at the rate their latency allows in both runs
//! (1.73 and 1.82 a second). At 600 steps the churn run had then had 251 rounds against
//! 350, and its loss 2.7% above the calm run's; the calm run after as long had had 267 and
//! was 1.4% below it.
//!
//! The bound is one-sided: churn may cost at most 5%, and a churn run that ends *below* the
//! calm run says nothing against churn. It happens when the calm run steps slower over the
//! same wall time: in one SGP run of the short version on a loaded host the churn run ended
//! 6.7% below the calm run after as long, and 0.5% above it at equal steps.
//!
//! The short version trains two minutes on 6 peers (the MLP task, which leaves the two
//! cores room); the long one 30 minutes on 8 (the small GPT), in release. Both write
//! `churn-rss.png`, `churn-round-gaps.png` and `churn-runs.csv`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::fault_plot::{self, Series};
use super::log_window;
use super::peer_lines::{BackgroundSwarm, PeerLines, SwarmEnd, Waited};
use super::{Report, ScenarioOptions, write_hosts_file};
use crate::{Harness, LinkShape, Topology};

/// The longest a survivor may go without a completed averaging round (with SGP: without a
/// neighbour's share folded in).
const MAX_ROUND_GAP_S: f64 = 10.0;
/// Log lines of a survivor's longest gap that a failure message shows, the first ones.
const GAP_LOG_LINES: usize = 60;
/// The most resident memory may grow after the warm-up.
const MAX_RSS_GROWTH: f64 = 0.10;
/// How far the final eval loss may be above the churn-free run's.
const MAX_LOSS_GAP: f64 = 0.05;
/// Resident memory levels are means over this long: the first window after the warm-up and
/// the last before the end. A sample swings ±15% around the level with SGP (buffers of
/// 128 KiB and more are mapped and unmapped as rounds come and go), so that the medians of
/// 10 s windows, the first version, differed by 24% in a run whose 30 s means differed by 4%
/// (peer 0's samples rose and fell between 48 and 65 MB from start to end).
const RSS_WINDOW_MS: u64 = 30_000;

/// How one version runs.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// `averaging.mode`.
    mode: &'static str,
    /// The built-in task (`murmur local --task`).
    task: &'static str,
    peers: usize,
    steps: u64,
    synthetic_step_ms: u64,
    /// From a survivor's first round; its memory after this is the reference.
    warm_up: Duration,
    /// Fewest kills for the run to count as a churn soak.
    min_kills: usize,
    /// A run still going after this is stopped, and counts as hung. A peer killed every
    /// 20 to 30 s loses the steps since its last checkpoint (100 steps, 20 s) and its
    /// restart each time, so churned peers train at about half the pace: in the long
    /// version they had 5,000 to 6,200 of 9,000 steps after 2,030 s, so they need about
    /// 3,300 s; the limits are three times the nominal length and more.
    limit: Duration,
}

impl Plan {
    /// The long version trains 30 minutes (9,000 steps of at least 200 ms), the short one
    /// 2 minutes (600 steps); a step is synthetic, so the pace is the config's, not the CPU's.
    fn new(long: bool, mode: &'static str) -> Plan {
        if long {
            Plan {
                mode,
                task: "markov-gpt",
                peers: 8,
                steps: 9000,
                synthetic_step_ms: 200,
                warm_up: Duration::from_secs(300),
                min_kills: 300,
                limit: Duration::from_secs(5400),
            }
        } else {
            Plan {
                mode,
                // Six peers training the small GPT want about twice the CPU of two cores
                // (a calm butterfly run of 300 synthetic 200 ms steps took 121 s in debug,
                // 195% CPU); the MLP wants half of it (67 s, 101%), so the run keeps the
                // config's pace and leaves the cores room for whatever else runs.
                task: "teacher-mlp",
                peers: 6,
                steps: 600,
                synthetic_step_ms: 200,
                warm_up: Duration::from_secs(30),
                min_kills: 20,
                limit: Duration::from_secs(420),
            }
        }
    }

    fn args(&self, churn: bool) -> Vec<String> {
        let mut args: Vec<String> = [
            "--mode",
            self.mode,
            "--task",
            self.task,
            "--steps",
            &self.steps.to_string(),
            "--synthetic-step-ms",
            &self.synthetic_step_ms.to_string(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if churn {
            args.extend(["--churn", "--churn-every", "2-5"].map(str::to_owned));
        }
        // The soak's wall bound was set for butterfly computing while its rounds run. With
        // `overlap` off (the default since it was found to make gradients stale) each step
        // also waits for its round, and restarted peers then fall so far behind peer 0 that
        // they outlive it and lose their only bootstrap address.
        if self.mode == "butterfly" {
            args.extend(["--set", "averaging.butterfly.overlap=true"].map(str::to_owned));
        }
        args
    }
}

/// What one survivor did in the churn run.
#[derive(Debug, Clone, PartialEq)]
pub struct Survivor {
    /// The peer's index.
    pub peer: usize,
    /// Averaging rounds it completed with at least one other peer.
    pub rounds: usize,
    /// The longest time without one, in seconds, from its first round to its end.
    pub longest_gap_s: f64,
    /// When that gap began and ended, in milliseconds since the Unix epoch.
    pub longest_gap_ms: Option<(u64, u64)>,
    /// The first lines of its log in that gap, for a failure message.
    pub gap_log: Vec<String>,
    /// Its resident memory after the warm-up, and at the end (means over 30 s); `None`
    /// when it did not train past the warm-up or reported no memory.
    pub rss_bytes: Option<(u64, u64)>,
    /// The largest resident memory it reported after the warm-up.
    pub rss_peak_bytes: Option<u64>,
    /// Its final eval loss.
    pub final_eval_loss: Option<f64>,
}

impl Survivor {
    /// How much its memory grew from the warm-up to the end, as a fraction.
    pub fn rss_growth(&self) -> Option<f64> {
        let (warm, end) = self.rss_bytes?;
        Some(end as f64 / warm.max(1) as f64 - 1.0)
    }
}

/// One run's totals.
#[derive(Debug, Clone, PartialEq)]
pub struct RunTotals {
    /// Seconds `murmur local` ran.
    pub wall_s: f64,
    /// Every peer ended finished.
    pub all_finished: bool,
    /// What peers that did not finish said, and notes of peers killed for silence.
    pub problems: Vec<String>,
    /// Peer 0's final eval loss.
    pub final_eval_loss: Option<f64>,
    /// Kills (restarts) over all peers.
    pub kills: usize,
    /// The longest time peer 0 went without a completed averaging round, in seconds.
    pub longest_gap_s: f64,
    /// Peer 0's eval losses by seconds since its first start: the initial one, each eval,
    /// the final one.
    pub loss_curve: Vec<(f64, f64)>,
    /// Seconds from peer 0's first start to its end, when it ended.
    pub trained_s: Option<f64>,
}

impl RunTotals {
    /// Peer 0's eval loss after `seconds` of training: interpolated linearly between
    /// evals, its final loss from its end on, `None` without evals.
    pub fn loss_after(&self, seconds: f64) -> Option<f64> {
        let curve = &self.loss_curve;
        let after = curve.iter().position(|&(at, _)| at >= seconds);
        match after {
            None => curve.last().map(|&(_, loss)| loss),
            Some(0) => curve.first().map(|&(_, loss)| loss),
            Some(i) => {
                let ((t0, l0), (t1, l1)) = (curve[i - 1], curve[i]);
                let share = if t1 > t0 {
                    (seconds - t0) / (t1 - t0)
                } else {
                    1.0
                };
                Some(l0 + (l1 - l0) * share)
            }
        }
    }
}

/// What the scenario measured.
#[derive(Debug, Clone)]
pub struct ChurnReport {
    long: bool,
    min_kills: usize,
    /// The run without churn.
    pub calm: RunTotals,
    /// The run with churn.
    pub churn: RunTotals,
    /// The churn run's survivors.
    pub survivors: Vec<Survivor>,
}

/// Runs the scenario with SGP: a churn-free run, then the churn run, on one network.
pub fn run(options: &ScenarioOptions) -> anyhow::Result<ChurnReport> {
    run_mode(options, "sgp")
}

/// Runs the scenario in `averaging.mode = mode`.
pub fn run_mode(options: &ScenarioOptions, mode: &'static str) -> anyhow::Result<ChurnReport> {
    let plan = Plan::new(options.long, mode);
    let link = LinkShape {
        rate_bits_per_sec: Some(100_000_000),
        delay: Duration::from_millis(if options.long { 10 } else { 5 }),
        loss: 0.0,
    };
    let harness = Harness::build(Topology::uniform(plan.peers, link), &options.netem)
        .context("cannot build the network")?;
    let hosts = options.out.join("churn-hosts.toml");
    write_hosts_file(&harness, &hosts)?;

    let (calm, calm_end) = run_one(options, &hosts, &plan, "churn-free")?;
    let (churn, churn_end) = run_one(options, &hosts, &plan, "churn")?;
    let mut survivors = survivors(&churn.lines, plan.warm_up);
    for s in &mut survivors {
        if let Some((from, to)) = s
            .longest_gap_ms
            .filter(|_| s.longest_gap_s > MAX_ROUND_GAP_S)
        {
            let log = options
                .out
                .join(format!("churn/peer-{}/murmur.log", s.peer));
            s.gap_log = log_window::lines_between(&log, from, to, GAP_LOG_LINES);
        }
    }
    let report = ChurnReport {
        long: options.long,
        min_kills: plan.min_kills,
        calm: totals(&calm, calm_end, plan.limit),
        churn: totals(&churn, churn_end, plan.limit),
        survivors,
    };
    write_outputs(&options.out, &calm, &churn, &report)?;
    Ok(report)
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunEnd {
    /// `murmur local` ended on its own within the plan's limit.
    OnItsOwn,
    /// Peer 0 and every survivor had finished, and the restarted peers still making up the
    /// steps churn cost them were stopped with SIGINT.
    SurvivorsDone,
    /// Still running at the plan's limit: stopped with SIGINT, and counted as hung.
    PastLimit,
}

/// One run to its end; a run past the plan's limit is stopped with SIGINT and reported as
/// not finished (its peers end `stopped`).
///
/// The churn run ends once peer 0 and every survivor have finished. Churn ends with peer
/// 0, and a restarted peer is then short of its steps by what each kill cost it (its steps
/// since its last checkpoint, and its restart): in a butterfly run the last of them
/// finished 90 s after peer 0, training in a swarm that shrank as the others finished,
/// which the soak measures nothing of. They are stopped as Ctrl-C stops them, and must
/// leave within `murmur local`'s grace.
fn run_one(
    options: &ScenarioOptions,
    hosts: &Path,
    plan: &Plan,
    name: &str,
) -> anyhow::Result<(SwarmEnd, RunEnd)> {
    let churn = name == "churn";
    let mut swarm = BackgroundSwarm::start(options, hosts, name, plan.peers, &plan.args(churn))?;
    let ended = if churn {
        swarm.exited_or(plan.limit, survivors_done)?
    } else if swarm.exited_within(plan.limit)? {
        Waited::Exited
    } else {
        Waited::TimedOut
    };
    let end = match ended {
        Waited::Exited => RunEnd::OnItsOwn,
        Waited::Reached => RunEnd::SurvivorsDone,
        Waited::TimedOut => RunEnd::PastLimit,
    };
    if end != RunEnd::OnItsOwn {
        swarm.interrupt()?;
    }
    Ok((swarm.finish(Duration::from_secs(60))?, end))
}

/// Whether the peer printed `ready` once: it was never killed.
fn survived(lines: &PeerLines) -> bool {
    lines.readies.len() == 1
}

/// Whether peer 0 and every survivor have printed `done`.
fn survivors_done(lines: &[PeerLines]) -> bool {
    lines.first().is_some_and(|l| !l.dones.is_empty())
        && lines
            .iter()
            .filter(|l| survived(l))
            .all(|l| !l.dones.is_empty())
}

/// The peers never killed.
fn survivors(lines: &[PeerLines], warm_up: Duration) -> Vec<Survivor> {
    let mut survivors = Vec::new();
    for (peer, l) in lines.iter().enumerate() {
        if !survived(l) {
            continue;
        }
        let averaged = l.averaged_at();
        let first_round = averaged.first().copied();
        let warm_end = first_round.map(|at| at + warm_up.as_millis() as u64);
        let last = l.progress.last().map(|p| p.at_ms);
        let rss_between = |from: u64, to: u64| {
            let values: Vec<u64> = l
                .progress
                .iter()
                .filter(|p| (from..=to).contains(&p.at_ms))
                .filter_map(|p| p.rss_bytes)
                .collect();
            let count = u64::try_from(values.len()).ok().filter(|&n| n > 0)?;
            Some(values.iter().sum::<u64>() / count)
        };
        // Only a survivor that trained two whole windows past its warm-up has two levels to
        // compare.
        let rss_bytes = match (warm_end, last) {
            (Some(warm_end), Some(last)) if last >= warm_end + 2 * RSS_WINDOW_MS => {
                rss_between(warm_end, warm_end + RSS_WINDOW_MS)
                    .zip(rss_between(last - RSS_WINDOW_MS, last))
            }
            _ => None,
        };
        let peak = warm_end.and_then(|warm_end| {
            l.progress
                .iter()
                .filter(|p| p.at_ms >= warm_end)
                .filter_map(|p| p.rss_bytes)
                .max()
        });
        let (longest_gap_s, longest_gap_ms) = longest_gap(l);
        survivors.push(Survivor {
            peer,
            rounds: averaged.len(),
            longest_gap_s,
            longest_gap_ms,
            gap_log: Vec::new(),
            rss_bytes,
            rss_peak_bytes: peak,
            final_eval_loss: l.dones.last().and_then(|d| d.final_eval_loss),
        });
    }
    survivors
}

/// The longest time without a completed averaging round, from the first to the peer's
/// `done` (or its last line), in seconds, and when it began and ended.
fn longest_gap(lines: &PeerLines) -> (f64, Option<(u64, u64)>) {
    let mut times = lines.averaged_at();
    if times.is_empty() {
        return (f64::INFINITY, None);
    }
    let end = lines
        .dones
        .last()
        .map(|d| d.at_ms)
        .or_else(|| lines.progress.last().map(|p| p.at_ms));
    times.extend(end);
    let widest = times.windows(2).max_by_key(|w| w[1].saturating_sub(w[0]));
    match widest {
        Some(w) => (
            w[1].saturating_sub(w[0]) as f64 / 1000.0,
            Some((w[0], w[1])),
        ),
        None => (0.0, None),
    }
}

/// What a run did. Every peer must finish, but where the run was ended once its survivors
/// had ([`RunEnd::SurvivorsDone`]): a restarted peer may then end `stopped`, and `murmur
/// local` exits with the failure an interrupted run exits with.
fn totals(end: &SwarmEnd, run_end: RunEnd, limit: Duration) -> RunTotals {
    let mut problems = Vec::new();
    if run_end == RunEnd::PastLimit {
        problems.push(format!(
            "still running after {:.0} s; stopped",
            limit.as_secs_f64()
        ));
    }
    let early = run_end == RunEnd::SurvivorsDone;
    let mut all_finished = run_end != RunEnd::PastLimit && (early || end.status.success());
    if !early && !end.status.success() {
        problems.push(format!("murmur local exited with {}", end.status));
    }
    let restarted = |peer: &Value| {
        peer["peer"]
            .as_u64()
            .and_then(|p| end.lines.get(usize::try_from(p).ok()?))
            .is_some_and(|l| l.readies.len() > 1)
    };
    let mut wall_s = 0.0;
    match &end.summary {
        None => {
            all_finished = false;
            problems.push("murmur local printed no summary".into());
        }
        Some(summary) => {
            wall_s = summary["wall_s"].as_f64().unwrap_or(0.0);
            for peer in summary["peer_results"].as_array().into_iter().flatten() {
                let status = peer["status"].as_str();
                let stopped_early = early && status == Some("stopped") && restarted(peer);
                if status != Some("finished") && !stopped_early {
                    all_finished = false;
                    problems.push(format!(
                        "peer {} {}: {}",
                        peer["peer"],
                        peer["status"].as_str().unwrap_or("?"),
                        peer["error"].as_str().unwrap_or("no reason given")
                    ));
                }
            }
            for note in summary["notes"].as_array().into_iter().flatten() {
                if let Some(note) = note.as_str().filter(|n| n.contains("silent for")) {
                    all_finished = false;
                    problems.push(note.to_owned());
                }
            }
        }
    }
    let peer0 = end.lines.first();
    let (loss_curve, trained_s) = peer0.map_or((Vec::new(), None), loss_curve);
    RunTotals {
        wall_s,
        all_finished,
        problems,
        loss_curve,
        trained_s,
        final_eval_loss: peer0
            .and_then(|l| l.dones.last())
            .and_then(|d| d.final_eval_loss),
        kills: end
            .lines
            .iter()
            .map(|l| l.readies.len().saturating_sub(1))
            .sum(),
        longest_gap_s: end
            .lines
            .first()
            .map_or(f64::INFINITY, |l| longest_gap(l).0),
    }
}

/// A peer's eval losses by seconds since its first `ready`, and the seconds to its last
/// `done`.
fn loss_curve(lines: &PeerLines) -> (Vec<(f64, f64)>, Option<f64>) {
    let Some(ready) = lines.readies.first() else {
        return (Vec::new(), None);
    };
    let since = |at_ms: u64| at_ms.saturating_sub(ready.at_ms) as f64 / 1000.0;
    let done = lines.dones.last();
    let curve = ready
        .initial_eval_loss
        .map(|loss| (0.0, loss))
        .into_iter()
        .chain(lines.evals.iter().map(|e| (since(e.at_ms), e.eval_loss)))
        .chain(done.and_then(|d| Some((since(d.at_ms), d.final_eval_loss?))))
        .collect();
    (curve, done.map(|d| since(d.at_ms)))
}

impl Report for ChurnReport {
    fn to_json(&self) -> Value {
        let run = |r: &RunTotals| {
            json!({
                "wall_s": r.wall_s,
                "all_finished": r.all_finished,
                "problems": r.problems,
                "final_eval_loss_peer0": r.final_eval_loss,
                "kills": r.kills,
                "longest_round_gap_s_peer0": r.longest_gap_s,
            })
        };
        let survivors: Vec<Value> = self
            .survivors
            .iter()
            .map(|s| {
                json!({
                    "peer": s.peer,
                    "rounds": s.rounds,
                    "longest_round_gap_s": s.longest_gap_s,
                    "rss_after_warm_up_bytes": s.rss_bytes.map(|r| r.0),
                    "rss_end_bytes": s.rss_bytes.map(|r| r.1),
                    "rss_peak_bytes": s.rss_peak_bytes,
                    "rss_growth": s.rss_growth(),
                    "final_eval_loss": s.final_eval_loss,
                })
            })
            .collect();
        json!({
            "scenario": "churn",
            "version": if self.long { "long" } else { "ci" },
            "churn_free": run(&self.calm),
            "churn": run(&self.churn),
            "final_loss_ratio": self.loss_ratio(),
            "churn_free_loss_after_as_long": self.calm_loss_after_as_long(),
            "final_loss_ratio_at_equal_steps": self.loss_ratio_at_equal_steps(),
            "survivors": survivors,
        })
    }

    fn check(&self) -> Result<(), String> {
        for (name, run) in [("churn-free", &self.calm), ("churn", &self.churn)] {
            if !run.all_finished {
                return Err(format!("{name} run: {}", run.problems.join("; ")));
            }
        }
        if self.churn.kills < self.min_kills {
            return Err(format!(
                "only {} kills in the churn run; at least {} expected",
                self.churn.kills, self.min_kills
            ));
        }
        if self.survivors.is_empty() {
            return Err("no survivor: peer 0 was restarted".into());
        }
        for s in &self.survivors {
            if s.longest_gap_s > MAX_ROUND_GAP_S {
                let window = s.longest_gap_ms.map_or(String::new(), |(from, to)| {
                    format!(
                        ", from {} to {} UTC",
                        log_window::utc_stamp(from),
                        log_window::utc_stamp(to)
                    )
                });
                return Err(format!(
                    "survivor {} went {:.1} s without a completed averaging round (at most \
                     {MAX_ROUND_GAP_S} s){window}; its log then:\n{}",
                    s.peer,
                    s.longest_gap_s,
                    s.gap_log.join("\n")
                ));
            }
            let (Some(growth), Some((warm, end))) = (s.rss_growth(), s.rss_bytes) else {
                return Err(format!(
                    "survivor {} did not train {:.0} s past its warm-up, or reported no \
                     memory: no growth to measure",
                    s.peer,
                    2.0 * RSS_WINDOW_MS as f64 / 1000.0
                ));
            };
            if growth >= MAX_RSS_GROWTH {
                return Err(format!(
                    "survivor {}'s resident memory grew {:.1}% after the warm-up ({warm} -> \
                     {end} bytes; at most {:.0}%)",
                    s.peer,
                    growth * 100.0,
                    MAX_RSS_GROWTH * 100.0
                ));
            }
        }
        let gap = MAX_LOSS_GAP;
        match self.loss_ratio() {
            Some(ratio) if ratio <= 1.0 + gap => Ok(()),
            ratio => Err(format!(
                "final eval loss {:?} with churn after {:?} s against {:?} without after as \
                 long: ratio {ratio:?}, expected at most {:.0}% above (at equal steps {:?})",
                self.churn.final_eval_loss,
                self.churn.trained_s,
                self.calm_loss_after_as_long(),
                gap * 100.0,
                self.loss_ratio_at_equal_steps(),
            )),
        }
    }
}

impl ChurnReport {
    /// Peer 0's final eval loss with churn over its loss without after as long (see the
    /// module docs).
    pub fn loss_ratio(&self) -> Option<f64> {
        Some(self.churn.final_eval_loss? / self.calm_loss_after_as_long()?)
    }

    /// Peer 0's eval loss in the churn-free run after as long as the churn run's peer 0
    /// trained.
    pub fn calm_loss_after_as_long(&self) -> Option<f64> {
        self.calm.loss_after(self.churn.trained_s?)
    }

    /// Peer 0's final eval loss with churn over without, both after the same steps.
    pub fn loss_ratio_at_equal_steps(&self) -> Option<f64> {
        Some(self.churn.final_eval_loss? / self.calm.final_eval_loss?)
    }
}

/// `churn-runs.csv`, `churn-rss.png` (every peer's memory, survivors apart) and
/// `churn-round-gaps.png` (peer 0's time since its previous round, with and without churn).
fn write_outputs(
    out: &Path,
    calm: &SwarmEnd,
    churn: &SwarmEnd,
    report: &ChurnReport,
) -> anyhow::Result<()> {
    let mut csv = String::from(
        "run,wall_s,kills,final_eval_loss_peer0,longest_round_gap_s_peer0,all_finished\n",
    );
    for (name, run) in [("churn-free", &report.calm), ("churn", &report.churn)] {
        csv.push_str(&format!(
            "{name},{:.1},{},{},{:.2},{}\n",
            run.wall_s,
            run.kills,
            run.final_eval_loss
                .map_or(String::new(), |l| format!("{l:.4}")),
            run.longest_gap_s,
            run.all_finished
        ));
    }
    let csv_path = out.join("churn-runs.csv");
    std::fs::write(&csv_path, csv)
        .with_context(|| format!("cannot write {}", csv_path.display()))?;

    let origin = |end: &SwarmEnd| {
        end.lines
            .iter()
            .filter_map(|l| l.readies.first().map(|r| r.at_ms))
            .min()
            .unwrap_or(0)
    };
    let churn_origin = origin(churn);
    let rss: Vec<Series> = churn
        .lines
        .iter()
        .map(|l| {
            let survivor = survived(l);
            Series {
                label: if survivor {
                    "survivors".into()
                } else {
                    "churned peers".into()
                },
                group: usize::from(!survivor),
                points: l
                    .progress
                    .iter()
                    .filter_map(|p| {
                        Some((
                            (p.at_ms - churn_origin) as f64 / 1000.0,
                            p.rss_bytes? as f64 / (1u64 << 20) as f64,
                        ))
                    })
                    .collect(),
            }
        })
        .collect();
    let mut notes = Vec::new();
    notes.extend(fault_plot::lines_over_time(
        &out.join("churn-rss.png"),
        "resident memory under churn (kill -9 every 2-5 s)",
        "MiB",
        &rss,
        &[],
        None,
        false,
    )?);
    let gaps = |end: &SwarmEnd, label: &str, group: usize| {
        let start = origin(end);
        let mut points = Vec::new();
        if let Some(l) = end.lines.first() {
            let times = l.averaged_at();
            for w in times.windows(2) {
                points.push((
                    (w[1] - start) as f64 / 1000.0,
                    (w[1] - w[0]) as f64 / 1000.0,
                ));
            }
        }
        Series {
            label: label.into(),
            group,
            points,
        }
    };
    notes.extend(fault_plot::lines_over_time(
        &out.join("churn-round-gaps.png"),
        "peer 0: seconds since its previous completed averaging round",
        "seconds",
        &[gaps(calm, "churn-free", 0), gaps(churn, "churn", 1)],
        &[],
        Some(MAX_ROUND_GAP_S),
        false,
    )?);
    for note in notes {
        eprintln!("churn: {note}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::peer_lines::{DoneLine, ProgressLine, ReadyLine};

    /// A survivor that prints a progress line a second for 150 s, averaging from the first,
    /// with the resident memory `rss(second)`.
    fn survivor(rss: impl Fn(u64) -> u64) -> Survivor {
        let lines = PeerLines {
            readies: vec![ReadyLine {
                at_ms: 0,
                initial_eval_loss: None,
            }],
            progress: (1..=150)
                .map(|second| ProgressLine {
                    at_ms: second * 1000,
                    step: second * 5,
                    peers: 5,
                    rss_bytes: Some(rss(second)),
                    shares_received: Some(second),
                })
                .collect(),
            ..PeerLines::default()
        };
        let mut found = survivors(&[lines], Duration::from_secs(30));
        found.pop().expect("one survivor")
    }

    /// A run whose peer 0 reached `losses` at 0, 10, 20, … seconds and ended at the last.
    fn run_with(losses: &[f64]) -> RunTotals {
        let loss_curve: Vec<(f64, f64)> = losses
            .iter()
            .enumerate()
            .map(|(i, &loss)| (i as f64 * 10.0, loss))
            .collect();
        RunTotals {
            wall_s: 0.0,
            all_finished: true,
            problems: Vec::new(),
            final_eval_loss: losses.last().copied(),
            kills: 0,
            longest_gap_s: 0.0,
            trained_s: loss_curve.last().map(|&(at, _)| at),
            loss_curve,
        }
    }

    #[test]
    fn the_churn_run_is_compared_with_the_calm_run_after_as_long() {
        let calm = run_with(&[3.0, 2.0, 1.5, 1.2, 1.1]);
        assert_eq!(calm.loss_after(0.0), Some(3.0));
        assert_eq!(calm.loss_after(15.0), Some(1.75));
        assert_eq!(calm.loss_after(40.0), Some(1.1));
        // Longer than the calm run trained: its final loss.
        assert_eq!(calm.loss_after(90.0), Some(1.1));
        let report = |churn: RunTotals| ChurnReport {
            long: false,
            min_kills: 0,
            calm: calm.clone(),
            churn,
            survivors: Vec::new(),
        };
        // Done in 30 s at 1.26: the calm run had 1.2 then, 5% better; at equal steps 1.1,
        // 15% better.
        let faster = report(run_with(&[3.0, 2.1, 1.6, 1.26]));
        let ratio = faster.loss_ratio().expect("a ratio");
        assert!((ratio - 1.05).abs() < 1e-9, "{ratio}");
        let at_equal_steps = faster.loss_ratio_at_equal_steps().expect("a ratio");
        assert!((at_equal_steps - 1.26 / 1.1).abs() < 1e-9);
        // Slower than the calm run: against its final loss, as at equal steps.
        let slower = report(run_with(&[3.0, 2.5, 2.0, 1.6, 1.3, 1.2]));
        assert_eq!(slower.loss_ratio(), slower.loss_ratio_at_equal_steps());
        // No evals: no ratio, and the check fails.
        let mut silent = run_with(&[]);
        silent.final_eval_loss = Some(1.0);
        assert_eq!(report(silent).loss_ratio(), None);
    }

    /// Three peers: peer 0 and a survivor that printed `ready` once, and peer 2 restarted
    /// once; `done` for those in `done`.
    fn three_peers(done: [bool; 3]) -> Vec<PeerLines> {
        let ready = ReadyLine {
            at_ms: 0,
            initial_eval_loss: None,
        };
        (0..3)
            .map(|peer| PeerLines {
                readies: vec![ready.clone(); if peer == 2 { 2 } else { 1 }],
                dones: if done[peer] {
                    vec![DoneLine {
                        at_ms: 1000,
                        exit: "finished".into(),
                        step: 600,
                        final_eval_loss: Some(1.0),
                    }]
                } else {
                    Vec::new()
                },
                ..PeerLines::default()
            })
            .collect()
    }

    #[test]
    fn a_churn_run_ended_once_its_survivors_finished_lets_only_restarted_peers_stop() {
        assert!(!survivors_done(&three_peers([true, false, false])));
        assert!(!survivors_done(&three_peers([false, true, true])));
        assert!(survivors_done(&three_peers([true, true, false])));
        let end = |statuses: [&str; 3], exit: i32| SwarmEnd {
            status: std::os::unix::process::ExitStatusExt::from_raw(exit << 8),
            summary: Some(json!({
                "wall_s": 100.0,
                "peer_results": statuses
                    .iter()
                    .enumerate()
                    .map(|(peer, status)| json!({"peer": peer, "status": status}))
                    .collect::<Vec<_>>(),
                "notes": [],
            })),
            lines: three_peers([true, true, false]),
        };
        let limit = Duration::from_secs(420);
        let restarted_stopped = end(["finished", "finished", "stopped"], 1);
        assert!(totals(&restarted_stopped, RunEnd::SurvivorsDone, limit).all_finished);
        // Only a run ended early may end so.
        assert!(!totals(&restarted_stopped, RunEnd::OnItsOwn, limit).all_finished);
        let survivor_stopped = end(["finished", "stopped", "finished"], 1);
        let totals = totals(&survivor_stopped, RunEnd::SurvivorsDone, limit);
        assert!(!totals.all_finished);
        assert!(
            totals.problems[0].contains("peer 1 stopped"),
            "{:?}",
            totals.problems
        );
        let failed = end(["finished", "finished", "failed"], 1);
        assert!(!super::totals(&failed, RunEnd::SurvivorsDone, limit).all_finished);
    }

    #[test]
    fn memory_that_swings_between_rounds_is_level_and_memory_that_stays_is_growth() {
        const MB: u64 = 1 << 20;
        // Samples between 48 and 65 MB, as SGP's were, seven seconds each: the medians of
        // the 10 s windows the first version compared are 48 and 65 MB (+35%).
        let swing = |s: u64| if s % 14 >= 7 { 48 * MB } else { 65 * MB };
        let swinging = survivor(swing);
        let growth = swinging.rss_growth().expect("two levels");
        assert!(growth.abs() < 0.05, "a swing counted as growth: {growth}");
        // The same swing on a level that rises 30% over the run.
        let leaking = survivor(|s| swing(s) + swing(s) * s / 500);
        let growth = leaking.rss_growth().expect("two levels");
        assert!(growth > MAX_RSS_GROWTH, "growth not seen: {growth}");
    }
}

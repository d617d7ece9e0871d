//! **Convergence**: the eval loss against wall-clock time of each averaging mode, on shaped
//! links.
//!
//! For each of `sgp`, `butterfly`, `local-sgd` and `sync-ring`, `murmur local` trains N
//! peers on the built-in task for a fixed number of steps over 100 Mbit/s links with a 20 ms
//! round trip; the long version stops a mode still training after a wall-clock budget. Steps are synthetic (`--synthetic-step-ms`), so time spent averaging shows
//! against a step time that does not depend on how many peers share the machine's cores.
//! The report gives, per mode, the swarm's mean eval loss at the start and end, how far it
//! fell toward the task's loss floor, when it first got half way there, the wall time and
//! the bytes each peer sent; `loss-over-time.png` draws the mean eval loss over time.
//!
//! Bound: every peer of every mode finishes, and every mode's mean eval loss falls at least
//! [`MIN_FRACTION_TO_FLOOR`] of the way to the floor.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::local_swarm::plot::{LossCurve, loss_over_time};
use super::local_swarm::{SwarmSpec, mean_eval_loss, run_swarm};
use super::{Report, ScenarioOptions, write_hosts_file};
use crate::{Harness, LinkShape, Topology};

/// The modes compared.
const MODES: [&str; 4] = ["sgp", "butterfly", "local-sgd", "sync-ring"];
/// The least fraction of the way from the starting loss to the floor every mode must go.
pub const MIN_FRACTION_TO_FLOOR: f64 = 0.3;
/// Link rate: 100 Mbit/s.
const RATE_BITS_PER_SEC: u64 = 100_000_000;
/// One-way delay of each link; a round trip crosses four links: 20 ms.
const LINK_DELAY: Duration = Duration::from_millis(5);

/// The sizes of one version of the scenario.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    peers: usize,
    steps: u64,
    synthetic_step_ms: u64,
    /// A mode still training this long after every peer is ready is stopped: every mode
    /// gets the same wall-clock budget.
    budget: Option<Duration>,
}

impl Sizes {
    /// The CI version.
    const SHORT: Sizes = Sizes {
        peers: 4,
        steps: 30,
        synthetic_step_ms: 200,
        budget: None,
    };
    /// The benchmark: the built-in task's whole schedule.
    const LONG: Sizes = Sizes {
        peers: 8,
        steps: 600,
        synthetic_step_ms: 100,
        budget: Some(Duration::from_secs(150)),
    };

    /// How long one run may take: its budget, or its steps at a generous multiple of the
    /// step time plus a second each (a debug build's ring on two busy cores has taken 2 s a
    /// step), and time to start and stop.
    fn limit(&self) -> Duration {
        let per_step_ms = self.synthetic_step_ms * 4 + 1000;
        let training = self
            .budget
            .unwrap_or(Duration::from_millis(self.steps * per_step_ms));
        Duration::from_secs(90) + training
    }
}

/// One mode's run.
#[derive(Debug, Clone)]
struct ModeRun {
    mode: &'static str,
    initial_loss: f64,
    final_loss: f64,
    floor: Option<f64>,
    /// `(wall s, mean eval loss)`.
    curve: Vec<(f64, f64)>,
    wall_s: f64,
    bytes_sent_per_peer: f64,
}

impl ModeRun {
    /// How far the mean eval loss fell toward the floor, as a fraction of the way.
    fn fraction_to_floor(&self) -> Option<f64> {
        let floor = self.floor?;
        let span = self.initial_loss - floor;
        (span > 0.0).then(|| (self.initial_loss - self.final_loss) / span)
    }

    /// When the mean eval loss first got half way from its start to the floor.
    fn half_way_s(&self) -> Option<f64> {
        let target = (self.initial_loss + self.floor?) / 2.0;
        self.curve.iter().find(|p| p.1 <= target).map(|p| p.0)
    }
}

/// What the convergence scenario measured.
#[derive(Debug, Clone)]
pub struct ConvergenceReport {
    sizes: Sizes,
    modes: Vec<ModeRun>,
    notes: Vec<String>,
}

/// Runs the convergence scenario.
pub fn run(options: &ScenarioOptions) -> anyhow::Result<ConvergenceReport> {
    let sizes = if options.long {
        Sizes::LONG
    } else {
        Sizes::SHORT
    };
    let link = LinkShape {
        rate_bits_per_sec: Some(RATE_BITS_PER_SEC),
        delay: LINK_DELAY,
        loss: 0.0,
    };
    let harness = Harness::build(Topology::uniform(sizes.peers, link), &options.netem)
        .context("building the network")?;
    let hosts = options.out.join("convergence-hosts.toml");
    write_hosts_file(&harness, &hosts)?;
    let mut modes = Vec::with_capacity(MODES.len());
    for mode in MODES {
        let spec = SwarmSpec {
            name: format!("convergence-{mode}"),
            mode,
            peers: sizes.peers,
            steps: sizes.steps,
            synthetic_step_ms: sizes.synthetic_step_ms,
            straggler: None,
            stop_after: sizes.budget,
            limit: sizes.limit(),
        };
        let run = run_swarm(options, &hosts, &spec)?;
        let field = |key: &str| {
            run.summary[key]
                .as_f64()
                .with_context(|| format!("{}: the summary has no {key}", spec.name))
        };
        let curve = mean_eval_loss(&run.rows, sizes.peers);
        // A run stopped at its budget has no final eval; its last periodic one stands in.
        let final_loss = match run.summary["final_eval_loss"].as_f64() {
            Some(loss) => loss,
            None => curve.last().map(|p| p.1).with_context(|| {
                format!(
                    "{}: no eval of every peer; see {}",
                    spec.name,
                    run.folder.display()
                )
            })?,
        };
        modes.push(ModeRun {
            mode,
            initial_loss: field("initial_eval_loss")?,
            final_loss,
            floor: run.summary["loss_floor"].as_f64(),
            curve,
            wall_s: field("wall_s")?,
            bytes_sent_per_peer: field("bytes_sent_per_peer")?,
        });
    }
    drop(harness);
    let report = ConvergenceReport {
        sizes,
        modes,
        notes: Vec::new(),
    };
    report.write_outputs(&options.out)
}

impl ConvergenceReport {
    /// Writes `convergence.csv` (every mode's curve) and `loss-over-time.png`.
    fn write_outputs(mut self, out: &Path) -> anyhow::Result<Self> {
        let mut csv = String::from("mode,wall_s,mean_eval_loss\n");
        for m in &self.modes {
            for (t, loss) in &m.curve {
                csv.push_str(&format!("{},{t:.3},{loss:.5}\n", m.mode));
            }
        }
        let path = out.join("convergence.csv");
        std::fs::write(&path, csv).with_context(|| format!("cannot write {}", path.display()))?;
        let curves: Vec<LossCurve> = self
            .modes
            .iter()
            .map(|m| LossCurve {
                label: m.mode.to_owned(),
                points: m.curve.clone(),
            })
            .collect();
        let title = format!(
            "{} peers, {} steps of {} ms, 100 Mbit/s links, 20 ms RTT",
            self.sizes.peers, self.sizes.steps, self.sizes.synthetic_step_ms
        );
        let floor = self.modes.iter().find_map(|m| m.floor);
        if let Some(note) = loss_over_time(&out.join("loss-over-time.png"), &title, &curves, floor)?
        {
            self.notes.push(note);
        }
        Ok(self)
    }
}

impl Report for ConvergenceReport {
    fn to_json(&self) -> Value {
        let modes: Vec<Value> = self
            .modes
            .iter()
            .map(|m| {
                json!({
                    "mode": m.mode,
                    "initial_eval_loss": m.initial_loss,
                    "final_eval_loss": m.final_loss,
                    "loss_floor": m.floor,
                    "fraction_to_floor": m.fraction_to_floor(),
                    "half_way_to_floor_s": m.half_way_s(),
                    "wall_s": m.wall_s,
                    "bytes_sent_per_peer": m.bytes_sent_per_peer,
                })
            })
            .collect();
        json!({
            "scenario": "convergence",
            "peers": self.sizes.peers,
            "steps": self.sizes.steps,
            "synthetic_step_ms": self.sizes.synthetic_step_ms,
            "budget_s": self.sizes.budget.map(|b| b.as_secs_f64()),
            "link": {"rate_bits_per_sec": RATE_BITS_PER_SEC, "round_trip_ms": 20},
            "bounds": {"fraction_to_floor_at_least": MIN_FRACTION_TO_FLOOR},
            "modes": modes,
            "notes": self.notes,
        })
    }

    fn check(&self) -> Result<(), String> {
        let missed: Vec<String> = self
            .modes
            .iter()
            .filter_map(|m| match m.fraction_to_floor() {
                Some(f) if f >= MIN_FRACTION_TO_FLOOR => None,
                Some(f) => Some(format!(
                    "{}: the mean eval loss went {:.0}% of the way to the floor ({:.3} to \
                     {:.3}), less than {:.0}%",
                    m.mode,
                    f * 100.0,
                    m.initial_loss,
                    m.final_loss,
                    MIN_FRACTION_TO_FLOOR * 100.0
                )),
                None => Some(format!("{}: no loss floor to measure against", m.mode)),
            })
            .collect();
        crate::scenario::verdict(&missed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(final_loss: f64, curve: Vec<(f64, f64)>) -> ModeRun {
        ModeRun {
            mode: "sgp",
            initial_loss: 3.0,
            final_loss,
            floor: Some(1.0),
            curve,
            wall_s: 10.0,
            bytes_sent_per_peer: 1e6,
        }
    }

    #[test]
    fn progress_is_measured_toward_the_floor() {
        let m = mode(1.5, vec![(1.0, 3.0), (4.0, 2.2), (6.0, 1.9), (9.0, 1.5)]);
        assert_eq!(m.fraction_to_floor(), Some(0.75));
        assert_eq!(m.half_way_s(), Some(6.0));
        assert_eq!(mode(2.5, vec![(1.0, 2.5)]).half_way_s(), None);
    }

    #[test]
    fn a_mode_that_barely_learns_misses_the_bound() {
        let report = |final_loss| ConvergenceReport {
            sizes: Sizes::SHORT,
            modes: vec![mode(final_loss, Vec::new())],
            notes: Vec::new(),
        };
        assert_eq!(report(2.0).check(), Ok(()));
        let why = report(2.6).check().unwrap_err();
        assert!(why.contains("sgp") && why.contains("20%"), "{why}");
        assert_eq!(report(2.0).to_json()["modes"][0]["fraction_to_floor"], 0.5);
    }
}

//! A `murmur local --hosts` run in the background, and the progress lines its peers printed,
//! read back while it runs.
//!
//! `murmur local` copies every line a peer prints on stdout to `<out>/peer-N/progress.jsonl`,
//! over all the peer's restarts (the format is docs/progress.md). Every line carries
//! `unix_ms`, so lines of different peers, of restarts, and the scenario's own actions (a
//! partition, a heal) share one clock. A line cut short by a `kill -9` is skipped.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::ScenarioOptions;
use crate::KillOnDrop;

/// How often a wait re-reads the peers' lines.
const POLL: Duration = Duration::from_millis(250);

/// A peer's `ready` line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReadyLine {
    /// When it was printed, in milliseconds since the Unix epoch.
    pub(crate) at_ms: u64,
    /// The starting eval loss.
    pub(crate) initial_eval_loss: Option<f64>,
}

/// A peer's `progress` line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProgressLine {
    /// When it was printed, in milliseconds since the Unix epoch.
    pub(crate) at_ms: u64,
    /// The peer's local step.
    pub(crate) step: u64,
    /// Peers it knows of.
    pub(crate) peers: u64,
    /// Its resident memory, when it could read it.
    pub(crate) rss_bytes: Option<u64>,
    /// SGP: shares received from other peers and folded in so far (this life).
    pub(crate) shares_received: Option<u64>,
}

/// A peer's `round` line: one averaging round ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RoundLine {
    /// When it was printed, in milliseconds since the Unix epoch.
    pub(crate) at_ms: u64,
    /// `complete`, `partial` or `failed`.
    pub(crate) outcome: String,
    /// Members of the round, this peer included.
    pub(crate) group: u64,
    /// Fraction of the vector averaged over every member still alive.
    pub(crate) coverage: f64,
    /// Fraction of the vector averaged over every member it began with.
    pub(crate) coverage_all: Option<f64>,
    /// Relative distance between what this peer contributed and the round's result.
    pub(crate) drift: Option<f64>,
    /// How long the round took, in milliseconds.
    pub(crate) duration_ms: u64,
}

impl RoundLine {
    /// When the round began, in milliseconds since the Unix epoch.
    pub(crate) fn started_ms(&self) -> u64 {
        self.at_ms.saturating_sub(self.duration_ms)
    }

    /// Whether the round averaged with at least one other peer.
    pub(crate) fn averaged(&self) -> bool {
        self.outcome != "failed" && self.group >= 2 && self.coverage > 0.0
    }
}

/// A peer's `eval` line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EvalLine {
    /// When it was printed, in milliseconds since the Unix epoch.
    pub(crate) at_ms: u64,
    /// The eval loss.
    pub(crate) eval_loss: f64,
}

/// A peer's `done` line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DoneLine {
    /// When it was printed, in milliseconds since the Unix epoch.
    pub(crate) at_ms: u64,
    /// `finished`, `signal` or `error`.
    pub(crate) exit: String,
    /// The peer's local step.
    pub(crate) step: u64,
    /// The final eval loss.
    pub(crate) final_eval_loss: Option<f64>,
}

/// Everything one peer printed, in order, over all its restarts.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PeerLines {
    /// One per start of the peer.
    pub(crate) readies: Vec<ReadyLine>,
    pub(crate) progress: Vec<ProgressLine>,
    pub(crate) rounds: Vec<RoundLine>,
    pub(crate) evals: Vec<EvalLine>,
    pub(crate) dones: Vec<DoneLine>,
}

impl PeerLines {
    /// When this peer averaged with at least one other peer, in milliseconds since the Unix
    /// epoch, in order: the ends of its rounds that averaged (round-based modes), and the
    /// progress lines by which its count of SGP shares received had grown.
    pub(crate) fn averaged_at(&self) -> Vec<u64> {
        let mut times: Vec<u64> = self
            .rounds
            .iter()
            .filter(|r| r.averaged())
            .map(|r| r.at_ms)
            .collect();
        let mut previous = 0;
        for line in &self.progress {
            let Some(received) = line.shares_received else {
                continue;
            };
            // A restart begins counting again from 0.
            if received > previous {
                times.push(line.at_ms);
            }
            previous = received;
        }
        times.sort_unstable();
        times
    }

    /// Parses the text of a `progress.jsonl`; lines that are not complete events are skipped.
    pub(crate) fn parse(text: &str) -> PeerLines {
        let mut lines = PeerLines::default();
        for line in text.lines() {
            let Ok(value) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let Some(at_ms) = value["unix_ms"].as_u64() else {
                continue;
            };
            let number = |name: &str| value[name].as_f64();
            let count = |name: &str| value[name].as_u64();
            match value["event"].as_str() {
                Some("ready") => lines.readies.push(ReadyLine {
                    at_ms,
                    initial_eval_loss: number("initial_eval_loss"),
                }),
                Some("progress") => {
                    if let (Some(step), Some(peers)) = (count("step"), count("peers")) {
                        lines.progress.push(ProgressLine {
                            at_ms,
                            step,
                            peers,
                            rss_bytes: count("rss_bytes"),
                            shares_received: count("shares_received"),
                        });
                    }
                }
                Some("round") => {
                    if let (Some(outcome), Some(group), Some(coverage), Some(duration)) = (
                        value["outcome"].as_str(),
                        count("group"),
                        number("coverage"),
                        number("duration_s"),
                    ) {
                        lines.rounds.push(RoundLine {
                            at_ms,
                            outcome: outcome.to_owned(),
                            group,
                            coverage,
                            coverage_all: number("coverage_all"),
                            drift: number("drift"),
                            duration_ms: (duration.max(0.0) * 1000.0) as u64,
                        });
                    }
                }
                Some("eval") => {
                    if let Some(eval_loss) = number("eval_loss") {
                        lines.evals.push(EvalLine { at_ms, eval_loss });
                    }
                }
                Some("done") => {
                    if let (Some(exit), Some(step)) = (value["exit"].as_str(), count("step")) {
                        lines.dones.push(DoneLine {
                            at_ms,
                            exit: exit.to_owned(),
                            step,
                            final_eval_loss: number("final_eval_loss"),
                        });
                    }
                }
                _ => {}
            }
        }
        lines
    }

    /// The peer's lines in `folder` (a `murmur local --out` folder); none before it printed.
    pub(crate) fn read(folder: &Path, peer: usize) -> anyhow::Result<PeerLines> {
        let path = folder.join(format!("peer-{peer}")).join("progress.jsonl");
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(PeerLines::parse(&text)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(PeerLines::default()),
            Err(error) => Err(error).with_context(|| format!("cannot read {}", path.display())),
        }
    }
}

/// Milliseconds since the Unix epoch, the clock of the peers' lines.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A `murmur local` run in the background; killed with its peers when dropped.
#[derive(Debug)]
pub(crate) struct BackgroundSwarm {
    child: KillOnDrop,
    name: String,
    folder: PathBuf,
    summary_path: PathBuf,
    stderr_path: PathBuf,
    peers: usize,
}

/// How [`BackgroundSwarm::exited_or`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// `murmur local` exited.
    Exited,
    /// What was waited for holds.
    Reached,
    /// Neither within the limit.
    TimedOut,
}

/// How a background run ended.
#[derive(Debug)]
pub(crate) struct SwarmEnd {
    /// `murmur local`'s exit status.
    pub(crate) status: ExitStatus,
    /// Its `--json` summary, when it printed one.
    pub(crate) summary: Option<Value>,
    /// Every peer's lines.
    pub(crate) lines: Vec<PeerLines>,
}

impl BackgroundSwarm {
    /// Starts `murmur local --json --hosts HOSTS --out OUT/NAME --peers PEERS ARGS...`; the
    /// folder is cleared first, as `murmur local` wants a new or empty one.
    pub(crate) fn start(
        options: &ScenarioOptions,
        hosts: &Path,
        name: &str,
        peers: usize,
        args: &[String],
    ) -> anyhow::Result<BackgroundSwarm> {
        let folder = options.out.join(name);
        if folder.exists() {
            std::fs::remove_dir_all(&folder)
                .with_context(|| format!("cannot clear {}", folder.display()))?;
        }
        let summary_path = options.out.join(format!("{name}.summary.json"));
        let stderr_path = options.out.join(format!("{name}.stderr"));
        let stdout = File::create(&summary_path)
            .with_context(|| format!("cannot create {}", summary_path.display()))?;
        let stderr = File::create(&stderr_path)
            .with_context(|| format!("cannot create {}", stderr_path.display()))?;
        let mut command = Command::new(&options.murmur);
        command
            .args(["local", "--json", "--hosts"])
            .arg(hosts)
            .arg("--out")
            .arg(&folder)
            .args(["--peers", &peers.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        crate::end_with_parent(&mut command);
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {}", options.murmur.display()))?;
        Ok(BackgroundSwarm {
            child: KillOnDrop(child),
            name: name.to_owned(),
            folder,
            summary_path,
            stderr_path,
            peers,
        })
    }

    /// Every peer's lines so far.
    pub(crate) fn lines(&self) -> anyhow::Result<Vec<PeerLines>> {
        (0..self.peers)
            .map(|peer| PeerLines::read(&self.folder, peer))
            .collect()
    }

    /// Waits until `reached` holds for the peers' lines, for at most `limit`; fails, naming
    /// `what`, when the limit passes or `murmur local` exits first.
    pub(crate) fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        mut reached: impl FnMut(&[PeerLines]) -> bool,
    ) -> anyhow::Result<Vec<PeerLines>> {
        let deadline = Instant::now() + limit;
        loop {
            let lines = self.lines()?;
            if reached(&lines) {
                return Ok(lines);
            }
            if let Some(status) = self
                .child
                .0
                .try_wait()
                .context("waiting for murmur local")?
            {
                bail!(
                    "{}: murmur local exited ({status}) before {what}; see {} and {}",
                    self.name,
                    self.stderr_path.display(),
                    self.folder.display()
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "{}: no {what} within {:.0} s; see {}",
                    self.name,
                    limit.as_secs_f64(),
                    self.folder.display()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits at most `limit` for `murmur local` to exit, or for `reached` to hold for the
    /// peers' lines, whichever comes first.
    pub(crate) fn exited_or(
        &mut self,
        limit: Duration,
        mut reached: impl FnMut(&[PeerLines]) -> bool,
    ) -> anyhow::Result<Waited> {
        let deadline = Instant::now() + limit;
        loop {
            if self
                .child
                .0
                .try_wait()
                .context("waiting for murmur local")?
                .is_some()
            {
                return Ok(Waited::Exited);
            }
            if reached(&self.lines()?) {
                return Ok(Waited::Reached);
            }
            if Instant::now() >= deadline {
                return Ok(Waited::TimedOut);
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits at most `limit` for `murmur local` to exit on its own; whether it did.
    pub(crate) fn exited_within(&mut self, limit: Duration) -> anyhow::Result<bool> {
        let status = crate::exec::wait_bounded(&mut self.child.0, limit)
            .context("waiting for murmur local")?;
        Ok(status.is_some())
    }

    /// Asks `murmur local` to stop its peers, as Ctrl-C does.
    pub(crate) fn interrupt(&self) -> anyhow::Result<()> {
        let pid = i32::try_from(self.child.id()).context("process id out of range")?;
        // SAFETY: `kill` has no memory preconditions; `pid` is our own child, not reaped
        // before `finish` consumes `self`, so the id cannot have been reused.
        unsafe { libc::kill(pid, libc::SIGINT) };
        Ok(())
    }

    /// Waits at most `limit` for `murmur local` to exit (killing it past the limit, which is
    /// an error), then reads its summary and the peers' lines.
    pub(crate) fn finish(mut self, limit: Duration) -> anyhow::Result<SwarmEnd> {
        let status = match crate::exec::wait_bounded(&mut self.child.0, limit)
            .context("waiting for murmur local")?
        {
            Some(status) => status,
            None => bail!(
                "{}: murmur local did not end within {:.0} s; see {}",
                self.name,
                limit.as_secs_f64(),
                self.stderr_path.display()
            ),
        };
        let summary = std::fs::read_to_string(&self.summary_path)
            .ok()
            .and_then(|text| {
                text.lines()
                    .rev()
                    .find_map(|line| serde_json::from_str::<Value>(line).ok())
            });
        Ok(SwarmEnd {
            status,
            summary,
            lines: self.lines()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_and_broken_or_unknown_lines_skipped() {
        let text = concat!(
            "{\"event\":\"ready\",\"unix_ms\":1000,\"initial_eval_loss\":3.4}\n",
            "{\"event\":\"progress\",\"unix_ms\":1500,\"step\":4,\"peers\":7,\"rss_bytes\":9000}\n",
            "{\"event\":\"progress\",\"unix_ms\":2000,\"step\":5,\"peers\":7,\"rss_bytes\":null}\n",
            "{\"event\":\"round\",\"unix_ms\":2100,\"outcome\":\"partial\",\"group\":8,",
            "\"coverage\":0.75,\"drift\":0.02,\"duration_s\":0.5}\n",
            "{\"event\":\"round\",\"unix_ms\":2200,\"outcome\":\"failed\",\"group\":1,",
            "\"coverage\":0.0,\"drift\":null,\"duration_s\":0.01}\n",
            "{\"event\":\"round\",\"unix_ms\":2250,\"outcome\":\"failed\",\"group\":1}\n",
            "{\"event\":\"eval\",\"unix_ms\":2300,\"step\":5,\"eval_loss\":2.5}\n",
            "{\"event\":\"future\",\"unix_ms\":2400}\n",
            "not json\n",
            "{\"event\":\"progress\",\"step\":6,\"peers\":7}\n",
            "{\"event\":\"done\",\"unix_ms\":3000,\"step\":9,\"exit\":\"finished\",",
            "\"final_eval_loss\":2.0}\n",
            "{\"event\":\"progress\",\"unix_ms\":3100,\"st",
        );
        let lines = PeerLines::parse(text);
        assert_eq!(lines.readies.len(), 1);
        assert_eq!(lines.readies[0].initial_eval_loss, Some(3.4));
        assert_eq!(lines.progress.len(), 2, "no unix_ms, or cut short: skipped");
        assert_eq!(lines.progress[0].rss_bytes, Some(9000));
        assert_eq!(lines.progress[1].rss_bytes, None);
        assert_eq!(
            lines.rounds.len(),
            2,
            "a round without a duration is skipped"
        );
        assert!(lines.rounds[0].averaged());
        assert_eq!(lines.rounds[0].drift, Some(0.02));
        assert_eq!(lines.rounds[0].started_ms(), 1600);
        assert!(!lines.rounds[1].averaged());
        assert_eq!(
            lines.evals,
            [EvalLine {
                at_ms: 2300,
                eval_loss: 2.5
            }]
        );
        assert_eq!(lines.dones[0].exit, "finished");
        assert_eq!(lines.dones[0].final_eval_loss, Some(2.0));
    }

    #[test]
    fn a_peer_that_printed_nothing_yet_has_no_lines() {
        let tmp = std::env::temp_dir().join(format!("murmur-peer-lines-{}", std::process::id()));
        assert_eq!(PeerLines::read(&tmp, 3).unwrap(), PeerLines::default());
    }
}

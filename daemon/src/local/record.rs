//! What `murmur local` knows about each peer, built from its events: latest progress, counters
//! summed over restarts, and how it ended.

use super::events::{Done, DoneExit, PeerEvent};

/// One CSV row / plot point: a progress or eval reading of one peer at one moment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reading {
    /// Seconds since `murmur local` started (one clock for every peer and restart).
    pub(crate) wall_s: f64,
    pub(crate) peer: usize,
    pub(crate) kind: ReadingKind,
    pub(crate) step: Option<u64>,
    pub(crate) loss: Option<f64>,
    pub(crate) eval_loss: Option<f64>,
    pub(crate) samples_per_s: Option<f64>,
    /// Bytes sent so far, summed over the peer's restarts.
    pub(crate) bytes_sent: Option<u64>,
}

/// Which event a reading came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadingKind {
    /// The starting eval in `ready`.
    Ready,
    /// A `progress` event.
    Progress,
    /// A periodic `eval`.
    Eval,
    /// The final eval in `done`.
    Done,
}

impl ReadingKind {
    /// The name in the CSV's `event` column.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ReadingKind::Ready => "ready",
            ReadingKind::Progress => "progress",
            ReadingKind::Eval => "eval",
            ReadingKind::Done => "done",
        }
    }
}

/// How a peer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It ran all its steps.
    Finished,
    /// Ctrl-C stopped it.
    Stopped,
    /// It failed, for this reason.
    Failed(String),
}

/// Counters a peer reports, which restart from zero when it restarts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) samples: u64,
    pub(crate) bytes_sent: u64,
    pub(crate) bytes_received: u64,
    pub(crate) raw_bytes: u64,
}

impl Counters {
    fn plus(self, other: Counters) -> Counters {
        Counters {
            samples: self.samples + other.samples,
            bytes_sent: self.bytes_sent + other.bytes_sent,
            bytes_received: self.bytes_received + other.bytes_received,
            raw_bytes: self.raw_bytes + other.raw_bytes,
        }
    }
}

/// Everything known about one peer.
#[derive(Debug, Clone, Default)]
pub(crate) struct PeerRecord {
    pub(crate) index: usize,
    /// The first `ready`'s starting eval loss (a restarted peer resumes a trained model).
    pub(crate) initial_eval_loss: Option<f64>,
    pub(crate) loss_floor: Option<f64>,
    pub(crate) params: Option<u64>,
    /// Where it trains (`cpu`, `cuda:0`), from its last `ready`.
    pub(crate) device: Option<String>,
    /// Peer 0's listen addresses, the others' bootstrap.
    pub(crate) listen: Vec<String>,
    /// Whether the current run of the peer printed `ready`.
    pub(crate) ready: bool,
    pub(crate) step: u64,
    /// When (seconds into the run) its step last went up.
    pub(crate) stepped_at: Option<f64>,
    /// The longest it took between two steps so far, in seconds (a large model's step after
    /// an averaging round can take twice its others).
    pub(crate) longest_step_s: f64,
    pub(crate) loss: Option<f64>,
    pub(crate) eval_loss: Option<f64>,
    pub(crate) samples_per_s: f64,
    /// Bytes sent per second between the last two progress events.
    pub(crate) bytes_per_s: f64,
    /// Peers this one knows of, from its last progress event.
    pub(crate) known_peers: Option<u32>,
    pub(crate) rounds: u64,
    pub(crate) rounds_incomplete: u64,
    pub(crate) restarts: u32,
    pub(crate) done: Option<Done>,
    pub(crate) done_wall_s: Option<f64>,
    pub(crate) outcome: Option<Outcome>,
    /// Malformed or overlong lines seen.
    pub(crate) bad_lines: u64,
    current: Counters,
    earlier: Counters,
    last_progress: Option<(f64, u64)>,
    /// `(wall_s, samples over every run)` at each progress and at `done`.
    pub(crate) samples_seen: Vec<(f64, u64)>,
}

impl PeerRecord {
    pub(crate) fn new(index: usize) -> PeerRecord {
        PeerRecord {
            index,
            ..PeerRecord::default()
        }
    }

    /// Folds in one event seen at `wall_s`; returns the reading it gives, if any.
    pub(crate) fn apply(&mut self, wall_s: f64, event: &PeerEvent) -> Option<Reading> {
        let reading = |kind| Reading {
            wall_s,
            peer: self.index,
            kind,
            step: None,
            loss: None,
            eval_loss: None,
            samples_per_s: None,
            bytes_sent: None,
        };
        match event {
            PeerEvent::Ready(r) => {
                self.ready = true;
                self.initial_eval_loss = self.initial_eval_loss.or(r.initial_eval_loss);
                self.loss_floor = r.loss_floor.or(self.loss_floor);
                self.params = r.params.or(self.params);
                if r.device.is_some() {
                    self.device.clone_from(&r.device);
                }
                self.listen.clone_from(&r.listen);
                self.eval_loss = self.eval_loss.or(r.initial_eval_loss);
                let eval_loss = r.initial_eval_loss?;
                Some(Reading {
                    eval_loss: Some(eval_loss),
                    ..reading(ReadingKind::Ready)
                })
            }
            PeerEvent::Progress(p) => {
                if let Some((at, sent)) = self.last_progress
                    && wall_s > at
                {
                    self.bytes_per_s = p.bytes_sent.saturating_sub(sent) as f64 / (wall_s - at);
                }
                self.last_progress = Some((wall_s, p.bytes_sent));
                if p.step > self.step {
                    if let Some(at) = self.stepped_at {
                        self.longest_step_s = self.longest_step_s.max(wall_s - at);
                    }
                    self.stepped_at = Some(wall_s);
                }
                self.step = p.step;
                // Before its first step a peer has no training loss yet (it prints 0).
                let loss = (p.step > 0).then_some(p.loss);
                self.loss = loss.or(self.loss);
                self.samples_per_s = p.samples_per_s;
                self.known_peers = p.peers;
                self.current = Counters {
                    samples: p.samples,
                    bytes_sent: p.bytes_sent,
                    bytes_received: p.bytes_received,
                    raw_bytes: self.current.raw_bytes,
                };
                self.samples_seen.push((wall_s, self.totals().samples));
                Some(Reading {
                    step: Some(p.step),
                    loss,
                    samples_per_s: Some(p.samples_per_s),
                    bytes_sent: Some(self.totals().bytes_sent),
                    ..reading(ReadingKind::Progress)
                })
            }
            PeerEvent::Eval(e) => {
                self.eval_loss = Some(e.eval_loss);
                Some(Reading {
                    step: Some(e.step),
                    eval_loss: Some(e.eval_loss),
                    ..reading(ReadingKind::Eval)
                })
            }
            PeerEvent::Round(r) => {
                self.rounds += 1;
                if r.outcome != "complete" {
                    self.rounds_incomplete += 1;
                }
                None
            }
            PeerEvent::Done(d) => {
                self.step = d.step;
                self.current = Counters {
                    samples: d.samples,
                    bytes_sent: d.bytes_sent,
                    bytes_received: d.bytes_received,
                    raw_bytes: d.raw_bytes,
                };
                self.initial_eval_loss = self.initial_eval_loss.or(d.initial_eval_loss);
                self.loss_floor = d.loss_floor.or(self.loss_floor);
                self.eval_loss = d.final_eval_loss.or(self.eval_loss);
                self.done = Some(d.clone());
                self.done_wall_s = Some(wall_s);
                self.samples_seen.push((wall_s, self.totals().samples));
                Some(Reading {
                    step: Some(d.step),
                    eval_loss: d.final_eval_loss,
                    bytes_sent: Some(self.totals().bytes_sent),
                    ..reading(ReadingKind::Done)
                })
            }
        }
    }

    /// The peer was killed and will start again: keep what it counted so far.
    pub(crate) fn restart(&mut self) {
        self.earlier = self.earlier.plus(self.current);
        self.current = Counters::default();
        self.last_progress = None;
        self.bytes_per_s = 0.0;
        self.samples_per_s = 0.0;
        self.ready = false;
        self.done = None;
        self.restarts += 1;
    }

    /// Counters summed over every run of the peer.
    pub(crate) fn totals(&self) -> Counters {
        self.earlier.plus(self.current)
    }

    /// How the peer ended, given its process ended; `stopping` when Ctrl-C or the overall
    /// bound asked it to stop. Sets `outcome` unless something set it already.
    pub(crate) fn conclude(&mut self, exit_status: &str, stopping: bool) {
        if self.outcome.is_some() {
            return;
        }
        let outcome = match &self.done {
            Some(d) => match d.exit {
                DoneExit::Finished => Outcome::Finished,
                DoneExit::Signal if stopping => Outcome::Stopped,
                DoneExit::Signal => Outcome::Failed("stopped by a signal it was not sent".into()),
                DoneExit::Error => Outcome::Failed(
                    d.error
                        .clone()
                        .unwrap_or_else(|| "failed without saying why".into()),
                ),
            },
            None if stopping => Outcome::Stopped,
            None => Outcome::Failed(format!("exited ({exit_status}) without a done line")),
        };
        self.outcome = Some(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::events::parse_line;

    fn event(line: &str) -> PeerEvent {
        parse_line(line).unwrap().unwrap()
    }

    fn progress(step: u64, samples: u64, sent: u64) -> PeerEvent {
        event(&format!(
            r#"{{"event":"progress","step":{step},"samples":{samples},"loss":2.0,"samples_per_s":100.0,"bytes_sent":{sent}}}"#
        ))
    }

    fn done(sent: u64, raw: u64, exit: &str) -> PeerEvent {
        event(&format!(
            r#"{{"event":"done","step":9,"samples":90,"initial_eval_loss":3.0,"final_eval_loss":1.5,"loss_floor":1.0,"bytes_sent":{sent},"raw_bytes":{raw},"exit":"{exit}"}}"#
        ))
    }

    #[test]
    fn counters_survive_restarts() {
        let mut r = PeerRecord::new(2);
        r.apply(1.0, &progress(10, 160, 1_000));
        r.apply(2.0, &progress(20, 320, 3_000));
        assert_eq!(r.bytes_per_s, 2_000.0);
        r.restart();
        assert_eq!(r.totals().bytes_sent, 3_000, "kept across the kill");
        let reading = r.apply(5.0, &progress(25, 80, 500)).unwrap();
        assert_eq!(reading.bytes_sent, Some(3_500));
        assert_eq!(reading.peer, 2);
        r.apply(6.0, &done(700, 2_800, "finished"));
        let t = r.totals();
        assert_eq!((t.samples, t.bytes_sent, t.raw_bytes), (410, 3_700, 2_800));
        assert_eq!(r.restarts, 1);
    }

    #[test]
    fn progress_before_the_first_step_has_no_loss() {
        let mut r = PeerRecord::new(0);
        let reading = r.apply(0.1, &progress(0, 0, 0)).unwrap();
        assert_eq!((reading.step, reading.loss), (Some(0), None));
        assert_eq!(r.loss, None);
        let reading = r.apply(0.6, &progress(1, 16, 10)).unwrap();
        assert_eq!(reading.loss, Some(2.0));
    }

    #[test]
    fn the_first_ready_sets_the_initial_loss() {
        let mut r = PeerRecord::new(0);
        let ready = |loss: f64| {
            event(&format!(
                r#"{{"event":"ready","peer":"p","listen":["/a"],"initial_eval_loss":{loss},"loss_floor":1.0}}"#
            ))
        };
        let reading = r.apply(0.5, &ready(3.5)).unwrap();
        assert_eq!(reading.kind, ReadingKind::Ready);
        assert_eq!(reading.eval_loss, Some(3.5));
        r.restart();
        r.apply(9.0, &ready(2.0));
        assert_eq!(r.initial_eval_loss, Some(3.5));
        assert_eq!(r.listen, vec!["/a".to_owned()]);
        assert!(r.ready);
    }

    #[test]
    fn outcomes_follow_the_done_line() {
        let mut r = PeerRecord::new(1);
        r.apply(1.0, &done(1, 4, "finished"));
        r.conclude("exit status: 0", false);
        assert_eq!(r.outcome, Some(Outcome::Finished));

        let mut r = PeerRecord::new(1);
        r.apply(1.0, &done(1, 4, "signal"));
        r.conclude("exit status: 0", true);
        assert_eq!(r.outcome, Some(Outcome::Stopped));

        let mut r = PeerRecord::new(1);
        r.conclude("signal: 9 (SIGKILL)", false);
        let Some(Outcome::Failed(why)) = &r.outcome else {
            panic!("failed")
        };
        assert!(why.contains("SIGKILL") && why.contains("without a done line"));

        // An earlier verdict (e.g. killed for silence) is kept.
        let mut r = PeerRecord::new(1);
        r.outcome = Some(Outcome::Failed("silent".into()));
        r.apply(1.0, &done(1, 4, "finished"));
        r.conclude("exit status: 0", false);
        assert_eq!(r.outcome, Some(Outcome::Failed("silent".into())));
    }
}

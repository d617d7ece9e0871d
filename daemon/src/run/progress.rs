//! What a peer tells whoever watches it: with `--progress`, one JSON object per line on
//! stdout, for `murmur local` and scripts (the format is documented in docs/progress.md);
//! unless `--quiet`, a short human line in the log every few seconds.

use std::io::Write as _;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::clock::unix_ms;
use crate::observe::process::own_status_bytes;
use murmur_gossip::engine::RoundReport;
use murmur_protocol::identity::PeerId;

/// Progress lines come at most this often.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// The human status line in the log comes at most this often.
const STATUS_LINE_EVERY: Duration = Duration::from_secs(5);

/// Counters a progress line reports.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counters {
    pub(crate) step: u64,
    pub(crate) samples: u64,
    pub(crate) loss: f32,
    pub(crate) samples_per_s: f64,
    pub(crate) bytes_sent: u64,
    pub(crate) bytes_received: u64,
    pub(crate) raw_bytes: u64,
    pub(crate) peers: usize,
    pub(crate) rounds: u64,
    /// SGP: shares received from other peers and folded in (0 in the round-based modes,
    /// whose `round` lines say when they averaged).
    pub(crate) shares_received: u64,
    /// SGP with a lossy codec: shares that started an edge from the zero reference.
    pub(crate) edges_started: u64,
    /// SGP: this peer's push-sum weight `w` (`None` in the round-based modes).
    pub(crate) push_sum_weight: Option<f64>,
    /// The last consensus drift measured: the relative L2 distance between this peer's
    /// parameters and the average it was compared with (a round's result, or an SGP
    /// neighbour's exact share).
    pub(crate) drift: Option<f64>,
}

/// The eval losses a summary reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EvalLosses {
    pub(crate) initial: f32,
    pub(crate) last: f32,
    pub(crate) floor: Option<f32>,
}

/// Writes the progress lines of one peer (or nothing, when off).
#[derive(Debug)]
pub(crate) struct Progress {
    enabled: bool,
    peer: String,
    mode: &'static str,
    started: Instant,
    last: Option<Instant>,
    /// The last human status line: when, and the byte counters then (for the rates).
    status_line: Option<StatusLine>,
}

/// Where the human status line stands.
#[derive(Debug, Clone, Copy)]
struct StatusLine {
    at: Instant,
    bytes_sent: u64,
    bytes_received: u64,
}

impl Progress {
    /// `json`: JSON lines on stdout. `status_lines`: the human line in the log.
    pub(crate) fn new(
        json: bool,
        status_lines: bool,
        peer: String,
        mode: &'static str,
    ) -> Progress {
        let started = Instant::now();
        Progress {
            enabled: json,
            peer,
            mode,
            started,
            last: None,
            status_line: status_lines.then_some(StatusLine {
                at: started,
                bytes_sent: 0,
                bytes_received: 0,
            }),
        }
    }

    fn wall_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn emit(&self, mut line: Value) {
        if !self.enabled {
            return;
        }
        if let Some(object) = line.as_object_mut() {
            object.insert("peer".into(), Value::String(self.peer.clone()));
            object.insert("wall_s".into(), json!(self.wall_s()));
            object.insert("unix_ms".into(), json!(unix_ms()));
        }
        let mut out = std::io::stdout().lock();
        // A closed stdout (the parent went away) must not stop training.
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    pub(crate) fn ready(
        &self,
        listen: &[String],
        params: usize,
        initial_eval_loss: f32,
        loss_floor: Option<f32>,
        metrics_addr: Option<String>,
        device: &str,
    ) {
        self.emit(json!({
            "event": "ready",
            "listen": listen,
            "params": params,
            "device": device,
            "initial_eval_loss": initial_eval_loss,
            "loss_floor": loss_floor,
            "metrics_addr": metrics_addr,
        }));
    }

    /// A progress line, unless one went out less than 500 ms ago; and the human status line
    /// in the log, unless one went out less than 5 s ago.
    pub(crate) fn progress(&mut self, c: &Counters) {
        let now = Instant::now();
        self.status_line(now, c);
        if self.last.is_some_and(|last| now - last < PROGRESS_EVERY) {
            return;
        }
        self.last = Some(now);
        self.emit(json!({
            "event": "progress",
            "step": c.step,
            "samples": c.samples,
            "loss": c.loss,
            "samples_per_s": c.samples_per_s,
            "bytes_sent": c.bytes_sent,
            "bytes_received": c.bytes_received,
            "peers": c.peers,
            "rounds": c.rounds,
            "shares_received": c.shares_received,
            "edges_started": c.edges_started,
            "push_sum_weight": c.push_sum_weight,
            "mode": self.mode,
            "drift": c.drift,
            "rss_bytes": own_status_bytes("VmRSS:"),
        }));
    }

    /// Logs `step 1200 · loss 2.41 · 3 peers · 420 samples/s · up 1.2 MB/s · down 1.1
    /// MB/s` at most every [`STATUS_LINE_EVERY`].
    fn status_line(&mut self, now: Instant, c: &Counters) {
        let Some(last) = self.status_line else {
            return;
        };
        let elapsed = now.saturating_duration_since(last.at);
        if elapsed < STATUS_LINE_EVERY {
            return;
        }
        let seconds = elapsed.as_secs_f64();
        let up = c.bytes_sent.saturating_sub(last.bytes_sent) as f64 / seconds;
        let down = c.bytes_received.saturating_sub(last.bytes_received) as f64 / seconds;
        tracing::info!(
            target: "murmur::status",
            "step {} · loss {:.4} · {} · {:.0} samples/s · up {} · down {}",
            c.step,
            c.loss,
            match c.peers {
                0 => "alone".to_owned(),
                1 => "1 peer".to_owned(),
                n => format!("{n} peers"),
            },
            c.samples_per_s,
            rate(up),
            rate(down),
        );
        self.status_line = Some(StatusLine {
            at: now,
            bytes_sent: c.bytes_sent,
            bytes_received: c.bytes_received,
        });
    }

    pub(crate) fn eval(&self, step: u64, eval_loss: f32) {
        self.emit(json!({"event": "eval", "step": step, "eval_loss": eval_loss}));
    }

    pub(crate) fn round(&self, round: &RoundReport<PeerId>) {
        self.emit(json!({
            "event": "round",
            "mode": self.mode,
            "round": round.round,
            "outcome": round.outcome(),
            "duration_s": round.finished_after.as_secs_f64(),
            "matchmaking_s": round.matchmaking.as_secs_f64(),
            "coverage": round.coverage,
            "coverage_all": round.coverage_all,
            "group": round.group_size,
            "part": round.part_elements,
            "drift": round.drift,
            "averaged": if round.parameters { "parameters" } else { "gradients" },
            "weights_capped": round.weights_capped,
            "contributions_rejected": round.contributions_rejected,
            "feedback_carried": round.feedback_carried,
        }));
    }

    /// A round this peer was due for formed no group: it applied its own update.
    pub(crate) fn alone(&self, round: u64) {
        self.emit(json!({
            "event": "round",
            "mode": self.mode,
            "round": round,
            "outcome": "alone",
            "duration_s": 0.0,
            "matchmaking_s": null,
            "coverage": 0.0,
            "coverage_all": 0.0,
            "group": 1,
            "part": 0,
            "drift": null,
            "weights_capped": 0,
            "contributions_rejected": 0,
            "feedback_carried": null,
        }));
    }

    pub(crate) fn done(&self, c: &Counters, losses: EvalLosses, exit: &str, error: Option<String>) {
        self.emit(json!({
            "event": "done",
            "step": c.step,
            "samples": c.samples,
            "initial_eval_loss": losses.initial,
            "final_eval_loss": losses.last,
            "loss_floor": losses.floor,
            "bytes_sent": c.bytes_sent,
            "bytes_received": c.bytes_received,
            "raw_bytes": c.raw_bytes,
            "peak_rss_bytes": own_status_bytes("VmHWM:"),
            "exit": exit,
            "error": error,
        }));
    }
}

/// Bytes per second for people: `850 B/s`, `12.3 kB/s`, `4.1 MB/s`.
fn rate(bytes_per_s: f64) -> String {
    if bytes_per_s < 1e3 {
        format!("{bytes_per_s:.0} B/s")
    } else if bytes_per_s < 1e6 {
        format!("{:.1} kB/s", bytes_per_s / 1e3)
    } else {
        format!("{:.1} MB/s", bytes_per_s / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_in_human_units() {
        assert_eq!(rate(0.0), "0 B/s");
        assert_eq!(rate(850.4), "850 B/s");
        assert_eq!(rate(12_345.0), "12.3 kB/s");
        assert_eq!(rate(4_100_000.0), "4.1 MB/s");
    }
}

//! The live view of a local swarm: a compact table redrawn at most twice a second on a
//! terminal, one line per update otherwise, nothing with `--json`.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use super::record::{Outcome, PeerRecord, Reading, ReadingKind};
use super::summary::bytes;

/// The shortest time between two redraws of the table.
const REDRAW_EVERY: Duration = Duration::from_millis(500);

/// How progress is shown.
#[derive(Debug)]
pub(crate) enum LiveView {
    /// Nothing (`--json`).
    Quiet,
    /// One line per reading and note (stdout is not a terminal).
    Lines,
    /// A table redrawn in place.
    Table {
        /// Lines of the table now on screen, to move back over.
        drawn: usize,
        last_draw: Option<Instant>,
        dirty: bool,
    },
}

impl LiveView {
    /// The view for this run: quiet with `--json`, else by whether stdout is a terminal.
    pub(crate) fn new(json: bool) -> LiveView {
        if json {
            LiveView::Quiet
        } else if std::io::stdout().is_terminal() {
            LiveView::Table {
                drawn: 0,
                last_draw: None,
                dirty: true,
            }
        } else {
            LiveView::Lines
        }
    }

    /// A peer reported something.
    pub(crate) fn reading(&mut self, reading: &Reading, record: &PeerRecord, steps: u64) {
        match self {
            LiveView::Quiet => {}
            LiveView::Lines => println!("{}", reading_line(reading, record, steps)),
            LiveView::Table { dirty, .. } => *dirty = true,
        }
    }

    /// Something happened that is worth a line of its own (a peer started, was killed...).
    pub(crate) fn note(&mut self, wall_s: f64, text: &str) {
        match self {
            LiveView::Quiet => {}
            LiveView::Lines => println!("{wall_s:7.1}s  {text}"),
            LiveView::Table { drawn, dirty, .. } => {
                let mut out = std::io::stdout().lock();
                // Clear the table, print the note where it was; the table comes back below.
                let _ = write!(out, "{}", erase(*drawn));
                let _ = writeln!(out, "{wall_s:7.1}s  {text}");
                let _ = out.flush();
                *drawn = 0;
                *dirty = true;
            }
        }
    }

    /// Redraws the table if something changed and the last redraw is old enough.
    pub(crate) fn refresh(&mut self, records: &[PeerRecord], wall_s: f64, steps: u64) {
        let LiveView::Table {
            drawn,
            last_draw,
            dirty,
        } = self
        else {
            return;
        };
        if !*dirty || last_draw.is_some_and(|at| at.elapsed() < REDRAW_EVERY) {
            return;
        }
        let table = table(records, wall_s, steps);
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "{}{table}", erase(*drawn));
        let _ = out.flush();
        *drawn = table.lines().count();
        *last_draw = Some(Instant::now());
        *dirty = false;
    }

    /// Removes the table before the summary is printed.
    pub(crate) fn finish(&mut self) {
        if let LiveView::Table { drawn, .. } = self {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "{}", erase(*drawn));
            let _ = out.flush();
            *drawn = 0;
        }
    }
}

/// ANSI: move up `lines` lines to column 1 and clear to the end of the screen.
fn erase(lines: usize) -> String {
    if lines == 0 {
        String::new()
    } else {
        format!("\x1b[{lines}F\x1b[J")
    }
}

fn reading_line(r: &Reading, record: &PeerRecord, steps: u64) -> String {
    let mut line = format!("{:7.1}s  peer {:<2} ", r.wall_s, r.peer);
    // `write!` into a String cannot fail.
    match r.kind {
        ReadingKind::Progress => {
            let _ = write!(
                line,
                "step {:>5}/{steps}  loss {}  {:.0} samples/s  {}/s sent",
                r.step.unwrap_or(0),
                r.loss.map_or("-".into(), |l| format!("{l:.4}")),
                r.samples_per_s.unwrap_or(0.0),
                bytes(record.bytes_per_s),
            );
        }
        ReadingKind::Ready => {
            let _ = write!(
                line,
                "ready        eval loss {:.4}",
                r.eval_loss.unwrap_or(f64::NAN)
            );
        }
        ReadingKind::Eval => {
            let _ = write!(
                line,
                "step {:>5}/{steps}  eval loss {:.4}",
                r.step.unwrap_or(0),
                r.eval_loss.unwrap_or(f64::NAN)
            );
        }
        ReadingKind::Done => {
            let _ = write!(
                line,
                "done at step {}  final eval loss {}",
                r.step.unwrap_or(0),
                r.eval_loss.map_or("-".into(), |l| format!("{l:.4}"))
            );
        }
    }
    line
}

fn state(record: &PeerRecord) -> &'static str {
    match &record.outcome {
        Some(Outcome::Finished) => "finished",
        Some(Outcome::Stopped) => "stopped",
        Some(Outcome::Failed(_)) => "failed",
        None if record.done.is_some() => "done",
        None if record.ready => "running",
        None => "starting",
    }
}

/// The table: one row per peer.
fn table(records: &[PeerRecord], wall_s: f64, steps: u64) -> String {
    let mut t = String::with_capacity(128 * (records.len() + 2));
    // `write!` into a String cannot fail.
    let _ = writeln!(
        t,
        "{:<5} {:>11} {:>8} {:>8} {:>10} {:>11} {:>6}  {:<9} {wall_s:6.1}s",
        "peer", "step", "loss", "eval", "samples/s", "sent/s", "peers", "state"
    );
    for r in records {
        let _ = writeln!(
            t,
            "{:<5} {:>11} {:>8} {:>8} {:>10.0} {:>11} {:>6}  {:<9}",
            r.index,
            format!("{}/{steps}", r.step),
            r.loss.map_or("-".into(), |l| format!("{l:.4}")),
            r.eval_loss.map_or("-".into(), |l| format!("{l:.4}")),
            r.samples_per_s,
            format!("{}/s", bytes(r.bytes_per_s)),
            r.known_peers.map_or("-".into(), |p| p.to_string()),
            state(r),
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_a_row_per_peer_and_the_latest_numbers() {
        let mut records = vec![PeerRecord::new(0), PeerRecord::new(1)];
        records[1].step = 120;
        records[1].loss = Some(2.3456);
        records[1].ready = true;
        records[1].bytes_per_s = 1_500_000.0;
        let t = table(&records, 12.34, 600);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].contains("12.3s"));
        assert!(lines[1].contains("starting"));
        assert!(
            lines[2].contains("120/600")
                && lines[2].contains("2.3456")
                && lines[2].contains("1.5 MB/s")
                && lines[2].contains("running"),
            "{}",
            lines[2]
        );
    }

    #[test]
    fn a_progress_line_says_step_loss_and_rates() {
        let mut record = PeerRecord::new(3);
        record.bytes_per_s = 2_000.0;
        let r = Reading {
            wall_s: 4.3,
            peer: 3,
            kind: ReadingKind::Progress,
            step: Some(40),
            loss: Some(2.91),
            eval_loss: None,
            samples_per_s: Some(410.2),
            bytes_sent: Some(1),
        };
        let line = reading_line(&r, &record, 600);
        for part in [
            "4.3s",
            "peer 3",
            "40/600",
            "2.9100",
            "410 samples/s",
            "2.0 kB/s",
        ] {
            assert!(line.contains(part), "{part}: {line}");
        }
    }
}

//! Peer child processes: starting `murmur run --progress`, reading its stdout line by line
//! into bounded messages, and stopping it.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::run::FAULT_VAR;
use tokio::sync::mpsc;

use super::events::{EventError, PeerEvent, parse_line};
use crate::hosts::Hosts;

/// The longest progress line read; longer ones are skipped (progress lines are ~300 bytes).
const MAX_LINE_BYTES: usize = 64 * 1024;
/// How long `kill -s INT` may take.
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(2);
/// Beside each peer's log: every line it printed on stdout, over all its restarts.
pub(crate) const PROGRESS_FILE: &str = "progress.jsonl";

/// How to start a peer: a program and the arguments before `--config FILE --progress`.
#[derive(Debug, Clone)]
pub(crate) struct Launcher {
    program: PathBuf,
    leading_args: Vec<OsString>,
}

impl Launcher {
    /// `murmur run`, with this very executable.
    pub(crate) fn murmur_run() -> anyhow::Result<Launcher> {
        let program = std::env::current_exe().context("finding the murmur executable")?;
        Ok(Launcher {
            program,
            leading_args: vec!["run".into()],
        })
    }

    /// Any program that speaks the progress protocol (tests use a shell script).
    #[cfg(test)]
    pub(crate) fn new(program: PathBuf, leading_args: Vec<OsString>) -> Launcher {
        Launcher {
            program,
            leading_args,
        }
    }
}

/// What a peer's stdout reader reports.
#[derive(Debug)]
pub(crate) enum PeerOutput {
    /// A parsed event.
    Event(PeerEvent),
    /// A JSON object that is not a valid event.
    Malformed(EventError),
    /// A line longer than [`MAX_LINE_BYTES`], skipped.
    Overlong,
    /// stdout ended (the process exited or closed it), or could not be read.
    Closed(Option<std::io::Error>),
}

/// A message from one run (generation) of one peer.
#[derive(Debug)]
pub(crate) struct PeerMessage {
    pub(crate) peer: usize,
    pub(crate) generation: u32,
    pub(crate) output: PeerOutput,
}

/// Starts one peer, under its launcher from `hosts` (with the test-only fault switch set to
/// `fault`, if any): stdout is parsed into `messages` and
/// appended to [`PROGRESS_FILE`] beside `log`, stderr is appended to `log`. The child runs in its own process group, so a terminal's Ctrl-C
/// reaches `murmur local` only, which forwards it exactly once.
#[allow(clippy::too_many_arguments)] // one per thing a peer is started with
pub(crate) fn spawn_peer(
    launcher: &Launcher,
    hosts: &Hosts,
    peer: usize,
    fault: Option<&str>,
    generation: u32,
    config: &Path,
    log: &Path,
    messages: mpsc::Sender<PeerMessage>,
) -> anyhow::Result<Child> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let lines_path = log.with_file_name(PROGRESS_FILE);
    let lines_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&lines_path)
        .with_context(|| format!("opening {}", lines_path.display()))?;
    let mut command = hosts.command(peer, &launcher.program);
    if let Some(fault) = fault {
        command.env(FAULT_VAR, fault);
    }
    let mut child = Command::from(command)
        .args(&launcher.leading_args)
        .arg("--config")
        .arg(config)
        .arg("--progress")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting peer {peer} ({})", launcher.program.display()))?;
    let stdout = child
        .stdout
        .take()
        .context("the child's stdout was not captured")?;
    tokio::spawn(forward_lines(
        BufReader::new(stdout),
        lines_file,
        peer,
        generation,
        messages,
    ));
    Ok(child)
}

/// Reads lines until EOF, appends each to `copy` and sends what they say; stops early if
/// nobody listens any more.
async fn forward_lines<R: AsyncBufRead + Unpin>(
    mut reader: R,
    mut copy: std::fs::File,
    peer: usize,
    generation: u32,
    messages: mpsc::Sender<PeerMessage>,
) {
    let mut buf = Vec::with_capacity(1024);
    loop {
        let output = match read_bounded_line(&mut reader, &mut buf, MAX_LINE_BYTES).await {
            Ok(LineRead::Line) => {
                // A lost copy must not stop the run; the line is still handled below.
                buf.push(b'\n');
                let _ = copy.write_all(&buf);
                buf.pop();
                match parse_line(&String::from_utf8_lossy(&buf)) {
                    Ok(Some(event)) => PeerOutput::Event(event),
                    Ok(None) => continue,
                    Err(e) => PeerOutput::Malformed(e),
                }
            }
            Ok(LineRead::Overlong) => PeerOutput::Overlong,
            Ok(LineRead::Eof) => PeerOutput::Closed(None),
            Err(e) => PeerOutput::Closed(Some(e)),
        };
        let closed = matches!(output, PeerOutput::Closed(_));
        let message = PeerMessage {
            peer,
            generation,
            output,
        };
        if messages.send(message).await.is_err() || closed {
            return;
        }
    }
}

/// What [`read_bounded_line`] found.
#[derive(Debug, PartialEq, Eq)]
enum LineRead {
    /// A line (without its newline) is in the buffer.
    Line,
    /// A line longer than the limit was skipped.
    Overlong,
    /// The stream ended with no line pending.
    Eof,
}

/// Reads one `\n`-terminated line into `buf`, holding at most `max` bytes of it.
async fn read_bounded_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<LineRead> {
    buf.clear();
    let mut overlong = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(match (overlong, buf.is_empty()) {
                (true, _) => LineRead::Overlong,
                (false, true) => LineRead::Eof,
                (false, false) => LineRead::Line,
            });
        }
        let newline = available.iter().position(|&b| b == b'\n');
        let chunk = &available[..newline.unwrap_or(available.len())];
        if !overlong {
            if buf.len() + chunk.len() > max {
                overlong = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = newline.map_or(available.len(), |i| i + 1);
        reader.consume(used);
        if newline.is_some() {
            return Ok(if overlong {
                LineRead::Overlong
            } else {
                LineRead::Line
            });
        }
    }
}

/// Sends SIGINT to the child, so it stops gracefully and prints `done`. Returns false when
/// that was not possible (the child already exited, or `kill` is missing).
pub(crate) async fn interrupt(child: &Child) -> bool {
    let Some(pid) = child.id() else {
        return false;
    };
    // std and tokio only send SIGKILL; the `kill` utility sends any signal.
    let status = Command::new("kill")
        .args(["-s", "INT", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    matches!(
        tokio::time::timeout(SIGNAL_TIMEOUT, status).await,
        Ok(Ok(s)) if s.success()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn lines_are_read_whole_and_overlong_ones_skipped() {
        runtime().block_on(async {
            let input: &[u8] = b"short\n0123456789abc\nlast-without-newline";
            // A tiny buffer makes lines arrive split over several fills.
            let mut reader = BufReader::with_capacity(4, input);
            let mut buf = Vec::new();
            let read = read_bounded_line(&mut reader, &mut buf, 10).await.unwrap();
            assert_eq!((read, buf.as_slice()), (LineRead::Line, &b"short"[..]));
            let read = read_bounded_line(&mut reader, &mut buf, 10).await.unwrap();
            assert_eq!(read, LineRead::Overlong);
            let read = read_bounded_line(&mut reader, &mut buf, 10).await.unwrap();
            assert_eq!(read, LineRead::Overlong, "20 bytes without a newline");
            let read = read_bounded_line(&mut reader, &mut buf, 10).await.unwrap();
            assert_eq!(read, LineRead::Eof);

            let mut reader = BufReader::with_capacity(4, &b"tail"[..]);
            let read = read_bounded_line(&mut reader, &mut buf, 10).await.unwrap();
            assert_eq!((read, buf.as_slice()), (LineRead::Line, &b"tail"[..]));
        });
    }

    #[test]
    fn the_reader_forwards_events_and_reports_the_end() {
        runtime().block_on(async {
            let input: &[u8] = b"log line\n{\"event\":\"eval\",\"step\":5,\"eval_loss\":2.5}\n{\"event\":\"eval\"}\n";
            let (tx, mut rx) = mpsc::channel(8);
            let tmp = tempfile::tempdir().unwrap();
            let copy_path = tmp.path().join(PROGRESS_FILE);
            let copy = std::fs::File::create(&copy_path).unwrap();
            forward_lines(BufReader::new(input), copy, 3, 7, tx).await;
            assert_eq!(
                std::fs::read(&copy_path).unwrap(),
                input,
                "every line is copied, whatever it says"
            );
            let first = rx.recv().await.unwrap();
            assert_eq!((first.peer, first.generation), (3, 7));
            assert!(matches!(first.output, PeerOutput::Event(PeerEvent::Eval(_))));
            assert!(matches!(
                rx.recv().await.unwrap().output,
                PeerOutput::Malformed(_)
            ));
            assert!(matches!(
                rx.recv().await.unwrap().output,
                PeerOutput::Closed(None)
            ));
            assert!(rx.recv().await.is_none());
        });
    }
}

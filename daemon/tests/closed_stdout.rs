//! Every CLI command whose reader goes away (`murmur checkpoint show DIR | head`) stops as
//! `cat` does, killed by SIGPIPE, and never panics on the broken pipe.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The daemon under test.
const MURMUR: &str = env!("CARGO_BIN_EXE_murmur");

/// SIGPIPE's number on Linux.
const SIGPIPE: i32 = 13;

/// How long one command may take.
const PATIENCE: Duration = Duration::from_secs(30);

/// Runs `murmur args…` with its stdout on a pipe whose reading end is already closed, so
/// that its first write fails; returns the exit status and stderr.
fn run_with_closed_stdout(args: &[&str]) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let mut child = Command::new(MURMUR)
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("murmur starts");
    let deadline = Instant::now() + PATIENCE;
    while child.try_wait().expect("waits").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "`murmur {}` still running after {PATIENCE:?}",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("the output");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn commands_whose_reader_is_gone_stop_on_sigpipe_without_a_panic() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let folder = dir.path().to_str().expect("a UTF-8 path");
    for args in [
        vec!["checkpoint", "show", folder],
        vec!["checkpoint", "show", folder, "--json"],
        vec!["completions", "bash"],
        vec!["--help"],
    ] {
        let (status, stderr) = run_with_closed_stdout(&args);
        assert!(
            !stderr.contains("panicked"),
            "`murmur {}` panicked: {status}\n{stderr}",
            args.join(" ")
        );
        assert_eq!(
            status.signal(),
            Some(SIGPIPE),
            "`murmur {}` did not stop on SIGPIPE: {status}\n{stderr}",
            args.join(" ")
        );
    }
}

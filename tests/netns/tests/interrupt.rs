//! A process interrupted while it holds a harness (Ctrl-C, a test runner's timeout) leaves
//! no namespace and no process of it behind.
//!
//! The test runs itself a second time as the victim: that copy builds a harness, starts a
//! long `sleep` inside a peer's namespace, says so, and waits; this copy sends it SIGTERM.
//! Needs root and iproute2, like the other tests here.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use murmur_netns::{Harness, KillOnDrop, LinkShape, NAMESPACE_PREFIX, Topology};

/// Set in the victim's environment.
const VICTIM: &str = "MURMUR_NETNS_INTERRUPT_VICTIM";
const TEST_NAME: &str = "sigterm_removes_the_namespaces_and_what_runs_in_them";

#[test]
fn sigterm_removes_the_namespaces_and_what_runs_in_them() {
    if std::env::var_os(VICTIM).is_some() {
        be_the_victim();
        return;
    }
    let mut victim = Command::new(std::env::current_exe().expect("this test's path"))
        .args([TEST_NAME, "--exact", "--nocapture"])
        .env(VICTIM, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the victim starts");
    let victim_pid = victim.id();
    let stdout = victim.stdout.take().expect("piped");
    let (lines, ready) = mpsc::sync_channel(64);
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let sleeper = wait_for_ready(&ready, Duration::from_secs(60)).unwrap_or_else(|| {
        let _ = victim.kill();
        panic!("the victim did not build its harness within 60 s")
    });
    assert!(alive(sleeper), "the sleeper runs before the signal");
    assert!(!namespaces_of(victim_pid).is_empty());

    // SAFETY: `kill` has no memory preconditions; the pid is our own child's.
    unsafe { libc::kill(victim_pid as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = victim.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = victim.kill();
            panic!("the victim did not end within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(
        status.signal(),
        Some(libc::SIGTERM),
        "the victim dies of the signal: {status}"
    );
    assert_eq!(namespaces_of(victim_pid), Vec::<String>::new());
    assert!(!alive(sleeper), "the sleeper in the namespace was killed");
}

/// Builds a harness, starts `sleep` in peer 0's namespace, prints `ready PID`, and waits to
/// be killed (at most two minutes).
fn be_the_victim() {
    let topology = Topology::uniform(2, LinkShape::UNSHAPED);
    let harness = Harness::build(topology, env!("CARGO_BIN_EXE_murmur-netem"))
        .unwrap_or_else(|error| panic!("could not build the network harness: {error}"));
    let sleeper = KillOnDrop(
        harness
            .command(0, "sleep")
            .arg("300")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("sleep starts in the namespace"),
    );
    println!("ready {}", sleeper.0.id());
    std::thread::sleep(Duration::from_secs(120));
    panic!("no signal came within two minutes");
}

fn wait_for_ready(lines: &mpsc::Receiver<String>, limit: Duration) -> Option<u32> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        let line = lines.recv_timeout(left).ok()?;
        if let Some(pid) = line.strip_prefix("ready ") {
            return pid.trim().parse().ok();
        }
    }
}

/// Whether `pid` is a live process (not a zombie waiting to be reaped).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z")
        })
        .unwrap_or(false)
}

/// The namespaces the harnesses of process `pid` created that still exist.
fn namespaces_of(pid: u32) -> Vec<String> {
    let prefix = format!("{NAMESPACE_PREFIX}{pid}-");
    let listing = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&listing.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

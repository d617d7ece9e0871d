//! `murmur local` and `murmur bench allreduce` start peer processes; stopping the parent,
//! with SIGTERM, SIGINT, or even SIGKILL, ends every peer it started within 10 s.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MURMUR: &str = env!("CARGO_BIN_EXE_murmur");

/// How long the peers have to end once their parent was told to stop.
const END_BOUND: Duration = Duration::from_secs(10);

/// How long the parent may take to start all its peers.
const START_BOUND: Duration = Duration::from_secs(90);

/// The pids of `parent`'s live children, from `/proc`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|(state, ppid)| ppid == parent && state != 'Z'))
        .collect()
}

/// A process's state letter and parent pid, from `/proc/PID/stat`; `None` once it is gone.
fn stat(pid: u32) -> Option<(char, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`; the command name may hold spaces and parentheses.
    let rest = &text[text.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether `pid` still runs (a zombie has ended: it only waits to be reaped).
fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(state, _)| state != 'Z')
}

/// Waits (bounded) until `parent` has `count` children and returns their pids.
fn wait_for_children(parent: &mut Child, count: usize) -> Vec<u32> {
    let deadline = Instant::now() + START_BOUND;
    loop {
        let children = children_of(parent.id());
        if children.len() >= count {
            return children;
        }
        if let Ok(Some(status)) = parent.try_wait() {
            panic!("the parent exited with {status} before starting {count} peers");
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {count} peers started within {START_BOUND:?}",
            children.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `signal` to `parent`, then waits (bounded) until every one of `children` has
/// ended; fails naming the ones still running. The parent is reaped, and killed if it
/// outlived the bound.
fn stop_and_check(parent: &mut Child, children: &[u32], signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), parent.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} failed");
    let deadline = Instant::now() + END_BOUND;
    let mut running: Vec<u32> = children.to_vec();
    let mut parent_ended = false;
    // Both must end within the bound: the peers, and the parent (which may still be writing
    // its summary after its last peer exited).
    while !(running.is_empty() && parent_ended) && Instant::now() < deadline {
        // Reap the parent when it exits, so its own peers are not kept as zombies of a
        // zombie (they are reaped by it, or by init once it is gone).
        parent_ended = parent_ended || matches!(parent.try_wait(), Ok(Some(_)));
        running.retain(|&pid| alive(pid));
        std::thread::sleep(Duration::from_millis(50));
    }
    let described: Vec<String> = running
        .iter()
        .map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            format!(
                "{pid}: {} [{stat}]",
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            )
        })
        .collect();
    for &pid in &running {
        // Clean up before failing, so a failure leaves no process behind either.
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    if !parent_ended {
        let _ = parent.kill();
    }
    let _ = parent.wait();
    assert!(
        running.is_empty(),
        "after SIG{signal} to the parent, these were still running {END_BOUND:?} later: {described:?}"
    );
    assert!(
        parent_ended,
        "the parent itself still ran {END_BOUND:?} after SIG{signal}"
    );
}

/// Waits (bounded) until every one of `murmur local`'s `peers` peers in `out` has printed a
/// progress line: they train.
fn wait_until_training(out: &std::path::Path, peers: usize) {
    let deadline = Instant::now() + START_BOUND;
    let training = |peer: usize| {
        std::fs::read_to_string(out.join(format!("peer-{peer}/progress.jsonl")))
            .is_ok_and(|text| text.contains("\"event\":\"progress\""))
    };
    while !(0..peers).all(training) {
        assert!(
            Instant::now() < deadline,
            "the peers did not all train within {START_BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `murmur local` with 3 peers and a long schedule.
fn start_local(out: &std::path::Path) -> Child {
    Command::new(MURMUR)
        .args([
            "local", "--json", "--peers", "3", "--steps", "1000000", "--out",
        ])
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("murmur local starts")
}

#[test]
fn sigterm_to_murmur_local_ends_every_peer_while_they_train() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("swarm");
    let mut local = start_local(&out);
    let children = wait_for_children(&mut local, 3);
    wait_until_training(&out, 3);
    stop_and_check(&mut local, &children, "TERM");
}

#[test]
fn sigint_to_murmur_local_ends_every_peer_while_they_meet() {
    let tmp = tempfile::tempdir().unwrap();
    let mut local = start_local(&tmp.path().join("swarm"));
    let children = wait_for_children(&mut local, 3);
    stop_and_check(&mut local, &children, "INT");
}

#[test]
fn even_sigkill_to_murmur_local_ends_every_peer_while_they_train() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("swarm");
    let mut local = start_local(&out);
    let children = wait_for_children(&mut local, 3);
    wait_until_training(&out, 3);
    stop_and_check(&mut local, &children, "KILL");
}

#[test]
fn sigterm_to_bench_allreduce_ends_every_peer() {
    let mut bench = Command::new(MURMUR)
        .args([
            "bench",
            "allreduce",
            "--peers",
            "3",
            "--elements",
            "100000",
            "--rounds",
            "100",
            "--json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("murmur bench starts");
    let children = wait_for_children(&mut bench, 3);
    stop_and_check(&mut bench, &children, "TERM");
}

//! Checkpoint crash recovery with a real `murmur run`: a crash injected while a checkpoint
//! is being written (`MURMUR_FAULT`, see `daemon/src/checkpoint.rs`), or a newest checkpoint
//! torn on disk, and the restart resumes from the previous valid checkpoint. And a
//! checkpoint folder that disappears under a running peer: the failures are counted in
//! `murmur_checkpoint_failures_total` (what the `MurmurCheckpointsFailing` alert reads), and
//! training goes on. And with `keep = 1`, a corrupt file that sorts newest is moved aside
//! instead of displacing every new checkpoint, so a `kill -9` loses at most `every_steps`.

mod run_support;
#[path = "support/swarm.rs"]
mod swarm;

use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use run_support::{PeerDir, PeerSettings, Swarm, decode_checkpoint, exclusive};

/// How long a solo peer may take for its few dozen steps.
const RUN_PATIENCE: Duration = Duration::from_secs(120);

/// Samples per step of the built-in task.
const BATCH: u64 = 16;

/// SIGABRT, what `std::process::abort` dies of.
const SIGABRT: i32 = 6;

/// A peer alone (no bootstrap), checkpointing every 10 steps and keeping them all.
fn solo(swarm: &Swarm, steps: u64) -> PeerDir {
    let dir = swarm.add_peer("solo");
    dir.write_config(&PeerSettings {
        steps,
        checkpoint_every_steps: 10,
        checkpoint_keep: 10,
        ..PeerSettings::default()
    });
    dir
}

/// The checkpoint file of `step`, and its temporary file.
fn checkpoint_file(dir: &PeerDir, step: u64) -> (PathBuf, PathBuf) {
    let base = format!("ckpt-{step:020}");
    let folder = dir.checkpoint_dir();
    (
        folder.join(format!("{base}.snap")),
        folder.join(format!("{base}.snap.tmp")),
    )
}

/// The file names in the checkpoint folder, sorted, but the run's lock file (`murmur.lock`,
/// held in the checkpoint folder so that one folder has one run).
fn checkpoint_names(dir: &PeerDir) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.checkpoint_dir())
        .expect("the checkpoint folder exists")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name != "murmur.lock")
        .collect();
    names.sort();
    names
}

/// Runs the peer with `fault` injected at step 30: it must die of SIGABRT with checkpoints
/// 10 and 20 in place and checkpoint 30 only as a temporary file.
fn crash_at_step_30(dir: &PeerDir, fault: &str) -> PathBuf {
    let mut peer = dir.start_with_env(&[("MURMUR_FAULT", fault)]);
    let status = peer.wait_exit(RUN_PATIENCE);
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "the injected crash should abort the peer, got {status}\n{}",
        peer.log()
    );
    peer.read_to_end(Duration::from_secs(5));
    assert!(
        !peer.seen.iter().any(|l| l.is("done")),
        "a crashed peer printed `done`"
    );
    let (final_30, temp_30) = checkpoint_file(dir, 30);
    assert!(!final_30.exists(), "checkpoint 30 reached its final name");
    assert!(temp_30.is_file(), "no temporary file of checkpoint 30");
    for step in [10, 20] {
        let (path, _) = checkpoint_file(dir, step);
        let snapshot = decode_checkpoint(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(snapshot.step, step);
    }
    assert_eq!(
        checkpoint_names(dir).len(),
        3,
        "{:?}",
        checkpoint_names(dir)
    );
    temp_30
}

/// Restarts the peer without faults: it must resume from checkpoint 20 (`resumed_from`),
/// run to `steps` and finish, with every sample since step 0 counted.
fn restart_resumes_from(dir: &PeerDir, resumed_from: u64, steps: u64) {
    let mut peer = dir.start();
    let status = peer.wait_exit(RUN_PATIENCE);
    assert!(status.success(), "restart failed: {status}\n{}", peer.log());
    peer.read_to_end(Duration::from_secs(5));
    let log = peer.log();
    let (path, _) = checkpoint_file(dir, resumed_from);
    let resumed = log
        .lines()
        .find(|l| l.contains("resumed from a checkpoint"))
        .unwrap_or_else(|| panic!("the restart did not resume:\n{log}"));
    assert!(
        resumed.contains(&path.display().to_string())
            && resumed.contains(&format!("step={resumed_from}")),
        "resumed from the wrong checkpoint: {resumed}"
    );
    let first = peer
        .seen
        .iter()
        .find(|l| l.is("progress"))
        .unwrap_or_else(|| peer.fail("no progress line"));
    let first_step = first.u64("step");
    assert!(
        (resumed_from..resumed_from + 10).contains(&first_step),
        "the restart's first progress line is at step {first_step}"
    );
    let done = peer
        .seen
        .last()
        .filter(|l| l.is("done"))
        .unwrap_or_else(|| peer.fail("the last line is not `done`"));
    assert_eq!(done.str("exit"), "finished", "{}", done.json);
    assert_eq!(done.u64("step"), steps, "{}", done.json);
    assert_eq!(done.u64("samples"), steps * BATCH, "{}", done.json);
}

#[test]
fn a_crash_before_the_rename_resumes_from_the_previous_checkpoint() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let dir = solo(&swarm, 40);
    let temp = crash_at_step_30(&dir, "checkpoint-crash-before-rename@30");
    // The temporary file is complete: it is skipped because it was never renamed, not
    // because it is damaged.
    let complete = decode_checkpoint(&temp).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(complete.step, 30);

    restart_resumes_from(&dir, 20, 40);
    assert!(
        !temp.exists(),
        "the leftover temporary file was not removed"
    );
}

#[test]
fn a_torn_checkpoint_write_resumes_from_the_previous_checkpoint() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let dir = solo(&swarm, 40);
    let temp = crash_at_step_30(&dir, "checkpoint-torn-write@30");
    let torn = decode_checkpoint(&temp);
    assert!(torn.is_err(), "the torn file decodes: {torn:?}");

    restart_resumes_from(&dir, 20, 40);
    assert!(
        !temp.exists(),
        "the leftover temporary file was not removed"
    );
}

#[test]
fn a_newest_checkpoint_torn_on_disk_is_skipped_with_a_warning() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let dir = solo(&swarm, 30);
    let mut peer = dir.start();
    let status = peer.wait_exit(RUN_PATIENCE);
    assert!(
        status.success(),
        "first run failed: {status}\n{}",
        peer.log()
    );
    drop(peer);

    let (newest, _) = checkpoint_file(&dir, 30);
    let bytes = std::fs::read(&newest).expect("checkpoint 30 exists");
    std::fs::write(&newest, &bytes[..bytes.len() / 2]).expect("checkpoint 30 is cut");

    dir.write_config(&PeerSettings {
        steps: 40,
        checkpoint_every_steps: 10,
        checkpoint_keep: 10,
        ..PeerSettings::default()
    });
    restart_resumes_from(&dir, 20, 40);
    let log = std::fs::read_to_string(dir.log_path()).expect("the log");
    assert!(
        log.lines()
            .any(|l| l.contains("skipping a checkpoint that cannot be used")
                && l.contains(&newest.display().to_string())),
        "no warning naming the torn checkpoint:\n{log}"
    );
}

/// The value of the unlabelled sample `name` on the `/metrics` page at `addr`.
fn metric(addr: SocketAddr, name: &str) -> Option<f64> {
    let (_, page) = swarm::http_get(addr, "/metrics").ok()?;
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn checkpoints_that_cannot_be_written_are_counted_and_training_goes_on() {
    let _one_swarm_at_a_time = swarm::exclusive();
    let swarm = Swarm::create();
    let dir = swarm.add_peer("solo");
    dir.write_config(&PeerSettings {
        checkpoint_every_steps: 10,
        metrics: true,
        ..PeerSettings::default()
    });
    let mut peer = dir.start();
    let ready = peer.ready();
    let addr: SocketAddr = ready.json["metrics_addr"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| peer.fail(&format!("no metrics_addr in {}", ready.json)));
    let wait_for = |name: &str, what: &str| {
        let deadline = Instant::now() + RUN_PATIENCE;
        loop {
            if metric(addr, name).is_some_and(|v| v >= 1.0) {
                return;
            }
            if Instant::now() > deadline {
                peer.fail(&format!(
                    "{what}: {name} still below 1 after {RUN_PATIENCE:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for("murmur_checkpoint_writes_total", "no checkpoint written");
    assert_eq!(metric(addr, "murmur_checkpoint_failures_total"), Some(0.0));

    // The folder becomes a file: neither opening it nor writing into it can succeed.
    let folder = dir.checkpoint_dir();
    std::fs::remove_dir_all(&folder).expect("the checkpoint folder is removed");
    std::fs::write(&folder, b"not a folder").expect("a file takes its place");
    let step_before = metric(addr, "murmur_training_step").unwrap_or_default();
    wait_for(
        "murmur_checkpoint_failures_total",
        "a failed checkpoint not counted",
    );
    let deadline = Instant::now() + RUN_PATIENCE;
    while metric(addr, "murmur_training_step").unwrap_or_default() < step_before + 20.0 {
        if Instant::now() > deadline {
            peer.fail("training stopped after a checkpoint failed");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        peer.log().contains("checkpoint not written"),
        "the failure is not in the log:\n{}",
        peer.log()
    );
    peer.kill_hard();
}

/// With `checkpoint.keep = 1`, a corrupt file that sorts after every checkpoint the peer
/// writes (planted while it runs) is moved aside and counted instead of displacing each new
/// checkpoint; after `kill -9`, the restart resumes within `every_steps` of the last step
/// the peer reported.
#[test]
fn with_keep_1_a_corrupt_newest_file_loses_nothing_across_kill_9() {
    const EVERY: u64 = 10;
    let _serial = exclusive();
    let swarm = Swarm::create();
    let dir = swarm.add_peer("solo");
    dir.write_config(&PeerSettings {
        checkpoint_every_steps: EVERY,
        checkpoint_keep: 1,
        // 5 steps a second: the progress lines (at most 500 ms apart) trail by ~3 steps.
        synthetic_step_ms: 200,
        metrics: true,
        ..PeerSettings::default()
    });
    let mut peer = dir.start();
    let ready = peer.ready();
    let addr: SocketAddr = ready.json["metrics_addr"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| peer.fail(&format!("no metrics_addr in {}", ready.json)));
    peer.wait_for("step 12", RUN_PATIENCE, |l| {
        l.is("progress") && l.u64("step") >= 12
    });
    let (corrupt, _) = checkpoint_file(&dir, 999_999);
    std::fs::write(&corrupt, b"damaged").expect("the corrupt file is planted");
    peer.wait_for("step 35", RUN_PATIENCE, |l| {
        l.is("progress") && l.u64("step") >= 35
    });
    assert_eq!(
        metric(addr, "murmur_checkpoint_corrupt_total"),
        Some(1.0),
        "the corrupt file is not counted"
    );
    // Frozen, so that the last progress line read is the step it dies at (within ~3).
    peer.signal("STOP");
    std::thread::sleep(Duration::from_millis(700));
    peer.drain();
    let reported = peer.step();
    peer.kill_hard();
    peer.wait_exit(Duration::from_secs(10));

    let mut aside = corrupt.into_os_string();
    aside.push(".corrupt");
    assert!(
        PathBuf::from(&aside).is_file(),
        "the corrupt file was not moved aside: {:?}",
        checkpoint_names(&dir)
    );
    let log = std::fs::read_to_string(dir.log_path()).expect("the log");
    assert!(
        log.contains("corrupt checkpoint moved aside"),
        "no log line for the corrupt file:\n{log}"
    );

    let mut restarted = dir.start();
    restarted.wait_for("a progress line", RUN_PATIENCE, |l| l.is("progress"));
    let log = restarted.log_once("the resume", Duration::from_secs(10), |log| {
        log.contains("resumed from a checkpoint")
    });
    let line = log
        .lines()
        .find(|l| l.contains("resumed from a checkpoint"))
        .unwrap_or_default();
    let resumed: u64 = line
        .split("step=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|step| step.parse().ok())
        .unwrap_or_else(|| panic!("no step in {line:?}"));
    assert!(
        resumed + EVERY >= reported,
        "reported step {reported} before kill -9, resumed from {resumed}: more than \
         {EVERY} steps lost; files {:?}",
        checkpoint_names(&dir)
    );
    restarted.kill_hard();
}

/// The optimizer's step count in a checkpoint, and one of its slots.
fn optimizer_of(snapshot: &murmur_protocol::snapshot::Snapshot, slot: &str) -> (u64, Vec<f32>) {
    let tensor = |name: &str| {
        snapshot
            .tensors
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("checkpoint {} holds no {name}", snapshot.step))
    };
    let steps = &tensor("optimizer.steps_taken").data;
    let steps = steps[0] as u64 | (steps[1] as u64) << 24;
    (
        steps,
        tensor(&format!("optimizer.slot.{slot}")).data.clone(),
    )
}

/// Every checkpoint holds the optimizer's state of its own step (AdamW's moments after as
/// many optimizer steps as the peer took), also between the steps where the trainer used
/// to share it (every 10); and a restart loads that state.
#[test]
fn a_checkpoint_holds_the_optimizer_state_of_its_step_and_a_restart_loads_it() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let dir = swarm.add_peer("solo");
    let settings = PeerSettings {
        steps: 21,
        checkpoint_every_steps: 7,
        checkpoint_keep: 10,
        ..PeerSettings::default()
    };
    dir.write_config(&settings);
    let mut peer = dir.start();
    let status = peer.wait_exit(RUN_PATIENCE);
    assert!(status.success(), "the run failed: {status}\n{}", peer.log());
    let mut moments = Vec::new();
    for step in [7, 14, 21] {
        let (path, _) = checkpoint_file(&dir, step);
        let snapshot = decode_checkpoint(&path).unwrap_or_else(|e| panic!("{e}"));
        let (steps, exp_avg) = optimizer_of(&snapshot, "exp_avg");
        assert_eq!(steps, step, "checkpoint {step}'s optimizer step count");
        assert!(
            exp_avg.iter().any(|&m| m != 0.0),
            "checkpoint {step}'s first moment is all zero"
        );
        moments.push(exp_avg);
    }
    assert_ne!(
        moments[0], moments[1],
        "the moments did not change from step 7 to 14"
    );

    dir.write_config(&PeerSettings {
        steps: 28,
        ..settings
    });
    let mut peer = dir.start();
    let status = peer.wait_exit(RUN_PATIENCE);
    assert!(
        status.success(),
        "the restart failed: {status}\n{}",
        peer.log()
    );
    let log = peer.log();
    assert!(
        log.lines()
            .any(|l| l.contains("optimizer state loaded") && l.contains("steps=21")),
        "the restart did not load the optimizer's state of step 21:\n{log}"
    );
}

/// Whether `values` are what 8-bit codes of `kind` decode to: coding them again gives them
/// back bit for bit.
fn on_code_levels(values: &[f32], kind: murmur_trainer::MomentKind) -> bool {
    let coded = murmur_trainer::Slot::Codes(murmur_trainer::MomentCodes::from_values(kind, values));
    coded.to_vec() == values
}

/// `optimizer.moment_bits = 8` keeps AdamW's moments in 8-bit codes: a checkpoint holds the
/// values the codes decode to, which code to themselves again, where the same run's moments
/// kept in `f32` do not; and a restart loads them and trains on.
#[test]
fn moment_bits_8_keeps_adams_moments_in_codes_through_checkpoints_and_restarts() {
    use murmur_trainer::MomentKind;
    let _serial = exclusive();
    let swarm = Swarm::create();
    let run = |bits: u8, steps: u64| {
        let dir = swarm.add_peer(&format!("bits-{bits}"));
        let settings = PeerSettings {
            steps,
            checkpoint_every_steps: 10,
            checkpoint_keep: 10,
            extra: format!("\n[optimizer]\nkind = \"adamw\"\nmoment_bits = {bits}\n"),
            ..PeerSettings::default()
        };
        dir.write_config(&settings);
        let mut peer = dir.start();
        let status = peer.wait_exit(RUN_PATIENCE);
        assert!(status.success(), "the run failed: {status}\n{}", peer.log());
        let snapshot =
            decode_checkpoint(&checkpoint_file(&dir, 10).0).unwrap_or_else(|e| panic!("{e}"));
        let (_, exp_avg) = optimizer_of(&snapshot, "exp_avg");
        let (_, exp_avg_sq) = optimizer_of(&snapshot, "exp_avg_sq");
        assert!(
            exp_avg.iter().any(|&m| m != 0.0),
            "{bits} bits: no first moment"
        );
        (dir, settings, exp_avg, exp_avg_sq)
    };
    let (_, _, m32, v32) = run(32, 10);
    assert!(
        !on_code_levels(&m32, MomentKind::Signed) && !on_code_levels(&v32, MomentKind::Squared),
        "f32 moments that happen to lie on the code levels cannot tell the two apart"
    );
    let (dir, settings, m8, v8) = run(8, 10);
    assert!(
        on_code_levels(&m8, MomentKind::Signed),
        "the first moment was not coded"
    );
    assert!(
        on_code_levels(&v8, MomentKind::Squared),
        "the second moment was not coded"
    );

    dir.write_config(&PeerSettings {
        steps: 14,
        ..settings
    });
    let mut peer = dir.start();
    let status = peer.wait_exit(RUN_PATIENCE);
    let log = peer.log();
    assert!(status.success(), "the restart failed: {status}\n{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("optimizer state loaded") && l.contains("steps=10")),
        "the restart did not load the 8-bit state of step 10:\n{log}"
    );
}

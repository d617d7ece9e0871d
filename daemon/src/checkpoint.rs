//! Checkpoints on disk: written atomically, checked on load, the last few kept.
//!
//! A checkpoint is a [`Snapshot`] in a file named `ckpt-<step>.snap`. Writing goes to a
//! temporary file in the same folder, which is synced and then renamed over the final
//! name, and the folder is synced, so a crash at any moment leaves either the old set of
//! checkpoints or the new one, never a half-written file under a final name. Files are
//! created with mode 0600: they hold the model and its optimizer state. Loading takes the
//! newest checkpoint that passes its digest check and reports every one it skipped.
//! A checkpoint is encoded from the trainer's vectors straight into its file, and read
//! back through its digest check and zstd as it comes (`murmur_protocol::snapshot_file`):
//! neither holds the encoded or uncompressed state in memory.
//!
//! Retention (`checkpoint.keep`) counts valid checkpoints only. After a write, the file
//! just written always stays; files of later steps (left by an earlier run) are always
//! checked, and older files newest first until `keep` valid ones are counted, and each one
//! that fails its check is moved aside to `<name>.corrupt` (kept for inspection, never
//! loaded, never counted) rather than standing in for a valid one. A file this store wrote
//! or checked before counts without being read again while its length and modification
//! time are unchanged.
//! Files older than the `keep` newest valid ones are removed. Of the files moved aside,
//! those of the [`CORRUPT_KEPT`] latest steps stay; older ones are removed, so that a disk
//! that damages every write does not fill up with them.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use murmur_protocol::snapshot::{Snapshot, SnapshotError, SnapshotLimits};
use murmur_protocol::snapshot_file::{SnapshotView, read_snapshot};
use thiserror::Error;

/// zstd's level for checkpoints: on a model's f32 state level 1 saves as much as level 3
/// (1,347 of 1,493 MB for GPT-2 small with AdamW) in less time; negative levels save
/// nothing (BENCHMARKS.md, `murmur bench checkpoint`).
const LEVEL: i32 = 1;
const PREFIX: &str = "ckpt-";
const SUFFIX: &str = ".snap";
const TEMP_SUFFIX: &str = ".snap.tmp";
/// Appended to the name of a checkpoint that failed its check when it is moved aside.
pub(crate) const CORRUPT_SUFFIX: &str = ".corrupt";
/// How many `.corrupt` files (those of the latest steps) stay in the folder.
pub(crate) const CORRUPT_KEPT: usize = 3;
/// The file [`check_writable`] creates and removes to prove the folder takes new files.
const PROBE_NAME: &str = ".murmur-write-check";
/// Checkpoint files hold the model and optimizer state: readable by their owner only.
const FILE_MODE: u32 = 0o600;

/// Crash injection for the crash-recovery tests, read once from the environment and inert
/// unless set:
///
/// - `MURMUR_FAULT=checkpoint-crash-before-rename@STEP`: the first checkpoint of step STEP
///   or later is written in full to its temporary file and synced; then the process aborts,
///   before the rename.
/// - `MURMUR_FAULT=checkpoint-torn-write@STEP`: the same, but only the first half of its
///   bytes reaches the temporary file (a torn write).
///
/// Any other value is ignored.
const FAULT_VAR: &str = "MURMUR_FAULT";

/// A crash [`FAULT_VAR`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Abort after the temporary file is complete and synced, before the rename.
    CrashBeforeRename {
        /// The first checkpoint step it applies to.
        step: u64,
    },
    /// Abort after half the bytes are written to the temporary file and synced.
    TornWrite {
        /// The first checkpoint step it applies to.
        step: u64,
    },
}

impl Fault {
    /// Parses a [`FAULT_VAR`] value; `None` for anything else.
    fn parse(value: &str) -> Option<Fault> {
        let (kind, step) = value.trim().split_once('@')?;
        let step = step.parse().ok()?;
        match kind {
            "checkpoint-crash-before-rename" => Some(Fault::CrashBeforeRename { step }),
            "checkpoint-torn-write" => Some(Fault::TornWrite { step }),
            _ => None,
        }
    }

    /// The fault set for this process, if any, read once.
    fn injected() -> Option<Fault> {
        static FAULT: OnceLock<Option<Fault>> = OnceLock::new();
        *FAULT.get_or_init(|| {
            std::env::var(FAULT_VAR)
                .ok()
                .and_then(|value| Fault::parse(&value))
        })
    }

    /// How many of a checkpoint's `len` bytes stay in its file before aborting, if this
    /// fault applies to a checkpoint of `step`.
    fn cut(self, step: u64, len: u64) -> Option<u64> {
        match self {
            Fault::CrashBeforeRename { step: from } => (step >= from).then_some(len),
            Fault::TornWrite { step: from } => (step >= from).then_some(len / 2),
        }
    }
}

/// What went wrong with the checkpoint folder.
#[derive(Debug, Error)]
pub(crate) enum CheckpointError {
    /// The folder or a file in it could not be read or written.
    #[error("checkpoint {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The state could not be encoded (e.g. it holds NaN).
    #[error("cannot write checkpoint: {0}")]
    Encode(SnapshotError),
}

/// A checkpoint that was found but could not be used, and why.
#[derive(Debug)]
pub(crate) struct SkippedCheckpoint {
    pub(crate) path: PathBuf,
    pub(crate) reason: String,
}

/// A checkpoint that failed its check and was moved out of the way.
#[derive(Debug)]
pub(crate) struct SetAside {
    /// Where it was.
    pub(crate) from: PathBuf,
    /// Where it is now (`from` with [`CORRUPT_SUFFIX`]).
    pub(crate) to: PathBuf,
    /// Why it failed its check.
    pub(crate) reason: String,
}

/// What a write did: the new file, and the corrupt ones it moved aside while pruning.
#[derive(Debug)]
pub(crate) struct Written {
    /// The checkpoint just written.
    pub(crate) path: PathBuf,
    /// Older files that failed their check, moved aside instead of counting toward `keep`.
    pub(crate) set_aside: Vec<SetAside>,
}

/// What loading found: the newest usable checkpoint, and the newer ones that were not.
#[derive(Debug)]
pub(crate) struct LatestCheckpoint {
    pub(crate) found: Option<(PathBuf, Snapshot)>,
    pub(crate) skipped: Vec<SkippedCheckpoint>,
}

/// A folder of checkpoints.
#[derive(Debug)]
pub(crate) struct CheckpointStore {
    dir: PathBuf,
    keep: usize,
    limits: SnapshotLimits,
    /// Files this store wrote, or read whole and found valid, as they looked then: pruning
    /// counts a file whose stamp is unchanged as valid without reading it again.
    known_valid: Mutex<HashMap<PathBuf, Stamp>>,
    /// Files read whole and checked, for tests.
    reads: AtomicU64,
}

/// What a file looked like when it was known valid: its length and modification time. A
/// file rewritten since (corrupted, truncated, replaced) has another stamp and is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: SystemTime,
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        let meta = fs::metadata(path).ok()?;
        Some(Stamp {
            len: meta.len(),
            modified: meta.modified().ok()?,
        })
    }
}

impl CheckpointStore {
    /// Opens (creating if needed) `dir`, keeping the newest `keep` (at least 1) checkpoints.
    pub(crate) fn open(dir: impl Into<PathBuf>, keep: usize) -> Result<Self, CheckpointError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| CheckpointError::Io {
            action: "create folder",
            path: dir.clone(),
            source,
        })?;
        Ok(CheckpointStore {
            dir,
            keep: keep.max(1),
            limits: SnapshotLimits::default(),
            known_valid: Mutex::new(HashMap::new()),
            reads: AtomicU64::new(0),
        })
    }

    /// Writes `snapshot` as the checkpoint for its step and prunes old ones (see the module
    /// docs): returns the new file's path and the corrupt files moved aside. The snapshot
    /// is encoded straight into the file from the vectors it borrows.
    pub(crate) fn write(&self, snapshot: &SnapshotView<'_>) -> Result<Written, CheckpointError> {
        let name = format!("{PREFIX}{:020}{SUFFIX}", snapshot.step);
        let path = self.dir.join(&name);
        let temp = self
            .dir
            .join(format!("{PREFIX}{:020}{TEMP_SUFFIX}", snapshot.step));
        let io = |action, path: &Path| {
            let path = path.to_owned();
            move |source| CheckpointError::Io {
                action,
                path,
                source,
            }
        };
        // A leftover from a crash may have other permissions; the new file gets FILE_MODE.
        match fs::remove_file(&temp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io("remove stale", &temp)(e));
            }
            _ => {}
        }
        // Read too: the digest is computed over the body read back (see `snapshot_file`).
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(&temp)
            .map_err(io("create", &temp))?;
        let len = snapshot.write_to(&mut file, LEVEL).map_err(|e| match e {
            SnapshotError::Io(source) => io("write", &temp)(source),
            e => CheckpointError::Encode(e),
        })?;
        if let Some(kept) = Fault::injected().and_then(|f| f.cut(snapshot.step, len)) {
            // Injected crash (see FAULT_VAR): what a power cut at this moment leaves.
            file.set_len(kept).map_err(io("write", &temp))?;
            file.sync_all().map_err(io("sync", &temp))?;
            std::process::abort();
        }
        file.sync_all().map_err(io("sync", &temp))?;
        drop(file);
        fs::rename(&temp, &path).map_err(io("rename", &temp))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io("sync folder", &self.dir))?;
        self.note_valid(&path);
        let set_aside = self.prune(&path)?;
        Ok(Written { path, set_aside })
    }

    /// Moves the checkpoint at `path`, which failed its check for `reason`, aside to
    /// `<name>.corrupt`, where it is neither loaded nor counted toward `keep`.
    pub(crate) fn set_aside(&self, path: &Path, reason: &str) -> Result<SetAside, CheckpointError> {
        let mut to = path.as_os_str().to_owned();
        to.push(CORRUPT_SUFFIX);
        let to = PathBuf::from(to);
        fs::rename(path, &to).map_err(|source| CheckpointError::Io {
            action: "move aside",
            path: path.to_owned(),
            source,
        })?;
        self.trim_corrupt();
        Ok(SetAside {
            from: path.to_owned(),
            to,
            reason: reason.to_owned(),
        })
    }

    /// Removes the `.corrupt` files but those of the [`CORRUPT_KEPT`] latest steps. Best
    /// effort: a file that cannot be listed or removed stays, and nothing else depends on it.
    fn trim_corrupt(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let corrupt_suffix = format!("{SUFFIX}{CORRUPT_SUFFIX}");
        let mut corrupt: Vec<PathBuf> = entries
            .flatten()
            .filter(|entry| {
                entry
                    .file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with(PREFIX) && n.ends_with(&corrupt_suffix))
            })
            .map(|entry| entry.path())
            .collect();
        // Zero-padded steps sort by name; the newest are last.
        corrupt.sort();
        let excess = corrupt.len().saturating_sub(CORRUPT_KEPT);
        for path in &corrupt[..excess] {
            let _ = fs::remove_file(path);
        }
    }

    /// Reads and checks the checkpoint at `path`; the reason it cannot be used otherwise.
    fn check(&self, path: &Path) -> Result<Snapshot, String> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let stamp = Stamp::of(path);
        let file = File::open(path).map_err(|e| e.to_string())?;
        let snapshot = read_snapshot(&mut BufReader::with_capacity(1 << 16, file), &self.limits)
            .map_err(|e| e.to_string())?;
        // The stamp from before the read: a file changed meanwhile is read again next time.
        if let Some(stamp) = stamp {
            self.known().insert(path.to_owned(), stamp);
        }
        Ok(snapshot)
    }

    /// Whether `path` is known valid and unchanged since; otherwise it is read and checked.
    fn check_unless_known(&self, path: &Path) -> Result<(), String> {
        let known = self.known().get(path).copied();
        if known.is_some() && known == Stamp::of(path) {
            return Ok(());
        }
        self.check(path).map(drop)
    }

    fn note_valid(&self, path: &Path) {
        if let Some(stamp) = Stamp::of(path) {
            self.known().insert(path.to_owned(), stamp);
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Stamp>> {
        // The map holds plain data: a panic elsewhere cannot leave it half-updated.
        self.known_valid
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The newest checkpoint that decodes and passes its checks, with the newer ones that
    /// did not. Leftover temporary files (torn writes) are removed.
    pub(crate) fn latest_valid(&self) -> Result<LatestCheckpoint, CheckpointError> {
        let mut skipped = Vec::new();
        for path in self.list()?.into_iter().rev() {
            match self.check(&path) {
                Ok(snapshot) => {
                    return Ok(LatestCheckpoint {
                        found: Some((path, snapshot)),
                        skipped,
                    });
                }
                Err(reason) => skipped.push(SkippedCheckpoint { path, reason }),
            }
        }
        Ok(LatestCheckpoint {
            found: None,
            skipped,
        })
    }

    /// Final checkpoint files, oldest first; removes temporary files as it goes.
    fn list(&self) -> Result<Vec<PathBuf>, CheckpointError> {
        let entries = fs::read_dir(&self.dir).map_err(|source| CheckpointError::Io {
            action: "list",
            path: self.dir.clone(),
            source,
        })?;
        let mut files = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(PREFIX) && name.ends_with(TEMP_SUFFIX) {
                // A write that never reached its rename; nothing refers to it.
                let _ = fs::remove_file(entry.path());
            } else if name.starts_with(PREFIX) && name.ends_with(SUFFIX) {
                files.push(entry.path());
            }
        }
        // Zero-padded steps sort by name.
        files.sort();
        Ok(files)
    }

    /// Keeps `written` and the newest valid files up to `keep` in all, moving corrupt ones
    /// aside and removing the rest. Files of later steps than `written` are checked, then
    /// the older ones until enough valid ones are counted; the rest are removed unread. A
    /// file this store wrote or checked before, unchanged since, is not read again.
    fn prune(&self, written: &Path) -> Result<Vec<SetAside>, CheckpointError> {
        let written = written.to_owned();
        let mut valid = 1;
        let mut set_aside = Vec::new();
        for path in self.list()?.into_iter().rev() {
            if path == written {
                continue;
            }
            // A file of a later step than the one written is never removed unread: it is
            // either valid (and kept) or corrupt (and moved aside).
            if valid < self.keep || path > written {
                match self.check_unless_known(&path) {
                    Ok(()) => valid += 1,
                    Err(reason) => {
                        self.known().remove(&path);
                        set_aside.push(self.set_aside(&path, &reason)?);
                    }
                }
                continue;
            }
            self.known().remove(&path);
            fs::remove_file(&path).map_err(|source| CheckpointError::Io {
                action: "remove old",
                path: path.clone(),
                source,
            })?;
        }
        Ok(set_aside)
    }
}

/// Whether the checkpoint folder `dir` can take new files, without creating it: an
/// existing `dir` must be a folder where a file can be created; a missing one needs its
/// nearest existing ancestor to be such a folder (the run creates `dir` there). The error
/// says what is wrong.
pub(crate) fn check_writable(dir: &Path) -> Result<(), String> {
    let mut folder = dir;
    loop {
        match fs::metadata(folder) {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) => return Err(format!("{} is not a folder", folder.display())),
            // Missing, or under a file: the nearest existing ancestor says which.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                folder = match folder.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => parent,
                    _ => Path::new("."),
                };
            }
            Err(e) => return Err(format!("cannot inspect {}: {e}", folder.display())),
        }
    }
    let probe = folder.join(format!("{PROBE_NAME}-{}", std::process::id()));
    let created = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(&probe)
        .and_then(|mut file| file.write_all(b"murmur"));
    let _ = fs::remove_file(&probe);
    created.map_err(|e| format!("cannot create a file in {}: {e}", folder.display()))
}

/// `murmur checkpoint show DIR`.
pub(crate) fn run(command: crate::cli::CheckpointCommand) -> anyhow::Result<()> {
    let crate::cli::CheckpointCommand::Show { dir, json } = command;
    if !dir.is_dir() {
        return Err(crate::input_error::BadInput(format!(
            "checkpoint folder {} does not exist",
            dir.display()
        ))
        .into());
    }
    let store = CheckpointStore::open(&dir, usize::MAX)?;
    let LatestCheckpoint {
        found: latest,
        skipped,
    } = store.latest_valid()?;
    let skipped_json: Vec<_> = skipped
        .iter()
        .map(|s| serde_json::json!({ "path": s.path.display().to_string(), "reason": s.reason }))
        .collect();
    let latest_json = latest.as_ref().map(|(path, snap)| {
        serde_json::json!({
            "path": path.display().to_string(),
            "step": snap.step,
            "samples": snap.samples,
            "push_sum_weight": snap.push_sum_weight,
            "swarm_id": snap.swarm_id,
            "tensors": snap.tensors.iter()
                .map(|t| serde_json::json!({ "name": t.name, "elements": t.data.len() }))
                .collect::<Vec<_>>(),
        })
    });
    if json {
        println!(
            "{}",
            serde_json::json!({ "latest": latest_json, "skipped": skipped_json })
        );
        return Ok(());
    }
    for s in &skipped {
        println!("skipped {}: {}", s.path.display(), s.reason);
    }
    match latest {
        None => println!("no valid checkpoint in {}", dir.display()),
        Some((path, snap)) => {
            println!("latest   {}", path.display());
            println!("swarm    {}", snap.swarm_id);
            println!(
                "step     {}  ({} samples, push-sum weight {})",
                snap.step, snap.samples, snap.push_sum_weight
            );
            for t in &snap.tensors {
                println!("tensor   {:<24} {} elements", t.name, t.data.len());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use murmur_protocol::snapshot::NamedTensor;

    use super::*;

    fn snapshot(step: u64) -> Snapshot {
        Snapshot {
            step,
            samples: step * 32,
            push_sum_weight: 1.0,
            swarm_id: "test".into(),
            model_fingerprint: [3; 32],
            tensors: vec![NamedTensor {
                name: "params".into(),
                data: vec![step as f32; 64],
            }],
        }
    }

    #[test]
    fn keeps_the_newest_k_and_loads_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), 2).unwrap();
        for step in [5, 10, 15, 20] {
            store.write(&snapshot(step).view()).unwrap();
        }
        assert_eq!(store.list().unwrap().len(), 2);
        let LatestCheckpoint {
            found: latest,
            skipped,
        } = store.latest_valid().unwrap();
        assert_eq!(latest.unwrap().1.step, 20);
        assert!(skipped.is_empty());
    }

    #[test]
    fn a_torn_or_corrupt_checkpoint_is_skipped_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), 3).unwrap();
        store.write(&snapshot(1).view()).unwrap();
        let second = store.write(&snapshot(2).view()).unwrap().path;
        let third = store.write(&snapshot(3).view()).unwrap().path;
        // Torn: cut short. Corrupt: one byte flipped in the body.
        let bytes = fs::read(&third).unwrap();
        fs::write(&third, &bytes[..bytes.len() / 2]).unwrap();
        let mut bytes = fs::read(&second).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&second, &bytes).unwrap();
        // And a temporary file left by a crash mid-write.
        fs::write(
            dir.path().join("ckpt-00000000000000000004.snap.tmp"),
            b"partial",
        )
        .unwrap();

        let LatestCheckpoint {
            found: latest,
            skipped,
        } = store.latest_valid().unwrap();
        assert_eq!(latest.unwrap().1.step, 1);
        assert_eq!(skipped.len(), 2);
        assert!(
            skipped[0].reason.contains("truncated") || skipped[0].reason.contains("body"),
            "{}",
            skipped[0].reason
        );
        assert!(
            skipped[1].reason.contains("digest"),
            "{}",
            skipped[1].reason
        );
        assert!(
            !dir.path()
                .join("ckpt-00000000000000000004.snap.tmp")
                .exists()
        );
    }

    #[test]
    fn crash_injection_is_parsed_strictly_and_cuts_where_asked() {
        assert_eq!(
            Fault::parse("checkpoint-crash-before-rename@30"),
            Some(Fault::CrashBeforeRename { step: 30 })
        );
        assert_eq!(
            Fault::parse("checkpoint-torn-write@0"),
            Some(Fault::TornWrite { step: 0 })
        );
        for other in [
            "",
            "checkpoint-torn-write",
            "checkpoint-torn-write@x",
            "crash@3",
        ] {
            assert_eq!(Fault::parse(other), None, "{other:?}");
        }
        let torn = Fault::TornWrite { step: 20 };
        assert_eq!(torn.cut(10, 6), None);
        assert_eq!(torn.cut(20, 6), Some(3));
        let whole = Fault::CrashBeforeRename { step: 20 };
        assert_eq!(whole.cut(30, 6), Some(6));
    }

    #[test]
    fn pruning_reads_no_file_it_wrote_or_checked_unless_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), 3).unwrap();
        let reads = || store.reads.load(Ordering::Relaxed);
        let mut written = Vec::new();
        for step in 1..=6 {
            written.push(store.write(&snapshot(step).view()).unwrap().path);
        }
        assert_eq!(reads(), 0, "every kept file was written by this store");
        assert_eq!(store.list().unwrap(), written[3..]);
        assert_eq!(store.known().len(), 3, "removed files are forgotten");

        // Rewritten in place (another length and time): read again, found corrupt, moved
        // aside; the next older valid file is kept instead, without a read.
        plant_corrupt(dir.path(), 5);
        let next = store.write(&snapshot(7).view()).unwrap();
        assert_eq!(reads(), 1);
        assert_eq!(next.set_aside.len(), 1);
        assert_eq!(
            store.list().unwrap(),
            [written[3].clone(), written[5].clone(), next.path.clone()]
        );

        // A store opened anew reads each file once, then knows it.
        let reopened = CheckpointStore::open(dir.path(), 3).unwrap();
        assert_eq!(reopened.latest_valid().unwrap().found.unwrap().1.step, 7);
        reopened.write(&snapshot(8).view()).unwrap();
        reopened.write(&snapshot(9).view()).unwrap();
        assert_eq!(reopened.reads.load(Ordering::Relaxed), 1 + 1);
    }

    /// A file with a checkpoint's name that fails its check.
    fn plant_corrupt(dir: &Path, step: u64) -> PathBuf {
        let path = dir.join(format!("{PREFIX}{step:020}{SUFFIX}"));
        fs::write(&path, b"not a checkpoint").unwrap();
        path
    }

    #[test]
    fn with_keep_1_a_corrupt_newest_file_never_displaces_new_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), 1).unwrap();
        let corrupt = plant_corrupt(dir.path(), 100);
        let first = store.write(&snapshot(10).view()).unwrap();
        assert_eq!(first.set_aside.len(), 1);
        assert_eq!(first.set_aside[0].from, corrupt);
        assert!(!corrupt.exists());
        assert!(
            first.set_aside[0]
                .to
                .ends_with("ckpt-00000000000000000100.snap.corrupt")
        );
        assert!(first.set_aside[0].to.is_file());
        let second = store.write(&snapshot(20).view()).unwrap();
        assert!(second.set_aside.is_empty());
        assert_eq!(store.list().unwrap(), vec![second.path]);
        let latest = store.latest_valid().unwrap();
        assert_eq!(latest.found.unwrap().1.step, 20);
        assert!(latest.skipped.is_empty());
    }

    #[test]
    fn only_the_latest_corrupt_files_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), 1).unwrap();
        for step in [10, 20, 30, 40, 50] {
            let path = plant_corrupt(dir.path(), step);
            store.set_aside(&path, "planted").unwrap();
        }
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let kept: Vec<String> = [30, 40, 50]
            .iter()
            .map(|step| format!("{PREFIX}{step:020}{SUFFIX}{CORRUPT_SUFFIX}"))
            .collect();
        assert_eq!(left, kept);
        assert_eq!(kept.len(), CORRUPT_KEPT);
    }

    #[test]
    fn keep_counts_valid_checkpoints_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), 2).unwrap();
        store.write(&snapshot(10).view()).unwrap();
        plant_corrupt(dir.path(), 20);
        let written = store.write(&snapshot(30).view()).unwrap();
        assert_eq!(written.set_aside.len(), 1, "{:?}", written.set_aside);
        // 30 and the valid 10 are the two kept, the corrupt 20 counts for nothing.
        let steps: Vec<u64> = store
            .list()
            .unwrap()
            .iter()
            .map(|p| store.check(p).unwrap().step)
            .collect();
        assert_eq!(steps, vec![10, 30]);
    }

    #[test]
    fn checkpoint_files_are_readable_by_their_owner_only() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), 3).unwrap();
        // A stale temporary file with wider permissions does not pass them on.
        let stale = dir.path().join(format!("{PREFIX}{:020}{TEMP_SUFFIX}", 7));
        fs::write(&stale, b"stale").unwrap();
        fs::set_permissions(&stale, fs::Permissions::from_mode(0o644)).unwrap();
        let written = store.write(&snapshot(7).view()).unwrap();
        let mode = fs::metadata(&written.path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "mode {mode:o}");
    }

    #[test]
    fn a_checkpoint_folder_that_cannot_take_files_is_refused_without_creating_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("a/b/checkpoints");
        check_writable(&missing).unwrap();
        assert!(!dir.path().join("a").exists(), "the check created folders");
        let file = dir.path().join("file");
        fs::write(&file, b"x").unwrap();
        let error = check_writable(&file).unwrap_err();
        assert!(error.contains("is not a folder"), "{error}");
        let error = check_writable(&file.join("checkpoints")).unwrap_err();
        assert!(error.contains("is not a folder"), "{error}");
        // /proc takes no new files, even from root.
        let error = check_writable(Path::new("/proc/checkpoints")).unwrap_err();
        assert!(error.contains("cannot create a file in /proc"), "{error}");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "a probe file was left"
        );
    }

    #[test]
    fn an_empty_folder_has_no_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path().join("new"), 1).unwrap();
        let LatestCheckpoint {
            found: latest,
            skipped,
        } = store.latest_valid().unwrap();
        assert!(latest.is_none() && skipped.is_empty());
    }
}

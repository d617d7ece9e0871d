//! Checkpoints on disk: written atomically, checked on load, the last few kept.
//!
//! A checkpoint is a [`Snapshot`] in a file named `ckpt-<step>.snap`. Writing goes to a
//! temporary file in the same folder, which is synced and then renamed over the final
//! name, and the folder is synced, so a crash at any moment leaves either the old set of
//! checkpoints or the new one, never a half-written file under a final name. Loading takes
//! the newest checkpoint that passes its digest check and reports every one it skipped.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use murmur_protocol::snapshot::{Snapshot, SnapshotError, SnapshotLimits};
use thiserror::Error;

const PREFIX: &str = "ckpt-";
const SUFFIX: &str = ".snap";
const TEMP_SUFFIX: &str = ".snap.tmp";

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

    /// The bytes to write before aborting, if this fault applies to a checkpoint of `step`.
    fn cut(self, step: u64, bytes: &[u8]) -> Option<&[u8]> {
        match self {
            Fault::CrashBeforeRename { step: from } => (step >= from).then_some(bytes),
            Fault::TornWrite { step: from } => (step >= from).then(|| &bytes[..bytes.len() / 2]),
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
        })
    }

    /// Writes `snapshot` as the checkpoint for its step and prunes old ones; returns the
    /// file's path.
    pub(crate) fn write(&self, snapshot: &Snapshot) -> Result<PathBuf, CheckpointError> {
        let bytes = snapshot.encode(3).map_err(CheckpointError::Encode)?;
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
        let mut file = File::create(&temp).map_err(io("create", &temp))?;
        if let Some(written) = Fault::injected().and_then(|f| f.cut(snapshot.step, &bytes)) {
            // Injected crash (see FAULT_VAR): what a power cut at this moment leaves.
            file.write_all(written).map_err(io("write", &temp))?;
            file.sync_all().map_err(io("sync", &temp))?;
            std::process::abort();
        }
        file.write_all(&bytes).map_err(io("write", &temp))?;
        file.sync_all().map_err(io("sync", &temp))?;
        drop(file);
        fs::rename(&temp, &path).map_err(io("rename", &temp))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io("sync folder", &self.dir))?;
        self.prune()?;
        Ok(path)
    }

    /// The newest checkpoint that decodes and passes its checks, with the newer ones that
    /// did not. Leftover temporary files (torn writes) are removed.
    pub(crate) fn latest_valid(&self) -> Result<LatestCheckpoint, CheckpointError> {
        let mut skipped = Vec::new();
        for path in self.list()?.into_iter().rev() {
            let result = fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|bytes| {
                    Snapshot::decode(&bytes, &self.limits).map_err(|e| e.to_string())
                });
            match result {
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

    fn prune(&self) -> Result<(), CheckpointError> {
        let files = self.list()?;
        let excess = files.len().saturating_sub(self.keep);
        for path in &files[..excess] {
            fs::remove_file(path).map_err(|source| CheckpointError::Io {
                action: "remove old",
                path: path.clone(),
                source,
            })?;
        }
        Ok(())
    }
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
            store.write(&snapshot(step)).unwrap();
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
        store.write(&snapshot(1)).unwrap();
        let second = store.write(&snapshot(2)).unwrap();
        let third = store.write(&snapshot(3)).unwrap();
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
        let bytes = [1u8, 2, 3, 4, 5, 6];
        let torn = Fault::TornWrite { step: 20 };
        assert_eq!(torn.cut(10, &bytes), None);
        assert_eq!(torn.cut(20, &bytes), Some(&bytes[..3]));
        let whole = Fault::CrashBeforeRename { step: 20 };
        assert_eq!(whole.cut(30, &bytes), Some(&bytes[..]));
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

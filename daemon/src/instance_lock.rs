//! One `murmur run` per peer folder: an exclusive lock beside the key and in the checkpoint
//! folder, held for the life of the process.
//!
//! Two runs with one key are one peer id twice in the swarm, and two runs on one checkpoint
//! folder interleave their checkpoints; both damage training state without a word. Each
//! lock is an advisory `flock` on a file named `murmur.lock` (in the checkpoint folder) and
//! `<key file>.lock` (beside the key). The kernel drops it when the process exits, however
//! it exits, so a stale file never blocks a restart; the file holds the holder's pid for
//! the message a second run prints.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name in the checkpoint folder.
pub(crate) const CHECKPOINT_LOCK: &str = "murmur.lock";

/// Locks held until dropped.
#[derive(Debug)]
pub(crate) struct InstanceLock {
    _files: Vec<File>,
}

/// Why the folder could not be locked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LockError {
    /// Another process holds the lock.
    #[error(
        "another murmur (pid {holder}) is running on {what}: {path} is locked; one `murmur run` \
         per key and checkpoint folder. Stop that run first, or give this peer its own \
         `identity.key_file` and `checkpoint.dir`"
    )]
    Held {
        what: &'static str,
        path: PathBuf,
        holder: String,
    },
    /// The lock file could not be created or locked.
    #[error("cannot lock {path} ({what}): {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl InstanceLock {
    /// Locks the key file `key_file` and the checkpoint folder `checkpoint_dir` (created if
    /// missing) for this process.
    pub(crate) fn acquire(key_file: &Path, checkpoint_dir: &Path) -> Result<Self, LockError> {
        let mut key_lock = key_file.as_os_str().to_owned();
        key_lock.push(".lock");
        let key = lock_file(Path::new(&key_lock), "this key")?;
        std::fs::create_dir_all(checkpoint_dir).map_err(|source| LockError::Io {
            what: "the checkpoint folder",
            path: checkpoint_dir.to_owned(),
            source,
        })?;
        let checkpoints = lock_file(
            &checkpoint_dir.join(CHECKPOINT_LOCK),
            "this checkpoint folder",
        )?;
        Ok(InstanceLock {
            _files: vec![key, checkpoints],
        })
    }
}

/// Takes `path`'s lock without waiting and writes this process's pid into it.
fn lock_file(path: &Path, what: &'static str) -> Result<File, LockError> {
    let io = |source| LockError::Io {
        what,
        path: path.to_owned(),
        source,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut text = String::new();
            let holder = match file.read_to_string(&mut text) {
                Ok(_) if !text.trim().is_empty() => text.trim().to_owned(),
                _ => "unknown".to_owned(),
            };
            return Err(LockError::Held {
                what,
                path: path.to_owned(),
                holder,
            });
        }
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    writeln!(file, "{}", std::process::id()).map_err(io)?;
    file.flush().map_err(io)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_folder_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("murmur.key");
        let checkpoints = dir.path().join("checkpoints");
        let first = InstanceLock::acquire(&key, &checkpoints).unwrap();
        let error = InstanceLock::acquire(&key, &checkpoints).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        assert!(text.contains("murmur.key.lock"), "{text}");
        // Another key on the same checkpoint folder is refused too, naming the folder.
        let other = InstanceLock::acquire(&dir.path().join("other.key"), &checkpoints)
            .unwrap_err()
            .to_string();
        assert!(other.contains(CHECKPOINT_LOCK), "{other}");
        drop(first);
        // Released with its holder: the files left behind do not block.
        InstanceLock::acquire(&key, &checkpoints).unwrap();
    }
}

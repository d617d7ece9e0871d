//! Opening the files a config names without hanging on them: regular files only.
//!
//! Opening a FIFO for reading blocks until a writer appears, and reading `/dev/zero` never
//! ends; a config that names either must be refused, not wait forever. Files are opened
//! without blocking, checked on the open descriptor (so the checked file is the one read),
//! and read up to a bound.

use std::fs::{File, OpenOptions};
use std::io::Read as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

/// What kind of thing a path that is not a regular file is, for messages.
fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    let kind = meta.file_type();
    if kind.is_dir() {
        "a folder"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// Checks that `path` is an existing regular file (following links); the error says what
/// it is instead.
pub(crate) fn check_regular(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.is_file() {
        Ok(())
    } else {
        Err(format!(
            "{} is {}; a regular file is needed",
            path.display(),
            kind_of(&meta)
        ))
    }
}

/// Opens the regular file `path` for reading without blocking on it.
fn open_regular(path: &Path) -> Result<File, String> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "{} is {}; a regular file is needed",
            path.display(),
            kind_of(&meta)
        ));
    }
    Ok(file)
}

/// Reads the regular file `path`, refusing one longer than `max_len` bytes.
pub(crate) fn read_regular(path: &Path, max_len: usize) -> Result<Vec<u8>, String> {
    let file = open_regular(path)?;
    let mut bytes = Vec::with_capacity(max_len.min(64 * 1024) + 1);
    file.take(max_len as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() > max_len {
        return Err(format!("{} is larger than {max_len} bytes", path.display()));
    }
    Ok(bytes)
}

/// Reads the secret in the regular file `path`, refusing one that others than its owner
/// may read or write (as the key file is).
pub(crate) fn read_secret(path: &Path, max_len: usize) -> Result<Vec<u8>, String> {
    let mode = open_regular(path)?
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} has mode {:04o}; others may read the secret in it: run `chmod 600 {}`",
            path.display(),
            mode & 0o7777,
            path.display()
        ));
    }
    read_regular(path, max_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let error = read_regular(&fifo, 100).unwrap_err();
        assert!(error.contains("is a FIFO"), "{error}");
        assert!(check_regular(&fifo).unwrap_err().contains("is a FIFO"));
        let error = read_regular(Path::new("/dev/zero"), 100).unwrap_err();
        assert!(error.contains("is a device"), "{error}");
        let error = read_regular(dir.path(), 100).unwrap_err();
        assert!(error.contains("is a folder"), "{error}");
        let big = dir.path().join("big");
        std::fs::write(&big, [0u8; 101]).unwrap();
        assert!(
            read_regular(&big, 100)
                .unwrap_err()
                .contains("larger than 100")
        );
        assert_eq!(read_regular(&big, 101).unwrap().len(), 101);
    }

    #[test]
    fn a_secret_others_may_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("token");
        std::fs::write(&secret, b"s3cret").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = read_secret(&secret, 100).unwrap_err();
        assert!(error.contains("mode 0644"), "{error}");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret(&secret, 100).unwrap(), b"s3cret");
    }
}

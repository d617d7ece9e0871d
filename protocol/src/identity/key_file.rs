//! The key file: a peer's secret key on disk, readable by its owner only.
//!
//! # Format
//!
//! A text file of two lines, so an operator can recognise it with `cat` or `file`:
//!
//! ```text
//! murmur-ed25519-secret-v1
//! 9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60
//! ```
//!
//! The first line names the format and its version; the second is the 32-byte RFC 8032
//! secret seed in hexadecimal (lowercase when written; either case is read). A final newline
//! is optional. The same seed gives the same peer id in libp2p
//! (`Keypair::ed25519_from_bytes`).
//!
//! # Permissions
//!
//! The file is created with mode `0600` (the mode is part of the `open` call, so the secret
//! is never readable by others, not even briefly) and never overwritten. Loading refuses a
//! file that group or others may read or write, before reading a byte of it, as OpenSSH does
//! for private keys.
//!
//! This is the one part of the crate that does I/O: a key file is read once at start-up.

use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::keypair::{EntropyError, Keypair, SECRET_SEED_LEN, wipe};

/// The first line of a key file.
pub const KEY_FILE_HEADER: &str = "murmur-ed25519-secret-v1";
/// Bytes of a key file: header, newline, 64 hex digits, newline.
const KEY_FILE_LEN: usize = KEY_FILE_HEADER.len() + 1 + 2 * SECRET_SEED_LEN + 1;
/// Key files longer than this are refused without being parsed.
const MAX_KEY_FILE_LEN: usize = 256;

/// Why a key file could not be created or loaded. Every variant names the file.
#[derive(Debug, Error)]
pub enum KeyFileError {
    /// There is no file at the path.
    #[error(
"key file {} does not exist; check the path", path.display()
    )]
    NotFound {
        /// The key file.
        path: PathBuf,
    },
    /// The path exists but is a directory or another non-regular file.
    #[error("key file {} is not a regular file", path.display())]
    NotAFile {
        /// The key file.
        path: PathBuf,
    },
    /// Group or others may access the file, so the secret may already have leaked.
    #[error(
        "key file {} has mode {mode:04o}, so other users can access the secret key; \
         run `chmod 600 {}` (and consider the key compromised if others could read it)",
        path.display(), path.display()
    )]
    LoosePermissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Creating a key file where one already exists; the existing key is kept.
    #[error(
        "key file {} already exists; refusing to overwrite a secret key \
         (move it away first if you really mean to replace it)",
        path.display()
    )]
    AlreadyExists {
        /// The key file.
        path: PathBuf,
    },
    /// The file is larger than any key file.
    #[error("key file {} is larger than {max} bytes, so it is not a murmur key file", path.display())]
    TooLarge {
        /// The key file.
        path: PathBuf,
        /// The largest accepted size.
        max: usize,
    },
    /// The first line is not [`KEY_FILE_HEADER`].
    #[error(
        "{} is not a murmur key file: its first line should be `{KEY_FILE_HEADER}`",
        path.display()
    )]
    UnknownFormat {
        /// The key file.
        path: PathBuf,
    },
    /// The secret line does not hold exactly 64 hexadecimal digits.
    #[error(
        "key file {} holds a secret of {found} characters; expected {} hexadecimal digits \
         (a 32-byte ed25519 seed)",
        path.display(), 2 * SECRET_SEED_LEN
    )]
    WrongSecretLength {
        /// The key file.
        path: PathBuf,
        /// Characters found on the secret line.
        found: usize,
    },
    /// Something follows the secret line.
    #[error(
        "key file {} has content after the secret on line 2; a key file has exactly two lines",
        path.display()
    )]
    TrailingContent {
        /// The key file.
        path: PathBuf,
    },
    /// The secret line holds a character that is not a hexadecimal digit.
    #[error(
        "key file {} has a non-hexadecimal character at column {column} of line 2",
        path.display()
    )]
    InvalidHex {
        /// The key file.
        path: PathBuf,
        /// 1-based column of the character on the secret line.
        column: usize,
    },
    /// A new key could not be generated.
    #[error("cannot create key file {}: {source}", path.display())]
    Entropy {
        /// The key file.
        path: PathBuf,
        /// The random number generator's failure.
        source: EntropyError,
    },
    /// The operating system refused an operation on the file.
    #[error("cannot {action} key file {}: {source}", path.display())]
    Io {
        /// The key file.
        path: PathBuf,
        /// What was being done: "create", "write", "open" or "read".
        action: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
}

impl Keypair {
    /// Generates a new keypair and writes it to a new key file at `path` with mode `0600`.
    ///
    /// Fails with [`KeyFileError::AlreadyExists`] rather than replace an existing file.
    pub fn create_file(path: impl AsRef<Path>) -> Result<Keypair, KeyFileError> {
        let path = path.as_ref();
        let keypair = Keypair::generate().map_err(|source| KeyFileError::Entropy {
            path: path.to_owned(),
            source,
        })?;
        keypair.write_new_file(path)?;
        Ok(keypair)
    }

    /// Writes this keypair to a new key file at `path` with mode `0600`, flushed to disk.
    ///
    /// Fails with [`KeyFileError::AlreadyExists`] rather than replace an existing file. If
    /// writing fails after the file was created, the partial file is removed.
    pub fn write_new_file(&self, path: impl AsRef<Path>) -> Result<(), KeyFileError> {
        let path = path.as_ref();
        let io_error = |action| {
            move |source: io::Error| KeyFileError::Io {
                path: path.to_owned(),
                action,
                source,
            }
        };
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| match source.kind() {
                io::ErrorKind::AlreadyExists => KeyFileError::AlreadyExists {
                    path: path.to_owned(),
                },
                _ => io_error("create")(source),
            })?;

        let mut contents = [0u8; KEY_FILE_LEN];
        encode_key_file(self, &mut contents);
        // The umask can only clear bits of 0600; setting the mode again makes it exactly 0600
        // even under an unusual umask such as 0277.
        let written = file
            .set_permissions(Permissions::from_mode(0o600))
            .and_then(|()| file.write_all(&contents))
            .and_then(|()| file.sync_all())
            .and_then(|()| sync_parent_dir(path));
        wipe(&mut contents);
        if let Err(source) = written {
            drop(file);
            // Leave no half-written key behind to block the next attempt; the write error is
            // the one worth reporting, so a failure to remove is not.
            let _ = std::fs::remove_file(path);
            return Err(io_error("write")(source));
        }
        Ok(())
    }

    /// Loads the keypair from the key file at `path`.
    ///
    /// The file's mode is checked before its contents are read: a file that group or others
    /// may access is refused with [`KeyFileError::LoosePermissions`].
    pub fn load_file(path: impl AsRef<Path>) -> Result<Keypair, KeyFileError> {
        let path = path.as_ref();
        let io_error = |action| {
            move |source| KeyFileError::Io {
                path: path.to_owned(),
                action,
                source,
            }
        };
        // A path check before opening: opening a FIFO would block until someone writes it.
        match std::fs::metadata(path) {
            Ok(metadata) if !metadata.is_file() => {
                return Err(KeyFileError::NotAFile {
                    path: path.to_owned(),
                });
            }
            _ => {}
        }
        let file = File::open(path).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => KeyFileError::NotFound {
                path: path.to_owned(),
            },
            _ => io_error("open")(source),
        })?;
        // fstat on the open file, so the checked inode is the one read.
        let metadata = file.metadata().map_err(io_error("read"))?;
        if !metadata.is_file() {
            return Err(KeyFileError::NotAFile {
                path: path.to_owned(),
            });
        }
        let mode = metadata.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyFileError::LoosePermissions {
                path: path.to_owned(),
                mode,
            });
        }

        let mut contents = [0u8; MAX_KEY_FILE_LEN + 1];
        let read = read_bounded(file, &mut contents);
        let parsed = match read {
            Ok(len) if len > MAX_KEY_FILE_LEN => Err(KeyFileError::TooLarge {
                path: path.to_owned(),
                max: MAX_KEY_FILE_LEN,
            }),
            Ok(len) => parse_key_file(&contents[..len], path),
            Err(source) => Err(io_error("read")(source)),
        };
        wipe(&mut contents);
        parsed
    }
}

/// Reads until end of file or until `buf` is full, returning the bytes read.
fn read_bounded(mut file: File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Makes the new directory entry durable, so a crash cannot lose a key already in use.
fn sync_parent_dir(path: &Path) -> io::Result<()> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

fn encode_key_file(keypair: &Keypair, out: &mut [u8; KEY_FILE_LEN]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let (header, rest) = out.split_at_mut(KEY_FILE_HEADER.len());
    header.copy_from_slice(KEY_FILE_HEADER.as_bytes());
    rest[0] = b'\n';
    for (pair, byte) in rest[1..].chunks_exact_mut(2).zip(keypair.secret_seed()) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0x0f)];
    }
    rest[rest.len() - 1] = b'\n';
}

fn parse_key_file(contents: &[u8], path: &Path) -> Result<Keypair, KeyFileError> {
    // Tolerate an editor's CRLF line endings.
    let mut lines = contents
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    if lines.next() != Some(KEY_FILE_HEADER.as_bytes()) {
        return Err(KeyFileError::UnknownFormat {
            path: path.to_owned(),
        });
    }
    let secret = lines.next().unwrap_or_default();
    // Nothing may follow but the final newline.
    let rest_is_empty = matches!((lines.next(), lines.next()), (None, _) | (Some(b""), None));
    if secret.len() != 2 * SECRET_SEED_LEN {
        return Err(KeyFileError::WrongSecretLength {
            path: path.to_owned(),
            found: secret.len(),
        });
    }
    if !rest_is_empty {
        return Err(KeyFileError::TrailingContent {
            path: path.to_owned(),
        });
    }
    let mut seed = [0u8; SECRET_SEED_LEN];
    for (i, pair) in secret.chunks_exact(2).enumerate() {
        match (hex_value(pair[0]), hex_value(pair[1])) {
            (Some(high), Some(low)) => seed[i] = high << 4 | low,
            (high, _) => {
                wipe(&mut seed);
                let column = 2 * i + if high.is_none() { 1 } else { 2 };
                return Err(KeyFileError::InvalidHex {
                    path: path.to_owned(),
                    column,
                });
            }
        }
    }
    let keypair = Keypair::from_seed(seed);
    wipe(&mut seed);
    Ok(keypair)
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

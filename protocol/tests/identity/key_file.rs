//! The key file: mode 0600 from creation, refused when others can read it, never
//! overwritten, and each malformed file named with its own error.

use std::fs::{self, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use murmur_protocol::identity::{KEY_FILE_HEADER, KeyFileError, Keypair};

use super::keypair;

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path)
        .expect("file exists")
        .permissions()
        .mode()
        & 0o7777
}

/// Writes `contents` as a key file with mode 0600.
fn write_private(path: &Path, contents: &[u8]) {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .expect("fresh path in a temporary directory");
    file.write_all(contents).expect("write test file");
}

#[test]
fn key_file_is_created_0600_and_reloads_to_the_same_peer() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("peer.key");
    let created = Keypair::create_file(&path).expect("create key file");
    assert_eq!(mode_of(&path), 0o600);
    let contents = fs::read_to_string(&path).expect("read key file");
    assert!(
        contents.starts_with(&format!("{KEY_FILE_HEADER}\n")),
        "{contents:?}"
    );

    let loaded = Keypair::load_file(&path).expect("load key file");
    assert_eq!(loaded.peer_id(), created.peer_id());
    assert_eq!(loaded.sign(b"x"), created.sign(b"x"));
}

#[test]
fn key_file_holds_the_libp2p_seed_in_hex() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let seed: [u8; 32] = std::array::from_fn(|i| (i * 7 + 3) as u8);
    let hex: String = seed.iter().map(|b| format!("{b:02X}")).collect();
    let path = dir.path().join("upper.key");
    write_private(&path, format!("{KEY_FILE_HEADER}\r\n{hex}\r\n").as_bytes());
    let libp2p_id = libp2p_identity::Keypair::ed25519_from_bytes(seed)
        .expect("seed")
        .public()
        .to_peer_id();
    assert_eq!(
        Keypair::load_file(&path)
            .expect("load")
            .peer_id()
            .to_string(),
        libp2p_id.to_base58()
    );

    let written = dir.path().join("written.key");
    Keypair::from_seed(seed)
        .write_new_file(&written)
        .expect("write");
    assert_eq!(
        fs::read_to_string(&written).expect("read"),
        format!("{KEY_FILE_HEADER}\n{}\n", hex.to_lowercase())
    );
}

#[test]
fn key_file_readable_by_others_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("peer.key");
    Keypair::create_file(&path).expect("create key file");

    for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o700 | 0o010] {
        fs::set_permissions(&path, Permissions::from_mode(mode)).expect("chmod");
        let err = Keypair::load_file(&path).expect_err("loose key file must be refused");
        let message = err.to_string();
        match err {
            KeyFileError::LoosePermissions {
                path: named,
                mode: found,
            } => {
                assert_eq!(named, path);
                assert_eq!(found, mode);
            }
            other => panic!("mode {mode:o}: expected LoosePermissions, got {other:?}"),
        }
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(
            message.contains(&format!("chmod 600 {}", path.display())),
            "{message}"
        );
    }

    fs::set_permissions(&path, Permissions::from_mode(0o400)).expect("chmod");
    assert!(Keypair::load_file(&path).is_ok(), "owner-only read is fine");
}

#[test]
fn key_file_is_never_overwritten() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("peer.key");
    let first = Keypair::create_file(&path).expect("create key file");
    let before = fs::read(&path).expect("read");

    match Keypair::create_file(&path) {
        Err(KeyFileError::AlreadyExists { path: named }) => assert_eq!(named, path),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    match keypair(5).write_new_file(&path) {
        Err(KeyFileError::AlreadyExists { .. }) => {}
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(fs::read(&path).expect("read"), before);
    assert_eq!(
        Keypair::load_file(&path).expect("load").peer_id(),
        first.peer_id()
    );
}

#[test]
fn malformed_key_files_give_specific_errors() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let hex = "ab".repeat(32);
    let load = |name: &str, contents: &str| {
        let path = dir.path().join(name);
        write_private(&path, contents.as_bytes());
        Keypair::load_file(&path).expect_err("malformed key file must be refused")
    };

    assert!(matches!(
        Keypair::load_file(dir.path().join("missing.key")),
        Err(KeyFileError::NotFound { .. })
    ));
    assert!(matches!(
        Keypair::load_file(dir.path()),
        Err(KeyFileError::NotAFile { .. })
    ));
    // A FIFO is refused without opening it: opening would block until a writer appears.
    let fifo = dir.path().join("fifo.key");
    let made = std::process::Command::new("mkfifo")
        .arg("-m")
        .arg("600")
        .arg(&fifo)
        .status();
    assert!(
        made.is_ok_and(|s| s.success()),
        "mkfifo is part of coreutils"
    );
    assert!(matches!(
        Keypair::load_file(&fifo),
        Err(KeyFileError::NotAFile { .. })
    ));
    assert!(matches!(
        load("openssh.key", "-----BEGIN OPENSSH PRIVATE KEY-----\n"),
        KeyFileError::UnknownFormat { .. }
    ));
    assert!(matches!(
        load("empty.key", ""),
        KeyFileError::UnknownFormat { .. }
    ));
    assert!(matches!(
        load("short.key", &format!("{KEY_FILE_HEADER}\n{}\n", &hex[..62])),
        KeyFileError::WrongSecretLength { found: 62, .. }
    ));
    assert!(matches!(
        load("no-secret.key", KEY_FILE_HEADER),
        KeyFileError::WrongSecretLength { found: 0, .. }
    ));
    assert!(matches!(
        load(
            "bad-hex.key",
            &format!("{KEY_FILE_HEADER}\n{}g{}\n", &hex[..40], &hex[41..])
        ),
        KeyFileError::InvalidHex { column: 41, .. }
    ));
    assert!(matches!(
        load("trailing.key", &format!("{KEY_FILE_HEADER}\n{hex}\nmore\n")),
        KeyFileError::TrailingContent { .. }
    ));
    assert!(matches!(
        load(
            "large.key",
            &format!("{KEY_FILE_HEADER}\n{hex}\n{}", "\n".repeat(300))
        ),
        KeyFileError::TooLarge { max: 256, .. }
    ));
    let err = load("named.key", "nonsense");
    assert!(err.to_string().contains("named.key"), "{err}");
}

//! `packaging/murmur.service` and its GPU drop-in, checked by `systemd-analyze`.
//!
//! The unit is copied to a temporary folder with its `ExecStart=` pointing at the murmur
//! binary this build made (`systemd-analyze verify` checks that the program exists), and
//! `systemd-analyze verify` must accept it, alone and with `murmur.service.d/gpu.conf`
//! beside it, without printing a word: an unknown key, a bad value or a missing program is
//! only a warning to systemd, and a failure here. `systemd-analyze security --offline`
//! must rate its exposure 2.0 or lower ("OK"). The unit's text must keep the settings
//! `docs/service.md` promises.
//!
//! `systemd-analyze` comes with systemd. A build on a machine without it marks these tests
//! ignored, so the runner reports them skipped rather than passed (see `daemon/build.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

#[path = "support/tool.rs"]
mod tool;

/// How long one `systemd-analyze` command may take.
const PATIENCE: Duration = Duration::from_secs(60);
/// The program the shipped unit starts, replaced by the built binary for the checks.
const INSTALLED_BINARY: &str = "/usr/local/bin/murmur";
/// The highest exposure level `systemd-analyze security` may give, in tenths.
const MAX_EXPOSURE_TENTHS: u32 = 20;

/// The repository's `packaging/` folder.
fn packaging_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The shipped unit's text.
fn unit_text() -> String {
    read(&packaging_dir().join("murmur.service"))
}

/// A temporary folder holding `murmur.service` (starting the built binary) and, when
/// `with_gpu`, `murmur.service.d/gpu.conf`.
fn staged_unit(with_gpu: bool) -> (tempfile::TempDir, PathBuf) {
    let text = unit_text();
    assert!(
        text.contains(&format!("ExecStart={INSTALLED_BINARY} run --config ")),
        "murmur.service no longer starts {INSTALLED_BINARY} run --config …"
    );
    let text = text.replace(INSTALLED_BINARY, env!("CARGO_BIN_EXE_murmur"));
    let dir = tempfile::tempdir().expect("a temporary folder");
    let unit = dir.path().join("murmur.service");
    std::fs::write(&unit, text).expect("the unit is written");
    if with_gpu {
        let drop_ins = dir.path().join("murmur.service.d");
        std::fs::create_dir(&drop_ins).expect("the drop-in folder");
        let gpu = packaging_dir().join("murmur.service.d/gpu.conf");
        std::fs::write(drop_ins.join("gpu.conf"), read(&gpu)).expect("the drop-in is written");
    }
    (dir, unit)
}

/// Runs `systemd-analyze args…`, bounded: whether it succeeded, and what it printed.
fn systemd_analyze(args: &[&str]) -> (bool, String) {
    tool::run_bounded(Path::new("systemd-analyze"), args, None, "", PATIENCE)
}

fn verify(with_gpu: bool) {
    let (_dir, unit) = staged_unit(with_gpu);
    let path = unit.to_str().expect("a UTF-8 path");
    let (ok, said) = systemd_analyze(&["verify", "--man=no", path]);
    assert!(
        ok && said.trim().is_empty(),
        "systemd-analyze verify {path} (gpu drop-in: {with_gpu}; exit ok: {ok}):\n{said}"
    );
}

#[test]
#[cfg_attr(
    not(murmur_has_systemd_analyze),
    ignore = "systemd-analyze was not on PATH when murmur was built: install systemd, then \
              rebuild (touch daemon/build.rs)"
)]
fn systemd_analyze_verify_accepts_the_unit_without_a_word() {
    verify(false);
}

#[test]
#[cfg_attr(
    not(murmur_has_systemd_analyze),
    ignore = "systemd-analyze was not on PATH when murmur was built: install systemd, then \
              rebuild (touch daemon/build.rs)"
)]
fn systemd_analyze_verify_accepts_the_unit_with_its_gpu_drop_in() {
    verify(true);
}

#[test]
#[cfg_attr(
    not(murmur_has_systemd_analyze),
    ignore = "systemd-analyze was not on PATH when murmur was built: install systemd, then \
              rebuild (touch daemon/build.rs)"
)]
fn the_unit_s_exposure_is_rated_ok_by_systemd_analyze_security() {
    let (_dir, unit) = staged_unit(false);
    let path = unit.to_str().expect("a UTF-8 path");
    let threshold = format!("--threshold={MAX_EXPOSURE_TENTHS}");
    let (ok, said) = systemd_analyze(&["security", "--offline=yes", &threshold, path]);
    let verdict = said
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or("no overall exposure level printed");
    assert!(
        ok,
        "systemd-analyze security rates murmur.service above {}.{}: {verdict}\n{said}",
        MAX_EXPOSURE_TENTHS / 10,
        MAX_EXPOSURE_TENTHS % 10
    );
}

/// The settings docs/service.md describes, each a whole line of the unit.
#[test]
fn the_unit_keeps_the_settings_the_service_docs_describe() {
    let text = unit_text();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut missing = Vec::new();
    for setting in [
        "DynamicUser=yes",
        "StateDirectory=murmur",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK",
        "SystemCallFilter=@system-service",
        "Restart=on-failure",
        "RestartPreventExitStatus=2",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=60s",
    ] {
        if !lines.contains(&setting) {
            missing.push(setting);
        }
    }
    assert!(missing.is_empty(), "murmur.service lacks {missing:?}");
    // Nothing but the state directory is writable: no other path is opened for writing.
    for key in [
        "ReadWritePaths=",
        "BindPaths=",
        "LogsDirectory=",
        "CacheDirectory=",
    ] {
        assert!(
            !lines.iter().any(|l| l.starts_with(key)),
            "murmur.service sets {key}; the state directory is the only writable place"
        );
    }
}

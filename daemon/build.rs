//! Tells the tests which external checkers this machine has.
//!
//! A few integration tests hand the repository's files to a tool that is not part of the
//! Rust toolchain (`promtool` for the alert rules, `systemd-analyze` for the service unit).
//! Where the tool is missing such a test cannot run, and it must then say so rather than
//! pass: this script sets `murmur_has_<tool>` for each tool found on `PATH`, and the tests
//! are `#[cfg_attr(not(murmur_has_<tool>), ignore = "…")]`, which the test runners report
//! as skipped. The script runs again when `PATH` changes or a found tool does; after
//! installing a missing one, rebuild with `touch daemon/build.rs`.

use std::path::PathBuf;

/// Each tool and the cfg that says it is there.
const TOOLS: [(&str, &str); 2] = [
    ("promtool", "murmur_has_promtool"),
    ("systemd-analyze", "murmur_has_systemd_analyze"),
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PATH");
    for (tool, cfg) in TOOLS {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        if let Some(path) = on_path(tool) {
            println!("cargo::rerun-if-changed={}", path.display());
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}

/// Where `name` is on `PATH`, if anywhere.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

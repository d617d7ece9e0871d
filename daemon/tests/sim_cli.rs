//! `murmur sim`: every shipped scenario is valid, a run prints its summary and writes its
//! CSV, and a bad scenario exits 2 naming the file, the line and the key.

use std::path::{Path, PathBuf};
use std::process::Command;

fn murmur() -> Command {
    Command::new(env!("CARGO_BIN_EXE_murmur"))
}

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/sim");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples/sim exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_shipped_scenario_is_valid() {
    let files = examples();
    assert!(
        files.len() >= 5,
        "expected the shipped scenarios, found {files:?}"
    );
    for file in files {
        let out = murmur()
            .arg("sim")
            .arg(&file)
            .arg("--check")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_run_prints_json_and_writes_csv() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("rounds.csv");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/sim/sgp-straggler-16.toml");
    let out = murmur()
        .arg("sim")
        .arg(&file)
        .arg("--json")
        .arg("--csv")
        .arg(&csv)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(summary["peers_start"], 16);
    let samples_per_sec = summary["samples_per_sec"].as_f64().unwrap();
    assert!(samples_per_sec > 0.0);
    let rows = std::fs::read_to_string(&csv).unwrap();
    assert!(rows.lines().count() > 100, "one CSV row per recorded round");
}

#[test]
fn a_bad_scenario_exits_2_naming_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "peers = 4\nvector_len = 8\nrounds = 3\npeeers = 5\n").unwrap();
    let out = murmur().arg("sim").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("peeers") && err.contains("line 4"),
        "{err}"
    );

    let out = murmur()
        .arg("sim")
        .arg(dir.path().join("missing.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
}

//! `murmur bench checkpoint` measures what a checkpoint write adds to peak memory, and the
//! daemon's way of writing (streamed from the vectors) adds a small fraction of what the
//! old way (a copy, encoded whole in memory) adds for the same state.

use std::process::Command;

use serde_json::Value;

const MURMUR: &str = env!("CARGO_BIN_EXE_murmur");

/// Four million parameters: 48 MB of state with AdamW's moments.
const PARAMS: &str = "4000000";

fn bench(dir: &std::path::Path, in_memory: bool) -> Value {
    let mut command = Command::new(MURMUR);
    command.args([
        "bench",
        "checkpoint",
        "--params",
        PARAMS,
        "--repeats",
        "1",
        "--json",
    ]);
    command.arg("--dir").arg(dir);
    if in_memory {
        command.arg("--in-memory");
    }
    let out = command.output().expect("murmur runs");
    assert!(
        out.status.success(),
        "bench checkpoint failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn a_streamed_checkpoint_adds_a_fraction_of_the_memory_an_encoded_one_does() {
    let dir = tempfile::tempdir().unwrap();
    let streamed = bench(dir.path(), false);
    let in_memory = bench(dir.path(), true);
    let state = streamed["state_bytes"].as_u64().unwrap();
    assert_eq!(state, 48_000_000);
    let added = |report: &Value| {
        report["peak_added_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("peak memory not measured: {report}"))
    };
    assert!(
        added(&streamed) < state / 8,
        "the streamed write added {} bytes to a state of {state}: {streamed}",
        added(&streamed)
    );
    assert!(
        added(&in_memory) > state,
        "the in-memory write added only {} bytes to a state of {state}: {in_memory}",
        added(&in_memory)
    );
    let file = streamed["file_bytes"].as_u64().unwrap();
    assert!(file > 0 && file <= state + 1024, "file of {file} bytes");
    assert!(streamed["ratio"].as_f64().unwrap() > 0.0);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the bench removes what it wrote"
    );
}

//! `[training] export` with a real swarm: the safetensors file each peer writes at the end
//! loads with Python's `safetensors` package (numpy backend; `scripts/setup.sh` installs
//! it) and holds the model's tensors, named and shaped as the model lays them out, with the
//! very values of the checkpoint written at exit.

mod run_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use murmur_trainer::{PeerSampling, TaskPreset};
use run_support::{
    PeerSettings, RunningPeer, Swarm, checkpoint_params, exclusive, newest_checkpoint,
};

/// Local steps of each peer.
const STEPS: u64 = 30;

/// How long the swarm may take for its steps.
const RUN_PATIENCE: Duration = Duration::from_secs(120);

fn check_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/check_safetensors.py")
}

/// Runs `scripts/check_safetensors.py MODEL LAYOUT PARAMS`.
fn check(model: &Path, layout: &Path, params: &Path) -> Output {
    Command::new("python3")
        .arg(check_script())
        .args([model, layout, params])
        .output()
        .expect("python3 runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The built-in task's tensors, in flat-vector order, as the check script reads them.
fn layout_json() -> String {
    let sampling = PeerSampling {
        swarm_seed: 1,
        peer_seed: 1,
        shard: 0,
        shards: 1,
    };
    let task = TaskPreset::default_local()
        .build(sampling)
        .expect("the built-in task builds");
    let tensors: Vec<serde_json::Value> = task
        .model
        .layout()
        .tensors()
        .iter()
        .map(|t| serde_json::json!({ "name": t.name(), "shape": t.shape() }))
        .collect();
    serde_json::json!({ "tensors": tensors }).to_string()
}

fn write_f32(path: &Path, values: &[f32]) {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).expect("the parameters are written");
}

#[test]
fn the_exported_model_loads_in_python_with_the_checkpoints_values() {
    let python = Command::new("python3")
        .args(["-c", "import safetensors.numpy, numpy"])
        .output();
    assert!(
        python.as_ref().is_ok_and(|o| o.status.success()),
        "python3 with the safetensors and numpy packages is needed; run scripts/setup.sh ({:?})",
        python.map(|o| text(&o.stderr))
    );
    let _serial = exclusive();
    let swarm = Swarm::create();
    let settings = PeerSettings {
        steps: STEPS,
        min_peers: 1,
        export: Some("model.safetensors".into()),
        ..PeerSettings::default()
    };
    let first = swarm.add_peer("p0");
    first.write_config(&settings);
    let mut p0 = first.start();
    let ready = p0.ready();
    let address = ready.json["listen"][0]
        .as_str()
        .unwrap_or_else(|| panic!("no listen address in {}", ready.json))
        .to_owned();
    let second = swarm.add_peer("p1");
    second.write_config(&PeerSettings {
        bootstrap: vec![address],
        ..settings
    });
    let p1 = second.start();

    let layout = swarm.root().join("layout.json");
    std::fs::write(&layout, layout_json()).expect("the layout is written");
    let dirs = [&first, &second];
    let mut peers: [RunningPeer; 2] = [p0, p1];
    for (peer, dir) in peers.iter_mut().zip(dirs) {
        let status = peer.wait_exit(RUN_PATIENCE);
        assert!(status.success(), "{}: {status}\n{}", peer.name, peer.log());
        peer.read_to_end(Duration::from_secs(5));
        let done = peer
            .seen
            .last()
            .filter(|l| l.is("done"))
            .unwrap_or_else(|| peer.fail("the last line is not `done`"));
        assert_eq!(done.str("exit"), "finished", "{}", done.json);
        assert!(
            done.u64("bytes_received") > 0,
            "{} trained alone: {}",
            peer.name,
            done.json
        );

        let (path, snapshot) = newest_checkpoint(&dir.checkpoint_dir());
        assert_eq!(snapshot.step, STEPS, "{}", path.display());
        let params = dir.dir.join("params.f32");
        write_f32(&params, checkpoint_params(&snapshot));
        let model = dir.dir.join("model.safetensors");
        let out = check(&model, &layout, &params);
        assert!(
            out.status.success(),
            "{}: the export does not match its checkpoint:\n{}{}",
            peer.name,
            text(&out.stdout),
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).starts_with("ok: "),
            "{}",
            text(&out.stdout)
        );
    }

    // The check can fail: one parameter off by one ulp, or a tensor the model lacks.
    let dir = &first.dir;
    let (_, snapshot) = newest_checkpoint(&first.checkpoint_dir());
    let mut off = checkpoint_params(&snapshot).to_vec();
    let middle = off.len() / 2;
    off[middle] = f32::from_bits(off[middle].to_bits() ^ 1);
    let params = dir.join("params-off.f32");
    write_f32(&params, &off);
    let out = check(&dir.join("model.safetensors"), &layout, &params);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("1 of"), "{stderr}");

    let renamed = layout_json().replacen("\"name\":\"", "\"name\":\"renamed.", 1);
    let bad_layout = dir.join("layout-renamed.json");
    std::fs::write(&bad_layout, renamed).expect("the layout is written");
    let out = check(
        &dir.join("model.safetensors"),
        &bad_layout,
        &dir.join("params.f32"),
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("renamed.") && stderr.contains("missing from the file"),
        "{stderr}"
    );
}

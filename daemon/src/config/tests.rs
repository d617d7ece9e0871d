//! The config module against real files: the example documents the defaults, a complete
//! swarm folder loads, and every kind of mistake names its key and line.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use murmur_gossip::sgp::OutDegree;
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::identity::{Invite, Keypair, Revocations, SwarmId};
use murmur_trainer::{TaskPreset, TrainerDevice};

use super::*;

const NOW: u64 = 1_800_000_000;
const DAY: u64 = 86_400;

/// A folder with a peer key, an authority, a config from the template and a valid invite.
struct Swarm {
    dir: tempfile::TempDir,
    authority: Keypair,
    peer: Keypair,
    swarm: SwarmId,
}

impl Swarm {
    fn new() -> Swarm {
        let dir = tempfile::tempdir().unwrap();
        let peer = Keypair::create_file(dir.path().join("murmur.key")).unwrap();
        let authority = Keypair::from_seed([9; 32]);
        let swarm = SwarmId::new("test-swarm".to_owned()).unwrap();
        let s = Swarm {
            dir,
            authority,
            peer,
            swarm,
        };
        s.write_config(&template::with_swarm(&s.swarm, &s.authority.peer_id()));
        s.write_invite(&s.peer.peer_id(), NOW - DAY, NOW + DAY);
        s
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("murmur.toml")
    }

    fn write_config(&self, text: &str) {
        std::fs::write(self.config_path(), text).unwrap();
    }

    /// The template with `edit` applied: each `(old, new)` replaces one exact line.
    fn write_edited(&self, edits: &[(&str, &str)]) {
        let mut text = template::with_swarm(&self.swarm, &self.authority.peer_id());
        for (old, new) in edits {
            assert_eq!(
                text.matches(old).count(),
                1,
                "{old:?} is in the template once"
            );
            text = text.replacen(old, new, 1);
        }
        self.write_config(&text);
    }

    fn write_invite(&self, peer: &PeerId, issued_at: u64, expires_at: u64) {
        let invite =
            Invite::issue(&self.authority, peer, &self.swarm, issued_at, expires_at).unwrap();
        std::fs::write(self.dir.path().join("invite"), invite.encode()).unwrap();
    }

    fn load(&self) -> Result<LoadedConfig, ConfigError> {
        load_at(&self.config_path(), NOW)
    }
}

/// The 1-based line of the first line of `text` that starts with `prefix`.
fn line_of(text: &str, prefix: &str) -> usize {
    text.lines()
        .position(|line| line.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starts with {prefix:?}"))
        + 1
}

fn parse(text: &str) -> Result<ConfigFile, ConfigError> {
    ConfigFile::parse(Path::new("swarm.toml"), text.to_owned())
}

#[test]
fn the_example_holds_exactly_the_defaults() {
    let example = parse(template::TEMPLATE).unwrap_or_else(|e| panic!("{e}"));
    let minimal = parse(
        "[swarm]\nid = \"demo-swarm\"\n\
         authority = \"12D3KooWKMPKDb9vXN7kWtpG9q5RoKya3w6P6BtnbTtSUFxcdFPR\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(example.config, minimal.config);
    let preset = TaskPreset::default_local();
    assert_eq!(example.checked.task, preset);
}

#[test]
fn a_complete_swarm_folder_loads_with_everything_filled_in() {
    let s = Swarm::new();
    let loaded = s.load().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.peer_id, s.peer.peer_id());
    assert_eq!(loaded.swarm, s.swarm);
    assert_eq!(loaded.authority, s.authority.peer_id());
    assert_eq!(loaded.net.swarm_id, "test-swarm");
    assert_eq!(loaded.net.authority, s.authority.peer_id().to_string());
    assert_eq!(loaded.net.invite, loaded.invite.encode());
    assert_eq!(loaded.averaging.codec, CodecSpec::Int8 { block: 64 });
    let ModeSettings::Sgp(sgp) = &loaded.averaging.mode else {
        panic!("the template's mode is sgp: {:?}", loaded.averaging.mode);
    };
    assert_eq!(sgp.share_codec, loaded.averaging.codec);
    assert!(loaded.averaging.error_feedback);
    assert_eq!(loaded.training.device, DeviceChoice::Auto);
    assert_eq!(loaded.checkpoint.dir, s.dir.path().join("checkpoints"));
    assert_eq!(loaded.metrics_listen, None);
    assert!(param_count(&loaded.task).is_some_and(|n| n > 10_000));
}

#[test]
fn relative_paths_resolve_against_the_config_folder() {
    let s = Swarm::new();
    s.write_edited(&[
        (
            "# export = \"model.safetensors\"\n",
            "export = \"out/m.safetensors\"\n",
        ),
        ("dir = \"checkpoints\"\n", "dir = \"/var/tmp/ckpt\"\n"),
        (
            "kind = \"synthetic-markov\"\n",
            "kind = \"text\"\npath = \"corpus.txt\"\n",
        ),
        ("states = 32\n", ""),
        ("branching = 4\n", ""),
        ("skew = 1.0\n", ""),
        ("communities = 1\n", ""),
    ]);
    // The files it names exist where they resolve to, so that only resolution is tested.
    std::fs::write(s.dir.path().join("corpus.txt"), b"text").unwrap();
    std::fs::create_dir(s.dir.path().join("out")).unwrap();
    let loaded = s.load().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        loaded.training.export,
        Some(s.dir.path().join("out/m.safetensors"))
    );
    assert_eq!(loaded.checkpoint.dir, PathBuf::from("/var/tmp/ckpt"));
    assert_eq!(
        loaded.task.data.source.files(),
        vec![s.dir.path().join("corpus.txt")]
    );
}

#[test]
fn an_unknown_key_is_named_with_its_line_and_column() {
    let text = "[swarm]\nid = \"a\"\nauthority = \"b\"\n\n[averaging.sgp]\nout_degre = 2\n";
    let err = parse(text).unwrap_err();
    assert_eq!(err.line(), Some(6));
    assert_eq!(err.key(), Some("averaging.sgp.out_degre"));
    let message = err.to_string();
    assert!(message.starts_with("swarm.toml:6:1: "), "{message}");
    assert!(message.contains("unknown field `out_degre`"), "{message}");
}

#[test]
fn a_value_of_the_wrong_type_is_named_with_its_line() {
    let text = "[swarm]\nid = \"a\"\nauthority = \"b\"\n[training]\nsteps = \"many\"\n";
    let err = parse(text).unwrap_err();
    assert_eq!(err.line(), Some(5));
    assert_eq!(err.key(), Some("training.steps"));
    assert!(
        err.to_string()
            .starts_with("swarm.toml:5:9: training.steps: ")
    );
}

#[test]
fn a_missing_swarm_section_is_reported() {
    let err = parse("[log]\nlevel = \"info\"\n").unwrap_err();
    assert!(err.to_string().contains("missing field `swarm`"), "{err}");
}

#[test]
fn out_of_range_values_name_their_key_line_and_value() {
    let s = Swarm::new();
    let template = template::with_swarm(&s.swarm, &s.authority.peer_id());
    for (old, new, key) in [
        (
            "out_degree = \"auto\"\n",
            "out_degree = 0\n",
            "averaging.sgp.out_degree",
        ),
        (
            "min_group = 2\n",
            "min_group = 1\n",
            "averaging.butterfly.min_group",
        ),
        (
            "max_reference_bytes = 2147483648\n",
            "max_reference_bytes = 1000\n",
            "averaging.sgp.max_reference_bytes",
        ),
        ("layers = 2\n", "layers = 0\n", "model.layers"),
        ("beta1 = 0.9\n", "beta1 = 1.5\n", "optimizer.beta1"),
        ("keep = 3\n", "keep = 0\n", "checkpoint.keep"),
        ("slowdown = 1.0\n", "slowdown = 0.5\n", "training.slowdown"),
        (
            "micro_batches = 1\n",
            "micro_batches = 3\n",
            "training.micro_batches",
        ),
        (
            "synthetic_step_ms = 0\n",
            "synthetic_step_ms = 60001\n",
            "training.synthetic_step_ms",
        ),
        (
            "cpu_threads = 0\n",
            "cpu_threads = 99999\n",
            "volunteer.cpu_threads",
        ),
        (
            "codec = \"int8:64\"\n",
            "codec = \"int9\"\n",
            "averaging.codec",
        ),
        (
            "device = \"auto\"\n",
            "device = \"gpu\"\n",
            "training.device",
        ),
        ("level = \"info\"\n", "level = \"loud\"\n", "log.level"),
        ("id = \"test-swarm\"\n", "id = \"Test Swarm\"\n", "swarm.id"),
        // Values that passed the check and then crashed `run`.
        (
            "command_capacity = 64\n",
            "command_capacity = 9223372036854775807\n",
            "net.command_capacity",
        ),
        (
            "event_capacity = 256\n",
            "event_capacity = 4000000000\n",
            "net.event_capacity",
        ),
        (
            "max_connections = 256\n",
            "max_connections = 0\n",
            "net.max_connections",
        ),
        (
            "listen_addrs = [\"/ip4/0.0.0.0/udp/0/quic-v1\", \"/ip4/0.0.0.0/tcp/0\"]\n",
            "listen_addrs = [\"/ip4/0.0.0.0/udp/0/quic\"]\n",
            "net.listen_addrs",
        ),
        (
            "listen_addrs = [\"/ip4/0.0.0.0/udp/0/quic-v1\", \"/ip4/0.0.0.0/tcp/0\"]\n",
            "listen_addrs = [\"/ip4/203.0.113.9/tcp/0\"]\n",
            "net.listen_addrs",
        ),
    ] {
        s.write_edited(&[(old, new)]);
        let err = s.load().unwrap_err();
        let line = line_of(&template, old.trim_end());
        assert_eq!(err.key(), Some(key), "{err}");
        assert_eq!(err.line(), Some(line), "{err}");
        let value = new.split_once(" = ").unwrap().1.trim_end();
        let prefix = format!("{}:{line}: {key} = {value}: ", s.config_path().display());
        assert!(err.to_string().starts_with(&prefix), "{err} / {prefix}");
    }
}

/// A GPU device is a valid value, but one a build without CUDA refuses at load time, naming
/// the key and line; `cpu` and `auto` load in every build.
#[test]
fn a_gpu_device_needs_a_cuda_build() {
    let s = Swarm::new();
    let template = std::fs::read_to_string(s.config_path()).unwrap();
    let line = line_of(&template, "device = \"auto\"");
    for (value, choice) in [
        ("cpu", DeviceChoice::Fixed(TrainerDevice::Cpu)),
        ("auto", DeviceChoice::Auto),
        ("cuda", DeviceChoice::Fixed(TrainerDevice::Cuda(0))),
        ("cuda:1", DeviceChoice::Fixed(TrainerDevice::Cuda(1))),
    ] {
        s.write_edited(&[("device = \"auto\"\n", &format!("device = \"{value}\"\n"))]);
        let refused = value.starts_with("cuda") && !TrainerDevice::CUDA_BUILT;
        match s.load() {
            Ok(loaded) if !refused => assert_eq!(loaded.training.device, choice),
            Err(err) if refused => {
                assert_eq!(err.key(), Some("training.device"), "{err}");
                assert_eq!(err.line(), Some(line), "{err}");
                assert!(err.to_string().contains("built without CUDA"), "{err}");
            }
            other => panic!("device = {value:?}: {other:?}"),
        }
    }
}

#[test]
fn a_conflict_with_a_default_names_the_default_and_its_table() {
    let s = Swarm::new();
    // int8:48 is a valid codec, but the default chunk of 16384 is not a multiple of 48.
    let text = format!(
        "[swarm]\nid = \"test-swarm\"\nauthority = \"{}\"\n[averaging]\ncodec = \"int8:48\"\n",
        s.authority.peer_id()
    );
    s.write_config(&text);
    let err = s.load().unwrap_err();
    assert_eq!(err.key(), Some("averaging.butterfly.chunk_elements"));
    assert_eq!(err.line(), Some(4), "the nearest written table: {err}");
    assert!(err.to_string().contains("= 16384 (default): "), "{err}");
}

#[test]
fn a_key_file_others_can_read_is_refused_naming_it() {
    let s = Swarm::new();
    let key_file = s.dir.path().join("murmur.key");
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = s.load().unwrap_err();
    assert_eq!(err.key(), Some("identity.key_file"));
    let message = err.to_string();
    assert!(
        message.contains(&format!("chmod 600 {}", key_file.display())),
        "{message}"
    );
}

#[test]
fn an_invite_for_another_peer_is_refused() {
    let s = Swarm::new();
    s.write_invite(&Keypair::from_seed([3; 32]).peer_id(), NOW - DAY, NOW + DAY);
    let err = s.load().unwrap_err();
    assert_eq!(err.key(), Some("swarm.invite_file"));
    assert!(err.to_string().contains("was issued to peer"), "{err}");
}

#[test]
fn an_expired_invite_is_refused() {
    let s = Swarm::new();
    s.write_invite(&s.peer.peer_id(), NOW - 2 * DAY, NOW - DAY);
    let err = s.load().unwrap_err();
    assert_eq!(err.key(), Some("swarm.invite_file"));
    assert!(err.to_string().contains("expired"), "{err}");
}

#[test]
fn an_invite_from_another_authority_is_refused() {
    let s = Swarm::new();
    let other = Keypair::from_seed([4; 32]);
    let invite = Invite::issue(&other, &s.peer.peer_id(), &s.swarm, NOW - DAY, NOW + DAY).unwrap();
    std::fs::write(s.dir.path().join("invite"), invite.encode()).unwrap();
    let err = s.load().unwrap_err();
    assert!(err.to_string().contains("signed by authority"), "{err}");
}

#[test]
fn a_revocation_file_must_be_this_swarms_list_when_it_exists() {
    let s = Swarm::new();
    s.write_edited(&[(
        "# revocation_file = \"revocations\"",
        "revocation_file = \"revocations\"",
    )]);
    // Not written yet: nothing is revoked, and the config loads.
    let loaded = s.load().expect("a missing list is fine");
    assert_eq!(
        loaded.net.revocation_file.as_deref(),
        Some(s.dir.path().join("revocations").as_path())
    );
    let file = s.dir.path().join("revocations");
    std::fs::write(&file, b"garbage").unwrap();
    let err = s.load().unwrap_err();
    assert_eq!(err.key(), Some("swarm.revocation_file"));
    assert!(
        err.to_string().contains("is not a revocation list"),
        "{err}"
    );
    let forged = Revocations::issue(&Keypair::from_seed([4; 32]), &s.swarm, 1, Vec::new()).unwrap();
    std::fs::write(&file, forged.encode()).unwrap();
    let err = s.load().unwrap_err();
    assert_eq!(err.key(), Some("swarm.revocation_file"));
    assert!(err.to_string().contains("signed by"), "{err}");
    let list = Revocations::issue(&s.authority, &s.swarm, 1, vec![s.peer.peer_id()]).unwrap();
    std::fs::write(&file, list.encode()).unwrap();
    assert!(s.load().is_ok(), "this swarm's list loads");
}

#[test]
fn a_missing_invite_says_whom_to_ask() {
    let s = Swarm::new();
    std::fs::remove_file(s.dir.path().join("invite")).unwrap();
    let err = s.load().unwrap_err();
    assert_eq!(err.key(), Some("swarm.invite_file"));
    assert!(
        err.to_string()
            .contains(&format!("murmur swarm invite {}", s.peer.peer_id())),
        "{err}"
    );
}

#[test]
fn the_sgp_table_becomes_an_sgp_config_with_the_swarm_codec() {
    let s = Swarm::new();
    s.write_edited(&[
        ("codec = \"int8:64\"\n", "codec = \"f16\"\n"),
        ("out_degree = \"auto\"\n", "out_degree = 3\n"),
    ]);
    let loaded = s.load().unwrap_or_else(|e| panic!("{e}"));
    let ModeSettings::Sgp(sgp) = &loaded.averaging.mode else {
        panic!("{:?}", loaded.averaging.mode);
    };
    assert_eq!(sgp.out_degree, OutDegree::Fixed(3));
    assert_eq!(sgp.share_codec, CodecSpec::F16);
}

/// Each mode carries the settings only it reads, from its own table.
#[test]
fn every_mode_carries_its_own_tables_settings() {
    let cases = [
        ("butterfly", "target_batch = 256\n", "target_batch = 96\n"),
        ("local-sgd", "local_steps = 8\n", "local_steps = 3\n"),
        (
            "sync-ring",
            "[averaging.ring]\n# Milliseconds a ring step may take before the round is abandoned. Default: 10000.\ntimeout_ms = 10000\n",
            "[averaging.ring]\ntimeout_ms = 7000\n",
        ),
    ];
    for (mode, from, to) in cases {
        let s = Swarm::new();
        let line = format!("mode = \"{mode}\"\n");
        s.write_edited(&[
            ("mode = \"sgp\"\n", line.as_str()),
            (from, to),
            ("error_feedback = true\n", "error_feedback = false\n"),
        ]);
        let loaded = s.load().unwrap_or_else(|e| panic!("{mode}: {e}"));
        assert!(!loaded.averaging.error_feedback, "{mode}");
        match &loaded.averaging.mode {
            ModeSettings::Butterfly { target_batch, .. } => assert_eq!(*target_batch, 96),
            ModeSettings::LocalSgd { local, .. } => assert_eq!(local.local_steps, 3),
            ModeSettings::SyncRing { timeout, .. } => {
                assert_eq!(*timeout, std::time::Duration::from_millis(7000));
            }
            other => panic!("{mode}: {other:?}"),
        }
        assert_eq!(loaded.averaging.mode.mode().name(), mode);
    }
}

/// Files and sizes that passed the check and then hung or aborted `run` are refused by the
/// check, naming the key: an invite that is a FIFO, a checkpoint folder that is a file, a
/// model far beyond this host's memory.
#[test]
fn special_files_and_oversized_models_are_refused_naming_the_key() {
    let s = Swarm::new();
    let fifo = s.dir.path().join("fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    std::fs::write(s.dir.path().join("a-file"), b"x").unwrap();
    for (old, new, key, says) in [
        (
            "invite_file = \"invite\"\n",
            "invite_file = \"fifo\"\n",
            "swarm.invite_file",
            "is a FIFO",
        ),
        (
            "dir = \"checkpoints\"\n",
            "dir = \"a-file/checkpoints\"\n",
            "checkpoint.dir",
            "is not a folder",
        ),
        ("width = 64\n", "width = 8192\n", "model", "GiB"),
    ] {
        s.write_edited(&[(old, new)]);
        let err = s.load().unwrap_err();
        assert_eq!(err.key(), Some(key), "{err}");
        assert!(err.to_string().contains(says), "{err}");
    }
}

/// With a lossy codec an SGP peer keeps a reference of the whole parameter vector per edge
/// end (16 bits an element) and an out-edge's last share: the byte budget bounds how many
/// edges it keeps each way for the configured model (one at least), and the memory estimate
/// counts them; exact shares keep none.
#[test]
fn the_sgp_reference_budget_bounds_the_edges_in_the_estimate() {
    let s = Swarm::new();
    // Width 256: 1.6M parameters, a pair of 8.2 MB (5.19 bytes a parameter with int8:64).
    let wide = ("width = 64\n", "width = 256\n");
    let each_way = |edits: &[(&str, &str)]| {
        s.write_edited(edits);
        let loaded = s.load().expect("loads");
        crate::config::memory_estimate(&loaded.task, loaded.training.passes, &loaded.averaging.mode)
            .expect("a size from the config")
            .references_each_way
    };
    assert_eq!(each_way(&[wide]), Some(8), "the count bound");
    let budget = |bytes: &'static str| ("max_reference_bytes = 2147483648\n", bytes);
    assert_eq!(
        each_way(&[wide, budget("max_reference_bytes = 40000000\n")]),
        Some(4)
    );
    assert_eq!(
        each_way(&[wide, budget("max_reference_bytes = 4194304\n")]),
        Some(1),
        "one edge each way whatever the budget"
    );
    assert_eq!(
        each_way(&[
            wide,
            budget("max_reference_bytes = 4194304\n"),
            ("codec = \"int8:64\"\n", "codec = \"f32\"\n"),
        ]),
        None,
        "exact shares keep no references"
    );
}

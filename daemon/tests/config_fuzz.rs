//! Config mutations: every key of the full config (`murmur swarm new`'s `swarm.toml`, every
//! key written), set to boundary, huge and wrong-kind values, and every path key pointed at
//! special files (a FIFO, a folder, `/dev/zero`). For each one:
//!
//! - `murmur config check` ends in time, with 0, or with 2 and an error naming the config
//!   file and a line: never a panic (101), an abort (134) or a hang;
//! - `murmur run` on the same file agrees: it exits 2 where the check refused, and where
//!   the check accepted it gets past its checks to its `ready` line (it is then stopped).
//!
//! About 450 mutations, each checked and run (a run stops at its `ready` line): well
//! under a minute on two cores.

mod run_support;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use run_support::{MURMUR, Swarm};
use toml::Value;

/// How long `config check` may take.
const CHECK_PATIENCE: Duration = Duration::from_secs(20);
/// How long `run` may take to refuse its config or print `ready`.
const RUN_PATIENCE: Duration = Duration::from_secs(30);

/// One mutated config: what was changed, and the file's value tree.
struct Mutation {
    what: String,
    config: Value,
}

/// Every leaf key of `table`, as dotted paths.
fn leaf_keys(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            Value::Table(inner) => leaf_keys(&path, inner, out),
            _ => out.push(path),
        }
    }
}

/// Sets the dotted `key` in `config` to `value`, creating tables on the way.
fn set(config: &mut Value, key: &str, value: Value) {
    let mut node = config;
    let parts: Vec<&str> = key.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        let table = node.as_table_mut().expect("a table on the path");
        node = table
            .entry(part.to_string())
            .or_insert_with(|| Value::Table(toml::Table::new()));
    }
    let table = node.as_table_mut().expect("a table holds the key");
    table.insert(parts[parts.len() - 1].to_owned(), value);
}

/// The value at the dotted `key`, if any.
fn get<'a>(config: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(config, |node, part| node.get(part))
}

/// Special files in `dir` that path keys are pointed at.
struct SpecialFiles {
    fifo: PathBuf,
    folder: PathBuf,
}

impl SpecialFiles {
    fn create(dir: &Path) -> SpecialFiles {
        let fifo = dir.join("a-fifo");
        let c_path = std::ffi::CString::new(fifo.to_str().expect("UTF-8")).expect("no NUL");
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
        let folder = dir.join("a-folder");
        std::fs::create_dir(&folder).expect("a folder");
        SpecialFiles { fifo, folder }
    }

    fn paths(&self) -> Vec<Value> {
        [
            self.fifo.to_str(),
            self.folder.to_str(),
            Some("/dev/zero"),
            Some("no/such/file"),
        ]
        .into_iter()
        .flatten()
        .map(|p| Value::String(p.to_owned()))
        .collect()
    }
}

/// Keys that hold paths.
fn is_path_key(key: &str) -> bool {
    [
        "key_file",
        "invite_file",
        "checkpoint.dir",
        "export",
        "token_file",
        ".path",
    ]
    .iter()
    .any(|k| key.ends_with(k))
}

/// The values `key`, now `value`, is set to.
fn values_for(key: &str, value: &Value, special: &SpecialFiles) -> Vec<Value> {
    let huge = Value::Integer(i64::MAX);
    let mut values = match value {
        Value::Integer(_) => vec![
            Value::Integer(0),
            Value::Integer(-1),
            Value::Integer(4_000_000_000),
            huge,
            Value::String("7".into()),
        ],
        Value::Float(_) => vec![
            Value::Float(0.0),
            Value::Float(-1.0),
            Value::Float(f64::NAN),
            Value::Float(f64::INFINITY),
            Value::Float(1e300),
            Value::Boolean(true),
        ],
        Value::Boolean(_) => vec![Value::String("yes".into()), Value::Integer(1)],
        Value::String(_) => vec![
            Value::String(String::new()),
            Value::String("x".repeat(100_000)),
            Value::String("/ip4/1.2.3.4/udp/0/quic".into()),
            Value::Integer(1),
        ],
        Value::Array(_) => vec![
            Value::Array(Vec::new()),
            Value::Array(vec![Value::String("garbage".into())]),
            Value::Array(vec![Value::String("/ip4/127.0.0.1/udp/0/quic".into())]),
            Value::Array(vec![Value::String("/ip4/203.0.113.9/tcp/0".into())]),
            Value::String("not a list".into()),
        ],
        other => vec![Value::String(format!("{other}"))],
    };
    if is_path_key(key) {
        values.extend(special.paths());
    }
    values
}

/// Every mutation of `base`, plus the cases the hardening issue found by hand.
fn mutations(base: &Value, special: &SpecialFiles) -> Vec<Mutation> {
    let mut keys = Vec::new();
    leaf_keys("", base.as_table().expect("a table"), &mut keys);
    // Keys the full config leaves commented out.
    for key in ["training.export", "metrics.control_token_file"] {
        if get(base, key).is_none() {
            keys.push(key.to_owned());
        }
    }
    let mut out = Vec::new();
    for key in &keys {
        // The swarm's identity is what makes the invite valid; a mutation there is an
        // invite error every time, which the invite tests cover.
        if key == "swarm.id" || key == "swarm.authority" {
            continue;
        }
        let now = get(base, key)
            .cloned()
            .unwrap_or_else(|| Value::String("x".into()));
        for value in values_for(key, &now, special) {
            let mut config = base.clone();
            set(&mut config, key, value.clone());
            let shown: String = value.to_string().chars().take(40).collect();
            out.push(Mutation {
                what: format!("{key} = {shown}"),
                config,
            });
        }
    }
    // A GPT within every documented range but far beyond this host's memory.
    let mut config = base.clone();
    for (key, value) in [
        ("model.width", 8192),
        ("model.layers", 64),
        ("model.context", 2048),
    ] {
        set(&mut config, key, Value::Integer(value));
    }
    out.push(Mutation {
        what: "a GPT of width 8192, 64 layers, context 2048".into(),
        config,
    });
    // A text data source that is a FIFO: read only once training starts.
    let mut config = base.clone();
    let mut source = toml::Table::new();
    source.insert("kind".into(), Value::String("text".into()));
    source.insert(
        "path".into(),
        Value::String(special.fifo.display().to_string()),
    );
    set(&mut config, "data.source", Value::Table(source));
    out.push(Mutation {
        what: "data.source = text from a FIFO".into(),
        config,
    });
    out
}

/// How one command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Exit code 0 (`check`), or the `ready` line (`run`).
    Accepted,
    /// Exit code 2.
    Refused,
}

/// Runs `murmur config check FILE`; panics on anything but 0 or 2 in time, or a refusal
/// that names no line of the file.
fn check(file: &Path, what: &str) -> Outcome {
    // A file, not a pipe: a long message must not block a child nobody reads yet.
    let log = file.with_extension("check.log");
    let mut child = Command::new(MURMUR)
        .args(["config", "check"])
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("the log file"))
        .spawn()
        .expect("murmur starts");
    let deadline = Instant::now() + CHECK_PATIENCE;
    while child.try_wait().expect("waits").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: `config check` still running after {CHECK_PATIENCE:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = child.wait().expect("the exit status");
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    match status.code() {
        Some(0) => Outcome::Accepted,
        Some(2) => {
            let prefix = format!("murmur: {}:", file.display());
            let located = stderr
                .strip_prefix(&prefix)
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
            assert!(
                located,
                "{what}: the refusal names no file and line:\n{stderr}"
            );
            Outcome::Refused
        }
        _ => panic!("{what}: `config check` ended {status}:\n{stderr}"),
    }
}

/// Runs `murmur run --progress` on `file` until it prints `ready` (then kills it) or
/// exits; panics on a crash, a hang, or an exit other than 2.
fn run(file: &Path, what: &str) -> Outcome {
    let log = file.with_extension("run.log");
    let mut child = Command::new(MURMUR)
        .args(["run", "--progress", "--quiet", "--config"])
        .arg(file)
        .env_remove("RUST_LOG")
        .env_remove("MURMUR_FAULT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("the log file"))
        .spawn()
        .expect("murmur starts");
    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::spawn(move || {
        let ready = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.contains("\"event\":\"ready\""));
        let _ = tx.send(ready);
    });
    let deadline = Instant::now() + RUN_PATIENCE;
    let outcome = loop {
        if let Ok(true) = rx.try_recv() {
            let _ = child.kill();
            break Outcome::Accepted;
        }
        if let Some(status) = child.try_wait().expect("waits") {
            let stderr = std::fs::read_to_string(&log).unwrap_or_default();
            match status.code() {
                Some(2) => break Outcome::Refused,
                _ => panic!("{what}: `run` ended {status} before `ready`:\n{stderr}"),
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: `run` neither refused nor got ready in {RUN_PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = child.wait();
    outcome
}

#[test]
fn config_check_and_run_agree_on_every_mutation_and_nothing_crashes_or_hangs() {
    let swarm = Swarm::create();
    let dir = swarm.add_peer("fuzz");
    let special = SpecialFiles::create(&dir.dir);
    let text = std::fs::read_to_string(swarm.root().join("swarm.toml")).expect("swarm.toml");
    let mut base: Value = toml::from_str(&text).expect("swarm.toml is TOML");
    // A free port each run, and no waiting for peers that never come.
    set(
        &mut base,
        "metrics.listen",
        Value::String("127.0.0.1:0".into()),
    );
    set(
        &mut base,
        "net.listen_addrs",
        Value::Array(vec![Value::String("/ip4/127.0.0.1/udp/0/quic-v1".into())]),
    );
    set(&mut base, "net.bootstrap", Value::Array(Vec::new()));
    set(&mut base, "volunteer.cpu_threads", Value::Integer(1));
    set(&mut base, "training.device", Value::String("cpu".into()));
    let file = dir.dir.join("fuzz.toml");
    let write = |config: &Value| {
        let text = toml::to_string(config).expect("serializes");
        std::fs::write(&file, text).expect("the config is written");
    };
    write(&base);
    assert_eq!(check(&file, "the base config"), Outcome::Accepted);
    assert_eq!(run(&file, "the base config"), Outcome::Accepted);

    let all = mutations(&base, &special);
    let (mut accepted, mut refused) = (0, 0);
    let started = Instant::now();
    for mutation in &all {
        write(&mutation.config);
        let checked = check(&file, &mutation.what);
        match checked {
            Outcome::Accepted => accepted += 1,
            Outcome::Refused => refused += 1,
        }
        let ran = run(&file, &mutation.what);
        assert_eq!(
            ran, checked,
            "{}: `config check` and `run` disagree",
            mutation.what
        );
    }
    eprintln!(
        "{} mutations: {accepted} accepted, {refused} refused by `config check` and `run` \
         alike; {:.0?}",
        all.len(),
        started.elapsed()
    );
    assert!(refused > accepted, "the mutations hardly test the checks");
}

//! `murmur init`, `murmur swarm new|invite` and `murmur config check` as a user runs them:
//! the organizer/volunteer round trip ends in a config that loads, `init` and `swarm new`
//! write the shipped example, and every kind of bad config exits 2 naming the file, the
//! line and the key.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use murmur_protocol::identity::{Invite, Keypair, PeerId, Revocations, SwarmId};

fn murmur() -> Command {
    Command::new(env!("CARGO_BIN_EXE_murmur"))
}

fn run(args: &[&str]) -> Output {
    murmur().args(args).output().expect("murmur runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        stdout(out),
        stderr(out)
    );
}

fn example() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/swarm.toml");
    std::fs::read_to_string(path).expect("examples/swarm.toml exists")
}

/// The id `murmur init` printed.
fn printed_peer_id(out: &Output) -> String {
    stdout(out)
        .lines()
        .find_map(|line| line.strip_prefix("peer id: "))
        .expect("init prints the peer id")
        .to_owned()
}

/// An organizer folder (`swarm new`) and a volunteer folder (`init`, the organizer's
/// swarm.toml, and an invite from `swarm invite`).
struct Workflow {
    _root: tempfile::TempDir,
    org: PathBuf,
    vol: PathBuf,
    peer: String,
}

impl Workflow {
    fn new() -> Workflow {
        let root = tempfile::tempdir().unwrap();
        let org = root.path().join("org");
        let vol = root.path().join("vol");
        assert_ok(&run(&[
            "swarm",
            "new",
            "--dir",
            org.to_str().unwrap(),
            "--id",
            "test-swarm",
        ]));
        let init = run(&["init", "--dir", vol.to_str().unwrap()]);
        assert_ok(&init);
        let peer = printed_peer_id(&init);
        std::fs::copy(org.join("swarm.toml"), vol.join("swarm.toml")).unwrap();
        let w = Workflow {
            _root: root,
            org,
            vol,
            peer,
        };
        assert_ok(&w.invite(&w.peer.clone(), &[]));
        w
    }

    fn invite(&self, peer: &str, extra: &[&str]) -> Output {
        let out = self.vol.join("invite");
        let mut args = vec![
            "swarm",
            "invite",
            peer,
            "--authority-key",
            self.org.join("authority.key").to_str().unwrap(),
            "--swarm-config",
            self.org.join("swarm.toml").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        murmur().args(&args).output().unwrap()
    }

    fn config(&self) -> PathBuf {
        self.vol.join("swarm.toml")
    }

    fn check(&self) -> Output {
        run(&["config", "check", self.config().to_str().unwrap()])
    }

    /// Replaces the one line equal to `old` in the volunteer's config; returns its number.
    fn edit_line(&self, old: &str, new: &str) -> usize {
        let text = std::fs::read_to_string(self.config()).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        let index = lines
            .iter()
            .position(|line| *line == old)
            .unwrap_or_else(|| panic!("no line {old:?}"));
        lines[index] = new;
        std::fs::write(self.config(), lines.join("\n") + "\n").unwrap();
        index + 1
    }

    /// Runs `config check` expecting exit 2 and a message starting `FILE:LINE` and
    /// naming `needle`; returns stderr.
    fn check_fails_at(&self, line: usize, needle: &str) -> String {
        let out = self.check();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        let at = format!("{}:{line}:", self.config().display());
        assert!(err.contains(&at), "expected {at:?} in: {err}");
        assert!(err.contains(needle), "expected {needle:?} in: {err}");
        err
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn swarm_new_init_invite_then_check_round_trip() {
    let w = Workflow::new();
    assert_eq!(mode(&w.org.join("authority.key")), 0o600);
    assert_eq!(mode(&w.vol.join("murmur.key")), 0o600);
    let out = w.check();
    assert_ok(&out);
    let summary = stdout(&out);
    for needle in [
        w.peer.as_str(),
        "test-swarm",
        "sgp",
        "int8:64",
        "parameters",
        "of training state",
    ] {
        assert!(summary.contains(needle), "{needle:?} in {summary}");
    }
    // The summary names the authority swarm new created.
    let authority = Keypair::load_file(w.org.join("authority.key")).unwrap();
    assert!(
        summary.contains(&authority.peer_id().to_string()),
        "{summary}"
    );
}

/// The lines in which `text` differs from `base`, which must have as many lines.
fn changed_lines<'a>(base: &'a str, text: &'a str) -> Vec<(&'a str, &'a str)> {
    assert_eq!(base.lines().count(), text.lines().count());
    base.lines()
        .zip(text.lines())
        .filter(|(a, b)| a != b)
        .collect()
}

#[test]
fn init_writes_the_example_with_metrics_on_and_swarm_new_changes_only_the_swarm_lines() {
    let w = Workflow::new();
    let example = example();
    let init = std::fs::read_to_string(w.vol.join("murmur.toml")).unwrap();
    let changed = changed_lines(&example, &init);
    assert_eq!(
        changed,
        [(
            "# listen = \"127.0.0.1:9464\"",
            "listen = \"127.0.0.1:9464\""
        )]
    );
    let swarm = std::fs::read_to_string(w.org.join("swarm.toml")).unwrap();
    let changed = changed_lines(&init, &swarm);
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert_eq!(changed[0].1, "id = \"test-swarm\"");
    assert!(changed[1].1.starts_with("authority = \"12D3KooW"));
}

#[test]
fn swarm_new_sets_up_the_organizer_s_first_peer_on_a_fixed_port() {
    let w = Workflow::new();
    let swarm = std::fs::read_to_string(w.org.join("swarm.toml")).unwrap();
    let peer = std::fs::read_to_string(w.org.join("peer/murmur.toml")).unwrap();
    let changed = changed_lines(&swarm, &peer);
    assert_eq!(
        changed,
        [(
            "listen_addrs = [\"/ip4/0.0.0.0/udp/0/quic-v1\", \"/ip4/0.0.0.0/tcp/0\"]",
            "listen_addrs = [\"/ip4/0.0.0.0/udp/7600/quic-v1\", \"/ip4/0.0.0.0/tcp/7600\"]"
        )]
    );
    // Its key and its own invite load: the config passes as it is.
    let check = run(&[
        "config",
        "check",
        w.org.join("peer/murmur.toml").to_str().unwrap(),
    ]);
    assert!(check.status.success(), "{}", stderr(&check));

    // With the public host, the published config bootstraps from the first peer.
    let dir = tempfile::tempdir().unwrap();
    let org = dir.path().to_str().unwrap();
    let new = run(&[
        "swarm",
        "new",
        "--dir",
        org,
        "--id",
        "s",
        "--public-host",
        "203.0.113.7",
        "--peer-port",
        "7700",
    ]);
    assert!(new.status.success(), "{}", stderr(&new));
    let key = Keypair::load_file(dir.path().join("peer/murmur.key")).unwrap();
    let id = key.peer_id();
    let published = std::fs::read_to_string(dir.path().join("swarm.toml")).unwrap();
    assert!(
        published.contains(&format!(
            "bootstrap = [\"/ip4/203.0.113.7/udp/7700/quic-v1/p2p/{id}\", \
             \"/ip4/203.0.113.7/tcp/7700/p2p/{id}\"]"
        )),
        "{published}"
    );
    let bad = run(&[
        "swarm",
        "new",
        "--dir",
        org,
        "--public-host",
        "a b",
        "--force",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("--public-host"), "{}", stderr(&bad));
}

#[test]
fn init_refuses_to_overwrite_a_key_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let first = printed_peer_id(&run(&["init", "--dir", d]));
    let again = run(&["init", "--dir", d]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert!(stderr(&again).contains("murmur.key already exists"));
    let key = Keypair::load_file(dir.path().join("murmur.key")).unwrap();
    assert_eq!(key.peer_id().to_string(), first, "the key was kept");
    let forced = run(&["init", "--dir", d, "--force"]);
    assert_ok(&forced);
    assert_ne!(printed_peer_id(&forced), first);
}

#[test]
fn an_unknown_key_exits_2_naming_key_and_line() {
    let w = Workflow::new();
    let line = w.edit_line("mdns = false", "mdsn = false");
    w.check_fails_at(line, "net.mdsn");
}

#[test]
fn a_wrong_type_exits_2_naming_key_and_line() {
    let w = Workflow::new();
    let line = w.edit_line("mdns = false", "mdns = \"yes\"");
    w.check_fails_at(line, "net.mdns");
}

#[test]
fn an_out_of_range_value_exits_2_naming_key_value_and_line() {
    let w = Workflow::new();
    let line = w.edit_line("out_degree = \"auto\"", "out_degree = 0");
    w.check_fails_at(line, "averaging.sgp.out_degree = 0: ");
}

/// A model whose sync-ring segment cannot travel in one frame is refused before any peer
/// starts, naming the frame limit and the size it would need; SGP, whose shares travel in
/// pieces, and butterfly, which sends parts in chunks, take the same model, and `config
/// check` says how large their frames are.
#[test]
fn a_model_whose_ring_segment_outgrows_a_frame_exits_2_naming_the_frame_limit() {
    let w = Workflow::new();
    w.edit_line("width = 64", "width = 640");
    let out = w.check();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(text.contains("an SGP share travels in at most"), "{text}");
    // Twice as wide: a segment, half the model, outgrows the default frame.
    w.edit_line("width = 640", "width = 1280");
    w.edit_line("mode = \"sgp\"", "mode = \"sync-ring\"");
    let line = w.edit_line(
        "max_frame_payload = 16777216",
        "max_frame_payload = 16777216",
    );
    let err = w.check_fails_at(
        line,
        "net.max_frame_payload = 16777216: a sync-ring segment travels in one frame of",
    );
    assert!(
        err.contains("raise net.max_frame_payload (now 16777216) to at least"),
        "{err}"
    );
    w.edit_line("mode = \"sync-ring\"", "mode = \"butterfly\"");
    let out = w.check();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        text.contains("butterfly chunks travel in frames of up to"),
        "{text}"
    );
}

/// `config check` refuses a GPU that this build cannot train on, before any peer starts.
#[cfg(not(feature = "cuda"))]
#[test]
fn a_gpu_device_on_a_build_without_cuda_exits_2_naming_key_and_line() {
    let w = Workflow::new();
    let line = w.edit_line("device = \"auto\"", "device = \"cuda\"");
    w.check_fails_at(
        line,
        "training.device = \"cuda\": this murmur was built without CUDA",
    );
}

#[test]
fn a_missing_config_exits_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.toml");
    let out = run(&["config", "check", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(&format!("{}: cannot read the config", path.display())),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_key_file_others_can_read_exits_2_saying_to_chmod_it() {
    let w = Workflow::new();
    let key = w.vol.join("murmur.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let text = std::fs::read_to_string(w.config()).unwrap();
    let line = text
        .lines()
        .position(|l| l.starts_with("key_file = "))
        .unwrap()
        + 1;
    let err = w.check_fails_at(line, "identity.key_file");
    assert!(
        err.contains(&format!("chmod 600 {}", key.display())),
        "{err}"
    );
}

#[test]
fn an_invite_for_another_peer_exits_2() {
    let w = Workflow::new();
    let other = Keypair::from_seed([5; 32]).peer_id().to_string();
    assert_ok(&w.invite(&other, &[]));
    let text = std::fs::read_to_string(w.config()).unwrap();
    let line = text
        .lines()
        .position(|l| l.starts_with("invite_file = "))
        .unwrap()
        + 1;
    w.check_fails_at(line, "was issued to peer");
}

#[test]
fn an_expired_invite_exits_2() {
    let w = Workflow::new();
    let authority = Keypair::load_file(w.org.join("authority.key")).unwrap();
    let peer: PeerId = w.peer.parse().unwrap();
    let swarm = SwarmId::new("test-swarm".to_owned()).unwrap();
    // Issued and expired in 2001.
    let invite = Invite::issue(&authority, &peer, &swarm, 1_000_000_000, 1_000_086_400).unwrap();
    std::fs::write(w.vol.join("invite"), invite.encode()).unwrap();
    let out = w.check();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("expired"), "{}", stderr(&out));
}

#[test]
fn swarm_invite_rejects_a_bad_peer_id_and_a_foreign_authority_key() {
    let w = Workflow::new();
    let out = w.invite("not-a-peer", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("PEER_ID \"not-a-peer\" is not a peer id"));

    let stranger = w.org.join("stranger.key");
    Keypair::create_file(&stranger).unwrap();
    let out = run(&[
        "swarm",
        "invite",
        &w.peer,
        "--authority-key",
        stranger.to_str().unwrap(),
        "--swarm-config",
        w.org.join("swarm.toml").to_str().unwrap(),
        "--out",
        w.vol.join("stranger.invite").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("pass the authority key of this swarm"));
    assert!(!w.vol.join("stranger.invite").exists());
}

/// `swarm revoke` builds on the list at `--out`: each run keeps the peers already named,
/// adds the new ones, drops the lifted ones, and raises the serial; a bad peer id or a list
/// of another swarm exits 2 and leaves the file as it was.
#[test]
fn swarm_revoke_extends_lifts_and_raises_the_serial_of_the_list_at_out() {
    let w = Workflow::new();
    let list = w.org.join("revocations");
    let other = printed_peer_id(&run(&["init", "--dir", w.org.join("v2").to_str().unwrap()]));
    let base: Vec<String> = [
        "swarm",
        "revoke",
        "--authority-key",
        w.org.join("authority.key").to_str().unwrap(),
        "--swarm-config",
        w.org.join("swarm.toml").to_str().unwrap(),
        "--out",
        list.to_str().unwrap(),
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    let revoke = |extra: &[&str]| {
        let mut args: Vec<&str> = base.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        run(&args)
    };
    let read = || {
        let list = Revocations::decode(&std::fs::read(&list).unwrap()).unwrap();
        let mut named: Vec<String> = list.revoked().iter().map(ToString::to_string).collect();
        named.sort();
        (list.serial(), named)
    };
    let out = revoke(&[&w.peer]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("revokes 1 peer(s)"),
        "{}",
        stdout(&out)
    );
    let (first, named) = read();
    assert_eq!(named, vec![w.peer.clone()]);

    assert_ok(&revoke(&[&other]));
    let (second, named) = read();
    assert!(second > first, "{second} after {first}");
    let mut both = vec![w.peer.clone(), other.clone()];
    both.sort();
    assert_eq!(named, both);

    assert_ok(&revoke(&["--lift", &w.peer]));
    let (third, named) = read();
    assert!(third > second);
    assert_eq!(named, vec![other.clone()]);

    let bad = revoke(&["not-a-peer"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("\"not-a-peer\" is not a peer id"),
        "{}",
        stderr(&bad)
    );
    let empty = revoke(&[]);
    assert_eq!(empty.status.code(), Some(2));
    assert_eq!(read().0, third, "a refused run leaves the list alone");

    // A list of another swarm at --out is not extended.
    let foreign = Revocations::issue(
        &Keypair::from_seed([5; 32]),
        &SwarmId::new("test-swarm").unwrap(),
        1,
        Vec::new(),
    )
    .unwrap();
    std::fs::write(&list, foreign.encode()).unwrap();
    let out = revoke(&[&other]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is not this swarm's revocation list"),
        "{}",
        stderr(&out)
    );
}

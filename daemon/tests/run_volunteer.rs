//! What a volunteer sees of `murmur run`, with real processes: progress and `murmur status`
//! with the config `murmur init` wrote, and one run per peer folder.

mod run_support;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

use run_support::{MURMUR, PeerSettings, SWARM_ID, Swarm, exclusive};

/// How long a refused second run is given before it is killed and the test fails.
const REFUSAL_BOUND: Duration = Duration::from_secs(10);

/// How long a peer may take to stop after SIGINT.
const STOP_PATIENCE: Duration = Duration::from_secs(30);

/// How soon a new volunteer must see the peer's progress.
const FIRST_SIGN: Duration = Duration::from_secs(10);

#[test]
fn a_fresh_volunteer_sees_progress_within_10_s_and_status_answers_with_init_s_config() {
    let _guard = exclusive();
    let swarm = Swarm::create();
    let dir = swarm.add_peer("volunteer");
    // `murmur init`'s config, with only the swarm's id and authority filled in.
    let text = std::fs::read_to_string(dir.config_path()).expect("init wrote a config");
    let text = text
        .replacen("id = \"demo-swarm\"", &format!("id = \"{SWARM_ID}\""), 1)
        .replacen(
            "authority = \"12D3KooWKMPKDb9vXN7kWtpG9q5RoKya3w6P6BtnbTtSUFxcdFPR\"",
            &format!("authority = \"{}\"", dir.authority()),
            1,
        );
    std::fs::write(dir.config_path(), text).expect("the config is written");

    let started = Instant::now();
    let mut run = Command::new(MURMUR)
        .args(["run", "--config"])
        .arg(dir.config_path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("murmur run starts");
    let stderr = run.stderr.take().expect("stderr is piped");
    let (tx, rx) = sync_channel::<String>(4096);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.try_send(line).is_err() {
                return;
            }
        }
    });
    let mut log = String::new();
    let mut seen = None;
    while seen.is_none() && started.elapsed() < FIRST_SIGN {
        let Ok(line) = rx.recv_timeout(FIRST_SIGN.saturating_sub(started.elapsed())) else {
            break;
        };
        if line.contains("step ") && line.contains("loss ") && line.contains("samples/s") {
            seen = Some(started.elapsed());
        }
        log.push_str(&line);
        log.push('\n');
    }
    // Not `murmur_cli`, which panics on failure: the peer must be stopped first.
    let status = Command::new(MURMUR)
        .arg("status")
        .stdin(Stdio::null())
        .output()
        .expect("murmur status runs");
    let _ = Command::new("kill")
        .args(["-INT", &run.id().to_string()])
        .status();
    let deadline = Instant::now() + STOP_PATIENCE;
    while run.try_wait().expect("waits").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = run.kill();
    let _ = run.wait();
    assert!(
        seen.is_some(),
        "no status line within {FIRST_SIGN:?} of `murmur run`:\n{log}"
    );
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && text.contains(&dir.peer_id),
        "`murmur status` did not describe the peer {}: {}\n{text}{}",
        dir.peer_id,
        status.status,
        String::from_utf8_lossy(&status.stderr)
    );
}

#[test]
fn a_second_run_on_the_same_folder_exits_2_naming_the_first_and_leaves_it_unharmed() {
    let _guard = exclusive();
    let swarm = Swarm::create();
    let dir = swarm.add_peer("solo");
    dir.write_config(&PeerSettings::default());
    let mut first = dir.start();
    first.ready();
    first.wait_for("a first progress line", Duration::from_secs(60), |l| {
        l.is("progress")
    });

    let (output, took) = run_until_refused(&dir.config_path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        took < Duration::from_secs(1),
        "the second run took {took:?} to refuse"
    );
    assert!(
        stderr.contains(&format!("pid {}", first.pid())),
        "the refusal does not name the first run's pid {}: {stderr}",
        first.pid()
    );

    // The first run goes on training, then stops cleanly.
    let step = first.step();
    first.wait_for(
        "progress after the refused run",
        Duration::from_secs(60),
        |l| l.is("progress") && l.u64("step") >= step + 40,
    );
    first.signal("INT");
    let status = first.wait_exit(STOP_PATIENCE);
    assert!(status.success(), "the first run ended with {status}");
}

#[test]
fn an_unreachable_bootstrap_address_is_named_in_a_warning_within_10_s() {
    let _guard = exclusive();
    let swarm = Swarm::create();
    // A real peer id, whose peer never runs, at ports nothing listens on.
    let ghost = swarm.add_peer("ghost");
    let tcp_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free TCP port")
        .port();
    let udp_port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free UDP port")
        .port();
    let tcp = format!("/ip4/127.0.0.1/tcp/{tcp_port}/p2p/{}", ghost.peer_id);
    let quic = format!(
        "/ip4/127.0.0.1/udp/{udp_port}/quic-v1/p2p/{}",
        ghost.peer_id
    );
    let dir = swarm.add_peer("volunteer");
    dir.write_config(&PeerSettings {
        bootstrap: vec![tcp.clone(), quic.clone()],
        metrics: true,
        ..PeerSettings::default()
    });
    let started = Instant::now();
    let mut peer = dir.start();
    let metrics_addr = peer.ready().str("metrics_addr").to_owned();
    let named = |log: &str, address: &str| {
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("bootstrap") && l.contains(address))
    };
    let log = peer.log_once(
        "a warning naming each unreachable bootstrap address",
        FIRST_SIGN.saturating_sub(started.elapsed()),
        |log| named(log, &tcp) && named(log, &quic),
    );
    assert!(
        started.elapsed() <= FIRST_SIGN,
        "the warnings took {:?}",
        started.elapsed()
    );
    // The warning says why.
    let line = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains(&tcp))
        .expect("the TCP warning");
    assert!(line.contains("reason"), "{line}");
    // `/status` lists both addresses with their errors, and `murmur status` shows them.
    let json = Command::new(MURMUR)
        .args(["status", "--json", "--addr", &metrics_addr])
        .output()
        .expect("murmur status runs");
    let report: serde_json::Value =
        serde_json::from_slice(&json.stdout).expect("`murmur status --json` prints JSON");
    let listed = report["bootstrap"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 2, "{report}");
    for (entry, address) in listed.iter().zip([&tcp, &quic]) {
        assert_eq!(entry["address"].as_str(), Some(address.as_str()), "{entry}");
        assert!(
            entry["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{entry}"
        );
        assert!(entry["reached"].is_null(), "{entry}");
    }
    let text = Command::new(MURMUR)
        .args(["status", "--addr", &metrics_addr])
        .output()
        .expect("murmur status runs");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("{tcp}  FAILED")), "{text}");
    peer.signal("INT");
    peer.wait_exit(STOP_PATIENCE);
}

/// A listen address whose port another program holds stops the run at once with the key
/// and the operating system's reason, not an empty one.
#[test]
fn a_listen_port_in_use_is_named_with_the_key_and_the_reason() {
    let _guard = exclusive();
    let swarm = Swarm::create();
    let holder = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP port to hold");
    let port = holder.local_addr().expect("its address").port();
    let addr = format!("/ip4/127.0.0.1/udp/{port}/quic-v1");
    let dir = swarm.add_peer("taken");
    dir.write_config(&PeerSettings {
        listen_addrs: vec![addr.clone()],
        ..PeerSettings::default()
    });
    let (output, took) = run_until_refused(&dir.config_path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(took < REFUSAL_BOUND, "the run did not stop: {stderr}");
    assert!(!output.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains(&addr))
        .unwrap_or_else(|| panic!("no line names {addr}: {stderr}"));
    assert!(
        line.contains("net.listen_addrs") && line.contains("in use"),
        "{line}"
    );
    drop(holder);
}

/// Starts `murmur run --config config` and waits for it to exit, killing it after
/// [`REFUSAL_BOUND`]; returns its output and how long it ran.
fn run_until_refused(config: &std::path::Path) -> (std::process::Output, Duration) {
    let started = Instant::now();
    let mut run = Command::new(MURMUR)
        .args(["run", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("murmur starts");
    while run.try_wait().expect("waits").is_none() && started.elapsed() < REFUSAL_BOUND {
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = started.elapsed();
    if took >= REFUSAL_BOUND {
        let _ = run.kill();
    }
    (run.wait_with_output().expect("the run ends"), took)
}

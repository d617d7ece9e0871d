//! `POST /pause` and `/resume` on a real `murmur run` whose metrics endpoint listens on
//! every address: a client on another address (this host's own non-loopback address) gets
//! `403` and changes nothing without the bearer token, and pauses with it; a foreign `Host`
//! or `Origin` gets `403` even from loopback; every decision's log line names the client.

mod run_support;
#[path = "support/swarm.rs"]
mod swarm;

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use run_support::{PeerSettings, Swarm};
use swarm::exclusive;

/// The bearer token the peer's `control_token_file` holds.
const TOKEN: &str = "c0ntrol-t0ken-for-the-test-0123456789";

/// How long a log line may take to land after its request was answered.
const LOG_PATIENCE: Duration = Duration::from_secs(5);

/// An address of this host that is not loopback: the source address the kernel picks for
/// a route off the host (no packet is sent), or else the first of `hostname -I`.
fn non_loopback_address() -> IpAddr {
    for probe in ["192.0.2.1:9", "10.255.255.255:9", "8.8.8.8:53"] {
        let picked = UdpSocket::bind("0.0.0.0:0")
            .and_then(|socket| socket.connect(probe).map(|()| socket))
            .and_then(|socket| socket.local_addr());
        if let Ok(addr) = picked
            && !addr.ip().is_loopback()
            && !addr.ip().is_unspecified()
        {
            return addr.ip();
        }
    }
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .expect("hostname -I runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv4() && !ip.is_loopback())
        .expect("this host has a non-loopback IPv4 address to test from")
}

/// Sends `POST path` with `headers` (each ending in `\r\n`) to `addr`; the status code.
fn post(addr: SocketAddr, path: &str, headers: &str) -> u16 {
    let mut stream = TcpStream::connect_timeout(&addr, swarm::HTTP_PATIENCE)
        .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    stream
        .set_read_timeout(Some(swarm::HTTP_PATIENCE))
        .expect("a read timeout");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\n{headers}Content-Length: 0\r\n\r\n"
    )
    .expect("the request is sent");
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .expect("the answer is read");
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"))
}

/// Whether the peer says it is paused (`/status`, over loopback).
fn paused(loopback: SocketAddr) -> bool {
    let (code, body) = swarm::http_get(loopback, "/status").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).expect("/status is JSON");
    status["paused"].as_bool().expect("/status has `paused`")
}

#[test]
fn pause_and_resume_need_loopback_or_the_token_and_this_daemons_host() {
    let _serial = exclusive();
    let lan = non_loopback_address();
    let swarm = Swarm::create();
    let dir = swarm.add_peer("solo");
    let token_file = dir.dir.join("control.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("the token file is written");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600))
        .expect("the token file is private");
    dir.write_config(&PeerSettings {
        metrics: true,
        metrics_listen: Some("0.0.0.0:0".to_owned()),
        control_token_file: Some("control.token".to_owned()),
        ..PeerSettings::default()
    });
    let mut peer = dir.start();
    let ready = peer.ready();
    let port = ready.json["metrics_addr"]
        .as_str()
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .unwrap_or_else(|| peer.fail(&format!("no metrics_addr in {}", ready.json)))
        .port();
    let loopback = SocketAddr::from(([127, 0, 0, 1], port));
    let remote = SocketAddr::new(lan, port);
    assert!(!paused(loopback));

    // Not loopback, no token (or a wrong one): refused, nothing changes.
    let host = format!("Host: {remote}\r\n");
    assert_eq!(post(remote, "/pause", &host), 403);
    let wrong = format!("{host}Authorization: Bearer not-{TOKEN}\r\n");
    assert_eq!(post(remote, "/pause", &wrong), 403);
    assert!(!paused(loopback), "a refused pause paused the peer");
    peer.log_once("the refusal naming the client", LOG_PATIENCE, |log| {
        log.lines()
            .any(|l| l.contains("control request refused") && l.contains(&lan.to_string()))
    });

    // Loopback, but a Host or Origin that is not this daemon (DNS rebinding, another site).
    let rebound = format!("Host: rebound.example:{port}\r\n");
    assert_eq!(post(loopback, "/pause", &rebound), 403);
    let foreign = format!("Host: {loopback}\r\nOrigin: http://evil.example\r\n");
    assert_eq!(post(loopback, "/pause", &foreign), 403);
    assert!(
        !paused(loopback),
        "a foreign Host or Origin paused the peer"
    );

    // The token admits the other address; the log names it.
    let bearer = format!("{host}Authorization: Bearer {TOKEN}\r\n");
    assert_eq!(post(remote, "/pause", &bearer), 200);
    assert!(paused(loopback));
    peer.log_once("the pause naming the client", LOG_PATIENCE, |log| {
        log.lines()
            .any(|l| l.contains("training paused over HTTP") && l.contains(&lan.to_string()))
    });
    assert_eq!(post(remote, "/resume", &host), 403);
    assert!(paused(loopback), "a refused resume resumed the peer");

    // Loopback needs no token.
    assert_eq!(
        post(loopback, "/resume", &format!("Host: {loopback}\r\n")),
        200
    );
    assert!(!paused(loopback));
    peer.kill_hard();
}

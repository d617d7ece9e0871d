//! `murmur status` against a stand-in daemon: what it prints, and how it fails.
//!
//! The stand-in serves a status document written out here by hand, so these tests also pin
//! the `/status` JSON schema that operators' scripts read.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Output};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The status client's own limit is 5 s; anything slower is a hang.
const PATIENCE: Duration = Duration::from_secs(20);

const STATUS: &str = r#"{
  "peer_id": "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN",
  "swarm": "tiny-lm",
  "mode": "butterfly",
  "codec": "int8",
  "device": "cuda:0",
  "step": 1234,
  "samples": 39488,
  "loss": 2.5,
  "eval_loss": null,
  "samples_per_s": 256.0,
  "paused": true,
  "uptime_s": 90.0,
  "bytes_sent": 1048576,
  "bytes_received": 2048,
  "peers": [
    {
      "peer_id": "12D3KooWH3uVF6wv47WnArKHk5p6cvgCJEb74UTmxztmQDc298L3",
      "last_heartbeat_step": 1230,
      "heartbeat_age_s": 2.0,
      "samples_per_s": 200.0,
      "reported_upload_bytes_per_s": 1000000,
      "reported_download_bytes_per_s": 2000000,
      "measured_upload_bytes_per_s": null,
      "measured_download_bytes_per_s": 3145728.0
    }
  ],
  "last_rounds": [
    {
      "mode": "butterfly",
      "outcome": "partial",
      "duration_s": 1.25,
      "coverage": 0.75,
      "group_size": 3,
      "out_peer": null,
      "stragglers_dropped": 1,
      "parts_timed_out": 1,
      "age_s": 4.0
    }
  ]
}"#;

/// What the stand-in does with its one connection.
enum Behaviour {
    /// Reads the request and writes this answer.
    Answer(Vec<u8>),
    /// Reads the request and then says nothing, holding the connection open.
    Silent,
}

/// A stand-in daemon on a free loopback port, serving one connection. Its thread returns
/// the request head it read.
fn stand_in(behaviour: Behaviour) -> (SocketAddr, JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
    let addr = listener.local_addr().expect("an address");
    let thread = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("the client connects");
        stream
            .set_read_timeout(Some(PATIENCE))
            .expect("timeout set");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
            match stream.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => break,
            }
        }
        match behaviour {
            Behaviour::Answer(answer) => {
                let _ = stream.write_all(&answer);
            }
            Behaviour::Silent => {
                // Hold the connection until the client gives up and closes it.
                let _ = stream.read(&mut byte);
            }
        }
        String::from_utf8_lossy(&head).into_owned()
    });
    (addr, thread)
}

fn ok_answer(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Runs `murmur status --addr ADDR [extra]`, failing the test if it takes too long.
fn murmur_status(addr: &str, extra: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .args(["status", "--addr", addr])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("murmur starts");
    while child.try_wait().expect("waits").is_none() {
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("`murmur status` still running after {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("output");
    (output, started.elapsed())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn status_prints_what_the_daemon_reports() {
    let (addr, server) = stand_in(Behaviour::Answer(ok_answer(STATUS)));
    let (out, _) = murmur_status(&addr.to_string(), &[]);
    let request = server.join().expect("stand-in ran");
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(request.starts_with("GET /status HTTP/1.1\r\n"), "{request}");
    let stdout = text(&out.stdout);
    for expected in [
        "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN",
        "mode butterfly   codec int8   device cuda:0",
        "paused",
        "step      1234",
        "loss 2.5000",
        "sent 1.0 MiB",
        "peers (1)",
        "12D3KooWH3uVF6wv47WnArKHk5p6cvgCJEb74UTmxztmQDc298L3",
        "3.0 MiB/s",
        "partial",
        "group of 3",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in\n{stdout}"
        );
    }
}

#[test]
fn status_json_is_the_daemon_document_unchanged() {
    let (addr, server) = stand_in(Behaviour::Answer(ok_answer(STATUS)));
    let (out, _) = murmur_status(&addr.to_string(), &["--json"]);
    server.join().expect("stand-in ran");
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let served: serde_json::Value = serde_json::from_str(STATUS).expect("valid test JSON");
    assert_eq!(printed, served);
}

#[test]
fn an_unreachable_daemon_is_a_clear_error_and_exit_code_1() {
    // A port that was free a moment ago and has no listener now.
    let addr = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let (out, _) = murmur_status(&addr.to_string(), &[]);
    assert_eq!(out.status.code(), Some(1), "stdout: {}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("cannot reach a murmur daemon at"),
        "{stderr}"
    );
    assert!(stderr.contains(&addr.to_string()), "{stderr}");
}

#[test]
fn a_silent_daemon_is_given_up_on_within_the_timeout() {
    let (addr, server) = stand_in(Behaviour::Silent);
    let (out, took) = murmur_status(&addr.to_string(), &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("did not answer within"),
        "{}",
        text(&out.stderr)
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    server.join().expect("stand-in ran");
}

#[test]
fn an_error_answer_or_a_stranger_is_reported_not_printed() {
    let refused = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 6\r\n\r\nbroken".to_vec();
    let (addr, server) = stand_in(Behaviour::Answer(refused));
    let (out, _) = murmur_status(&addr.to_string(), &[]);
    server.join().expect("stand-in ran");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("answered 500") && stderr.contains("broken"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    let stranger = ok_answer(r#"{"hello":"world"}"#);
    let (addr, server) = stand_in(Behaviour::Answer(stranger));
    let (out, _) = murmur_status(&addr.to_string(), &["--json"]);
    server.join().expect("stand-in ran");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not a murmur status"),
        "{}",
        text(&out.stderr)
    );
}

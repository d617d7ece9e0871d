//! `murmur status`: asks a running daemon for its `/status` and prints it.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::time::{Duration, Instant};

use crate::cli::StatusArgs;
use crate::observe::StatusReport;

/// The whole exchange (resolve, connect, send, read) must finish within this.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read; a status document is a few KiB per listed peer.
const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;

/// Why the status could not be fetched.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StatusFetchError {
    /// The address is not `host:port` or does not resolve.
    #[error("cannot resolve `{addr}`: {reason}; give --addr as host:port, e.g. 127.0.0.1:9464")]
    Resolve {
        /// What was given.
        addr: String,
        /// Why it failed.
        reason: String,
    },
    /// Nothing answered at the address.
    #[error(
        "cannot reach a murmur daemon at {addr}: {source}; is it running, and is --addr its \
         metrics/status address?"
    )]
    Connect {
        /// The address tried.
        addr: String,
        /// What the operating system reported.
        source: std::io::Error,
    },
    /// The daemon did not answer within [`TIMEOUT`].
    #[error("the daemon at {addr} did not answer within {TIMEOUT:?}")]
    Timeout {
        /// The address tried.
        addr: String,
    },
    /// The connection failed midway.
    #[error("talking to the daemon at {addr} failed: {source}")]
    Io {
        /// The address tried.
        addr: String,
        /// What the operating system reported.
        source: std::io::Error,
    },
    /// The answer is not an HTTP response, or is larger than any status document.
    #[error("the answer from {addr} is not a murmur status ({what}); is --addr a murmur daemon?")]
    NotStatus {
        /// The address tried.
        addr: String,
        /// What was wrong with it.
        what: String,
    },
    /// The daemon answered with an error status.
    #[error("the daemon at {addr} answered {status}: {body}")]
    Refused {
        /// The address tried.
        addr: String,
        /// The HTTP status line's code.
        status: u16,
        /// The start of its body.
        body: String,
    },
}

/// Runs `murmur status`.
pub(crate) fn run(args: &StatusArgs) -> anyhow::Result<()> {
    let body = fetch_status(&args.addr, TIMEOUT)?;
    let report: StatusReport =
        serde_json::from_slice(&body).map_err(|e| StatusFetchError::NotStatus {
            addr: args.addr.clone(),
            what: format!("bad JSON: {e}"),
        })?;
    let mut stdout = std::io::stdout().lock();
    if args.json {
        stdout.write_all(&body)?;
        writeln!(stdout)?;
    } else {
        stdout.write_all(render(&report).as_bytes())?;
    }
    Ok(())
}

/// `GET /status` from `addr` within `timeout`: the answer's body.
pub(crate) fn fetch_status(addr: &str, timeout: Duration) -> Result<Vec<u8>, StatusFetchError> {
    let deadline = Instant::now() + timeout;
    let named = || addr.to_owned();
    let target: SocketAddr = addr
        .to_socket_addrs()
        .map_err(|e| StatusFetchError::Resolve {
            addr: named(),
            reason: e.to_string(),
        })?
        .next()
        .ok_or_else(|| StatusFetchError::Resolve {
            addr: named(),
            reason: "no address found".to_owned(),
        })?;
    let left = |deadline: Instant| {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| StatusFetchError::Timeout { addr: named() })
    };
    let mut stream = TcpStream::connect_timeout(&target, left(deadline)?).map_err(|source| {
        if source.kind() == std::io::ErrorKind::TimedOut {
            StatusFetchError::Timeout { addr: named() }
        } else {
            StatusFetchError::Connect {
                addr: named(),
                source,
            }
        }
    })?;
    let io = |source: std::io::Error| match source.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
            StatusFetchError::Timeout { addr: named() }
        }
        _ => StatusFetchError::Io {
            addr: named(),
            source,
        },
    };
    stream
        .set_write_timeout(Some(left(deadline)?))
        .map_err(io)?;
    let request = format!("GET /status HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        stream.set_read_timeout(Some(left(deadline)?)).map_err(io)?;
        let n = stream.read(&mut chunk).map_err(io)?;
        if n == 0 {
            break;
        }
        if answer.len() + n > MAX_ANSWER_BYTES {
            return Err(StatusFetchError::NotStatus {
                addr: named(),
                what: format!("over {MAX_ANSWER_BYTES} bytes"),
            });
        }
        answer.extend_from_slice(&chunk[..n]);
    }
    split_answer(addr, &answer)
}

/// The body of a `200` answer; an error for anything else.
fn split_answer(addr: &str, answer: &[u8]) -> Result<Vec<u8>, StatusFetchError> {
    let not_status = |what: &str| StatusFetchError::NotStatus {
        addr: addr.to_owned(),
        what: what.to_owned(),
    };
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| not_status("no complete HTTP head"))?;
    let head = std::str::from_utf8(&answer[..end]).map_err(|_| not_status("head not text"))?;
    let status: u16 = head
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| not_status("no HTTP status line"))?;
    let body = &answer[end + 4..];
    if status != 200 {
        let shown: String = String::from_utf8_lossy(body).chars().take(200).collect();
        return Err(StatusFetchError::Refused {
            addr: addr.to_owned(),
            status,
            body: shown.trim().to_owned(),
        });
    }
    Ok(body.to_vec())
}

/// The report as a few aligned lines for a terminal.
pub(crate) fn render(r: &StatusReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let opt = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.4}"));
    let state = if r.paused { "paused" } else { "training" };
    // Writing to a String cannot fail.
    let _ = writeln!(out, "peer      {}", r.peer_id);
    let _ = writeln!(
        out,
        "swarm     {}   mode {}   codec {}   device {}",
        r.swarm, r.mode, r.codec, r.device
    );
    let _ = writeln!(out, "state     {state}   up {}", duration(r.uptime_s));
    let _ = writeln!(
        out,
        "step      {}   samples {}   loss {}   eval loss {}   samples/s {:.1}",
        r.step,
        r.samples,
        opt(r.loss),
        opt(r.eval_loss),
        r.samples_per_s
    );
    let _ = writeln!(
        out,
        "traffic   sent {}   received {}",
        bytes(r.bytes_sent as f64),
        bytes(r.bytes_received as f64)
    );
    let c = &r.connections;
    let _ = writeln!(
        out,
        "network   reachability {}   connections {} direct, {} hole-punched, {} relayed",
        r.reachability, c.direct, c.hole_punched, c.relayed
    );
    let _ = writeln!(out, "\npeers ({})", r.peers.len());
    if !r.peers.is_empty() {
        let _ = writeln!(
            out,
            "  {:<54} {:>10} {:>10} {:>12} {:>12} {:>8}",
            "PEER", "STEP", "SAMPLES/S", "UP", "DOWN", "HEARD"
        );
    }
    for p in &r.peers {
        let up = p
            .measured_upload_bytes_per_s
            .unwrap_or(p.reported_upload_bytes_per_s as f64);
        let down = p
            .measured_download_bytes_per_s
            .unwrap_or(p.reported_download_bytes_per_s as f64);
        let _ = writeln!(
            out,
            "  {:<54} {:>10} {:>10.1} {:>12} {:>12} {:>8}",
            p.peer_id,
            p.last_heartbeat_step,
            p.samples_per_s,
            format!("{}/s", bytes(up)),
            format!("{}/s", bytes(down)),
            format!("{} ago", duration(p.heartbeat_age_s)),
        );
    }
    if !r.bootstrap.is_empty() {
        let _ = writeln!(out, "\nbootstrap ({})", r.bootstrap.len());
    }
    for b in &r.bootstrap {
        let result = match (&b.reached, &b.error) {
            (Some(peer), _) => format!("reached {peer}"),
            (None, Some(error)) => {
                format!("FAILED {} times in a row: {error}", b.failures_in_a_row)
            }
            (None, None) => "dialing".to_owned(),
        };
        let _ = writeln!(out, "  {}  {result}", b.address);
    }
    let _ = writeln!(out, "\nlast rounds ({}, newest first)", r.last_rounds.len());
    for round in &r.last_rounds {
        let with = match &round.out_peer {
            Some(peer) => format!("pushed to {peer}"),
            None => format!("group of {}", round.group_size),
        };
        let _ = writeln!(
            out,
            "  {:<10} {:<9} {:>9.3}s  coverage {:>5.1}%  {with}  ({} ago)",
            round.mode,
            round.outcome,
            round.duration_s,
            round.coverage * 100.0,
            duration(round.age_s),
        );
    }
    out
}

fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn duration(seconds: f64) -> String {
    // Float to integer casts saturate; a negative or NaN age reads as 0 s.
    let s = seconds.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::{BootstrapStatus, ConnectionsStatus, PeerStatus, RoundStatus};

    fn report() -> StatusReport {
        StatusReport {
            peer_id: "12D3KooWself".to_owned(),
            swarm: "tiny-lm".to_owned(),
            mode: "sgp".to_owned(),
            codec: "int8".to_owned(),
            device: "cuda:0".to_owned(),
            step: 1200,
            samples: 38_400,
            loss: Some(2.25),
            eval_loss: None,
            samples_per_s: 512.0,
            paused: true,
            uptime_s: 3725.0,
            bytes_sent: 3 << 20,
            bytes_received: 512,
            peers: vec![PeerStatus {
                peer_id: "12D3KooWother".to_owned(),
                last_heartbeat_step: 1199,
                heartbeat_age_s: 1.5,
                samples_per_s: 480.0,
                reported_upload_bytes_per_s: 1 << 20,
                reported_download_bytes_per_s: 2 << 20,
                measured_upload_bytes_per_s: Some(5.0 * 1024.0 * 1024.0),
                measured_download_bytes_per_s: None,
            }],
            bootstrap: vec![BootstrapStatus {
                address: "/ip4/192.0.2.1/udp/7600/quic-v1/p2p/12D3KooWboot".to_owned(),
                attempts: 3,
                failures_in_a_row: 3,
                reached: None,
                error: Some("handshake timed out".to_owned()),
            }],
            reachability: "private".to_owned(),
            connections: ConnectionsStatus {
                direct: 2,
                hole_punched: 1,
                relayed: 1,
            },
            last_rounds: vec![RoundStatus {
                mode: "sgp".to_owned(),
                outcome: "complete".to_owned(),
                duration_s: 0.125,
                coverage: 1.0,
                group_size: 2,
                out_peer: Some("12D3KooWother".to_owned()),
                stragglers_dropped: 0,
                parts_timed_out: 0,
                age_s: 75.0,
            }],
        }
    }

    #[test]
    fn the_rendering_shows_what_an_operator_looks_for() {
        let text = render(&report());
        for expected in [
            "peer      12D3KooWself",
            "mode sgp   codec int8   device cuda:0",
            "state     paused   up 1h02m",
            "step      1200   samples 38400   loss 2.2500   eval loss -",
            "sent 3.0 MiB   received 512 B",
            "peers (1)",
            "12D3KooWother",
            "5.0 MiB/s",
            "2.0 MiB/s",
            "1s ago",
            "pushed to 12D3KooWother",
            "coverage 100.0%",
            "(1m15s ago)",
            "bootstrap (1)",
            "network   reachability private   connections 2 direct, 1 hole-punched, 1 relayed",
            "/ip4/192.0.2.1/udp/7600/quic-v1/p2p/12D3KooWboot  FAILED 3 times in a row: handshake timed out",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }

    #[test]
    fn only_a_200_answer_yields_a_body() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(split_answer("a", ok).expect("a body"), b"{}");
        let refused = b"HTTP/1.1 404 Not Found\r\n\r\nno such endpoint\n";
        let err = split_answer("a", refused).expect_err("404");
        assert!(
            matches!(err, StatusFetchError::Refused { status: 404, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("no such endpoint"), "{err}");
        for junk in [&b"SSH-2.0-OpenSSH\r\n"[..], b"HTTP/1.1 2\r\n\r\n", b""] {
            let err = split_answer("a", junk).expect_err("junk");
            assert!(matches!(err, StatusFetchError::NotStatus { .. }), "{err}");
        }
    }

    #[test]
    fn a_bad_address_is_named_in_the_error() {
        let err = fetch_status("not an address", Duration::from_secs(1)).expect_err("bad addr");
        assert!(matches!(err, StatusFetchError::Resolve { .. }), "{err}");
        assert!(err.to_string().contains("--addr"), "{err}");
    }

    #[test]
    fn the_default_address_is_the_daemons_default_port_on_loopback() {
        use clap::Parser as _;
        let cli = crate::cli::Cli::try_parse_from(["murmur", "status"]).expect("parses");
        let crate::cli::Command::Status(args) = cli.command else {
            panic!("not the status command");
        };
        let expected = format!("127.0.0.1:{}", crate::observe::DEFAULT_PORT);
        assert_eq!((args.addr.as_str(), args.json), (expected.as_str(), false));
    }

    #[test]
    fn sizes_and_durations_read_naturally() {
        assert_eq!(bytes(0.0), "0 B");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(bytes(5.0 * 1024.0 * 1024.0 * 1024.0), "5.0 GiB");
        assert_eq!(duration(59.9), "59s");
        assert_eq!(duration(61.0), "1m01s");
        assert_eq!(duration(f64::NAN), "0s");
        assert_eq!(duration(7322.0), "2h02m");
    }
}

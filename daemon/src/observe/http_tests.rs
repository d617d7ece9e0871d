use std::io::Write as _;
use std::process::{Command, Stdio};

use murmur_protocol::message::AveragingMode;
use tokio::sync::oneshot;

use super::*;
use crate::observe::network::tests::{busy_net, peer};
use crate::observe::{MetricsOptions, RoundOutcome, RoundSummary, StatusIdentity, StatusReport};

/// Every test's own wait, well beyond what a loopback request needs.
const PATIENCE: Duration = Duration::from_secs(10);

struct Running {
    server: ObserveServer,
    board: StatusBoard,
    stop: Option<oneshot::Sender<()>>,
}

async fn start(limits: HttpLimits) -> Running {
    let metrics = Metrics::new(MetricsOptions {
        gpu: true,
        ..MetricsOptions::default()
    })
    .expect("registers");
    metrics
        .network
        .attach(Arc::new(busy_net()))
        .expect("attach");
    metrics.training.record_step(3, 96, 2.5, 0.01);
    let round = RoundSummary {
        mode: AveragingMode::Sgp,
        outcome: RoundOutcome::Complete,
        duration: Duration::from_millis(40),
        coverage: 1.0,
        group_size: 2,
        out_peer: Some(peer(4)),
        stragglers_dropped: 0,
        parts_timed_out: 0,
    };
    metrics.averaging.record_round(&round);
    metrics
        .network
        .record_sent(None, murmur_protocol::frame::FrameKind::Heartbeat, 90);
    metrics.gpu.record_kernel_time("encode", 0.5);
    let board = StatusBoard::new(StatusIdentity {
        peer_id: peer(0).to_string(),
        swarm: "tiny-lm".to_owned(),
        mode: "sgp".to_owned(),
        codec: "f16".to_owned(),
        device: "cpu".to_owned(),
    });
    board.record_step(3, 96, 2.5, 40.0);
    board.record_round(&round);
    metrics.set_build_info(&board.identity());
    let (stop, stopped) = oneshot::channel::<()>();
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let shutdown = async {
        let _ = stopped.await;
    };
    let server = serve(addr, limits, None, metrics, board.clone(), shutdown)
        .await
        .expect("binds");
    Running {
        server,
        board,
        stop: Some(stop),
    }
}

/// An answer: status code, head text, body.
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

/// Sends `raw` on a fresh connection and reads the whole answer.
async fn exchange(addr: SocketAddr, raw: &[u8]) -> Answer {
    let work = async {
        let mut stream = TcpStream::connect(addr).await.expect("connects");
        stream.write_all(raw).await.expect("sends");
        let mut bytes = Vec::new();
        stream.read_to_end(&mut bytes).await.expect("reads");
        bytes
    };
    let bytes = tokio::time::timeout(PATIENCE, work)
        .await
        .expect("answered in time");
    parse_answer(&bytes)
}

fn parse_answer(bytes: &[u8]) -> Answer {
    let end = find_head_end(bytes).expect("a complete head");
    let head = String::from_utf8(bytes[..end].to_vec()).expect("text head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    Answer {
        status,
        head,
        body: bytes[end + 4..].to_vec(),
    }
}

async fn get(addr: SocketAddr, path: &str) -> Answer {
    let raw = format!("GET {path} HTTP/1.1\r\nHost: murmur\r\n\r\n");
    exchange(addr, raw.as_bytes()).await
}

async fn post(addr: SocketAddr, path: &str) -> Answer {
    let raw = format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n");
    exchange(addr, raw.as_bytes()).await
}

#[tokio::test]
async fn healthz_answers_ok_and_closes() {
    let running = start(HttpLimits::default()).await;
    let answer = get(running.server.local_addr(), "/healthz").await;
    assert_eq!(answer.status, 200, "{}", answer.head);
    assert_eq!(answer.body, b"ok");
    assert!(
        answer.head.contains("\r\nConnection: close"),
        "{}",
        answer.head
    );
    assert!(
        answer.head.contains("\r\nContent-Length: 2"),
        "{}",
        answer.head
    );
}

/// Checks the Prometheus text format line by line: every sample belongs to a family
/// announced by `# HELP` and `# TYPE`, names and labels are well formed, values are numbers.
fn check_exposition(text: &str) -> Result<usize, String> {
    let mut typed: std::collections::HashMap<&str, &str> = Default::default();
    let mut helped = std::collections::HashSet::new();
    let mut samples = 0;
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
            && !n.as_bytes()[0].is_ascii_digit()
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            if !helped.insert(name) {
                return Err(format!("HELP twice: {line}"));
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            if !["counter", "gauge", "histogram"].contains(&kind) || !helped.contains(name) {
                return Err(format!("bad or unhelped TYPE: {line}"));
            }
            typed.insert(name, kind);
        } else {
            let (series, value) = line.rsplit_once(' ').ok_or(format!("no value: {line}"))?;
            let value_ok = value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value);
            let name = series.split('{').next().unwrap_or_default();
            if !value_ok || !name_ok(name) {
                return Err(format!("bad sample: {line}"));
            }
            if let Some(labels) = series.strip_prefix(name).filter(|l| !l.is_empty()) {
                let inner = labels
                    .strip_prefix('{')
                    .and_then(|l| l.strip_suffix('}'))
                    .ok_or(format!("bad labels: {line}"))?;
                for pair in inner.split("\",").filter(|p| !p.is_empty()) {
                    let (label, quoted) =
                        pair.split_once("=\"").ok_or(format!("bad label: {line}"))?;
                    if !name_ok(label) || quoted.contains('"') && !quoted.ends_with('"') {
                        return Err(format!("bad label: {line}"));
                    }
                }
            }
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| typed.get(f) == Some(&"histogram"))
                })
                .unwrap_or(name);
            if !typed.contains_key(family) {
                return Err(format!("sample of an undeclared family: {line}"));
            }
            if !family.starts_with("murmur_") {
                return Err(format!("not a murmur metric: {line}"));
            }
            samples += 1;
        }
    }
    Ok(samples)
}

#[tokio::test]
async fn metrics_are_valid_prometheus_text() {
    let running = start(HttpLimits::default()).await;
    let answer = get(running.server.local_addr(), "/metrics").await;
    assert_eq!(answer.status, 200, "{}", answer.head);
    assert!(
        answer
            .head
            .contains("Content-Type: text/plain; version=0.0.4"),
        "{}",
        answer.head
    );
    let text = String::from_utf8(answer.body).expect("utf-8");
    let samples = check_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(samples > 50, "only {samples} samples:\n{text}");
    for family in [
        "murmur_training_step",
        "murmur_averaging_round_duration_seconds",
        "murmur_net_peer_throughput_bytes_per_second",
        "murmur_net_message_bytes_sent_total",
        "murmur_process_cpu_seconds_total",
        "murmur_gpu_kernel_seconds_total",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "no {family} in\n{text}"
        );
    }

    // The Prometheus project's own linter, where installed (scripts/setup.sh installs it).
    let promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut promtool) = promtool else {
        eprintln!("promtool not installed; checked the format without it");
        return;
    };
    promtool
        .stdin
        .take()
        .expect("piped")
        .write_all(text.as_bytes())
        .expect("promtool reads");
    let out = promtool.wait_with_output().expect("promtool runs");
    let problems = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && problems.trim().is_empty(),
        "promtool: {problems}"
    );
}

#[test]
fn the_format_check_catches_what_it_should() {
    let good = "# HELP murmur_x X.\n# TYPE murmur_x counter\nmurmur_x{a=\"1\"} 2\n";
    assert_eq!(check_exposition(good), Ok(1));
    let unhelped = "# TYPE murmur_x counter\nmurmur_x 2\n";
    assert!(check_exposition(unhelped).is_err());
    let undeclared = "murmur_y 1\n";
    assert!(check_exposition(undeclared).is_err());
    let not_a_number = "# HELP murmur_x X.\n# TYPE murmur_x gauge\nmurmur_x many\n";
    assert!(check_exposition(not_a_number).is_err());
    let foreign = "# HELP go_x X.\n# TYPE go_x gauge\ngo_x 1\n";
    assert!(check_exposition(foreign).is_err());
}

#[tokio::test]
async fn status_json_round_trips_and_matches_the_board() {
    let running = start(HttpLimits::default()).await;
    let answer = get(running.server.local_addr(), "/status").await;
    assert_eq!(answer.status, 200, "{}", answer.head);
    assert!(
        answer.head.contains("Content-Type: application/json"),
        "{}",
        answer.head
    );
    let report: StatusReport = serde_json::from_slice(&answer.body).expect("a status report");
    let again: StatusReport =
        serde_json::from_str(&serde_json::to_string(&report).expect("serializes")).expect("parses");
    assert_eq!(again, report);
    assert_eq!(report.peer_id, peer(0).to_string());
    assert_eq!(
        (report.swarm.as_str(), report.mode.as_str()),
        ("tiny-lm", "sgp")
    );
    assert_eq!(report.device, "cpu");
    assert_eq!(
        (report.step, report.samples, report.loss),
        (3, 96, Some(2.5))
    );
    // From the attached network layer.
    assert_eq!((report.bytes_sent, report.bytes_received), (10_000, 20_000));
    assert_eq!(report.last_rounds.len(), 1);
    assert_eq!(report.last_rounds[0].out_peer, Some(peer(4).to_string()));
}

#[tokio::test]
async fn pause_and_resume_flip_the_flag_the_run_loop_reads() {
    let running = start(HttpLimits::default()).await;
    let addr = running.server.local_addr();
    let answer = post(addr, "/pause").await;
    assert_eq!(
        (answer.status, answer.body.as_slice()),
        (200, &b"{\"paused\":true}"[..])
    );
    assert!(running.board.is_paused());
    let status: StatusReport =
        serde_json::from_slice(&get(addr, "/status").await.body).expect("json");
    assert!(status.paused);
    let answer = post(addr, "/resume").await;
    assert_eq!(
        (answer.status, answer.body.as_slice()),
        (200, &b"{\"paused\":false}"[..])
    );
    assert!(!running.board.is_paused());
    // A body is read and ignored.
    let raw = b"POST /pause HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
    assert_eq!(exchange(addr, raw).await.status, 200);
    assert!(running.board.is_paused());
}

#[tokio::test]
async fn a_foreign_host_origin_or_token_gets_403_and_changes_nothing() {
    let running = start(HttpLimits::default()).await;
    let addr = running.server.local_addr();
    for headers in [
        "Host: rebound.example:9464\r\n".to_owned(),
        format!("Host: {addr}\r\nOrigin: http://evil.example\r\n"),
        "Origin: null\r\n".to_owned(),
        "Authorization: Bearer not-the-token-at-all\r\n".to_owned(),
    ] {
        let raw = format!("POST /pause HTTP/1.1\r\n{headers}Content-Length: 0\r\n\r\n");
        let answer = exchange(addr, raw.as_bytes()).await;
        assert_eq!(answer.status, 403, "{headers}: {}", answer.head);
        assert!(!running.board.is_paused(), "{headers}: paused anyway");
    }
    // This daemon's own address passes.
    let raw = format!("POST /pause HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\n\r\n");
    assert_eq!(exchange(addr, raw.as_bytes()).await.status, 200);
    assert!(running.board.is_paused());
}

#[tokio::test]
async fn metrics_show_the_paused_flag_and_what_the_daemon_runs() {
    let running = start(HttpLimits::default()).await;
    let addr = running.server.local_addr();
    let page = |answer: Answer| String::from_utf8(answer.body).expect("utf-8");
    let before = page(get(addr, "/metrics").await);
    assert!(before.contains("\nmurmur_paused 0\n"), "{before}");
    let info = format!(
        "\nmurmur_build_info{{codec=\"f16\",device=\"cpu\",mode=\"sgp\",peer=\"{}\",\
         swarm=\"tiny-lm\",version=\"{}\"}} 1\n",
        peer(0),
        env!("CARGO_PKG_VERSION")
    );
    assert!(before.contains(&info), "missing {info:?} in\n{before}");
    post(addr, "/pause").await;
    let paused = page(get(addr, "/metrics").await);
    assert!(paused.contains("\nmurmur_paused 1\n"), "{paused}");
    // SIGUSR1 and SIGUSR2 set the same flag on the board.
    running.board.set_paused(false);
    let resumed = page(get(addr, "/metrics").await);
    assert!(resumed.contains("\nmurmur_paused 0\n"), "{resumed}");
}

#[tokio::test]
async fn wrong_methods_unknown_paths_and_bad_requests_are_answered_and_survived() {
    let running = start(HttpLimits::default()).await;
    let addr = running.server.local_addr();
    let answer = get(addr, "/pause").await;
    assert_eq!(answer.status, 405);
    assert!(answer.head.contains("\r\nAllow: POST"), "{}", answer.head);
    let answer = post(addr, "/metrics").await;
    assert_eq!(answer.status, 405);
    assert!(
        answer.head.contains("\r\nAllow: GET, HEAD"),
        "{}",
        answer.head
    );
    assert_eq!(get(addr, "/nope").await.status, 404);
    assert_eq!(exchange(addr, b"HELLO\r\n\r\n").await.status, 400);
    assert_eq!(exchange(addr, b"GET / HTTP/9\r\n\r\n").await.status, 400);
    let chunked = b"POST /pause HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    assert_eq!(exchange(addr, chunked).await.status, 400);
    let huge_body = b"POST /pause HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n";
    assert_eq!(exchange(addr, huge_body).await.status, 413);
    assert!(
        !running.board.is_paused(),
        "refused requests change nothing"
    );
    let head = exchange(addr, b"HEAD /healthz HTTP/1.1\r\n\r\n").await;
    assert_eq!((head.status, head.body.len()), (200, 0));
    assert!(head.head.contains("Content-Length: 2"), "{}", head.head);
    assert_eq!(get(addr, "/healthz").await.status, 200);
}

#[tokio::test]
async fn an_oversized_head_gets_400_and_the_server_keeps_serving() {
    let running = start(HttpLimits::default()).await;
    let addr = running.server.local_addr();
    let mut raw = b"GET /metrics HTTP/1.1\r\nX-Filler: ".to_vec();
    raw.resize(HttpLimits::default().max_head_bytes + 1024, b'a');
    raw.extend_from_slice(b"\r\n\r\n");
    let answer = exchange(addr, &raw).await;
    assert_eq!(answer.status, 400, "{}", answer.head);
    assert!(String::from_utf8_lossy(&answer.body).contains("8192"));
    assert_eq!(get(addr, "/healthz").await.status, 200);
}

#[tokio::test]
async fn slow_clients_cannot_hold_the_endpoint_past_the_read_timeout() {
    let limits = HttpLimits {
        read_timeout: Duration::from_millis(800),
        ..HttpLimits::default()
    };
    let running = start(limits).await;
    let addr = running.server.local_addr();
    // One more slow client than there are slots: each sends half a request and stalls.
    let mut slow = Vec::new();
    for _ in 0..=limits.max_connections {
        let mut stream = TcpStream::connect(addr).await.expect("connects");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .expect("sends");
        slow.push(stream);
    }
    // Let the server take up every slot before the fresh request queues behind them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let answer = get(addr, "/healthz").await;
    let waited = started.elapsed();
    assert_eq!(answer.status, 200);
    // Served only once the slow ones were cut (so at most `max_connections` at once) …
    assert!(
        waited >= limits.read_timeout / 2,
        "served after {waited:?}: slots not limited"
    );
    // … and not much later than that.
    let bound = limits.read_timeout + Duration::from_secs(2);
    assert!(waited <= bound, "served after {waited:?}, bound {bound:?}");
    // A cut slow client is told why.
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(PATIENCE, slow[0].read_to_end(&mut bytes)).await;
    assert!(matches!(read, Ok(Ok(_))), "{read:?}");
    assert_eq!(parse_answer(&bytes).status, 408);
}

#[tokio::test]
async fn shutdown_stops_the_server_and_frees_the_port() {
    let mut running = start(HttpLimits::default()).await;
    let addr = running.server.local_addr();
    // A connection left open must not keep the server from stopping.
    let _idle = TcpStream::connect(addr).await.expect("connects");
    assert_eq!(get(addr, "/healthz").await.status, 200);
    if let Some(stop) = running.stop.take() {
        let _ = stop.send(());
    }
    tokio::time::timeout(PATIENCE, running.server.stopped())
        .await
        .expect("stops in time");
    assert!(TcpStream::connect(addr).await.is_err(), "still listening");
}

#[tokio::test]
async fn an_address_in_use_is_a_clear_error() {
    let taken = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = taken.local_addr().expect("an address");
    let metrics = Metrics::disabled();
    let board = StatusBoard::new(StatusIdentity {
        peer_id: String::new(),
        swarm: String::new(),
        mode: String::new(),
        codec: String::new(),
        device: String::new(),
    });
    let result = serve(
        addr,
        HttpLimits::default(),
        None,
        metrics,
        board,
        std::future::pending(),
    )
    .await;
    let Err(err @ ObserveError::Bind { .. }) = result else {
        panic!("bound a taken address");
    };
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
}

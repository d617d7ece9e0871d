//! Memory a member can pin in a real `murmur run` peer with frames it never finishes: a
//! member in the test process opens every tensor stream it may and sends each a full-size
//! frame but its last byte. The peer's resident memory grows by at most its
//! `net.max_partial_frame_bytes_per_peer` budget plus one frame, the streams' read buffers
//! and the QUIC windows; the streams over the budget close at once, the others at
//! `net.frame_timeout_ms`.

#[path = "support/member.rs"]
mod member;
mod run_support;
#[path = "support/swarm.rs"]
mod swarm;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use member::Member;
use murmur_protocol::frame::{FrameFlags, FrameKind, HEADER_LEN, encode_header};
use run_support::{PeerSettings, Swarm};
use swarm::{exclusive, http_get};

/// The frame limit (the default).
const MAX_FRAME: usize = 16 << 20;
/// The peer's budget: two full frames, headers included.
const BUDGET: u64 = 2 * (MAX_FRAME + HEADER_LEN) as u64;
/// The peer's `net.frame_timeout_ms`.
const FRAME_TIMEOUT: Duration = Duration::from_secs(3);
/// Streams a member may open towards a peer (the default).
const STREAMS: usize = 8;
/// The peer's QUIC connection window (a quarter of it per stream), small so that QUIC's own
/// buffers stay small.
const WINDOW: u64 = 1 << 20;

/// The resident set of process `pid`, from `/proc/<pid>/status`.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Streams the peer closed at the frame deadline, and over the budget.
fn closed(addr: SocketAddr) -> [f64; 2] {
    let page = match http_get(addr, "/metrics") {
        Ok((200, body)) => body,
        other => panic!("GET /metrics: {other:?}"),
    };
    [
        "murmur_net_tensor_frames_timed_out_total",
        "murmur_net_tensor_streams_over_partial_budget_total",
    ]
    .map(|series| {
        page.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    })
}

#[test]
fn a_member_trickling_frames_pins_at_most_the_budget_of_a_running_peer_until_the_deadline() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let dir = swarm.add_peer("victim");
    dir.write_config(&PeerSettings {
        metrics: true,
        net_keys: vec![
            ("max_partial_frame_bytes_per_peer", BUDGET),
            ("frame_timeout_ms", 3_000),
            ("tensor_read_timeout_ms", 60_000),
            ("quic_stream_receive_window", WINDOW / 4),
            ("quic_connection_receive_window", WINDOW),
        ],
        ..PeerSettings::default()
    });
    let mut victim = dir.start();
    let ready = victim.ready();
    let metrics: SocketAddr = ready
        .str("metrics_addr")
        .parse()
        .expect("a metrics address");
    let listen = ready.json["listen"][0]
        .as_str()
        .expect("a listen address")
        .to_owned();
    let member = Member::join(&swarm, &dir, 78, &listen);
    member.admitted_by(&dir.peer_id, Duration::from_secs(20));
    let victim_id = dir.peer_id.parse().expect("a peer id");

    let mut frame = vec![1u8; MAX_FRAME + HEADER_LEN - 1];
    let mut header = [0u8; HEADER_LEN];
    encode_header(
        FrameKind::TensorPartChunk,
        FrameFlags::EMPTY,
        MAX_FRAME,
        &mut header,
    )
    .expect("header");
    frame[..HEADER_LEN].copy_from_slice(&header);
    let frame = Arc::new(frame);
    // The peer trains meanwhile; its memory settles first.
    std::thread::sleep(Duration::from_secs(2));
    let baseline = rss_bytes(victim.pid());
    let started = Instant::now();
    let mut writers = Vec::new();
    for _ in 0..STREAMS {
        let mut writer = member
            .runtime
            .block_on(member.handle.open_tensor_stream(&victim_id))
            .expect("a stream opens");
        let frame = Arc::clone(&frame);
        writers.push(member.runtime.spawn(async move {
            // All but the last byte; the write fails once the peer closes the stream.
            let _ = writer.send_encoded(&frame).await;
            writer
        }));
    }

    let mut peak = baseline;
    let deadline = started + FRAME_TIMEOUT + Duration::from_secs(5);
    let mut counts = closed(metrics);
    while counts[0] + counts[1] < STREAMS as f64 && Instant::now() < deadline {
        peak = peak.max(rss_bytes(victim.pid()));
        std::thread::sleep(Duration::from_millis(20));
        counts = closed(metrics);
    }
    let grown = peak.saturating_sub(baseline);
    let bound =
        BUDGET + MAX_FRAME as u64 + STREAMS as u64 * 256 * 1024 + 2 * WINDOW + 8 * (1 << 20);
    eprintln!(
        "partial frames against murmur run: RSS grew {} MiB (bound {} MiB); {} streams over \
         the budget, {} at the frame deadline, after {:?}",
        grown >> 20,
        bound >> 20,
        counts[1],
        counts[0],
        started.elapsed(),
    );
    assert_eq!(
        counts[0] + counts[1],
        STREAMS as f64,
        "not every trickling stream was closed within {:?}: {counts:?}",
        FRAME_TIMEOUT + Duration::from_secs(5)
    );
    assert!(
        counts[0] >= 1.0,
        "no stream reached its frame deadline: {counts:?}"
    );
    assert!(
        grown <= bound,
        "the peer's memory grew by {grown} bytes, over the bound {bound}"
    );
    for writer in writers {
        writer.abort();
    }
    member.shutdown();
}

//! Memory a member can pin in a real `murmur run` peer with frames it never finishes: a
//! member in the test process opens every tensor stream it may and sends each a full-size
//! frame but its last byte. The peer's resident memory grows by at most its
//! `net.max_partial_frame_bytes_per_peer` budget plus one frame, the streams' read buffers
//! and the QUIC windows; the streams over the budget close at once, the others at
//! `net.frame_timeout_ms`.

#[path = "support/member.rs"]
mod member;
#[path = "../../gossip/tests/net_support/partial_frames.rs"]
mod partial_frames;
mod run_support;
#[path = "support/swarm.rs"]
mod swarm;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use member::Member;
use partial_frames::{
    BUDGET, FRAME_TIMEOUT, RSS_BOUND, STREAMS, WINDOW, all_but_the_last_byte, rss_bytes,
};
use run_support::{PeerSettings, Swarm};
use swarm::{exclusive, metric, scrape};

/// Streams the peer closed at the frame deadline, and over the budget.
fn closed(addr: SocketAddr) -> [f64; 2] {
    let page = scrape(addr);
    [
        "murmur_net_tensor_frames_timed_out_total",
        "murmur_net_tensor_streams_over_partial_budget_total",
    ]
    .map(|series| metric(&page, series))
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
    let pid_of = |peer: &run_support::RunningPeer| peer.pid().to_string();
    let mut victim = dir.start();
    let ready = victim.ready();
    let (metrics, listen) = (ready.metrics_addr(), ready.listen());
    let member = Member::join(&swarm, &dir, 78, &listen);
    member.admitted_by(&dir.peer_id, Duration::from_secs(20));
    let victim_id = dir.peer_id.parse().expect("a peer id");

    let frame = Arc::new(all_but_the_last_byte());
    // The peer trains meanwhile; its memory settles first.
    std::thread::sleep(Duration::from_secs(2));
    let baseline = rss_bytes(&pid_of(&victim));
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
        peak = peak.max(rss_bytes(&pid_of(&victim)));
        std::thread::sleep(Duration::from_millis(20));
        counts = closed(metrics);
    }
    let grown = peak.saturating_sub(baseline);
    let bound = RSS_BOUND;
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

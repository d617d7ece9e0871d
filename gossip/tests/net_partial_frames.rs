//! Memory a member can pin with frames it never finishes: bounded by
//! `net.max_partial_frame_bytes_per_peer`, and for no longer than `net.frame_timeout_ms`.

#[path = "net_support/partial_frames.rs"]
mod partial_frames;
#[path = "net_support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use murmur_gossip::net::{self, NetHandle, NetMetricsSnapshot};
use partial_frames::{
    BUDGET, FRAME_TIMEOUT, RSS_BOUND, STREAMS, WINDOW, all_but_the_last_byte, rss_bytes,
};
use support::{Authority, InviteKind, connect, eventually};

fn snapshot(handle: &NetHandle) -> NetMetricsSnapshot {
    handle.metrics().snapshot()
}

/// A member opens every stream it may, sends each a full-size frame but its last byte, and
/// then trickles nothing more. The victim's resident memory grows by at most the budget,
/// one decoder growth step (a frame), the streams' read buffers and the QUIC windows, far
/// below the 128 MiB the frames would pin unbounded; the streams over the budget close at
/// once and the others at the frame deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_trickling_frames_pins_at_most_the_budget_until_the_frame_deadline() {
    let authority = Authority::new();
    let (mut config, identity) = authority.config(1, InviteKind::Valid);
    config.max_partial_frame_bytes_per_peer = BUDGET;
    config.frame_timeout_ms = u64::try_from(FRAME_TIMEOUT.as_millis()).expect("small");
    config.tensor_read_timeout_ms = 60_000;
    config.quic_stream_receive_window = u32::try_from(WINDOW / 4).expect("small");
    config.quic_connection_receive_window = u32::try_from(WINDOW).expect("small");
    let (victim, mut victim_in) = net::spawn(&config, identity).await.expect("network starts");
    let (member, _member_in) = authority.spawn(2, InviteKind::Valid).await;
    connect(&member, &victim).await;
    let victim_id = victim.local_peer_id();
    eventually(Duration::from_secs(10), "the member is admitted", || {
        let member = member.clone();
        async move {
            member
                .peers()
                .await
                .unwrap_or_default()
                .contains(&victim_id)
        }
    })
    .await;

    // The victim reads every stream it is given, as the run loop does.
    let reading = tokio::spawn(async move {
        let mut readers = Vec::new();
        while let Some(mut reader) = victim_in.tensor_streams.recv().await {
            readers.push(tokio::spawn(async move {
                while let Ok(Some(())) = reader.recv(|_| ()).await {}
            }));
        }
        readers
    });

    // One buffer, allocated and touched before the baseline.
    let frame = std::sync::Arc::new(all_but_the_last_byte());
    let baseline = rss_bytes("self");
    let started = Instant::now();

    let mut writers = Vec::new();
    for _ in 0..STREAMS {
        let mut writer = member
            .open_tensor_stream(&victim_id)
            .await
            .expect("a stream opens");
        let frame = std::sync::Arc::clone(&frame);
        writers.push(tokio::spawn(async move {
            // All but the last byte; the write fails once the victim closes the stream.
            let _ = writer.send_encoded(&frame).await;
            writer
        }));
    }

    // Watch the victim's memory until every stream is closed, bounded.
    let mut peak = baseline;
    let deadline = started + FRAME_TIMEOUT + Duration::from_secs(5);
    let closed =
        |s: &NetMetricsSnapshot| s.tensor_frames_timed_out + s.tensor_streams_over_partial_budget;
    while closed(&snapshot(&victim)) < STREAMS as u64 && Instant::now() < deadline {
        peak = peak.max(rss_bytes("self"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let closed_after = started.elapsed();
    let metrics = snapshot(&victim);
    let grown = peak.saturating_sub(baseline);
    let bound = RSS_BOUND;
    eprintln!(
        "partial frames: RSS grew {} MiB (bound {} MiB); {} streams over the budget, {} at the frame deadline, all closed after {closed_after:?}",
        grown >> 20,
        bound >> 20,
        metrics.tensor_streams_over_partial_budget,
        metrics.tensor_frames_timed_out,
    );
    assert_eq!(
        closed(&metrics),
        STREAMS as u64,
        "not every trickling stream was closed within {:?}: {metrics:?}",
        FRAME_TIMEOUT + Duration::from_secs(5)
    );
    assert!(
        metrics.tensor_frames_timed_out >= 1,
        "no stream reached its frame deadline: {metrics:?}"
    );
    assert!(
        grown <= bound,
        "the victim's memory grew by {grown} bytes, over the bound {bound}"
    );
    drop(writers);
    reading.abort();
    for handle in [victim, member] {
        handle.shutdown().await.expect("shutdown");
    }
}

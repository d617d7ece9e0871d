//! The attack of the pinned-memory tests: a member sends every tensor stream it may open a
//! full-size frame but its last byte. Shared by the in-process test (`net_partial_frames`)
//! and the one against a real `murmur run` peer (`daemon/tests/run_partial_frames.rs`).

#![allow(dead_code)]

use std::time::Duration;

use murmur_protocol::frame::{FrameFlags, FrameKind, HEADER_LEN, encode_header};

/// The frame limit (the default).
pub(crate) const MAX_FRAME: usize = 16 << 20;
/// The victim's `net.max_partial_frame_bytes_per_peer`: two full frames, headers included.
pub(crate) const BUDGET: u64 = 2 * (MAX_FRAME + HEADER_LEN) as u64;
/// The victim's `net.frame_timeout_ms`.
pub(crate) const FRAME_TIMEOUT: Duration = Duration::from_secs(3);
/// Streams a member may open towards a peer (the default).
pub(crate) const STREAMS: usize = 8;
/// The victim's QUIC connection window (a quarter of it per stream), small so that QUIC's
/// own buffers stay small.
pub(crate) const WINDOW: u64 = 1 << 20;

/// How much the victim's resident memory may grow: the budget, one decoder growth step (a
/// frame), the streams' read buffers and the QUIC windows, plus 8 MiB of slack — far below
/// the 128 MiB the frames would pin unbounded.
pub(crate) const RSS_BOUND: u64 =
    BUDGET + MAX_FRAME as u64 + STREAMS as u64 * 256 * 1024 + 2 * WINDOW + 8 * (1 << 20);

/// A frame header announcing a full-size tensor chunk, followed by all of its payload but
/// the last byte.
pub(crate) fn all_but_the_last_byte() -> Vec<u8> {
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
    frame
}

/// The resident set of process `pid` (`"self"` for this one), from `/proc/<pid>/status`.
pub(crate) fn rss_bytes(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

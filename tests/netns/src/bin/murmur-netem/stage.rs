//! The delay stage's loop: TUN device in, [`DelayLine`], TUN device out.

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use anyhow::Context;
use murmur_netns::{DelayLine, LinkImpairment};

use crate::tun::{TunDevice, catch_termination, terminated};

/// Largest packet a slot holds: the harness's links have a 1500-byte MTU, and the TUN device
/// has no offloads, so the kernel never hands it more.
const SLOT_BYTES: usize = 2048;
/// The longest the loop sleeps with nothing due, so a missed signal is noticed soon.
const IDLE_WAKE: Duration = Duration::from_millis(50);
/// The most packets read per wake-up, so releases due meanwhile are not held up.
const READ_BATCH: usize = 256;

/// What `murmur-netem delay` was asked to do.
pub(crate) struct StageSettings {
    /// Name of the TUN device.
    pub(crate) tun: String,
    /// Seed of the loss draws.
    pub(crate) seed: u64,
    /// The most packets held at once.
    pub(crate) queue_packets: usize,
    /// The links' delays and losses.
    pub(crate) links: Vec<LinkImpairment>,
}

/// Runs until SIGTERM or SIGINT, then prints the counters.
pub(crate) fn run(settings: StageSettings) -> anyhow::Result<()> {
    catch_termination()?;
    let mut line = DelayLine::new(
        settings.links,
        settings.queue_packets,
        SLOT_BYTES,
        settings.seed,
    )?;
    let mut tun = TunDevice::open(&settings.tun)?;
    println!(
        "{}",
        serde_json::json!({ "event": "ready", "tun": settings.tun })
    );
    let mut buffer = vec![0u8; 65536];
    let mut write_errors = 0u64;
    while !terminated() {
        let now = Instant::now();
        while let Some(packet) = line.release_due(now) {
            // A packet the kernel refuses (e.g. no route back) is counted, not fatal.
            if tun.write_packet(packet).is_err() {
                write_errors += 1;
            }
        }
        let wait = line
            .next_release()
            .map_or(IDLE_WAKE, |at| at.saturating_duration_since(Instant::now()))
            .min(IDLE_WAKE);
        if !tun
            .wait_readable(wait)
            .context("waiting on the TUN device")?
        {
            continue;
        }
        for _ in 0..READ_BATCH {
            match tun.read_packet(&mut buffer) {
                Ok(length) => {
                    line.admit(&buffer[..length], Instant::now());
                }
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) =>
                {
                    break;
                }
                Err(error) => return Err(error).context("reading the TUN device"),
            }
        }
    }
    let stats = line.stats();
    println!(
        "{}",
        serde_json::json!({
            "event": "stats",
            "received": stats.received,
            "forwarded": stats.forwarded,
            "lost": stats.lost,
            "dropped_queue_full": stats.dropped_queue_full,
            "dropped_oversize": stats.dropped_oversize,
            "held": line.held(),
            "write_errors": write_errors,
        })
    );
    Ok(())
}

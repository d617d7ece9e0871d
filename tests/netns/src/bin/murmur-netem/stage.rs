//! The delay stage's loop: TUN device in, [`DelayLine`], TUN device out.
//!
//! One packet costs a read and a write system call and a copy, about a core per Gbit/s of
//! full-size packets, so one thread cannot carry eight 200 Mbit/s links. The device is
//! multi-queue: the stage attaches one queue per thread, and the kernel picks a packet's
//! queue by a hash of its flow that is the same in both directions, so each flow stays in
//! one thread's delay line, in order.
//!
//! With segment offloads (`--offloads on`, the harness's choice when no link loses packets)
//! a read returns a whole TCP or UDP super-packet as the sender's GSO built it, so the same
//! read and write carry many packets' bytes. Loss would then strike a super-packet whole, so
//! a lossy network runs without them.

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use anyhow::Context;
use murmur_netns::delay_line::SlotClass;
use murmur_netns::{DelayLine, DelayLineStats, LinkImpairment};

use crate::tun::{TunDevice, VNET_HEADER_BYTES, catch_termination, terminated};

/// Largest packet a small slot holds: the harness's links have a 1500-byte MTU, and without
/// offloads the kernel never hands the stage more.
const SMALL_SLOT_BYTES: usize = 2048;
/// Largest packet a large slot holds: an IPv4 super-packet and its `virtio_net_hdr`.
const LARGE_SLOT_BYTES: usize = 65_535 + VNET_HEADER_BYTES;
/// With offloads, one large slot for this many small ones: a 1.6 Gbit/s network holds about
/// 2 MB in a 10 ms stage, 32 full super-packets, and a queue's 1024 small slots come with
/// 128 large ones (8 MiB).
const SMALL_SLOTS_PER_LARGE: usize = 8;
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
    /// The most packets held at once, all queues together.
    pub(crate) queue_packets: usize,
    /// Queues of the TUN device, one thread each.
    pub(crate) queues: usize,
    /// Whether the TUN device hands over super-packets (segment offloads).
    pub(crate) offloads: bool,
    /// The links' delays and losses.
    pub(crate) links: Vec<LinkImpairment>,
}

/// Runs until SIGTERM or SIGINT, then prints the counters of all queues together.
pub(crate) fn run(settings: StageSettings) -> anyhow::Result<()> {
    catch_termination()?;
    let queues = settings.queues.max(1);
    let per_queue = settings.queue_packets.div_ceil(queues);
    let mut lanes = Vec::with_capacity(queues);
    let small = SlotClass {
        count: per_queue,
        bytes: SMALL_SLOT_BYTES,
    };
    let (classes, header_bytes) = if settings.offloads {
        let large = SlotClass {
            count: per_queue.div_ceil(SMALL_SLOTS_PER_LARGE),
            bytes: LARGE_SLOT_BYTES,
        };
        (vec![small, large], VNET_HEADER_BYTES)
    } else {
        (vec![small], 0)
    };
    for queue in 0..queues {
        let line = DelayLine::with_slots(
            settings.links.clone(),
            &classes,
            header_bytes,
            // Each queue draws its losses from a stream of its own.
            settings.seed.wrapping_add(queue as u64),
        )?;
        let tun = TunDevice::open(&settings.tun, settings.offloads)
            .with_context(|| format!("queue {queue} of {queues}"))?;
        lanes.push((line, tun));
    }
    println!(
        "{}",
        serde_json::json!({
            "event": "ready",
            "tun": settings.tun,
            "queues": queues,
            "offloads": settings.offloads,
        })
    );
    let results = std::thread::scope(|scope| {
        let threads: Vec<_> = lanes
            .into_iter()
            .map(|(line, tun)| scope.spawn(move || serve(line, tun)))
            .collect();
        threads
            .into_iter()
            .map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a queue's thread panicked")))
            })
            .collect::<Vec<_>>()
    });
    let mut total = QueueReport::default();
    for result in results {
        total.add(&result?);
    }
    let stats = total.stats;
    println!(
        "{}",
        serde_json::json!({
            "event": "stats",
            "received": stats.received,
            "received_bytes": stats.received_bytes,
            "forwarded": stats.forwarded,
            "lost": stats.lost,
            "dropped_queue_full": stats.dropped_queue_full,
            "dropped_oversize": stats.dropped_oversize,
            "held": total.held,
            "write_errors": total.write_errors,
        })
    );
    Ok(())
}

/// What one queue's thread did.
#[derive(Default)]
struct QueueReport {
    stats: DelayLineStats,
    held: usize,
    write_errors: u64,
}

impl QueueReport {
    fn add(&mut self, other: &QueueReport) {
        let (a, b) = (&mut self.stats, &other.stats);
        a.received += b.received;
        a.received_bytes += b.received_bytes;
        a.forwarded += b.forwarded;
        a.lost += b.lost;
        a.dropped_queue_full += b.dropped_queue_full;
        a.dropped_oversize += b.dropped_oversize;
        self.held += other.held;
        self.write_errors += other.write_errors;
    }
}

/// One queue's loop: releases what is due, waits for the next packet or release, reads a
/// batch. Runs until SIGTERM or SIGINT.
fn serve(mut line: DelayLine, mut tun: TunDevice) -> anyhow::Result<QueueReport> {
    // Room for any packet and its header; a larger one would be cut short by the read.
    let mut buffer = vec![0u8; LARGE_SLOT_BYTES + 1];
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
    Ok(QueueReport {
        stats: line.stats(),
        held: line.held(),
        write_errors,
    })
}

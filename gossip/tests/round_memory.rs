//! What a member of a round mode holds between and during rounds, counted by the allocator.
//! A butterfly member that computes nothing while it averages keeps its gradient, its
//! contribution and its round's result in two whole vectors, not four (the gradient's buffer
//! becomes the accumulation and then the contribution; the idle gradient buffer takes the
//! result). A member that steps more than once a round keeps its round's sums in its idle
//! gradient buffer. A sync-ring member keeps no copy of its contribution for a ring that
//! fails.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use murmur_gossip::Time;
use murmur_gossip::butterfly::ButterflyConfig;
use murmur_gossip::engine::{EngineSetup, ModeSettings};
use murmur_gossip::sim::{EngineSwarm, EngineSwarmConfig, Scenario, Workload};
use murmur_protocol::codec::CodecSpec;

/// Counts the live allocations of exactly one whole vector's bytes, and their peak. The
/// simulator's own memory (parcels in flight, chunk payloads, parts) comes in other sizes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Allocations of exactly one member's part of the vector (a round's sums), ever made.
static PARTS: AtomicUsize = AtomicUsize::new(0);

fn whole(size: usize) -> bool {
    size == LEN * std::mem::size_of::<f32>()
}

fn counted(size: usize) {
    if whole(size) {
        let live = LIVE.fetch_add(1, Ordering::Relaxed) + 1;
        PEAK.fetch_max(live, Ordering::Relaxed);
    }
    if size == LEN / PEERS * std::mem::size_of::<f32>() {
        PARTS.fetch_add(1, Ordering::Relaxed);
    }
}

fn freed(size: usize) {
    if whole(size) {
        LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

// SAFETY: every call goes to `System` unchanged; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        freed(layout.size());
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        freed(layout.size());
        counted(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const PEERS: usize = 4;
const LEN: usize = 1 << 18;

/// Runs four peers in `mode` for three simulated seconds; returns the most whole vectors
/// held at once, over all peers.
fn peak_vectors(mode: ModeSettings) -> usize {
    peak_vectors_and_parts(mode).0
}

/// [`peak_vectors`], and the part-sized allocations made meanwhile.
fn peak_vectors_and_parts(mode: ModeSettings) -> (usize, usize) {
    let mut scenario = Scenario::new(PEERS, LEN, 100);
    scenario.seed = 5;
    scenario.workload = Workload::Quadratic { learning_rate: 0.1 };
    scenario.link.latency_ms = 1.0;
    scenario.link.uplink_mbps = Some(10_000.0);
    scenario.link.downlink_mbps = Some(10_000.0);
    scenario.compute.step_ms = 50.0;
    let config = EngineSwarmConfig {
        mode,
        setup: EngineSetup {
            codec: CodecSpec::F32,
            error_feedback: false,
            size_parts_by_bandwidth: false,
            batch_size: 32,
            upload_cap: 0,
            accepts_connections: true,
            wall_ms_at_zero: 0,
            seed: 7,
            max_share_piece: 0,
        },
        heartbeat_ms: 200,
        gossip_ms: 5.0,
        upload_caps: Vec::new(),
        unreachable: Vec::new(),
    };
    let before = LIVE.load(Ordering::Relaxed);
    let parts_before = PARTS.load(Ordering::Relaxed);
    let mut swarm = EngineSwarm::new(&scenario, config).expect("the swarm starts");
    swarm
        .run_until(Time::from_secs_f64(3.0))
        .expect("the swarm runs");
    let rounds = swarm.round_reports().len();
    assert!(rounds >= PEERS * 5, "only {rounds} round reports");
    assert!(
        swarm
            .round_reports()
            .iter()
            .all(|(_, r)| r.group_size == PEERS),
        "every round averages the whole swarm"
    );
    (
        PEAK.load(Ordering::Relaxed) - before,
        PARTS.load(Ordering::Relaxed) - parts_before,
    )
}

fn matchmaking() -> ButterflyConfig {
    ButterflyConfig {
        min_group: 2,
        target_group: PEERS,
        chunk_elements: 16_384,
        ..ButterflyConfig::default()
    }
}

/// The most whole vectors the simulated swarm held at once over a few rounds, per peer.
#[test]
fn a_member_that_computes_nothing_while_it_averages_holds_two_vectors_for_its_rounds() {
    let peak = peak_vectors(ModeSettings::Butterfly {
        target_batch: PEERS as u64 * 32,
        butterfly: matchmaking(),
    });
    eprintln!("at most {peak} whole vectors at once, {PEERS} peers");
    // Each simulated peer: its parameters, and the simulator's target and copy of them (3),
    // and for its rounds the gradient, the contribution and the result in two.
    assert!(
        peak <= PEERS * 5,
        "{peak} whole vectors for {PEERS} peers: a round holds more than two"
    );
}

/// A member that takes two steps towards each round holds a gradient buffer the trainer
/// does not use while the round runs; the round keeps its sums there, so no member ever
/// allocates memory for its part's sums, and none holds more whole vectors for it. Before
/// the sums went into the idle buffer: one part-sized allocation per peer, kept between
/// rounds beside the three vectors.
#[test]
fn a_member_that_steps_twice_a_round_keeps_its_sums_in_its_idle_gradient_buffer() {
    let (peak, parts) = peak_vectors_and_parts(ModeSettings::Butterfly {
        target_batch: 2 * PEERS as u64 * 32,
        butterfly: matchmaking(),
    });
    eprintln!("at most {peak} whole vectors at once, {parts} part-sized allocations");
    assert_eq!(parts, 0, "{parts} allocations of a part's sums");
    // Each peer: its parameters and the simulator's two (3), the accumulation, and the
    // gradient buffer, which holds the sums while the round runs (2).
    assert!(
        peak <= PEERS * 5,
        "{peak} whole vectors for {PEERS} peers: the sums took one of their own"
    );
}

/// A ring member's contribution is scaled and reduced in place; it keeps no copy of it to
/// fall back on (a failed ring hands over partial means, `ring.rs`). Before: 24 whole
/// vectors for 4 peers; after: 20.
#[test]
fn a_ring_member_keeps_no_copy_of_its_contribution() {
    let peak = peak_vectors(ModeSettings::SyncRing {
        timeout: Duration::from_secs(2),
        butterfly: matchmaking(),
    });
    eprintln!("at most {peak} whole vectors at once, {PEERS} peers");
    assert!(
        peak <= PEERS * 5,
        "{peak} whole vectors for {PEERS} peers: a ring round holds more than two"
    );
}

//! Scenarios the simulator's tests share: the quadratic workload over symmetric links, and
//! butterfly training in groups of two to sixteen.

#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use murmur_gossip::butterfly::ButterflyConfig;
use murmur_gossip::sim::{AlgorithmSpec, ButterflyTraining, RandomChurn, Scenario, Workload};

/// A link every peer has: one-way latency, the same bandwidth up and down, and how long
/// the swarm takes to notice a join, leave or crash.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    pub latency_ms: f64,
    pub mbps: f64,
    pub detect_ms: f64,
}

/// The training-mode table's link (examples/sim/table-*.toml): 0.2 ms, 1 Gbit/s, churn
/// noticed after half a second.
pub const TABLE_LINK: Link = Link {
    latency_ms: 0.2,
    mbps: 1000.0,
    detect_ms: 500.0,
};

/// `peers` peers training `algorithm` on the quadratic workload (learning rate 0.1) over
/// `link`, from `seed`.
pub fn quadratic(
    peers: usize,
    vector_len: usize,
    rounds: u64,
    seed: u64,
    algorithm: AlgorithmSpec,
    link: Link,
) -> Scenario {
    let mut scenario = Scenario::new(peers, vector_len, rounds);
    scenario.seed = seed;
    scenario.algorithm = algorithm;
    scenario.link.latency_ms = link.latency_ms;
    scenario.link.uplink_mbps = Some(link.mbps);
    scenario.link.downlink_mbps = Some(link.mbps);
    scenario.link.detect_ms = link.detect_ms;
    scenario.workload = Workload::Quadratic { learning_rate: 0.1 };
    scenario
}

/// Butterfly training that averages every `target_batch` samples in groups of 2 to 16,
/// with 5 ms gossip, `chunk_elements`-element chunks and `chunks_in_flight` of them in
/// flight per member.
pub fn butterfly(
    target_batch: u64,
    chunk_elements: u32,
    chunks_in_flight: u32,
) -> ButterflyTraining {
    ButterflyTraining {
        target_batch,
        gossip_ms: 5.0,
        butterfly: ButterflyConfig {
            min_group: 2,
            target_group: 16,
            max_wait_ms: 1000,
            begin_margin_ms: 200,
            chunk_elements,
            chunks_in_flight,
            chunk_timeout_ms: 1000,
            reducer_timeout_ms: 1500,
            ..ButterflyConfig::default()
        },
        ..ButterflyTraining::default()
    }
}

/// Two joins, a leave and a crash at random times between 0.5 s and 3.5 s.
pub fn early_churn() -> RandomChurn {
    RandomChurn {
        from_ms: 500.0,
        to_ms: 3_500.0,
        joins: 2,
        leaves: 1,
        crashes: 1,
        restarts: 0,
    }
}

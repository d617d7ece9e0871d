//! A deterministic discrete-event simulator for murmur's averaging algorithms.
//!
//! The simulator drives the very state machines the daemon runs ([`crate::sgp::SgpPeer`])
//! in virtual time, so that an algorithm can be tested on thousands of peers, on slow and
//! lossy links, through joins, leaves and crashes, in one process and in seconds.
//!
//! # Model
//!
//! - **Time** is virtual, in nanoseconds. Events wait in a priority queue ordered by time
//!   and then by insertion order, so a run depends on its seed and nothing else.
//! - **Compute**: a step takes `compute.step_ms`, scaled per peer by a straggler factor
//!   and per step by uniform jitter. A *round* is one nominal step; records are taken at
//!   the end of every round, after everything due at that instant has happened.
//! - **Links**: every peer has an uplink and a downlink of fixed bandwidth, each a FIFO
//!   pipe, plus a one-way latency; loss costs retransmission time, as on QUIC.
//! - **Churn**: joins, graceful leaves and crashes at given or random times. The swarm
//!   hears of each after `link.detect_ms`; until then peers may send to a peer that is
//!   gone, and the transport hands those shares back to their senders.
//! - **Byzantine peers** send every share sign-flipped and scaled.
//! - **Synchronous baselines** (ring, tree, recursive halving/doubling, torus, parameter
//!   server) run as latency–bandwidth cost models ([`Collective`]): a barrier on the
//!   slowest peer, then one all-reduce per step.
//!
//! # Using it
//!
//! [`run`] takes a [`Scenario`] (the Rust form of a TOML file in `examples/sim/`) and
//! returns a [`SimReport`] with one [`RoundRecord`] per round. Tests that need to look
//! inside a run build an [`SgpSwarm`] and step it with [`SgpSwarm::run_until`].

mod collective;
mod error;
mod metrics;
mod network;
mod queue;
mod report;
mod scenario;
mod sgp_swarm;

pub use collective::Collective;
pub use error::SimError;
pub use report::{RoundRecord, SimReport, SimSummary};
pub use scenario::{
    AlgorithmSpec, ByzantineSpec, ChurnEvent, ComputeSpec, InitSpec, LinkSpec, RandomChurn,
    Scenario, Straggler, Workload,
};
pub use sgp_swarm::SgpSwarm;

/// Runs `scenario` to its last round and reports.
pub fn run(scenario: &Scenario) -> Result<SimReport, SimError> {
    match &scenario.algorithm {
        AlgorithmSpec::Sgp(config) => SgpSwarm::new(scenario, config)?.run_to_end(),
        AlgorithmSpec::SyncAllReduce { collective } => collective::run(scenario, *collective),
    }
}

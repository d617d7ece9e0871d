//! A deterministic discrete-event simulator for murmur's averaging algorithms.
//!
//! The simulator drives the very state machines the daemon runs in virtual time, so that an
//! algorithm can be tested on thousands of peers, on slow and lossy links, through joins,
//! leaves, crashes and restarts, in one process and in seconds. It runs three training
//! modes:
//!
//! - **SGP** ([`SgpSwarm`]): every peer steps and pushes shares with
//!   [`crate::sgp::SgpPeer`], never waiting for anyone.
//! - **Butterfly** ([`ButterflySwarm`]): peers accumulate gradients until the swarm reaches a
//!   target batch, form groups with [`crate::butterfly::Matchmaker`] and average in
//!   [`crate::butterfly::ButterflyRound`]s; a straggler contributes what it has finished.
//! - **Sync-ring** ([`RingSwarm`]): after every step all peers average in one
//!   [`crate::ring::RingAllReduce`] and wait for it.
//!
//! # Model
//!
//! - **Time** is virtual, in nanoseconds. Events wait in a priority queue ordered by time
//!   and then by insertion order, so a run depends on its seed and nothing else.
//! - **Compute**: a step takes `compute.step_ms`, scaled per peer by a straggler factor
//!   and per step by uniform jitter. A *round* is one nominal step; records are taken at
//!   the end of every round, after everything due at that instant has happened.
//! - **Links**: every peer has an uplink and a downlink of fixed bandwidth, each a FIFO
//!   pipe, plus a one-way latency; a message queues at the receiver's downlink when its
//!   first byte gets there. Loss costs retransmission time, as on QUIC.
//! - **Churn**: joins, graceful leaves, crashes and restarts at given or random times
//!   ([`ChurnEvent`]: `join`, `leave`, `crash`, `restart`). The swarm hears of a join,
//!   leave or crash after `link.detect_ms`; until then peers may send to a peer that is
//!   gone. Joiners of the synchronous modes download the parameters first.
//! - **Restarts**: a restarted peer loses all it held, as in a crash, and is back at once
//!   under the same index with no mass, like a joiner; nobody is told, and messages in
//!   flight to it reach the new process. In SGP its neighbours go on sending it quantized
//!   shares built on edge references it lost: it refuses each with a refusal notice that
//!   crosses the links back to the sender, who takes the share back and shares exactly
//!   from then on ([`ShareRefusals`] counts them). The synchronous modes' swarms have no
//!   identity to come back under: there a restart is a crash followed at once by a join.
//!   The engine swarm ([`EngineSwarm`]) runs the daemon's engines, which restart as
//!   `murmur run` does, under the same key: a fresh engine at round 0 with the peer's last
//!   parameters, knowing nothing of the rounds and groups the old one was in.
//! - **Byzantine peers** send every SGP share, or contribute every butterfly or ring
//!   average, sign-flipped and scaled.
//! - **Synchronous baselines as cost models** (ring, tree, recursive halving/doubling,
//!   torus, parameter server) run as latency–bandwidth formulas ([`Collective`]): a barrier
//!   on the slowest peer, then one all-reduce per step.
//!
//! # The daemon's engines
//!
//! With `engine = true` a scenario runs [`EngineSwarm`]: every peer is the averaging engine
//! `murmur run` builds ([`crate::engine::ModeEngine`]), fed parcels over the same simulated
//! links and a simulated trainer, so what it shows is what the daemon decides.
//!
//! # Using it
//!
//! [`run`] takes a [`Scenario`] (the Rust form of a TOML file in `examples/sim/`) and
//! returns a [`SimReport`] with one [`RoundRecord`] per round. Tests that need to look
//! inside a run build a swarm and step it with its `run_until`.

mod butterfly_swarm;
mod collective;
mod engine_swarm;
mod error;
mod learner;
mod metrics;
mod network;
mod queue;
mod report;
mod ring_swarm;
mod scenario;
mod schedule;
mod sgp_swarm;
mod training;
mod training_run;

pub use butterfly_swarm::ButterflySwarm;
pub use collective::Collective;
pub use engine_swarm::{EngineSwarm, EngineSwarmConfig};
pub use error::SimError;
pub use report::{AveragingSummary, RoundRecord, ShareRefusals, SimReport, SimSummary};
pub use ring_swarm::RingSwarm;
pub use scenario::{
    AlgorithmSpec, ByzantineSpec, ChurnEvent, ComputeSpec, InitSpec, LinkSpec, RandomChurn,
    Scenario, Straggler, Workload,
};
pub use sgp_swarm::SgpSwarm;
pub use training::{ButterflyTraining, RingTraining};

/// Runs `scenario` to its last round and reports.
pub fn run(scenario: &Scenario) -> Result<SimReport, SimError> {
    if scenario.engine {
        return EngineSwarm::from_scenario(scenario)?.run_to_end();
    }
    match &scenario.algorithm {
        AlgorithmSpec::Sgp(config) => SgpSwarm::new(scenario, config)?.run_to_end(),
        AlgorithmSpec::Butterfly(training) => ButterflySwarm::new(scenario, training)?.run_to_end(),
        AlgorithmSpec::SyncRing(training) => RingSwarm::new(scenario, training)?.run_to_end(),
        AlgorithmSpec::SyncAllReduce { collective } => collective::run(scenario, *collective),
    }
}

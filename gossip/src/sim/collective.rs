//! Synchronous all-reduce collectives as cost models: the baselines SGP is compared with.
//!
//! Every round, every peer computes its step, all wait for the slowest (the barrier), and
//! the swarm runs one all-reduce of the whole vector. The all-reduce time follows the usual
//! latency–bandwidth (α–β) model (Thakur, Rabenseifner and Gropp, "Optimization of
//! Collective Communication Operations in MPICH", IJHPCA 2005), with α the one-way latency
//! and β the seconds per byte of the slower direction of a peer's link. These runs move no
//! data: after an all-reduce every peer holds the same vector, so only time is modelled.
//! Synchronous collectives are not fault tolerant by design; scenarios with churn or
//! byzantine peers are refused.

use rand::RngExt;
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use serde::{Deserialize, Serialize};

use super::error::SimError;
use super::report::{RoundRecord, SimReport, SimSummary};
use super::scenario::Scenario;

/// Bytes per element of the all-reduced vector (`f32`).
const ELEMENT_BYTES: f64 = 4.0;

/// A synchronous all-reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    /// Ring: reduce-scatter then all-gather around a ring, `2(n − 1)` steps of `B / n`.
    Ring,
    /// Binary tree: reduce to the root, then broadcast, whole vector per hop.
    Tree,
    /// Recursive halving (reduce-scatter) then doubling (all-gather), `2·log₂ n` steps.
    HalvingDoubling,
    /// Two-dimensional torus: a ring all-reduce along rows, then along columns.
    Torus,
    /// One parameter server: every peer pushes its vector to it and pulls the average back,
    /// all through the server's one link.
    ParameterServer,
}

impl Collective {
    /// Seconds one all-reduce of `bytes` takes among `n` peers.
    pub fn allreduce_secs(self, n: usize, bytes: f64, latency: f64, secs_per_byte: f64) -> f64 {
        if n < 2 {
            return 0.0;
        }
        let nf = n as f64;
        let (alpha, beta) = (latency, secs_per_byte);
        match self {
            Collective::Ring => 2.0 * (nf - 1.0) * (alpha + bytes / nf * beta),
            Collective::Tree => {
                let depth = f64::from(n.next_power_of_two().ilog2());
                2.0 * depth * (alpha + bytes * beta)
            }
            Collective::HalvingDoubling => {
                let steps = f64::from(n.next_power_of_two().ilog2());
                2.0 * steps * alpha + 2.0 * (nf - 1.0) / nf * bytes * beta
            }
            Collective::Torus => {
                let side = nf.sqrt().ceil();
                let rows = Collective::Ring.allreduce_secs(side as usize, bytes, alpha, beta);
                let cols =
                    Collective::Ring.allreduce_secs(side as usize, bytes / side, alpha, beta);
                rows + cols
            }
            Collective::ParameterServer => 2.0 * (alpha + nf * bytes * beta),
        }
    }

    /// The collective's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Collective::Ring => "sync-ring",
            Collective::Tree => "sync-tree",
            Collective::HalvingDoubling => "sync-halving-doubling",
            Collective::Torus => "sync-torus",
            Collective::ParameterServer => "parameter-server",
        }
    }
}

/// Runs `scenario` as synchronous data-parallel training with `collective`.
pub(crate) fn run(scenario: &Scenario, collective: Collective) -> Result<SimReport, SimError> {
    scenario.validate()?;
    if !scenario.churn.is_empty() || scenario.random_churn.is_some() {
        return Err(SimError::InvalidScenario {
            key: "churn",
            value: "churn with a synchronous collective".into(),
            allowed: "none: synchronous all-reduce is not fault tolerant; use sgp",
        });
    }
    if !scenario.byzantine.is_empty() {
        return Err(SimError::InvalidScenario {
            key: "byzantine",
            value: "byzantine peers with a synchronous collective".into(),
            allowed: "none: the cost model moves no data",
        });
    }
    let n = scenario.peers;
    let mut slowdown = vec![1.0; n];
    for straggler in &scenario.compute.stragglers {
        if let Some(factor) = slowdown.get_mut(straggler.peer as usize) {
            *factor = straggler.slowdown;
        }
    }
    let link = &scenario.link;
    let secs_per_byte = [link.uplink_mbps, link.downlink_mbps]
        .into_iter()
        .flatten()
        .map(|mbps| 8.0 / (mbps * 1e6))
        .fold(0.0, f64::max);
    let bytes = scenario.vector_len as f64 * ELEMENT_BYTES;
    let reduce = collective.allreduce_secs(n, bytes, link.latency_ms * 1e-3, secs_per_byte);
    let messages_per_round = match collective {
        Collective::Ring => 2 * n * (n - 1),
        Collective::Tree | Collective::ParameterServer => 2 * (n - 1),
        Collective::HalvingDoubling | Collective::Torus => {
            2 * n * n.next_power_of_two().ilog2() as usize
        }
    } as u64;
    let bytes_per_round = 2.0 * bytes * (n as f64 - 1.0);

    let mut rng = Xoshiro256PlusPlus::seed_from_u64(scenario.seed);
    let jitter = scenario.compute.jitter;
    let step_secs = scenario.compute.step_ms * 1e-3;
    let samples_per_round = n as u64 * scenario.compute.samples_per_step;
    let mut now = 0.0;
    let mut bytes_sent = 0.0;
    let mut records = Vec::new();
    let record = |round: u64, now: f64, bytes_sent: f64| RoundRecord {
        round,
        time_s: now,
        live_peers: n,
        // Every peer applies the same averaged update: they never disagree.
        consensus_error: 0.0,
        average_error: 0.0,
        total_weight: n as f64,
        min_weight: 1.0,
        steps: round * n as u64,
        samples: round * samples_per_round,
        bytes_sent: bytes_sent as u64,
    };
    records.push(record(0, now, bytes_sent));
    for round in 1..=scenario.rounds {
        let slowest = slowdown
            .iter()
            .map(|factor| {
                let draw = if jitter > 0.0 {
                    rng.random_range(-jitter..jitter)
                } else {
                    0.0
                };
                step_secs * factor * (1.0 + draw)
            })
            .fold(0.0, f64::max);
        now += slowest + reduce;
        bytes_sent += bytes_per_round;
        if round % scenario.record_every == 0 || round == scenario.rounds {
            records.push(record(round, now, bytes_sent));
        }
    }
    let samples = scenario.rounds * samples_per_round;
    Ok(SimReport {
        summary: SimSummary {
            name: scenario.name.clone(),
            algorithm: collective.name().into(),
            peers_start: n,
            peers_end: n,
            rounds: scenario.rounds,
            virtual_secs: now,
            samples_per_sec: if now > 0.0 { samples as f64 / now } else { 0.0 },
            final_consensus_error: 0.0,
            final_average_error: 0.0,
            initial_total_weight: n as f64,
            final_total_weight: n as f64,
            crashed_weight: 0.0,
            dropped_weight: 0.0,
            bytes_sent: bytes_sent as u64,
            messages: messages_per_round * scenario.rounds,
            events: scenario.rounds,
            averaging: None,
            share_refusals: None,
        },
        rounds: records,
    })
}

#[cfg(test)]
mod tests {
    use super::Collective;

    #[test]
    fn ring_is_bandwidth_optimal_and_tree_latency_optimal() {
        let (n, bytes) = (64, 4e8);
        // Bandwidth-bound: the ring moves 2(n − 1)/n of the vector, the tree 2·log₂ n times.
        let ring = Collective::Ring.allreduce_secs(n, bytes, 0.0, 1e-9);
        let tree = Collective::Tree.allreduce_secs(n, bytes, 0.0, 1e-9);
        assert!((ring - 2.0 * 63.0 / 64.0 * 0.4).abs() < 1e-9);
        assert!((tree - 12.0 * 0.4).abs() < 1e-9);
        // Latency-bound: 2(n − 1) hops against 2·log₂ n.
        let ring = Collective::Ring.allreduce_secs(n, 0.0, 1e-3, 0.0);
        let halving = Collective::HalvingDoubling.allreduce_secs(n, 0.0, 1e-3, 0.0);
        assert!((ring - 0.126).abs() < 1e-12 && (halving - 0.012).abs() < 1e-12);
        assert_eq!(Collective::Ring.allreduce_secs(1, bytes, 1.0, 1.0), 0.0);
    }
}

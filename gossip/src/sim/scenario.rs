//! Scenario files: everything a simulated run depends on, as data.

use serde::{Deserialize, Serialize};

use crate::sgp::SgpConfig;

use super::collective::Collective;
use super::error::SimError;
use super::training::{ButterflyTraining, RingTraining};

/// One simulated run: the swarm, its links and compute, its faults, and the algorithm.
///
/// Scenario files in `examples/sim/` are this struct in TOML. Every field but `peers`,
/// `vector_len` and `rounds` has a default; unknown keys are rejected so that a typo is an
/// error, not a silently ignored setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// A name for reports.
    #[serde(default)]
    pub name: String,
    /// Seed of the run's only random number generator: same seed, same run, bit for bit.
    #[serde(default)]
    pub seed: u64,
    /// Peers at the start.
    pub peers: usize,
    /// Elements of the averaged vector.
    pub vector_len: usize,
    /// Rounds to simulate; a round lasts one nominal step (`compute.step_ms`).
    pub rounds: u64,
    /// A record is taken every `record_every` rounds (1 = every round).
    #[serde(default = "one")]
    pub record_every: u64,
    /// The averaging algorithm and its settings.
    #[serde(default)]
    pub algorithm: AlgorithmSpec,
    /// Compute time per step.
    #[serde(default)]
    pub compute: ComputeSpec,
    /// The network.
    #[serde(default)]
    pub link: LinkSpec,
    /// Initial values of the averaged vectors.
    #[serde(default)]
    pub init: InitSpec,
    /// What a local step does to the parameters.
    #[serde(default)]
    pub workload: Workload,
    /// Joins, leaves, crashes and restarts at given times.
    #[serde(default)]
    pub churn: Vec<ChurnEvent>,
    /// Joins, leaves, crashes and restarts drawn at random from the seed.
    #[serde(default)]
    pub random_churn: Option<RandomChurn>,
    /// Peers that send corrupted shares.
    #[serde(default)]
    pub byzantine: Vec<ByzantineSpec>,
    /// Run the daemon's own averaging engines (the `ModeEngine` that `murmur run` builds)
    /// instead of the mode's simulated peers: the trainer and the network are simulated,
    /// every averaging decision is the daemon's. Crashes and leaves are supported, joins
    /// and restarts not yet; byzantine peers neither.
    #[serde(default)]
    pub engine: bool,
}

/// The averaging algorithm of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum AlgorithmSpec {
    /// Stochastic Gradient Push.
    Sgp(SgpConfig),
    /// Butterfly training: accumulate gradients to a target batch, then average them in
    /// groups, driving the real matchmaking and butterfly round state machines.
    Butterfly(ButterflyTraining),
    /// Synchronous training with a ring all-reduce after every step, driving the real ring
    /// state machine.
    SyncRing(RingTraining),
    /// Synchronous data-parallel training with an all-reduce every step (cost model only).
    SyncAllReduce {
        /// The all-reduce algorithm.
        collective: Collective,
    },
}

impl Default for AlgorithmSpec {
    fn default() -> AlgorithmSpec {
        AlgorithmSpec::Sgp(SgpConfig::default())
    }
}

/// How long local steps take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ComputeSpec {
    /// Nominal duration of one local step, in milliseconds; also the length of a round.
    pub step_ms: f64,
    /// Each step's duration is scaled by a uniform draw from `[1 − jitter, 1 + jitter]`.
    pub jitter: f64,
    /// Training samples one step processes (for samples/s).
    pub samples_per_step: u64,
    /// Peers whose steps take longer.
    pub stragglers: Vec<Straggler>,
}

impl Default for ComputeSpec {
    fn default() -> ComputeSpec {
        ComputeSpec {
            step_ms: 100.0,
            jitter: 0.0,
            samples_per_step: 32,
            stragglers: Vec::new(),
        }
    }
}

/// A peer whose steps take `slowdown` times the nominal duration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Straggler {
    /// The peer's index.
    pub peer: u32,
    /// Factor applied to its step duration (≥ 1 for a straggler).
    pub slowdown: f64,
}

/// The links between peers. Every peer has the same uplink and downlink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkSpec {
    /// One-way latency, in milliseconds.
    pub latency_ms: f64,
    /// Uplink bandwidth per peer, in megabits per second; absent means unlimited.
    pub uplink_mbps: Option<f64>,
    /// Downlink bandwidth per peer, in megabits per second; absent means unlimited.
    pub downlink_mbps: Option<f64>,
    /// Probability that a transmission is lost. The transport is reliable, like QUIC: a
    /// lost transmission is resent after a retransmission timeout, so loss costs time.
    pub loss: f64,
    /// How long the swarm takes to notice a join, leave or crash, in milliseconds. A
    /// restart goes unnoticed.
    pub detect_ms: f64,
    /// Bytes each message carries besides its payload (framing, headers).
    pub overhead_bytes: u64,
}

impl Default for LinkSpec {
    fn default() -> LinkSpec {
        LinkSpec {
            latency_ms: 0.0,
            uplink_mbps: None,
            downlink_mbps: None,
            loss: 0.0,
            detect_ms: 0.0,
            overhead_bytes: 64,
        }
    }
}

/// Initial values: element `k` of peer `i` is `offset + spread · u`, with `u` uniform in
/// `[−1, 1)`, drawn from the seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InitSpec {
    /// Added to every element of every peer.
    pub offset: f32,
    /// Half-width of the spread between peers.
    pub spread: f32,
}

impl Default for InitSpec {
    fn default() -> InitSpec {
        InitSpec {
            offset: 0.0,
            spread: 1.0,
        }
    }
}

/// What a local step does to the parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Workload {
    /// Nothing: pure averaging, to measure consensus.
    #[default]
    Consensus,
    /// Gradient descent on `½‖z − b_i‖²`, where `b_i` is peer `i`'s initial vector: the
    /// swarm's optimum is the average of the `b_i`.
    Quadratic {
        /// Learning rate γ.
        learning_rate: f32,
    },
}

/// A membership change at a given time. In a scenario file, `action` names it: `join`,
/// `leave`, `crash` or `restart`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ChurnEvent {
    /// A new peer joins; it takes the next unused index.
    Join {
        /// When, in milliseconds.
        at_ms: f64,
    },
    /// A peer leaves gracefully, handing off its mass.
    Leave {
        /// When, in milliseconds.
        at_ms: f64,
        /// The peer's index.
        peer: u32,
    },
    /// A peer stops without a word; its mass is lost.
    Crash {
        /// When, in milliseconds.
        at_ms: f64,
        /// The peer's index.
        peer: u32,
    },
    /// A peer restarts under the same identity before anyone notices: it loses all it held
    /// (its mass is lost, as in a crash) and is back at once under the same index, with no
    /// mass, like a joiner, and no edge references. The swarm hears of no change, and
    /// messages in flight to it reach the restarted peer.
    ///
    /// In SGP its neighbours go on sending it quantized shares built on references it no
    /// longer holds; it refuses them and tells each sender, who takes the share back. A
    /// peer that is leaving or gone does not restart. The synchronous modes (butterfly,
    /// sync-ring) know a peer by its place in the membership, not by a key it keeps: there
    /// a restart is a crash followed at once by a join, under the next unused index. The
    /// engine swarm restarts the daemon's engine under the same index, as `murmur run`
    /// restarts under the same key.
    Restart {
        /// When, in milliseconds.
        at_ms: f64,
        /// The peer's index.
        peer: u32,
    },
}

impl ChurnEvent {
    /// When the change happens, in milliseconds.
    pub fn at_ms(&self) -> f64 {
        match *self {
            ChurnEvent::Join { at_ms }
            | ChurnEvent::Leave { at_ms, .. }
            | ChurnEvent::Crash { at_ms, .. }
            | ChurnEvent::Restart { at_ms, .. } => at_ms,
        }
    }
}

/// Churn drawn from the seed: the given numbers of joins, graceful leaves, crashes and
/// restarts, at uniform times in `[from_ms, to_ms)`. Each leave or crash hits a distinct
/// founding peer chosen uniformly; each restart a founding peer chosen uniformly among those
/// that neither leave nor crash, so one peer may restart more than once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomChurn {
    /// Start of the window, in milliseconds.
    pub from_ms: f64,
    /// End of the window, in milliseconds.
    pub to_ms: f64,
    /// Number of joins.
    #[serde(default)]
    pub joins: usize,
    /// Number of graceful leaves.
    #[serde(default)]
    pub leaves: usize,
    /// Number of crashes.
    #[serde(default)]
    pub crashes: usize,
    /// Number of restarts under the same identity (see [`ChurnEvent::Restart`]).
    #[serde(default)]
    pub restarts: usize,
}

/// A peer that corrupts every share it sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByzantineSpec {
    /// The peer's index.
    pub peer: u32,
    /// Every payload element `v` is sent as `−scale · v`.
    pub sign_flip_scale: f32,
}

impl Scenario {
    /// A scenario with `peers` founding peers averaging `vector_len` elements for `rounds`
    /// rounds, everything else at its default.
    pub fn new(peers: usize, vector_len: usize, rounds: u64) -> Scenario {
        Scenario {
            name: String::new(),
            seed: 0,
            peers,
            vector_len,
            rounds,
            record_every: 1,
            algorithm: AlgorithmSpec::default(),
            compute: ComputeSpec::default(),
            link: LinkSpec::default(),
            init: InitSpec::default(),
            workload: Workload::default(),
            churn: Vec::new(),
            random_churn: None,
            byzantine: Vec::new(),
            engine: false,
        }
    }

    /// Checks every value, naming the key that is out of range.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |key: &'static str, value: String, allowed: &'static str| {
            Err(SimError::InvalidScenario {
                key,
                value,
                allowed,
            })
        };
        if !(1..=1 << 20).contains(&self.peers) {
            return bad("peers", self.peers.to_string(), "1 to 1048576");
        }
        if !(1..=1 << 28).contains(&self.vector_len) {
            return bad("vector_len", self.vector_len.to_string(), "1 to 2^28");
        }
        if self.record_every == 0 {
            return bad("record_every", "0".into(), "at least 1");
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let non_negative = |v: f64| v.is_finite() && v >= 0.0;
        if !positive(self.compute.step_ms) {
            return bad("compute.step_ms", self.compute.step_ms.to_string(), "> 0");
        }
        if !(0.0..1.0).contains(&self.compute.jitter) {
            return bad("compute.jitter", self.compute.jitter.to_string(), "0 to 1");
        }
        for straggler in &self.compute.stragglers {
            if !positive(straggler.slowdown) {
                return bad(
                    "compute.stragglers.slowdown",
                    straggler.slowdown.to_string(),
                    "> 0",
                );
            }
        }
        if !non_negative(self.link.latency_ms) {
            return bad("link.latency_ms", self.link.latency_ms.to_string(), ">= 0");
        }
        if !non_negative(self.link.detect_ms) {
            return bad("link.detect_ms", self.link.detect_ms.to_string(), ">= 0");
        }
        for (key, value) in [
            ("link.uplink_mbps", self.link.uplink_mbps),
            ("link.downlink_mbps", self.link.downlink_mbps),
        ] {
            if let Some(value) = value
                && !positive(value)
            {
                return bad(key, value.to_string(), "> 0, or absent for unlimited");
            }
        }
        if !(0.0..0.9).contains(&self.link.loss) {
            return bad("link.loss", self.link.loss.to_string(), "0 to 0.9");
        }
        if !self.init.offset.is_finite() || !self.init.spread.is_finite() {
            return bad("init", format!("{:?}", self.init), "finite numbers");
        }
        if let Workload::Quadratic { learning_rate } = self.workload
            && !(learning_rate.is_finite() && learning_rate > 0.0 && learning_rate <= 1.0)
        {
            return bad(
                "workload.learning_rate",
                learning_rate.to_string(),
                "0 < γ ≤ 1",
            );
        }
        for event in &self.churn {
            if !non_negative(event.at_ms()) {
                return bad("churn.at_ms", event.at_ms().to_string(), ">= 0");
            }
        }
        if let Some(random) = &self.random_churn {
            if !(non_negative(random.from_ms) && random.to_ms.is_finite())
                || random.to_ms < random.from_ms
            {
                return bad(
                    "random_churn.to_ms",
                    random.to_ms.to_string(),
                    "from_ms ≤ to_ms, both ≥ 0",
                );
            }
            if random.leaves + random.crashes >= self.peers {
                return bad(
                    "random_churn.crashes",
                    (random.leaves + random.crashes).to_string(),
                    "leaves + crashes below peers",
                );
            }
        }
        for byzantine in &self.byzantine {
            if !byzantine.sign_flip_scale.is_finite() {
                return bad(
                    "byzantine.sign_flip_scale",
                    byzantine.sign_flip_scale.to_string(),
                    "a finite number",
                );
            }
        }
        match &self.algorithm {
            AlgorithmSpec::Sgp(config) => config.validate().map_err(SimError::Sgp),
            AlgorithmSpec::Butterfly(training) => training.validate(),
            AlgorithmSpec::SyncRing(training) => training.validate(),
            AlgorithmSpec::SyncAllReduce { .. } => Ok(()),
        }
    }

    /// Duration of one round in nanoseconds.
    pub(crate) fn round_nanos(&self) -> u64 {
        (self.compute.step_ms * 1e6).round().max(1.0) as u64
    }
}

fn one() -> u64 {
    1
}

//! synthetic-markov: token sequences from a seeded random Markov chain.
//!
//! Each state has `branching` successors with log-normal weights, so the entropy rate sits
//! well below `ln(states)` and a small language model has something to learn. Every row
//! starts from the stationary distribution, so each next-token target has conditional
//! entropy exactly the chain's entropy rate `H = −Σᵢ πᵢ Σⱼ Pᵢⱼ ln Pᵢⱼ` (nats): the loss
//! floor no model can beat in expectation.
//!
//! The chain is kept irreducible and aperiodic by construction: state `i` always leads to
//! `i + 1 mod states` (one cycle through every state) and state 0 also to itself (a cycle of
//! length one), so the stationary distribution is unique and sequences mix.
//!
//! With `communities = C > 1` the states fall into `C` equal ranges and every successor but
//! the cycle's is drawn from the state's own range: a sequence leaves its community only at
//! the range's last state, so the communities are parts of the distribution that a short
//! sequence seldom crosses. A peer given data shard `k` of `n` (`data.shard`,
//! `data.shards`) starts its sequences in the `k`-th of `n` equal ranges of the states, drawn
//! from the stationary distribution restricted to it; with `n = C` each peer sees
//! (almost) only its own community: non-IID data, which averaging must combine.

use serde::{Deserialize, Serialize};

use super::{PeerSampling, build_eval_set};
use crate::batch::Batch;
use crate::data::Dataset;
use crate::error::ConfigError;
use crate::model::DataShape;
use crate::rng::{Rng, tag};

fn default_states() -> usize {
    32
}
fn default_branching() -> usize {
    4
}
fn default_skew() -> f32 {
    1.0
}
fn default_communities() -> usize {
    1
}

/// Power iterations allowed while finding the stationary distribution.
const MAX_POWER_ITERATIONS: usize = 1_000_000;

/// The `[data.source]` section for `kind = "synthetic-markov"`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MarkovConfig {
    /// Number of states (the vocabulary).
    #[serde(default = "default_states")]
    pub states: usize,
    /// Successors per state (non-zero entries per transition row).
    #[serde(default = "default_branching")]
    pub branching: usize,
    /// Standard deviation of the log-weights: 0 makes successors equally likely.
    #[serde(default = "default_skew")]
    pub skew: f32,
    /// Equal ranges of states whose successors stay within the range (but for the cycle's);
    /// 1 = one community, successors drawn from every state.
    #[serde(default = "default_communities")]
    pub communities: usize,
}

impl MarkovConfig {
    /// Checks sizes and the skew.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(2..=4096).contains(&self.states) {
            return Err(ConfigError::out_of_range(
                "data.source.states",
                self.states,
                "2..=4096",
            ));
        }
        let max_branching = self.states.min(64);
        if !(2..=max_branching).contains(&self.branching) {
            return Err(ConfigError::out_of_range(
                "data.source.branching",
                self.branching,
                format!("2..={max_branching} (at most states, at most 64)"),
            ));
        }
        let per_community = self.states / self.communities.max(1);
        if self.communities == 0
            || !self.states.is_multiple_of(self.communities)
            || (self.communities > 1 && per_community <= self.branching)
        {
            return Err(ConfigError::out_of_range(
                "data.source.communities",
                self.communities,
                format!(
                    "1, or a divisor of states ({}) leaving more than branching ({}) states in each",
                    self.states, self.branching
                ),
            ));
        }
        if !(0.0..=8.0).contains(&self.skew) {
            return Err(ConfigError::out_of_range(
                "data.source.skew",
                self.skew,
                "[0, 8]",
            ));
        }
        Ok(())
    }
}

/// A sparse Markov chain with its stationary distribution and entropy rate.
#[derive(Debug, Clone)]
pub struct MarkovChain {
    states: usize,
    branching: usize,
    /// `[states, branching]`: successor ids.
    successors: Vec<u32>,
    /// `[states, branching]`: transition probabilities.
    probs: Vec<f64>,
    /// `[states, branching]`: running sums of `probs` per row.
    cumulative: Vec<f64>,
    stationary: Vec<f64>,
    stationary_cumulative: Vec<f64>,
    entropy_rate: f64,
}

impl MarkovChain {
    /// Draws the chain from `seed` (the swarm seed: same chain on every peer).
    pub fn new(config: &MarkovConfig, seed: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        let (v, k) = (config.states, config.branching);
        // With one community the range is every state, and the draws are those of a chain
        // without communities.
        let per_community = v / config.communities;
        let mut rng = Rng::for_stream(&[seed, tag::TASK]);
        let mut successors = Vec::with_capacity(v * k);
        let mut probs = Vec::with_capacity(v * k);
        for i in 0..v {
            let row = successors.len();
            successors.push(((i + 1) % v) as u32);
            if i == 0 {
                successors.push(0);
            }
            let community = (i / per_community) * per_community;
            while successors.len() - row < k {
                let s = (community + rng.index(per_community)) as u32;
                if !successors[row..].contains(&s) {
                    successors.push(s);
                }
            }
            let weights: Vec<f64> = (0..k)
                .map(|_| (rng.normal() * f64::from(config.skew)).exp())
                .collect();
            let total: f64 = weights.iter().sum();
            probs.extend(weights.iter().map(|w| w / total));
        }
        let cumulative = probs
            .chunks(k)
            .flat_map(|row| {
                row.iter().scan(0.0, |acc, p| {
                    *acc += p;
                    Some(*acc)
                })
            })
            .collect();
        let mut chain = Self {
            states: v,
            branching: k,
            successors,
            probs,
            cumulative,
            stationary: Vec::new(),
            stationary_cumulative: Vec::new(),
            entropy_rate: 0.0,
        };
        chain.stationary = chain.stationary_distribution();
        chain.stationary_cumulative = chain
            .stationary
            .iter()
            .scan(0.0, |acc, p| {
                *acc += p;
                Some(*acc)
            })
            .collect();
        chain.entropy_rate = chain
            .stationary
            .iter()
            .enumerate()
            .map(|(i, pi)| {
                let row = &chain.probs[i * k..(i + 1) * k];
                pi * -row.iter().map(|p| p * p.ln()).sum::<f64>()
            })
            .sum();
        Ok(chain)
    }

    /// π with π = πP, by power iteration from the uniform distribution.
    fn stationary_distribution(&self) -> Vec<f64> {
        let v = self.states;
        let mut pi = vec![1.0 / v as f64; v];
        let mut next = vec![0.0; v];
        for _ in 0..MAX_POWER_ITERATIONS {
            next.fill(0.0);
            for (i, &mass) in pi.iter().enumerate() {
                let row = i * self.branching..(i + 1) * self.branching;
                for (&s, &p) in self.successors[row.clone()].iter().zip(&self.probs[row]) {
                    next[s as usize] += mass * p;
                }
            }
            let change: f64 = pi.iter().zip(&next).map(|(a, b)| (a - b).abs()).sum();
            std::mem::swap(&mut pi, &mut next);
            if change < 1e-14 {
                break;
            }
        }
        pi
    }

    /// Number of states.
    pub fn states(&self) -> usize {
        self.states
    }

    /// The entropy rate in nats per token: the loss floor of next-token prediction.
    pub fn entropy_rate(&self) -> f64 {
        self.entropy_rate
    }

    /// The stationary distribution.
    pub fn stationary(&self) -> &[f64] {
        &self.stationary
    }

    /// P(next = `to` | current = `from`); 0 for ids out of range.
    pub fn transition(&self, from: u32, to: u32) -> f64 {
        let from = from as usize;
        if from >= self.states {
            return 0.0;
        }
        let row = from * self.branching..(from + 1) * self.branching;
        self.successors[row.clone()]
            .iter()
            .zip(&self.probs[row])
            .find(|(s, _)| **s == to)
            .map_or(0.0, |(_, p)| *p)
    }

    /// The state after `from`.
    fn step(&self, from: u32, rng: &mut Rng) -> u32 {
        let row = from as usize * self.branching..(from as usize + 1) * self.branching;
        let k = rng.pick_cumulative(&self.cumulative[row.clone()]);
        self.successors[row.start + k]
    }

    /// Appends one sequence of `context + 1` states as `context` inputs and their next states,
    /// the first state drawn by `start`.
    fn draw(
        &self,
        rng: &mut Rng,
        start: &StartStates,
        context: usize,
        ids: &mut Vec<u32>,
        targets: &mut Vec<u32>,
    ) {
        let mut state = (start.first + rng.pick_cumulative(&start.cumulative)) as u32;
        for _ in 0..context {
            ids.push(state);
            state = self.step(state, rng);
            targets.push(state);
        }
    }
}

/// Where sequences start: states `first..first + cumulative.len()`, with the running sums of
/// their stationary probabilities.
#[derive(Debug, Clone)]
struct StartStates {
    first: usize,
    cumulative: Vec<f64>,
}

impl StartStates {
    /// Every state, by the stationary distribution.
    fn all(chain: &MarkovChain) -> StartStates {
        StartStates {
            first: 0,
            cumulative: chain.stationary_cumulative.clone(),
        }
    }

    /// The `shard`-th of `shards` equal ranges of the states (the last ones longer by the
    /// remainder), by the stationary distribution restricted to it; one shard is every state.
    fn shard(chain: &MarkovChain, shard: u32, shards: u32) -> StartStates {
        if shards <= 1 {
            return StartStates::all(chain);
        }
        let v = chain.states;
        let range = |k: u32| (k as usize * v) / shards as usize;
        let (first, end) = (range(shard), range(shard + 1).max(range(shard) + 1).min(v));
        let cumulative = chain.stationary[first..end]
            .iter()
            .scan(0.0, |acc, p| {
                *acc += p;
                Some(*acc)
            })
            .collect();
        StartStates { first, cumulative }
    }
}

/// The synthetic-markov dataset for one peer.
#[derive(Debug)]
pub struct MarkovDataset {
    chain: MarkovChain,
    context: usize,
    train_rng: Rng,
    /// Where this peer's training sequences start (its data shard).
    train_start: StartStates,
    eval: Vec<Batch>,
}

impl MarkovDataset {
    /// Draws the chain and eval set from the swarm seed; the peer's stream from its seeds.
    pub(crate) fn new(
        config: &MarkovConfig,
        context: usize,
        eval_samples: usize,
        rows: usize,
        sampling: PeerSampling,
    ) -> Result<Self, ConfigError> {
        let chain = MarkovChain::new(config, sampling.swarm_seed)?;
        let mut eval_rng = Rng::for_stream(&[sampling.swarm_seed, tag::EVAL]);
        let eval_start = StartStates::all(&chain);
        let eval = build_eval_set(
            eval_samples,
            rows,
            |n| Batch::tokens_with_capacity(n, context),
            |batch, n| {
                let mut ids = batch.take_token_ids();
                for _ in 0..n {
                    chain.draw(
                        &mut eval_rng,
                        &eval_start,
                        context,
                        &mut ids,
                        &mut batch.targets,
                    );
                }
                batch.set_tokens(ids, context, n);
            },
        );
        let train_rng = Rng::for_stream(&[
            sampling.swarm_seed,
            tag::TRAIN,
            sampling.peer_seed,
            u64::from(sampling.shard),
        ]);
        let train_start = StartStates::shard(&chain, sampling.shard, sampling.shards);
        Ok(Self {
            chain,
            context,
            train_rng,
            train_start,
            eval,
        })
    }

    /// The chain the sequences come from.
    pub fn chain(&self) -> &MarkovChain {
        &self.chain
    }
}

impl Dataset for MarkovDataset {
    fn shape(&self) -> DataShape {
        DataShape::Tokens {
            vocab: self.chain.states,
            context: self.context,
        }
    }

    fn fill_train_batch(&mut self, rows: usize, batch: &mut Batch) {
        let mut ids = batch.take_token_ids();
        for _ in 0..rows {
            self.chain.draw(
                &mut self.train_rng,
                &self.train_start,
                self.context,
                &mut ids,
                &mut batch.targets,
            );
        }
        batch.set_tokens(ids, self.context, rows);
    }

    fn eval_set(&self) -> &[Batch] {
        &self.eval
    }

    fn loss_floor(&self) -> Option<f32> {
        Some(self.chain.entropy_rate as f32)
    }
}

//! A simulated trainer in the synchronous training modes (butterfly and sync-ring): its
//! parameters, the gradient it accumulates, and what it contributes to an average.
//!
//! A contribution is the peer's parameters after a step along its own mean gradient,
//! `x − γ·ḡ_i`, weighted by the samples `s_i` behind `ḡ_i`. When the members share their
//! parameters `x`, the weighted mean of the contributions is `x − γ·Σ s_i ḡ_i / Σ s_i`:
//! exactly one large-batch SGD step with the gradients averaged by samples, so every member
//! that applies the result applies the same update. A member with no sample contributes its
//! parameters at weight zero: it takes the others' update and adds nothing to it.

use std::time::Duration;

use rand::RngExt;
use rand::rngs::Xoshiro256PlusPlus;

use super::scenario::{ComputeSpec, Scenario, Workload};

/// One simulated trainer's state.
#[derive(Debug)]
pub(crate) struct Learner {
    params: Vec<f32>,
    /// Quadratic workload: the optimum `b_i` of this peer's loss; empty for consensus.
    target: Vec<f32>,
    /// Gradient of the step in progress, taken at the parameters it started from.
    step_gradient: Vec<f32>,
    /// `Σ samples · gradient` over the steps accumulated since the last contribution.
    accumulated: Vec<f32>,
    samples: u64,
    slowdown: f64,
    sign_flip_scale: Option<f32>,
}

impl Learner {
    /// A learner starting from `params`; with the quadratic workload its optimum is
    /// `target`.
    pub(crate) fn new(params: Vec<f32>, target: Vec<f32>, slowdown: f64) -> Learner {
        let len = target.len();
        Learner {
            params,
            target,
            step_gradient: vec![0.0; len],
            accumulated: vec![0.0; len],
            samples: 0,
            slowdown,
            sign_flip_scale: None,
        }
    }

    /// Makes this peer byzantine: it contributes `−scale ·` what it should.
    pub(crate) fn corrupt(&mut self, scale: f32) {
        self.sign_flip_scale = Some(scale);
    }

    /// The current parameters.
    pub(crate) fn params(&self) -> &[f32] {
        &self.params
    }

    /// Samples accumulated since the last contribution.
    pub(crate) fn samples(&self) -> u64 {
        self.samples
    }

    /// Starts a step: its gradient is taken at the parameters held now.
    pub(crate) fn begin_step(&mut self) {
        // ∇ ½‖x − b‖² = x − b.
        for ((g, &x), &b) in self
            .step_gradient
            .iter_mut()
            .zip(&self.params)
            .zip(&self.target)
        {
            *g = x - b;
        }
    }

    /// Ends the step begun last: its gradient joins the accumulation.
    pub(crate) fn end_step(&mut self, samples: u64) {
        let weight = samples as f32;
        for (a, &g) in self.accumulated.iter_mut().zip(&self.step_gradient) {
            *a += weight * g;
        }
        self.samples += samples;
    }

    /// Writes this peer's contribution into `out`, returns its weight (samples), and starts
    /// a new accumulation.
    pub(crate) fn take_contribution(&mut self, learning_rate: f32, out: &mut Vec<f32>) -> f32 {
        out.clear();
        out.extend_from_slice(&self.params);
        if self.samples > 0 && !self.accumulated.is_empty() {
            let scale = learning_rate / self.samples as f32;
            for (o, &a) in out.iter_mut().zip(&self.accumulated) {
                *o -= scale * a;
            }
        }
        if let Some(scale) = self.sign_flip_scale {
            out.iter_mut().for_each(|o| *o *= -scale);
        }
        self.accumulated.fill(0.0);
        let weight = self.samples as f32;
        self.samples = 0;
        weight
    }

    /// Replaces the parameters by `values` (an averaged result, or a state download).
    pub(crate) fn adopt(&mut self, values: &[f32]) {
        self.params.clear();
        self.params.extend_from_slice(values);
    }

    /// How long this peer's next step takes.
    pub(crate) fn step_duration(
        &self,
        spec: &ComputeSpec,
        rng: &mut Xoshiro256PlusPlus,
    ) -> Duration {
        step_duration(spec, self.slowdown, rng)
    }
}

/// A step's duration: `step_ms`, scaled by the peer's slowdown and a uniform jitter draw.
pub(crate) fn step_duration(
    spec: &ComputeSpec,
    slowdown: f64,
    rng: &mut Xoshiro256PlusPlus,
) -> Duration {
    let draw = if spec.jitter > 0.0 {
        rng.random_range(-spec.jitter..spec.jitter)
    } else {
        0.0
    };
    Duration::from_secs_f64(spec.step_ms * 1e-3 * slowdown * (1.0 + draw))
}

/// A vector of `offset + spread · u`, `u` uniform in `[−1, 1)`.
pub(crate) fn random_vector(
    rng: &mut Xoshiro256PlusPlus,
    scenario: &Scenario,
    len: usize,
) -> Vec<f32> {
    let (offset, spread) = (scenario.init.offset, scenario.init.spread);
    (0..len)
        .map(|_| offset + spread * rng.random_range(-1.0f32..1.0))
        .collect()
}

/// The founding learners of `scenario`: initial vectors drawn from `rng` in peer order,
/// stragglers slowed, byzantine peers corrupted.
pub(crate) fn founders(scenario: &Scenario, rng: &mut Xoshiro256PlusPlus) -> Vec<Learner> {
    let mut learners: Vec<Learner> = (0..scenario.peers)
        .map(|_| {
            let initial = random_vector(rng, scenario, scenario.vector_len);
            let target = match scenario.workload {
                Workload::Consensus => Vec::new(),
                Workload::Quadratic { .. } => initial.clone(),
            };
            Learner::new(initial, target, 1.0)
        })
        .collect();
    for straggler in &scenario.compute.stragglers {
        if let Some(learner) = learners.get_mut(straggler.peer as usize) {
            learner.slowdown = straggler.slowdown;
        }
    }
    for byzantine in &scenario.byzantine {
        if let Some(learner) = learners.get_mut(byzantine.peer as usize) {
            learner.corrupt(byzantine.sign_flip_scale);
        }
    }
    learners
}

/// A learner for a peer that joins: its own optimum, parameters to be downloaded.
pub(crate) fn joiner(scenario: &Scenario, rng: &mut Xoshiro256PlusPlus) -> Learner {
    let len = scenario.vector_len;
    let target = match scenario.workload {
        Workload::Consensus => Vec::new(),
        Workload::Quadratic { .. } => random_vector(rng, scenario, len),
    };
    Learner::new(vec![0.0; len], target, 1.0)
}

/// The learning rate γ of the workload (none for consensus).
pub(crate) fn learning_rate(scenario: &Scenario) -> f32 {
    match scenario.workload {
        Workload::Consensus => 0.0,
        Workload::Quadratic { learning_rate } => learning_rate,
    }
}

//! Local SGD with an outer optimizer: H local steps, then an average and one outer Nesterov
//! step (`averaging.mode = "local-sgd"`).
//!
//! Every peer keeps an *anchor*: the parameters at the start of its outer step. After `H`
//! local optimizer steps it contributes its parameters `θᵢ`, weighted by the samples
//! behind them; the group averages them in a butterfly all-reduce ([`crate::butterfly`]).
//! With `θ̄` the average, the *pseudo-gradient* is `Δ̄ = anchor − θ̄`, which is the mean of
//! the members' own pseudo-gradients `anchor − θᵢ` (how far each inner optimizer moved),
//! and every member applies it with Nesterov momentum:
//!
//! ```text
//! v ← μ·v + Δ̄
//! anchor ← anchor − η·(Δ̄ + μ·v)
//! θ ← anchor
//! ```
//!
//! This is DiLoCo (Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam and
//! Shen, "DiLoCo: Distributed Low-Communication Training of Language Models", 2023). DiLoCo
//! uses `η = 0.7`, `μ = 0.9` with hundreds of inner steps per round; murmur's default of 8
//! takes `η = 0.7`, `μ = 0.5`: with `μ = 0.9` the momentum, summing some ten rounds of
//! pseudo-gradients, overshoots a well-tuned inner optimizer (on the quality task, at the
//! synchronous reference's learning rate, it closed 0.42 of the gap to it and `μ = 0.5`
//! 0.81; BENCHMARKS.md). The
//! pseudo-gradients are small next to the parameters, so a lossy codec quantizes them with
//! far less error than it would the parameters themselves, and error feedback carries what
//! each round loses into the next.

use serde::{Deserialize, Serialize};

/// Local SGD's outer loop (`[averaging.local_sgd]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalSgdSettings {
    /// H: local steps between averages.
    pub local_steps: u32,
    /// η: the outer learning rate applied to the averaged pseudo-gradient.
    pub outer_lr: f32,
    /// μ: the outer Nesterov momentum.
    pub outer_momentum: f32,
}

impl Default for LocalSgdSettings {
    fn default() -> Self {
        LocalSgdSettings {
            local_steps: 8,
            outer_lr: 0.7,
            outer_momentum: 0.5,
        }
    }
}

/// One peer's outer optimizer: its anchor and momentum.
#[derive(Debug, Clone)]
pub struct OuterStep {
    settings: LocalSgdSettings,
    anchor: Vec<f32>,
    velocity: Vec<f32>,
}

impl OuterStep {
    /// An outer optimizer anchored at `params`, with no momentum yet.
    pub fn new(params: &[f32], settings: LocalSgdSettings) -> OuterStep {
        OuterStep {
            settings,
            anchor: params.to_vec(),
            velocity: vec![0.0; params.len()],
        }
    }

    /// Local steps between averages.
    pub fn local_steps(&self) -> u64 {
        u64::from(self.settings.local_steps.max(1))
    }

    /// The anchor: the parameters the swarm agreed on at the last outer step.
    pub fn anchor(&self) -> &[f32] {
        &self.anchor
    }

    /// Takes the outer Nesterov step along the pseudo-gradient `anchor − average`, where
    /// `average` is the group's mean of the members' parameters, and writes the new anchor
    /// into `params`.
    pub fn apply(&mut self, average: &[f32], params: &mut [f32]) {
        let LocalSgdSettings {
            outer_lr: lr,
            outer_momentum: mu,
            ..
        } = self.settings;
        for (((anchor, v), p), &mean) in self
            .anchor
            .iter_mut()
            .zip(&mut self.velocity)
            .zip(params.iter_mut())
            .zip(average)
        {
            let delta = *anchor - mean;
            *v = mu * *v + delta;
            *anchor -= lr * (delta + mu * *v);
            *p = *anchor;
        }
    }

    /// Re-anchors at `params` and forgets the momentum (after a state download).
    pub fn reset(&mut self, params: &[f32]) {
        self.anchor.clear();
        self.anchor.extend_from_slice(params);
        self.velocity.fill(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Anchors that differ by `d` differ by `(1 − η)·d` after a round averaging their
    /// (unmoved) parameters: drift heals.
    #[test]
    fn anchors_apart_come_together() {
        let settings = LocalSgdSettings {
            local_steps: 1,
            outer_lr: 0.7,
            outer_momentum: 0.0,
        };
        let (mut a, mut b) = (
            OuterStep::new(&[0.0], settings),
            OuterStep::new(&[1.0], settings),
        );
        let (mut pa, mut pb) = ([0.0f32], [1.0f32]);
        let mean = [(pa[0] + pb[0]) / 2.0];
        a.apply(&mean, &mut pa);
        b.apply(&mean, &mut pb);
        assert!(((pb[0] - pa[0]) - 0.3).abs() < 1e-6, "{pa:?} {pb:?}");
    }

    #[test]
    fn with_no_momentum_and_unit_rate_the_outer_step_lands_on_the_average() {
        let settings = LocalSgdSettings {
            local_steps: 4,
            outer_lr: 1.0,
            outer_momentum: 0.0,
        };
        let anchor = [1.0, 2.0, 3.0];
        let mut outer = OuterStep::new(&anchor, settings);
        // Two peers moved to a and b; the group's average is their mean.
        let (a, b) = ([0.0, 2.0, 4.0], [1.0, 1.0, 1.0]);
        let mean: Vec<f32> = a.iter().zip(&b).map(|(x, y)| (x + y) / 2.0).collect();
        let mut params = a;
        outer.apply(&mean, &mut params);
        assert_eq!(params, [0.5, 1.5, 2.5]);
    }

    #[test]
    fn momentum_carries_the_last_direction_into_the_next_outer_step() {
        let settings = LocalSgdSettings {
            local_steps: 1,
            outer_lr: 0.5,
            outer_momentum: 0.9,
        };
        let mut outer = OuterStep::new(&[0.0], settings);
        let mut params = [0.0];
        // The group moved to −1: Δ = 1, v = 1, anchor = −0.5·(1 + 0.9).
        outer.apply(&[-1.0], &mut params);
        assert!((params[0] + 0.95).abs() < 1e-6);
        // The group stayed at the anchor: Δ = 0, v = 0.9, anchor −= 0.5·(0 + 0.81).
        outer.apply(&[-0.95], &mut params);
        assert!((params[0] + 0.95 + 0.405).abs() < 1e-6);
    }
}

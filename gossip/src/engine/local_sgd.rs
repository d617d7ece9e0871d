//! Local SGD with an outer optimizer: H local steps, then an average of the pseudo-gradients
//! and one outer Nesterov step (`averaging.mode = "local-sgd"`).
//!
//! Every peer keeps an *anchor*: the parameters at the start of its outer step. After `H`
//! local optimizer steps it contributes its *pseudo-gradient* `Δᵢ = anchor − θᵢ` (how far
//! its inner optimizer moved it), weighted by the samples behind it. The group averages the
//! pseudo-gradients in a butterfly all-reduce ([`crate::butterfly`]), and every member
//! applies the average `Δ̄` with Nesterov momentum:
//!
//! ```text
//! v ← μ·v + Δ̄
//! anchor ← anchor − η·(Δ̄ + μ·v)
//! θ ← anchor
//! ```
//!
//! This is DiLoCo (Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam and
//! Shen, "DiLoCo: Distributed Low-Communication Training of Language Models", 2023), whose
//! outer Nesterov step with `η = 0.7`, `μ = 0.9` murmur takes as its default. The
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
            outer_momentum: 0.9,
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

    /// Writes the pseudo-gradient `anchor − params` into `out`.
    pub fn pseudo_gradient(&self, params: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.extend(self.anchor.iter().zip(params).map(|(a, p)| a - p));
    }

    /// Takes the outer Nesterov step along the averaged pseudo-gradient and writes the new
    /// anchor into `params`.
    pub fn apply(&mut self, averaged: &[f32], params: &mut [f32]) {
        let LocalSgdSettings {
            outer_lr: lr,
            outer_momentum: mu,
            ..
        } = self.settings;
        for (((anchor, v), p), &delta) in self
            .anchor
            .iter_mut()
            .zip(&mut self.velocity)
            .zip(params.iter_mut())
            .zip(averaged)
        {
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

    #[test]
    fn with_no_momentum_and_unit_rate_the_outer_step_lands_on_the_average() {
        let settings = LocalSgdSettings {
            local_steps: 4,
            outer_lr: 1.0,
            outer_momentum: 0.0,
        };
        let anchor = [1.0, 2.0, 3.0];
        let mut outer = OuterStep::new(&anchor, settings);
        // Two peers moved to a and b; their pseudo-gradients average to anchor − (a+b)/2.
        let (a, b) = ([0.0, 2.0, 4.0], [1.0, 1.0, 1.0]);
        let (mut da, mut db) = (Vec::new(), Vec::new());
        outer.pseudo_gradient(&a, &mut da);
        outer.pseudo_gradient(&b, &mut db);
        let mean: Vec<f32> = da.iter().zip(&db).map(|(x, y)| (x + y) / 2.0).collect();
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
        outer.apply(&[1.0], &mut params);
        // v = 1, anchor = −0.5·(1 + 0.9)
        assert!((params[0] + 0.95).abs() < 1e-6);
        outer.apply(&[0.0], &mut params);
        // v = 0.9, anchor −= 0.5·(0 + 0.81)
        assert!((params[0] + 0.95 + 0.405).abs() < 1e-6);
    }
}

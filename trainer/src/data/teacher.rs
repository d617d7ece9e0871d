//! synthetic-classification: feature rows labelled by a seeded teacher network.
//!
//! Inputs are standard normal vectors; the teacher is a one-hidden-layer tanh network drawn
//! from the swarm seed; each label is *sampled* from the softmax of the teacher's logits times
//! `sharpness`. The Bayes-optimal predictor is the teacher itself, so the loss floor reported
//! is the teacher's own cross-entropy on the eval set — exactly the lowest eval loss any
//! model can reach on those samples.

use serde::{Deserialize, Serialize};

use super::{PeerSampling, build_eval_set};
use crate::batch::Batch;
use crate::data::Dataset;
use crate::error::ConfigError;
use crate::model::DataShape;
use crate::rng::{Rng, tag};

fn default_features() -> usize {
    32
}
fn default_classes() -> usize {
    10
}
fn default_hidden() -> usize {
    64
}
fn default_sharpness() -> f32 {
    4.0
}

/// The `[data.source]` section for `kind = "synthetic-classification"`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TeacherConfig {
    /// Features per row.
    #[serde(default = "default_features")]
    pub features: usize,
    /// Number of classes.
    #[serde(default = "default_classes")]
    pub classes: usize,
    /// Hidden width of the teacher network.
    #[serde(default = "default_hidden")]
    pub hidden: usize,
    /// Scale on the teacher's logits: higher means cleaner labels and a lower floor.
    #[serde(default = "default_sharpness")]
    pub sharpness: f32,
}

impl TeacherConfig {
    /// Checks every size and the sharpness.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value, lo, hi) in [
            ("data.source.features", self.features, 1, 1 << 16),
            ("data.source.classes", self.classes, 2, 1 << 16),
            ("data.source.hidden", self.hidden, 1, 1 << 12),
        ] {
            if !(lo..=hi).contains(&value) {
                return Err(ConfigError::out_of_range(
                    key,
                    value,
                    format!("{lo}..={hi}"),
                ));
            }
        }
        if !(self.sharpness > 0.0 && self.sharpness <= 100.0) {
            return Err(ConfigError::out_of_range(
                "data.source.sharpness",
                self.sharpness,
                "(0, 100]",
            ));
        }
        Ok(())
    }
}

/// The teacher network and scratch space for one forward pass.
#[derive(Debug, Clone)]
struct Teacher {
    config: TeacherConfig,
    /// `[features, hidden]`.
    w1: Vec<f64>,
    /// `[hidden, classes]`.
    w2: Vec<f64>,
    hidden: Vec<f64>,
    probs: Vec<f64>,
}

impl Teacher {
    fn new(config: TeacherConfig, swarm_seed: u64) -> Self {
        let mut rng = Rng::for_stream(&[swarm_seed, tag::TASK]);
        let (f, h, c) = (config.features, config.hidden, config.classes);
        let s1 = 1.0 / (f as f64).sqrt();
        let s2 = 1.0 / (h as f64).sqrt();
        let w1 = (0..f * h).map(|_| rng.normal() * s1).collect();
        let w2 = (0..h * c).map(|_| rng.normal() * s2).collect();
        Self {
            config,
            w1,
            w2,
            hidden: vec![0.0; h],
            probs: vec![0.0; c],
        }
    }

    /// Fills `self.probs` with the label distribution for input `x`.
    fn label_distribution(&mut self, x: &[f32]) {
        let (h, c) = (self.config.hidden, self.config.classes);
        self.hidden.fill(0.0);
        for (i, &xi) in x.iter().enumerate() {
            let row = &self.w1[i * h..(i + 1) * h];
            for (acc, &w) in self.hidden.iter_mut().zip(row) {
                *acc += f64::from(xi) * w;
            }
        }
        self.probs.fill(0.0);
        for (j, acc) in self.hidden.iter().enumerate() {
            let a = acc.tanh();
            let row = &self.w2[j * c..(j + 1) * c];
            for (logit, &w) in self.probs.iter_mut().zip(row) {
                *logit += a * w;
            }
        }
        let sharp = f64::from(self.config.sharpness);
        let max = self.probs.iter().fold(f64::NEG_INFINITY, |m, &l| m.max(l));
        let mut sum = 0.0;
        for p in &mut self.probs {
            *p = ((*p - max) * sharp).exp();
            sum += *p;
        }
        for p in &mut self.probs {
            *p /= sum;
        }
    }

    /// Appends one sample; returns the teacher's probability of the drawn label.
    fn draw(&mut self, rng: &mut Rng, values: &mut Vec<f32>, targets: &mut Vec<u32>) -> f64 {
        let start = values.len();
        values.extend((0..self.config.features).map(|_| rng.normal() as f32));
        let x = &values[start..];
        self.label_distribution(x);
        let u = rng.next_f64();
        let mut acc = 0.0;
        let mut label = self.config.classes - 1;
        for (k, &p) in self.probs.iter().enumerate() {
            acc += p;
            if u < acc {
                label = k;
                break;
            }
        }
        targets.push(label as u32);
        self.probs[label]
    }
}

/// The synthetic-classification dataset for one peer.
#[derive(Debug)]
pub struct TeacherDataset {
    teacher: Teacher,
    train_rng: Rng,
    eval: Vec<Batch>,
    floor: f32,
}

impl TeacherDataset {
    /// Draws the teacher and the eval set from the swarm seed; the peer's stream from its seeds.
    pub(crate) fn new(
        config: &TeacherConfig,
        eval_samples: usize,
        rows: usize,
        sampling: PeerSampling,
    ) -> Self {
        let mut teacher = Teacher::new(*config, sampling.swarm_seed);
        let mut eval_rng = Rng::for_stream(&[sampling.swarm_seed, tag::EVAL]);
        let mut nll = 0.0f64;
        let eval = build_eval_set(
            eval_samples,
            rows,
            |n| Batch::features_with_capacity(n, config.features),
            |batch, n| {
                let mut values = batch.take_feature_values();
                for _ in 0..n {
                    nll -= teacher
                        .draw(&mut eval_rng, &mut values, &mut batch.targets)
                        .ln();
                }
                batch.set_features(values, config.features, n);
            },
        );
        let train_rng = Rng::for_stream(&[
            sampling.swarm_seed,
            tag::TRAIN,
            sampling.peer_seed,
            u64::from(sampling.shard),
        ]);
        Self {
            teacher,
            train_rng,
            eval,
            floor: (nll / eval_samples as f64) as f32,
        }
    }
}

impl Dataset for TeacherDataset {
    fn shape(&self) -> DataShape {
        DataShape::Features {
            width: self.teacher.config.features,
            classes: self.teacher.config.classes,
        }
    }

    fn fill_train_batch(&mut self, rows: usize, batch: &mut Batch) {
        let mut values = batch.take_feature_values();
        for _ in 0..rows {
            self.teacher
                .draw(&mut self.train_rng, &mut values, &mut batch.targets);
        }
        batch.set_features(values, self.teacher.config.features, rows);
    }

    fn eval_set(&self) -> &[Batch] {
        &self.eval
    }

    fn loss_floor(&self) -> Option<f32> {
        Some(self.floor)
    }
}

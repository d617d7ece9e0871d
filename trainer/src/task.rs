//! A training task: model, data, optimizer and schedule from one config, plus the presets.

use serde::{Deserialize, Serialize};

use crate::batch::Batch;
use crate::data::{
    DataConfig, DataSource, Dataset, MarkovConfig, PeerSampling, TeacherConfig, open_dataset,
};
use crate::error::{ConfigError, TrainerError};
use crate::model::{Activation, GptConfig, GradWrite, MlpConfig, Model, ModelConfig, ParamTensors};
use crate::optim::{Optimizer, OptimizerConfig};
use crate::schedule::{LrSchedule, ScheduleConfig};

/// The trainer's part of a swarm config: `[model]`, `[data]`, `[optimizer]`, `[schedule]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    /// The model.
    pub model: ModelConfig,
    /// The data.
    pub data: DataConfig,
    /// The optimizer.
    pub optimizer: OptimizerConfig,
    /// The learning-rate schedule.
    pub schedule: ScheduleConfig,
}

impl TaskConfig {
    /// Checks every section and that the model reads what the data yields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate()?;
        self.data.validate()?;
        self.optimizer.validate()?;
        self.schedule.validate()?;
        let gpt = matches!(self.model, ModelConfig::Gpt(_));
        if gpt != self.data.source.yields_tokens() {
            let want = if self.data.source.yields_tokens() {
                "gpt"
            } else {
                "mlp"
            };
            return Err(ConfigError::Incompatible {
                key: "model.kind".into(),
                reason: format!("this data source needs kind = \"{want}\""),
            });
        }
        Ok(())
    }

    /// Opens the data and builds the model, optimizer and schedule for one peer.
    pub fn build(&self, sampling: PeerSampling) -> Result<Task, TrainerError> {
        self.validate()?;
        let dataset = open_dataset(&self.data, self.model.context(), sampling)?;
        let model = Model::new(&self.model, dataset.shape())?;
        let optimizer = Optimizer::new(self.optimizer, model.layout())?;
        let schedule = LrSchedule::new(self.schedule)?;
        Ok(Task {
            model,
            dataset,
            optimizer,
            schedule,
            batch_size: self.data.batch_size,
            micro_batches: 1,
        })
    }
}

/// One peer's model, data stream, optimizer and schedule.
#[derive(Debug)]
pub struct Task {
    /// The model.
    pub model: Model,
    /// This peer's data.
    pub dataset: Box<dyn Dataset>,
    /// The optimizer and its state.
    pub optimizer: Optimizer,
    /// The learning-rate schedule.
    pub schedule: LrSchedule,
    /// Samples per local step (`data.batch_size`).
    pub batch_size: usize,
    /// Passes a local step's batch is cut into (gradient accumulation); 1 by default. It
    /// must divide `batch_size`.
    pub micro_batches: usize,
}

impl Task {
    /// One purely local step: next batch, loss and gradient, optimizer update at the
    /// scheduled rate for `step` and `swarm_batch`. Returns the training loss.
    ///
    /// `batch` and `grad` are the caller's reusable buffers (`grad` has the model's length).
    pub fn local_step(
        &mut self,
        params: &mut [f32],
        batch: &mut Batch,
        grad: &mut [f32],
        step: u64,
        swarm_batch: u64,
    ) -> Result<f32, TrainerError> {
        let loss = self.next_loss_and_grad(params, batch, grad)?;
        let lr = self.schedule.lr(step, swarm_batch);
        self.optimizer.step(params, grad, lr)?;
        Ok(loss)
    }

    /// Loss and gradient of the next `batch_size` samples, in `micro_batches` passes of
    /// `batch_size / micro_batches` samples each (gradient accumulation): `grad` gets the
    /// mean of the passes' gradients, which is the whole batch's up to float rounding, and
    /// only one pass's activations are held at a time. Returns the mean loss.
    ///
    /// `params` is lent to the model for the passes and holds its values again on return,
    /// error or not; on the CPU its memory, and `grad`'s, go back to the kernel meanwhile, so
    /// that the passes hold the parameters once and the gradient once.
    pub fn next_loss_and_grad(
        &mut self,
        params: &mut [f32],
        batch: &mut Batch,
        grad: &mut [f32],
    ) -> Result<f32, TrainerError> {
        let passes = self.micro_batches.max(1);
        if !self.batch_size.is_multiple_of(passes) {
            return Err(TrainerError::BatchMismatch {
                reason: format!(
                    "{passes} micro-batches do not divide the batch of {}",
                    self.batch_size
                ),
            });
        }
        TrainerError::check_len("grad", self.model.param_count(), grad.len())?;
        // The first pass overwrites every element: the old gradient's pages can go.
        if self.model.device().is_cpu() {
            crate::pages::release(grad);
        }
        let lent = self.model.lend(params)?;
        let loss = self.passes(&lent, batch, grad, passes);
        self.model.give_back(lent, params)?;
        loss
    }

    fn passes(
        &mut self,
        lent: &ParamTensors,
        batch: &mut Batch,
        grad: &mut [f32],
        passes: usize,
    ) -> Result<f32, TrainerError> {
        let rows = self.batch_size / passes;
        let mut loss = 0.0f32;
        for pass in 0..passes {
            self.dataset.fill_train_batch(rows, batch);
            let write = if pass == 0 {
                GradWrite::Overwrite
            } else {
                GradWrite::Add { scale: 1.0 }
            };
            loss += self.model.pass(lent, batch, grad, write)?;
        }
        if passes > 1 {
            let scale = 1.0 / passes as f32;
            for g in grad.iter_mut() {
                *g *= scale;
            }
            loss *= scale;
        }
        Ok(loss)
    }

    /// Mean loss of `params` over the shared eval set, in passes of a micro-batch's samples
    /// at most. `params` is lent to the model meanwhile ([`Model::evaluate`]).
    pub fn evaluate(&mut self, params: &mut [f32]) -> Result<f32, TrainerError> {
        let rows = self.batch_size / self.micro_batches.max(1);
        self.model.evaluate(params, self.dataset.eval_set(), rows)
    }
}

/// Built-in tasks that need no files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskPreset {
    /// A small GPT learning a sparse 32-state Markov chain (the default for `murmur local`).
    MarkovGpt,
    /// An MLP learning a teacher network's labels.
    TeacherMlp,
    /// The quality benchmark's task: a GPT on a Markov chain with many states and branches,
    /// where the samples one peer sees in a run leave it clearly short of the chain's
    /// entropy rate, so averaging with other peers (more samples per step) shows. Its peak
    /// learning rate is the synchronous ring's best on it, so that the gap a mode closes is
    /// measured against a tuned reference.
    Quality,
}

impl TaskPreset {
    /// Every preset.
    pub const ALL: [TaskPreset; 3] = [
        TaskPreset::MarkovGpt,
        TaskPreset::TeacherMlp,
        TaskPreset::Quality,
    ];

    /// The preset's name, as `murmur local --task` takes it.
    pub fn name(self) -> &'static str {
        match self {
            TaskPreset::MarkovGpt => "markov-gpt",
            TaskPreset::TeacherMlp => "teacher-mlp",
            TaskPreset::Quality => "quality",
        }
    }

    /// The task `murmur local` trains by default: small enough that four peers sharing two
    /// cores bring the eval loss most of the way to the Markov chain's entropy rate within
    /// about two minutes.
    pub fn default_local() -> TaskConfig {
        TaskPreset::MarkovGpt.config()
    }

    /// The preset's config.
    pub fn config(self) -> TaskConfig {
        match self {
            TaskPreset::MarkovGpt => TaskConfig {
                model: ModelConfig::Gpt(GptConfig {
                    layers: 2,
                    heads: 2,
                    width: 64,
                    context: 32,
                    vocab: None,
                    mlp_ratio: 4,
                }),
                data: DataConfig {
                    shard: 0,
                    shards: 1,
                    batch_size: 16,
                    eval_samples: 256,
                    source: DataSource::SyntheticMarkov(MarkovConfig {
                        communities: 1,
                        states: 32,
                        branching: 4,
                        skew: 1.0,
                    }),
                },
                optimizer: OptimizerConfig::AdamW {
                    beta1: 0.9,
                    beta2: 0.99,
                    eps: 1e-8,
                    weight_decay: 0.01,
                    moment_bits: 32,
                },
                schedule: ScheduleConfig {
                    peak_lr: 3e-3,
                    warmup_steps: 30,
                    total_steps: 600,
                    min_lr_ratio: 0.1,
                    reference_batch: None,
                },
            },
            TaskPreset::Quality => TaskConfig {
                model: ModelConfig::Gpt(GptConfig {
                    layers: 2,
                    heads: 2,
                    width: 64,
                    context: 32,
                    vocab: None,
                    mlp_ratio: 4,
                }),
                data: DataConfig {
                    shard: 0,
                    shards: 1,
                    batch_size: 8,
                    eval_samples: 256,
                    source: DataSource::SyntheticMarkov(MarkovConfig {
                        communities: 1,
                        states: 256,
                        branching: 16,
                        skew: 1.0,
                    }),
                },
                optimizer: OptimizerConfig::AdamW {
                    beta1: 0.9,
                    beta2: 0.99,
                    eps: 1e-8,
                    weight_decay: 0.01,
                    moment_bits: 32,
                },
                schedule: ScheduleConfig {
                    peak_lr: 1.6e-2,
                    warmup_steps: 30,
                    total_steps: 400,
                    min_lr_ratio: 0.1,
                    reference_batch: None,
                },
            },
            TaskPreset::TeacherMlp => TaskConfig {
                model: ModelConfig::Mlp(MlpConfig {
                    hidden: vec![128, 128],
                    activation: Activation::Relu,
                }),
                data: DataConfig {
                    shard: 0,
                    shards: 1,
                    batch_size: 64,
                    eval_samples: 2048,
                    source: DataSource::SyntheticClassification(TeacherConfig {
                        features: 32,
                        classes: 10,
                        hidden: 64,
                        sharpness: 4.0,
                    }),
                },
                optimizer: OptimizerConfig::SgdNesterov {
                    momentum: 0.9,
                    weight_decay: 1e-4,
                },
                schedule: ScheduleConfig {
                    peak_lr: 0.05,
                    warmup_steps: 50,
                    total_steps: 3000,
                    min_lr_ratio: 0.05,
                    reference_batch: None,
                },
            },
        }
    }
}

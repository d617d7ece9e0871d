//! The built-in models: an MLP classifier and a GPT language model.
//!
//! A model owns no parameters. The caller keeps them in one flat `Vec<f32>` laid out by
//! [`Model::layout`]; every call takes that slice, builds candle tensors from it, and writes
//! the gradient into a flat buffer of the same length.

mod attention;
mod autograd;
mod gelu;
mod gpt;
mod gpt_preset;
mod grad_sink;
mod linear;
mod mlp;
mod projected_loss;

use candle_core::Device;
use serde::{Deserialize, Serialize};

pub use autograd::GradWrite;
pub(crate) use autograd::ParamTensors;
pub use gpt::{Gpt, GptConfig};
pub use gpt_preset::GptPreset;
pub use mlp::{Activation, Mlp, MlpConfig};
pub use projected_loss::BLOCK_LOGITS;

use crate::batch::Batch;
use crate::error::{ConfigError, TrainerError};
use crate::layout::ParamLayout;

/// The `[model]` section: which model and its dimensions.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ModelConfig {
    /// A multi-layer perceptron over feature rows.
    Mlp(MlpConfig),
    /// A decoder-only transformer over token sequences.
    Gpt(GptConfig),
}

impl ModelConfig {
    /// Checks the section on its own.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            ModelConfig::Mlp(c) => c.validate(),
            ModelConfig::Gpt(c) => c.validate(),
        }
    }

    /// The sequence length token data must be cut to (the GPT's context), if any.
    pub fn context(&self) -> Option<usize> {
        match self {
            ModelConfig::Mlp(_) => None,
            ModelConfig::Gpt(c) => Some(c.context),
        }
    }
}

/// What a dataset feeds a model: the dimensions the model's input and output layers need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataShape {
    /// Feature rows with one class label each.
    Features {
        /// Features per row.
        width: usize,
        /// Number of classes.
        classes: usize,
    },
    /// Token sequences with a next-token target per position.
    Tokens {
        /// Token ids are below this.
        vocab: usize,
        /// Tokens per sequence.
        context: usize,
    },
}

/// A built-in model, ready to compute losses and gradients on a flat parameter vector.
#[derive(Debug)]
pub enum Model {
    /// The MLP classifier.
    Mlp(Mlp),
    /// The GPT language model.
    Gpt(Gpt),
}

impl Model {
    /// Builds the model `config` describes for data of shape `data`.
    pub fn new(config: &ModelConfig, data: DataShape) -> Result<Self, ConfigError> {
        match (config, data) {
            (ModelConfig::Mlp(c), DataShape::Features { width, classes }) => {
                Ok(Model::Mlp(Mlp::new(c, width, classes)?))
            }
            (ModelConfig::Gpt(c), DataShape::Tokens { vocab, context }) => {
                if context != c.context {
                    return Err(ConfigError::Incompatible {
                        key: "model.context".into(),
                        reason: format!("the data yields sequences of {context} tokens"),
                    });
                }
                Ok(Model::Gpt(Gpt::new(c, vocab)?))
            }
            (ModelConfig::Mlp(_), DataShape::Tokens { .. }) => Err(ConfigError::Incompatible {
                key: "model.kind".into(),
                reason: "the data yields token sequences; use kind = \"gpt\"".into(),
            }),
            (ModelConfig::Gpt(_), DataShape::Features { .. }) => Err(ConfigError::Incompatible {
                key: "model.kind".into(),
                reason: "the data yields feature rows; use kind = \"mlp\"".into(),
            }),
        }
    }

    /// Where each named tensor lives in the flat parameter vector.
    pub fn layout(&self) -> &ParamLayout {
        match self {
            Model::Mlp(m) => m.layout(),
            Model::Gpt(m) => m.layout(),
        }
    }

    /// Number of parameters (the flat vector's length).
    pub fn param_count(&self) -> usize {
        self.layout().len()
    }

    /// The device the forward and backward passes run on (the CPU unless
    /// [`Model::set_device`] moved the model).
    pub fn device(&self) -> &Device {
        match self {
            Model::Mlp(m) => m.device(),
            Model::Gpt(m) => m.device(),
        }
    }

    /// Runs the model's passes on `device` from now on (see [`crate::TrainerDevice::open`]).
    ///
    /// The parameters stay in the caller's flat host vector: each step copies them to the
    /// device and the gradient back, so averaging and the optimizer never see device memory.
    pub fn set_device(&mut self, device: Device) -> Result<(), TrainerError> {
        match self {
            Model::Mlp(m) => m.set_device(device),
            Model::Gpt(m) => m.set_device(device),
        }
    }

    /// Initial parameters, identical on every peer given the same swarm seed.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        self.layout().init(seed)
    }

    /// Mean loss over the batch (nats per prediction), with its gradient written to `grad_out`.
    ///
    /// `params` and `grad_out` must both have [`Model::param_count`] elements; `grad_out` is
    /// overwritten, not accumulated into.
    pub fn loss_and_grad(
        &mut self,
        params: &[f32],
        batch: &Batch,
        grad_out: &mut [f32],
    ) -> Result<f32, TrainerError> {
        self.loss_and_grad_into(params, batch, grad_out, GradWrite::Overwrite)
    }

    /// Mean loss over the batch, with its gradient written into `grad_out` as `write` says:
    /// [`GradWrite::Add`] sums micro-batches' gradients into one buffer.
    pub fn loss_and_grad_into(
        &mut self,
        params: &[f32],
        batch: &Batch,
        grad_out: &mut [f32],
        write: GradWrite,
    ) -> Result<f32, TrainerError> {
        let tensors = ParamTensors::from_flat(self.layout(), params, self.device(), true)?;
        self.run(&tensors, batch, Some((grad_out, write)))
    }

    /// Whether a training pass keeps only each transformer block's input and computes the
    /// block again in its backward pass: about one block's activations held instead of
    /// every block's, for one more forward pass of compute, the gradient the same up to
    /// float rounding. GPT only; an MLP keeps its few activations either way.
    pub fn set_recompute_activations(&mut self, recompute: bool) {
        if let Model::Gpt(gpt) = self {
            gpt.set_recompute_activations(recompute);
        }
    }

    /// Lends `params` to the model for the passes of one step ([`Model::pass`]), until
    /// [`Model::give_back`]. On the CPU the flat vector's pages go back to the kernel
    /// meanwhile (its values read as zeros until given back), so that the step holds the
    /// parameters once.
    pub(crate) fn lend(&self, params: &mut [f32]) -> Result<ParamTensors, TrainerError> {
        ParamTensors::lend(self.layout(), params, self.device(), true)
    }

    /// Mean loss over the batch at the lent parameters, with its gradient written into
    /// `grad_out` as `write` says.
    pub(crate) fn pass(
        &mut self,
        lent: &ParamTensors,
        batch: &Batch,
        grad_out: &mut [f32],
        write: GradWrite,
    ) -> Result<f32, TrainerError> {
        self.run(lent, batch, Some((grad_out, write)))
    }

    /// Ends a loan: `params` holds its values again.
    pub(crate) fn give_back(
        &self,
        lent: ParamTensors,
        params: &mut [f32],
    ) -> Result<(), TrainerError> {
        lent.give_back(self.layout(), params)
    }

    fn run(
        &self,
        tensors: &ParamTensors,
        batch: &Batch,
        grad_out: Option<(&mut [f32], GradWrite)>,
    ) -> Result<f32, TrainerError> {
        if let Some((grad_out, _)) = &grad_out {
            TrainerError::check_len("grad", self.param_count(), grad_out.len())?;
        }
        let (grad_out, write) = match grad_out {
            Some((grad_out, write)) => (Some(grad_out), write),
            None => (None, GradWrite::Overwrite),
        };
        match self {
            Model::Mlp(m) => m.run(tensors, batch, grad_out, write),
            Model::Gpt(m) => m.run(tensors, batch, grad_out, write),
        }
    }

    /// Mean loss over the batch (nats per prediction), without recording a backward graph.
    pub fn eval_loss(&mut self, params: &[f32], batch: &Batch) -> Result<f32, TrainerError> {
        let tensors = ParamTensors::from_flat(self.layout(), params, self.device(), false)?;
        self.run(&tensors, batch, None)
    }

    /// Mean loss over a whole eval set, each batch weighted by its number of predictions,
    /// in passes of at most `rows` samples (a training pass's), so that an eval holds no
    /// more activations than a step does.
    ///
    /// `params` is lent to the model meanwhile, as for a step's passes (no graph recorded),
    /// and holds its values again on return, error or not.
    pub fn evaluate(
        &mut self,
        params: &mut [f32],
        eval_set: &[Batch],
        rows: usize,
    ) -> Result<f32, TrainerError> {
        let lent = ParamTensors::lend(self.layout(), params, self.device(), false)?;
        let losses = self.eval_passes(&lent, eval_set, rows.max(1));
        self.give_back(lent, params)?;
        let (total, count) = losses?;
        if count == 0 {
            return Err(TrainerError::BatchMismatch {
                reason: "the eval set is empty".into(),
            });
        }
        Ok((total / count as f64) as f32)
    }

    /// The summed loss (weighted by predictions) and the predictions of `eval_set`, in
    /// passes of at most `rows` samples.
    fn eval_passes(
        &mut self,
        lent: &ParamTensors,
        eval_set: &[Batch],
        rows: usize,
    ) -> Result<(f64, usize), TrainerError> {
        let (mut total, mut count) = (0.0f64, 0usize);
        let mut part = None;
        for batch in eval_set {
            let mut start = 0;
            while start < batch.rows {
                let take = rows.min(batch.rows - start);
                let pass = if take == batch.rows {
                    batch
                } else {
                    let part = part.get_or_insert_with(|| batch.clone());
                    batch.copy_rows(start, take, part);
                    &*part
                };
                let loss = self.run(lent, pass, None)?;
                total += f64::from(loss) * pass.predictions() as f64;
                count += pass.predictions();
                start += take;
            }
        }
        Ok((total, count))
    }
}

/// Checks that every id is below `limit` (candle would refuse, with a less helpful message).
pub(crate) fn check_ids(what: &str, ids: &[u32], limit: usize) -> Result<(), TrainerError> {
    match ids.iter().position(|&id| id as usize >= limit) {
        None => Ok(()),
        Some(at) => Err(TrainerError::BatchMismatch {
            reason: format!("{what} {} at position {at} is not below {limit}", ids[at]),
        }),
    }
}

/// Deterministic values in [-scale, scale], different for each `seed`: inputs for the ops'
/// tests.
#[cfg(test)]
pub(crate) fn wave(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + 0.5) * (0.37 + seed as f32)).sin() * scale)
        .collect()
}

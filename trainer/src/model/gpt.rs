//! A decoder-only transformer (GPT-2 shaped: Radford et al. 2019) over token sequences.
//!
//! Pre-norm blocks of causal multi-head self-attention and a GELU MLP, learned positional
//! embeddings, and an output head tied to the token embedding. Weight matrices are stored
//! `[in, out]` and named as in GPT-2 checkpoints (`h.0.attn.c_attn.weight`, …) so exported
//! files read naturally next to them.

use std::ops::Range;
use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use super::attention::causal_weights;
use super::autograd::{GradWrite, ParamTensors, add_rows, layer_norm, with_host_values};
use super::gpt_preset::GptSection;
use super::grad_sink::{GradSink, OpenSink};
use super::linear::linear;
use super::projected_loss::projected_cross_entropy;
use crate::batch::{Batch, BatchInputs};
use crate::error::{ConfigError, TrainerError};
use crate::layout::{Init, ParamLayout};
use crate::transfer;

/// Standard deviation of GPT-2's weight initialisation.
const INIT_STD: f32 = 0.02;
/// Layer-norm epsilon.
const LN_EPS: f64 = 1e-5;
/// Tensors per transformer block in the layout.
const PER_BLOCK: usize = 12;

/// The `[model]` section for `kind = "gpt"`: the shape, written key by key or named by
/// `preset` ([`GptPreset`](super::GptPreset)) with any key overriding the preset's.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "GptSection")]
pub struct GptConfig {
    /// Number of transformer blocks.
    pub layers: usize,
    /// Attention heads per block; must divide `width`.
    pub heads: usize,
    /// Embedding width.
    pub width: usize,
    /// Longest sequence the model reads (positional table size); data windows have this length.
    pub context: usize,
    /// Vocabulary size; defaults to the data's, may be larger (e.g. padded), never smaller.
    pub vocab: Option<usize>,
    /// MLP hidden width as a multiple of `width` (default 4).
    pub mlp_ratio: usize,
}

impl GptConfig {
    /// Checks every dimension and that heads divide the width.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ranges: [(&str, usize, usize, usize); 5] = [
            ("model.layers", self.layers, 1, 64),
            ("model.heads", self.heads, 1, 128),
            ("model.width", self.width, 1, 8192),
            ("model.context", self.context, 1, 2048),
            ("model.mlp_ratio", self.mlp_ratio, 1, 16),
        ];
        for (key, value, lo, hi) in ranges {
            if !(lo..=hi).contains(&value) {
                return Err(ConfigError::out_of_range(
                    key,
                    value,
                    format!("{lo}..={hi}"),
                ));
            }
        }
        if !self.width.is_multiple_of(self.heads) {
            return Err(ConfigError::Incompatible {
                key: "model.heads".into(),
                reason: format!(
                    "{} heads do not divide width {}; pick a divisor of the width",
                    self.heads, self.width
                ),
            });
        }
        if let Some(vocab) = self.vocab
            && !(2..=1 << 24).contains(&vocab)
        {
            return Err(ConfigError::out_of_range(
                "model.vocab",
                vocab,
                "2..=16777216",
            ));
        }
        Ok(())
    }
}

/// The GPT model.
#[derive(Debug)]
pub struct Gpt {
    layout: ParamLayout,
    layers: usize,
    heads: usize,
    width: usize,
    context: usize,
    vocab: usize,
    /// `[context, context]`: 0 on and below the diagonal, −∞ above.
    causal_mask: Tensor,
    device: Device,
    /// Whether a training pass keeps only each block's input and computes the block again
    /// in the backward pass ([`Gpt::set_recompute_activations`]).
    recompute: bool,
}

/// One block's parameter tensors, in layout order.
type BlockParams = [Tensor; PER_BLOCK];

/// Where the ops of one block send their weights' gradients: the sink, and the layout
/// index of the block's first tensor.
type BlockSink<'a> = Option<(&'a Arc<GradSink>, usize)>;

impl Gpt {
    /// Builds the layout for a vocabulary of `vocab` tokens (`config.vocab` overrides if larger).
    pub(crate) fn new(config: &GptConfig, data_vocab: usize) -> Result<Self, ConfigError> {
        config.validate()?;
        let vocab = match config.vocab {
            Some(v) if v < data_vocab => {
                return Err(ConfigError::Incompatible {
                    key: "model.vocab".into(),
                    reason: format!("{v} is smaller than the data's vocabulary of {data_vocab}"),
                });
            }
            Some(v) => v,
            None => data_vocab,
        };
        let (d, l) = (config.width, config.layers);
        let hidden = config.mlp_ratio * d;
        let normal = Init::Normal { std: INIT_STD };
        // Residual projections start smaller so the residual stream's variance does not grow
        // with depth (GPT-2).
        let proj = Init::Normal {
            std: INIT_STD / ((2 * l) as f32).sqrt(),
        };
        let mut layout = ParamLayout::default();
        layout.push("wte.weight".into(), &[vocab, d], true, normal);
        layout.push("wpe.weight".into(), &[config.context, d], true, normal);
        for i in 0..l {
            let p = |s: &str| format!("h.{i}.{s}");
            layout.push(p("ln_1.weight"), &[d], false, Init::Ones);
            layout.push(p("ln_1.bias"), &[d], false, Init::Zeros);
            layout.push(p("attn.c_attn.weight"), &[d, 3 * d], true, normal);
            layout.push(p("attn.c_attn.bias"), &[3 * d], false, Init::Zeros);
            layout.push(p("attn.c_proj.weight"), &[d, d], true, proj);
            layout.push(p("attn.c_proj.bias"), &[d], false, Init::Zeros);
            layout.push(p("ln_2.weight"), &[d], false, Init::Ones);
            layout.push(p("ln_2.bias"), &[d], false, Init::Zeros);
            layout.push(p("mlp.c_fc.weight"), &[d, hidden], true, normal);
            layout.push(p("mlp.c_fc.bias"), &[hidden], false, Init::Zeros);
            layout.push(p("mlp.c_proj.weight"), &[hidden, d], true, proj);
            layout.push(p("mlp.c_proj.bias"), &[d], false, Init::Zeros);
        }
        layout.push("ln_f.weight".into(), &[d], false, Init::Ones);
        layout.push("ln_f.bias".into(), &[d], false, Init::Zeros);

        let device = Device::Cpu;
        let t = config.context;
        let mask: Vec<f32> = (0..t * t)
            .map(|k| {
                if k % t > k / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let causal_mask = Tensor::from_vec(mask, (t, t), &device).map_err(|e| {
            ConfigError::out_of_range("model.context", t, format!("a size candle accepts ({e})"))
        })?;
        Ok(Self {
            layout,
            layers: l,
            heads: config.heads,
            width: d,
            context: t,
            vocab,
            causal_mask,
            device,
            recompute: false,
        })
    }

    /// From now on a training pass keeps only each block's input (a `[tokens, width]`
    /// tensor) instead of every intermediate its backward pass reads, and computes each
    /// block again, one at a time, in the backward pass (activation checkpointing, Chen et
    /// al. 2016): a pass's activations shrink from about `layers` blocks' worth to one, for
    /// one more forward pass of compute. The gradient is the same up to float rounding.
    pub(crate) fn set_recompute_activations(&mut self, recompute: bool) {
        self.recompute = recompute;
    }

    /// The flat-vector layout.
    pub(crate) fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The device the passes run on.
    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// Runs the passes on `device` from now on, moving the causal mask there.
    pub(crate) fn set_device(&mut self, device: Device) -> Result<(), TrainerError> {
        self.causal_mask = self.causal_mask.to_device(&device)?;
        self.device = device;
        Ok(())
    }

    /// The vocabulary size of the embedding and output head.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Mean next-token loss; gradient into `grad_out` when given, as `write` says.
    pub(crate) fn run(
        &self,
        p: &ParamTensors,
        batch: &Batch,
        mut grad_out: Option<&mut [f32]>,
        write: GradWrite,
    ) -> Result<f32, TrainerError> {
        let BatchInputs::Tokens { ids, context: t } = &batch.inputs else {
            return Err(TrainerError::BatchMismatch {
                reason: "the GPT reads token sequences, not feature rows".into(),
            });
        };
        let (rows, t) = (batch.rows, *t);
        let n = rows * t;
        if rows == 0 || t == 0 || t > self.context || ids.len() != n || batch.targets.len() != n {
            return Err(TrainerError::BatchMismatch {
                reason: format!(
                    "expected {rows} sequences of 1..={} tokens with one target each, got {} ids \
                     and {} targets at length {t}",
                    self.context,
                    ids.len(),
                    batch.targets.len()
                ),
            });
        }
        super::check_ids("token", ids, self.vocab)?;
        super::check_ids("target", &batch.targets, self.vocab)?;

        // The weights' gradients go into the flat gradient as the trainer's ops compute
        // them (on the CPU; on a GPU the sink stays empty and the graph carries them).
        let training = grad_out.is_some();
        transfer::uploaded(&self.device, std::mem::size_of_val(ids.as_slice()));
        let id_tensor = Tensor::from_slice(ids, n, &self.device)?;
        // The token rows are looked up outside the graph and enter it as a variable of their
        // own, whose gradient is added into the embedding's rows afterwards: candle's
        // lookup would have summed it into a zeroed copy of the whole embedding, a
        // vocabulary-sized temporary at the end of the backward pass.
        let tok = p.get(0).detach().embedding(&id_tensor)?;
        let tok = if training {
            Var::from_tensor(&tok)?.into_inner()
        } else {
            tok
        };
        let pos = p.get(1).narrow(0, 0, t)?;
        let x = tok
            .reshape((rows, t, self.width))?
            .broadcast_add(&pos)?
            .reshape((n, self.width))?;
        transfer::uploaded(
            &self.device,
            std::mem::size_of_val(batch.targets.as_slice()),
        );
        let shape = PassShape { rows, t };
        // What the backward pass leaves: the loss, the rows' gradient, the tensors whose
        // gradients went through the sink, and the store holding the others'.
        let passed = match grad_out
            .as_deref_mut()
            .map(|grad_out| OpenSink::open(grad_out, &self.layout, write))
        {
            None => {
                let value = self.loss(p, x, shape, &batch.targets, None)?.0;
                return Ok(value);
            }
            Some(open) if self.recompute => {
                let (value, rows_grad) =
                    self.backward_recomputing(p, x, &tok, shape, &batch.targets, open.sink())?;
                (value, rows_grad, open.close(), GradStore::default())
            }
            Some(open) => {
                let (value, loss) = self.loss(p, x, shape, &batch.targets, Some(open.sink()))?;
                let mut grads = loss.backward()?;
                // The graph's activations go before the gradients are moved out.
                drop(loss);
                let rows_grad = grads.remove(&tok);
                (value, rows_grad, open.close(), grads)
            }
        };
        let (value, rows_grad, written, grads) = passed;
        drop(tok);
        let Some(grad_out) = grad_out else {
            unreachable!("the sink was open over the gradient buffer")
        };
        p.write_grads(grads, &self.layout, grad_out, write, &written)?;
        // The looked-up rows' part of the embedding's gradient.
        if let Some(rows_grad) = rows_grad {
            let embedding = self.layout.tensors()[0].range();
            add_rows(&rows_grad, ids, &mut grad_out[embedding], write)?;
        }
        Ok(value)
    }

    /// The blocks, the final layer norm and the loss on the embedded tokens `x`, with a
    /// graph back to whatever `x`'s has; the loss's value, and the loss tensor.
    fn loss(
        &self,
        p: &ParamTensors,
        mut x: Tensor,
        shape: PassShape,
        targets: &[u32],
        sink: Option<&Arc<GradSink>>,
    ) -> Result<(f32, Tensor), TrainerError> {
        for layer in 0..self.layers {
            let first = block_start(layer);
            let w: BlockParams = std::array::from_fn(|k| p.get(first + k).clone());
            x = self.block(&x, &w, sink.map(|sink| (sink, first)), shape)?;
        }
        let loss = self.head(p, &x, targets, sink)?;
        transfer::downloaded(&self.device, std::mem::size_of::<f32>());
        Ok((loss.to_scalar::<f32>()?, loss))
    }

    /// The final layer norm and the loss of `x`, the last block's output.
    fn head(
        &self,
        p: &ParamTensors,
        x: &Tensor,
        targets: &[u32],
        sink: Option<&Arc<GradSink>>,
    ) -> candle_core::Result<Tensor> {
        let last = block_start(self.layers);
        let x = layer_norm(x, p.get(last), p.get(last + 1), LN_EPS)?;
        // The output head is the embedding (tied, layout index 0).
        projected_cross_entropy(&x, p.get(0), targets, sink.map(|sink| (sink, 0)))
    }

    /// One transformer block on `x` (`[tokens, width]`) with parameters `w`.
    fn block(
        &self,
        x: &Tensor,
        w: &BlockParams,
        sink: BlockSink<'_>,
        shape: PassShape,
    ) -> candle_core::Result<Tensor> {
        let PassShape { rows, t } = shape;
        let (d, h) = (self.width, self.heads);
        let (n, hd) = (rows * t, d / h);
        let sink = |k: usize| sink.map(|(sink, first)| (sink, first + k));
        let mask = self.causal_mask.narrow(0, 0, t)?.narrow(1, 0, t)?;
        let scale = 1.0 / (hd as f64).sqrt();
        // Attention.
        let a = layer_norm(x, &w[0], &w[1], LN_EPS)?;
        let qkv = linear(&a, &w[2], sink(2))?.broadcast_add(&w[3])?;
        let qkv = qkv.reshape((rows, t, 3, h, hd))?.permute((2, 0, 3, 1, 4))?;
        let q = qkv.get(0)?.contiguous()?;
        let k = qkv.get(1)?.contiguous()?;
        let v = qkv.get(2)?.contiguous()?;
        let att = causal_weights(&q, &k, scale, &mask)?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape((n, d))?;
        let x = (x + linear(&y, &w[4], sink(4))?.broadcast_add(&w[5])?)?;
        // MLP.
        let m = layer_norm(&x, &w[6], &w[7], LN_EPS)?;
        let m = linear(&m, &w[8], sink(8))?.broadcast_add(&w[9])?;
        let m = super::gelu::apply(&m)?;
        x + linear(&m, &w[10], sink(10))?.broadcast_add(&w[11])?
    }

    /// A training pass that keeps only each block's input: the blocks run forward outside
    /// the graph, then the backward pass goes from the loss down one block at a time,
    /// computing each block again with its graph and sending every parameter's gradient
    /// into `sink`. `x` is the embedded tokens, in the graph of `tok` (the looked-up rows)
    /// and the positional table. Returns the loss and the rows' gradient.
    fn backward_recomputing(
        &self,
        p: &ParamTensors,
        x: Tensor,
        tok: &Tensor,
        shape: PassShape,
        targets: &[u32],
        sink: &Arc<GradSink>,
    ) -> Result<(f32, Option<Tensor>), TrainerError> {
        let mut inputs = Vec::with_capacity(self.layers + 1);
        inputs.push(x.detach());
        for layer in 0..self.layers {
            let first = block_start(layer);
            let w: BlockParams = std::array::from_fn(|k| p.get(first + k).detach());
            let out = self.block(&inputs[layer], &w, None, shape)?;
            inputs.push(out);
        }
        // The head, from the last block's output as a variable of its own.
        let top = Var::from_tensor(&inputs[self.layers])?.into_inner();
        inputs.pop();
        let loss = self.head(p, &top, targets, Some(sink))?;
        transfer::downloaded(&self.device, std::mem::size_of::<f32>());
        let value = loss.to_scalar::<f32>()?;
        let last = block_start(self.layers);
        let mut upstream = backward_to(loss, &top, p, last..last + 2, sink)?;
        drop(top);
        for layer in (0..self.layers).rev() {
            let input = inputs.pop().expect("one input per block");
            let input = Var::from_tensor(&input)?.into_inner();
            let first = block_start(layer);
            let w: BlockParams = std::array::from_fn(|k| p.get(first + k).clone());
            let out = self.block(&input, &w, Some((sink, first)), shape)?;
            let along = (out * &upstream)?.sum_all()?;
            upstream = backward_to(along, &input, p, first..first + PER_BLOCK, sink)?;
        }
        // The embedding: the positional table's gradient, and the looked-up rows'.
        let along = (x * &upstream)?.sum_all()?;
        let mut grads = along.backward()?;
        add_into_sink(&mut grads, p, 1..2, sink)?;
        Ok((value, grads.remove(tok)))
    }
}

/// The rows and sequence length of a pass's batch.
#[derive(Debug, Clone, Copy)]
struct PassShape {
    rows: usize,
    t: usize,
}

/// The layout index of block `layer`'s first tensor (`layers` gives the final layer norm's).
fn block_start(layer: usize) -> usize {
    2 + layer * PER_BLOCK
}

/// Back-propagates `scalar` (a loss, or a block's output against its upstream gradient),
/// sends the gradients of the parameter tensors `indices` into `sink`, and returns the
/// gradient of `input`, detached.
fn backward_to(
    scalar: Tensor,
    input: &Tensor,
    p: &ParamTensors,
    indices: Range<usize>,
    sink: &Arc<GradSink>,
) -> Result<Tensor, TrainerError> {
    let mut grads = scalar.backward()?;
    drop(scalar);
    add_into_sink(&mut grads, p, indices, sink)?;
    let upstream = grads
        .remove(input)
        .ok_or_else(|| candle_core::Error::Msg("a block's input got no gradient".into()))?;
    Ok(upstream.detach())
}

/// Adds the gradients `grads` holds for the parameter tensors `indices` into `sink`,
/// removing each from the store as it goes.
fn add_into_sink(
    grads: &mut GradStore,
    p: &ParamTensors,
    indices: Range<usize>,
    sink: &Arc<GradSink>,
) -> Result<(), TrainerError> {
    for index in indices {
        let Some(grad) = grads.remove(p.get(index)) else {
            continue;
        };
        let mut added = Ok(());
        with_host_values(&grad, grad.elem_count(), |values| {
            added = sink.add_with(index, |out, scale| {
                for (out, &g) in out.iter_mut().zip(values) {
                    *out += scale * g;
                }
            });
        })?;
        added?;
    }
    Ok(())
}

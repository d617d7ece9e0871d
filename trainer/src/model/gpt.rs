//! A decoder-only transformer (GPT-2 shaped: Radford et al. 2019) over token sequences.
//!
//! Pre-norm blocks of causal multi-head self-attention and a GELU MLP, learned positional
//! embeddings, and an output head tied to the token embedding. Weight matrices are stored
//! `[in, out]` and named as in GPT-2 checkpoints (`h.0.attn.c_attn.weight`, …) so exported
//! files read naturally next to them.

use candle_core::{Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use super::attention::causal_weights;
use super::autograd::{GradWrite, ParamTensors, add_rows, layer_norm};
use super::gpt_preset::GptSection;
use super::grad_sink::OpenSink;
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
}

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
        })
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

        let (d, h) = (self.width, self.heads);
        let hd = d / h;
        // The weights' gradients go into the flat gradient as the trainer's ops compute
        // them (on the CPU; on a GPU the sink stays empty and the graph carries them).
        let open = grad_out
            .as_deref_mut()
            .map(|grad_out| OpenSink::open(grad_out, &self.layout, write));
        let sink = |index: usize| open.as_ref().map(|open| (open.sink(), index));
        transfer::uploaded(&self.device, std::mem::size_of_val(ids.as_slice()));
        let id_tensor = Tensor::from_slice(ids, n, &self.device)?;
        // The token rows are looked up outside the graph and enter it as a variable of their
        // own, whose gradient is added into the embedding's rows afterwards: candle's
        // lookup would have summed it into a zeroed copy of the whole embedding, a
        // vocabulary-sized temporary at the end of the backward pass.
        let tok = p.get(0).detach().embedding(&id_tensor)?;
        let tok = if open.is_some() {
            Var::from_tensor(&tok)?.into_inner()
        } else {
            tok
        };
        let pos = p.get(1).narrow(0, 0, t)?;
        let mut x = tok
            .reshape((rows, t, d))?
            .broadcast_add(&pos)?
            .reshape((n, d))?;
        let mask = self.causal_mask.narrow(0, 0, t)?.narrow(1, 0, t)?;
        let scale = 1.0 / (hd as f64).sqrt();
        for layer in 0..self.layers {
            let at = |k: usize| 2 + layer * PER_BLOCK + k;
            let w = |k: usize| p.get(at(k));
            // Attention.
            let a = layer_norm(&x, w(0), w(1), LN_EPS)?;
            let qkv = linear(&a, w(2), sink(at(2)))?.broadcast_add(w(3))?;
            let qkv = qkv.reshape((rows, t, 3, h, hd))?.permute((2, 0, 3, 1, 4))?;
            let q = qkv.get(0)?.contiguous()?;
            let k = qkv.get(1)?.contiguous()?;
            let v = qkv.get(2)?.contiguous()?;
            let att = causal_weights(&q, &k, scale, &mask)?;
            let y = att.matmul(&v)?.transpose(1, 2)?.reshape((n, d))?;
            x = (x + linear(&y, w(4), sink(at(4)))?.broadcast_add(w(5))?)?;
            // MLP.
            let m = layer_norm(&x, w(6), w(7), LN_EPS)?;
            let m = linear(&m, w(8), sink(at(8)))?.broadcast_add(w(9))?;
            let m = super::gelu::apply(&m)?;
            x = (x + linear(&m, w(10), sink(at(10)))?.broadcast_add(w(11))?)?;
        }
        let last = 2 + self.layers * PER_BLOCK;
        let x = layer_norm(&x, p.get(last), p.get(last + 1), LN_EPS)?;
        transfer::uploaded(
            &self.device,
            std::mem::size_of_val(batch.targets.as_slice()),
        );
        // The output head is the embedding (tied, layout index 0).
        let loss = projected_cross_entropy(&x, p.get(0), &batch.targets, sink(0))?;
        transfer::downloaded(&self.device, std::mem::size_of::<f32>());
        let value = loss.to_scalar::<f32>()?;
        let backward = |open: OpenSink<'_>| -> candle_core::Result<_> {
            let mut grads = loss.backward()?;
            // The graph's activations go before the gradients are moved out.
            drop((loss, x));
            let rows_grad = grads.remove(&tok);
            drop(tok);
            Ok((grads, rows_grad, open.close()))
        };
        let Some((grads, rows_grad, written)) = open.map(backward).transpose()? else {
            return Ok(value);
        };
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
}

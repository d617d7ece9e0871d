//! How much memory a config's model needs, estimated before anything is allocated, so that
//! `config check` refuses a model this host cannot hold instead of `run` aborting on an
//! allocation.
//!
//! The estimate is an upper bound with a margin, calibrated on peak resident memory measured
//! per mode at two shapes (BENCHMARKS.md, *What each mode holds, measured again*); it counts
//! - the training state: [`STATE_COPIES`] copies of the parameters (the flat parameters,
//!   the gradient, and what candle holds of them during a pass) and the optimizer's slots,
//!   at the bytes a parameter each keeps (4 in `f32`, a little over 1 for AdamW's moments
//!   in 8 bits);
//! - the averaging mode's buffers: [`averaging_copies`] more copies (push-sum numerators,
//!   one pair of edge references and shares in flight for SGP; a round's vectors and error
//!   feedback's residuals for the others), from peak memory measured per mode and rounded
//!   up, and for SGP with a lossy codec a pair's bytes for every further edge it may keep
//!   ([`SgpConfig::edge_pair_bytes`]; `averaging.sgp.max_edge_references` and
//!   `max_reference_bytes` bound them: [`SgpConfig::references_each_way`]);
//! - the activations one pass keeps for its backward pass (a batch, or one micro-batch of
//!   it) (a GPT's per-token blocks and attention scores, and one block of at most
//!   [`BLOCK_LOGITS`] logits, which the loss computes a block at a time; an MLP's layer
//!   outputs), twice over for their gradients.
//!
//! It is compared with the memory this host has available (`MemAvailable` in
//! `/proc/meminfo`).

use std::fmt;

use murmur_gossip::sgp::SgpConfig;
use murmur_protocol::message::AveragingMode;
use murmur_trainer::{BLOCK_LOGITS, DataShape, ModelConfig, TaskConfig};

/// Copies of the parameter vector a running peer's trainer may hold at once, besides its
/// optimizer's state and a pass's activations. Measured: about 2 for a 124M-parameter GPT
/// alone (`none`) once its 8-bit moments and activations are set aside, and under 2 at 38M.
pub(crate) const STATE_COPIES: u64 = 3;

/// Copies of the parameter vector the averaging of `mode` holds at its peak, beyond the
/// trainer's. Measured as the peak resident memory of two peers in that mode above one
/// peer of `none`, same model and steps, in parameter-vectors (BENCHMARKS.md, *What each
/// mode holds*), then rounded up with a margin.
pub(crate) fn averaging_copies(mode: AveragingMode) -> u64 {
    match mode {
        AveragingMode::Solo => 0,
        // Measured 1.8 (38M) and 1.7 (124M), two peers; error feedback's residuals grow
        // by up to half a vector more where groups change.
        AveragingMode::Butterfly => 3,
        // Measured 2.7 (38M, two peers handing off to each other at the end) and 2.1
        // (124M): numerator, one pair of edge references, shares in pieces, the hand-off.
        AveragingMode::Sgp => 4,
        // Measured 3.8 (38M) and 3.8 (124M): the anchor, the outer momentum, a round's
        // vectors.
        AveragingMode::LocalSgd => 5,
        // Measured 0.0 at 38M (three peers, `f32`), where a round's vectors fit in the
        // pages a step's activations free; a round holds the contribution, segments in
        // flight and, with a lossy codec, residuals of up to a vector.
        AveragingMode::SyncRing => 4,
    }
}

/// How a step's batch goes through the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Passes {
    /// Passes the batch is cut into (gradient accumulation).
    pub(crate) micro_batches: usize,
    /// Whether a GPT pass keeps only each block's input and computes the block again in
    /// the backward pass (`training.recompute_activations`).
    pub(crate) recompute_activations: bool,
}

impl Passes {
    /// One pass a step, every activation kept.
    #[cfg(test)]
    pub(crate) fn whole(micro_batches: usize) -> Passes {
        Passes {
            micro_batches,
            recompute_activations: false,
        }
    }
}

/// Bytes of one `f32`.
const F32: u64 = 4;

/// The estimate for one config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemoryEstimate {
    /// Model parameters.
    pub(crate) params: u64,
    /// Bytes of the training state ([`STATE_COPIES`] copies of the parameters and the
    /// optimizer's slots).
    pub(crate) state_bytes: u64,
    /// The averaging mode.
    pub(crate) mode: AveragingMode,
    /// Bytes of the mode's buffers ([`averaging_copies`] copies of the parameters, and two
    /// for each of SGP's edges beyond the first).
    pub(crate) averaging_bytes: u64,
    /// SGP with a lossy codec: the edge references kept each way.
    pub(crate) references_each_way: Option<usize>,
    /// Bytes of one pass's activations and their gradients.
    pub(crate) activation_bytes: u64,
}

impl MemoryEstimate {
    /// The whole estimate, in bytes.
    pub(crate) fn total(&self) -> u64 {
        self.state_bytes
            .saturating_add(self.averaging_bytes)
            .saturating_add(self.activation_bytes)
    }
}

impl fmt::Display for MemoryEstimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let references = match self.references_each_way {
            Some(count) => format!(", up to {count} edge references each way"),
            None => String::new(),
        };
        write!(
            f,
            "about {} ({} parameters: {} of training state, {} of averaging buffers ({}{}), \
             {} of activations per pass)",
            Bytes(self.total()),
            self.params,
            Bytes(self.state_bytes),
            Bytes(self.averaging_bytes),
            self.mode,
            references,
            Bytes(self.activation_bytes)
        )
    }
}

/// A byte count in KiB, MiB or GiB.
pub(crate) struct Bytes(pub(crate) u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: f64 = (1u64 << 20) as f64;
        const GIB: f64 = (1u64 << 30) as f64;
        let bytes = self.0 as f64;
        if bytes >= GIB {
            write!(f, "{:.1} GiB", bytes / GIB)
        } else if bytes >= MIB {
            write!(f, "{:.1} MiB", bytes / MIB)
        } else {
            write!(f, "{:.1} KiB", bytes / 1024.0)
        }
    }
}

/// The estimate for `task` with `params` parameters on data of `shape`, each step's batch
/// going through the model as `passes` says, averaged in `mode` (with the settings `sgp`
/// when that is `sgp`).
pub(crate) fn estimate(
    task: &TaskConfig,
    shape: DataShape,
    params: usize,
    passes: Passes,
    mode: AveragingMode,
    sgp: Option<&SgpConfig>,
) -> MemoryEstimate {
    let references_each_way = sgp.and_then(|sgp| sgp.references_each_way(params));
    // The measured copies hold one pair; every further edge adds a pair's bytes.
    let further = match (sgp, references_each_way) {
        (Some(sgp), Some(each_way)) => sgp
            .edge_pair_bytes(params)
            .saturating_mul(each_way as u64 - 1),
        _ => 0,
    };
    let params = params as u64;
    let batch = (task.data.batch_size / passes.micro_batches.max(1)).max(1) as u64;
    // Per sample, and once per pass (a GPT's block of logits).
    let (per_sample, per_pass) = match (&task.model, shape) {
        (ModelConfig::Gpt(gpt), DataShape::Tokens { vocab, context }) => {
            let width = gpt.width as u64;
            let tokens = context.min(gpt.context) as u64;
            let vocab = gpt.vocab.unwrap_or(vocab).max(vocab) as u64;
            let heads = gpt.heads as u64;
            let per_block = tokens
                .saturating_mul(width.saturating_mul(12 + 2 * gpt.mlp_ratio as u64))
                .saturating_add(heads.saturating_mul(tokens).saturating_mul(tokens) * 2);
            // Computed again in the backward pass, the blocks keep their inputs through
            // the pass and one block's intermediates at a time.
            let blocks = if passes.recompute_activations {
                tokens
                    .saturating_mul(width)
                    .saturating_mul(gpt.layers as u64)
                    .saturating_add(per_block)
            } else {
                per_block.saturating_mul(gpt.layers as u64)
            };
            // The final norm's output and the loss's gradient of it; the logits a block
            // of rows at a time, turned into their gradient in place.
            let logits = batch
                .saturating_mul(tokens)
                .saturating_mul(vocab)
                .min(BLOCK_LOGITS as u64);
            (
                blocks.saturating_add(tokens.saturating_mul(width) * 2),
                logits,
            )
        }
        (ModelConfig::Mlp(mlp), DataShape::Features { width, classes }) => {
            let hidden: u64 = mlp.hidden.iter().map(|&h| h as u64).sum();
            ((width as u64 + hidden + classes as u64) * 3, 0)
        }
        // A model and data that do not fit each other were refused before this.
        _ => (0, 0),
    };
    MemoryEstimate {
        params,
        state_bytes: params
            .saturating_mul(STATE_COPIES * F32)
            .saturating_add((params as f64 * task.optimizer.state_bytes_per_param()) as u64),
        mode,
        averaging_bytes: params
            .saturating_mul(averaging_copies(mode) * F32)
            .saturating_add(further),
        references_each_way,
        activation_bytes: per_sample
            .saturating_mul(batch)
            .saturating_add(per_pass)
            .saturating_mul(2 * F32),
    }
}

/// The memory this host has available for a new process, from `/proc/meminfo`; `None`
/// where that cannot be read.
pub(crate) fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

#[cfg(test)]
mod tests {
    use murmur_trainer::{GptConfig, TaskPreset};

    use murmur_protocol::codec::CodecSpec;

    use super::*;
    use crate::config::schema::SgpSection;
    use crate::config::validate::sgp_config;

    /// `[averaging.sgp]`'s defaults with the default codec, `int8:64`.
    fn sgp() -> SgpConfig {
        sgp_config(SgpSection::default(), CodecSpec::parse("int8:64").unwrap())
    }

    #[test]
    fn sgp_counts_a_reference_pair_per_edge_its_byte_budget_holds() {
        let task = TaskPreset::default_local();
        let shape = crate::config::validate::data_shape(&task).expect("a synthetic shape");
        // 124M parameters: a pair of edges keeps two 16-bit references (248 MB each, and
        // their scales) and an int8 share (132 MB), so the default 2 GiB holds three pairs.
        let params = 124_000_000;
        let mut config = sgp();
        let pair = config.edge_pair_bytes(params);
        assert_eq!(
            pair,
            2 * (2 * 124_000_000 + 124_000_000 / 64 * 4) + 131_750_000
        );
        let three = estimate(
            &task,
            shape,
            params,
            Passes::whole(1),
            AveragingMode::Sgp,
            Some(&config),
        );
        assert_eq!(three.references_each_way, Some(3), "{three}");
        assert_eq!(
            three.averaging_bytes,
            params as u64 * averaging_copies(AveragingMode::Sgp) * 4 + 2 * pair
        );
        config.max_reference_bytes = pair;
        let one = estimate(
            &task,
            shape,
            params,
            Passes::whole(1),
            AveragingMode::Sgp,
            Some(&config),
        );
        assert_eq!(one.references_each_way, Some(1), "{one}");
        assert_eq!(
            one.averaging_bytes,
            params as u64 * averaging_copies(AveragingMode::Sgp) * 4
        );
        config.max_reference_bytes = 4 * pair;
        let four = estimate(
            &task,
            shape,
            params,
            Passes::whole(1),
            AveragingMode::Sgp,
            Some(&config),
        );
        assert_eq!(four.references_each_way, Some(4));
        assert_eq!(
            four.averaging_bytes,
            params as u64 * averaging_copies(AveragingMode::Sgp) * 4 + 3 * pair
        );
        assert!(
            four.to_string()
                .contains("up to 4 edge references each way"),
            "{four}"
        );
        // The count bound still holds, and exact shares keep no references.
        config.max_edge_references = 3;
        let three = estimate(
            &task,
            shape,
            params,
            Passes::whole(1),
            AveragingMode::Sgp,
            Some(&config),
        );
        assert_eq!(three.references_each_way, Some(3));
        config.share_codec = CodecSpec::F32;
        let exact = estimate(
            &task,
            shape,
            params,
            Passes::whole(1),
            AveragingMode::Sgp,
            Some(&config),
        );
        assert_eq!(
            (exact.references_each_way, exact.averaging_bytes),
            (None, one.averaging_bytes)
        );
    }

    #[test]
    fn a_64_layer_gpt_of_width_8192_needs_hundreds_of_gib() {
        let mut task = TaskPreset::default_local();
        task.model = ModelConfig::Gpt(GptConfig {
            layers: 64,
            heads: 64,
            width: 8192,
            context: 2048,
            vocab: None,
            mlp_ratio: 4,
        });
        let shape = DataShape::Tokens {
            vocab: 256,
            context: 2048,
        };
        let params = 64 * 12 * 8192 * 8192;
        let estimate = estimate(
            &task,
            shape,
            params,
            Passes::whole(1),
            AveragingMode::Butterfly,
            None,
        );
        assert!(estimate.state_bytes > 500 << 30, "{estimate}");
        assert!(estimate.total() > estimate.state_bytes);
        assert!(estimate.to_string().contains("GiB"), "{estimate}");
    }

    #[test]
    fn the_default_task_needs_little() {
        let task = TaskPreset::default_local();
        let shape = crate::config::validate::data_shape(&task).expect("a synthetic shape");
        let params = crate::config::param_count(&task).expect("a size");
        let estimate = estimate(
            &task,
            shape,
            params,
            Passes::whole(1),
            AveragingMode::Sgp,
            Some(&sgp()),
        );
        assert!(estimate.total() < 256 << 20, "{estimate}");
        let quarter = super::estimate(
            &task,
            shape,
            params,
            Passes::whole(4),
            AveragingMode::Sgp,
            Some(&sgp()),
        );
        assert_eq!(quarter.state_bytes, estimate.state_bytes);
        assert!(
            quarter.activation_bytes * 4 <= estimate.activation_bytes,
            "{quarter}"
        );
        assert!(available_bytes().is_some_and(|b| b > 0));
    }

    #[test]
    fn blocks_computed_again_keep_one_blocks_activations_and_every_blocks_input() {
        let mut task = TaskPreset::default_local();
        task.model = ModelConfig::Gpt(GptConfig {
            layers: 12,
            heads: 12,
            width: 768,
            context: 256,
            vocab: Some(50_257),
            mlp_ratio: 4,
        });
        let shape = crate::config::validate::data_shape(&task).expect("a synthetic shape");
        let params = crate::config::param_count(&task).expect("a size");
        let kept = estimate(
            &task,
            shape,
            params,
            Passes::whole(4),
            AveragingMode::Solo,
            None,
        );
        let again = Passes {
            micro_batches: 4,
            recompute_activations: true,
        };
        let again = estimate(&task, shape, params, again, AveragingMode::Solo, None);
        assert_eq!(again.state_bytes, kept.state_bytes);
        // Per sequence of 256 tokens: 12 blocks of 256·(768·20 + 12·256·2) floats, or 12
        // inputs of 256·768 and one block, and the final norm's output and its gradient;
        // four sequences a pass (16 in 4 micro-batches), whose 4·256·50,257 logits come
        // one block of 4 Mi at a time; twice over for gradients, 4 bytes each.
        let block = 256 * (768 * 20 + 12 * 256 * 2);
        let last = 2 * 256 * 768;
        let logits = 1 << 22;
        assert_eq!(
            kept.activation_bytes,
            ((12 * block + last) * 4 + logits) * 8
        );
        assert_eq!(
            again.activation_bytes,
            ((12 * 256 * 768 + block + last) * 4 + logits) * 8
        );
    }

    #[test]
    fn adams_moments_in_8_bits_count_a_quarter_of_their_f32_bytes() {
        let mut task = TaskPreset::default_local();
        let shape = crate::config::validate::data_shape(&task).expect("a synthetic shape");
        let params = 1_000_000;
        task.optimizer = adamw(32);
        let full = estimate(
            &task,
            shape,
            params,
            Passes::whole(1),
            AveragingMode::Solo,
            None,
        );
        task.optimizer = adamw(8);
        let coded = estimate(
            &task,
            shape,
            params,
            Passes::whole(1),
            AveragingMode::Solo,
            None,
        );
        // 8 bytes a parameter against 2 and two scales per 256.
        assert_eq!(full.state_bytes - coded.state_bytes, 6 * 1_000_000 - 31_250);
    }

    /// Peak resident memory measured per peer (`murmur local --json`, release build,
    /// 2026-12-01; BENCHMARKS.md, *What each mode holds, measured again*) for a GPT of
    /// 38,473,216 parameters: 4 layers, width 512, context 256, GPT-2's vocabulary, 4
    /// sequences a step in one pass, `f32` moments, 10 steps; one peer of `none`, two of
    /// the others, three of the ring (`f32`).
    const MEASURED_38M: [(AveragingMode, u64); 5] = [
        (AveragingMode::Solo, 1_027_473_408),
        (AveragingMode::Butterfly, 1_298_079_744),
        (AveragingMode::Sgp, 1_445_474_304),
        (AveragingMode::LocalSgd, 1_605_242_880),
        (AveragingMode::SyncRing, 1_030_434_816),
    ];

    /// The same for GPT-2 small's shape (123,849,984 parameters: 12 layers, width 768),
    /// 4 sequences a step in 4 micro-batches, blocks computed again, 8-bit moments; `none`
    /// and `local-sgd` 8 and 9 steps (`local-sgd` the one peer that finished), butterfly
    /// and SGP the 20-step runs of issue 24's acceptance (4.575× and 4.93× the
    /// parameters' 495.4 MB).
    const MEASURED_124M: [(AveragingMode, u64); 4] = [
        (AveragingMode::Solo, 1_422_385_152),
        (AveragingMode::Butterfly, 2_266_000_000),
        (AveragingMode::Sgp, 2_442_000_000),
        (AveragingMode::LocalSgd, 3_291_197_440),
    ];

    /// Checks every mode's estimate for `task` against `measured` (`none` first): above
    /// each measurement by more than the spread between peers (15%), the mode's own part
    /// above what it was measured to add to `none`, and (SGP counting the one pair of edge
    /// references two peers keep) at most `most` times the measurement, so that a host that
    /// could hold the run is not refused it.
    fn check_against(
        task: &TaskConfig,
        params: usize,
        passes: Passes,
        measured: &[(AveragingMode, u64)],
        most: f64,
    ) {
        let shape = crate::config::validate::data_shape(task).expect("a synthetic shape");
        let mut sgp = sgp();
        sgp.max_edge_references = 1;
        let none = estimate(task, shape, params, passes, AveragingMode::Solo, None);
        for &(mode, bytes) in measured {
            let settings = (mode == AveragingMode::Sgp).then_some(&sgp);
            let estimated = estimate(task, shape, params, passes, mode, settings);
            let ratio = estimated.total() as f64 / bytes as f64;
            assert!(
                ratio > 1.15 && ratio <= most,
                "{mode}: {estimated} against {bytes} bytes measured: {ratio:.2}×"
            );
            let added = bytes.saturating_sub(measured[0].1);
            assert!(
                estimated.averaging_bytes >= added,
                "{mode}: {estimated} against {added} bytes measured above none"
            );
            assert_eq!(estimated.total() - estimated.averaging_bytes, none.total());
        }
    }

    /// AdamW keeping its moments in `moment_bits` bits.
    fn adamw(moment_bits: u8) -> murmur_trainer::OptimizerConfig {
        murmur_trainer::OptimizerConfig::AdamW {
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            moment_bits,
        }
    }

    /// A GPT of `layers` blocks of `heads` heads and width `width` on GPT-2's vocabulary,
    /// 256 tokens a sequence, 4 sequences a step.
    fn gpt_task(layers: usize, heads: usize, width: usize) -> TaskConfig {
        let mut task = TaskPreset::default_local();
        task.model = ModelConfig::Gpt(GptConfig {
            layers,
            heads,
            width,
            context: 256,
            vocab: Some(50_257),
            mlp_ratio: 4,
        });
        task.data.batch_size = 4;
        task
    }

    #[test]
    fn every_mode_is_estimated_above_what_it_was_measured_to_hold_and_not_far_above() {
        let task = gpt_task(4, 4, 512);
        assert_eq!(crate::config::param_count(&task), Some(38_473_216));
        // 1.8: the ring's round at 38M fits in pages a step's activations free (measured no
        // more than `none`), while its estimate counts its vectors beside them.
        check_against(&task, 38_473_216, Passes::whole(1), &MEASURED_38M, 1.8);
        let mut task = gpt_task(12, 12, 768);
        task.optimizer = adamw(8);
        assert_eq!(crate::config::param_count(&task), Some(123_849_984));
        let passes = Passes {
            micro_batches: 4,
            recompute_activations: true,
        };
        check_against(&task, 123_849_984, passes, &MEASURED_124M, 1.6);
    }
}

//! Datasets: where each peer's training samples and the shared eval set come from.
//!
//! Every dataset gives each peer its own training stream and every peer the same eval set:
//!
//! - **Synthetic tasks** draw fresh samples from a seeded distribution. The task itself (the
//!   teacher network, the Markov chain) and the eval set come from the swarm seed alone; a
//!   peer's training stream comes from the swarm seed, its peer seed and its shard, so two
//!   peers' streams are independent draws (they coincide with probability zero for continuous
//!   inputs and negligibly often for token sequences).
//! - **File datasets** hold a fixed eval split out of training, then cut the rest into
//!   `shards` disjoint parts: peer `shard` reads only part `shard`, so peers with different
//!   shard indices never see the same training sample. Peers that share a shard index (e.g.
//!   an open swarm run with `shards = 1`) draw independent random orders of the same part.
//!
//! Streams are infinite: a peer can ask for as many batches as it trains for.

mod idx;
mod markov;
mod teacher;
mod text;
mod tokens;
mod windows;

use std::fmt::Debug;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use idx::{IDX_TYPE_U8, IdxArray, IdxConfig, IdxDataset, read_idx};
pub use markov::{MarkovChain, MarkovConfig, MarkovDataset};
pub use teacher::{TeacherConfig, TeacherDataset};
pub use text::{BYTE_VOCAB, TextConfig};
pub use tokens::{
    LLMC_HEADER_BYTES, LLMC_MAGIC_U16, LLMC_MAGIC_U32, LLMC_VERSION_U16, LLMC_VERSION_U32,
    TokenFormat, TokensConfig, read_token_file,
};
pub use windows::{TokenStore, WindowDataset};

use crate::batch::Batch;
use crate::error::{ConfigError, DataError, TrainerError};
use crate::model::DataShape;

/// The first two bytes of a gzip stream.
pub(crate) const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Reads a whole file, naming it in the error.
pub(crate) fn read_whole_file(path: &std::path::Path) -> Result<Vec<u8>, DataError> {
    std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Upper bound on `batch_size` and `eval_samples`, to catch typos before allocating.
const MAX_ROWS: usize = 1 << 20;

/// The `[data]` section: the source plus how much each step and the eval set take from it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// Samples (rows) per training step on one peer.
    pub batch_size: usize,
    /// Samples in the held-out eval set (cut into batches of `batch_size`).
    pub eval_samples: usize,
    /// This peer's part of the training data, `0..shards` (see [`PeerSampling::shard`]).
    #[serde(default)]
    pub shard: u32,
    /// How many parts the training data is cut into; 1 = every peer draws from all of it.
    #[serde(default = "one_shard")]
    pub shards: u32,
    /// Where samples come from.
    pub source: DataSource,
}

fn one_shard() -> u32 {
    1
}

/// The most parts `data.shards` may cut the training data into.
pub const MAX_SHARDS: u32 = 4096;

/// The `[data.source]` section.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum DataSource {
    /// Feature rows labelled by a seeded teacher network.
    SyntheticClassification(TeacherConfig),
    /// Token sequences from a seeded Markov chain.
    SyntheticMarkov(MarkovConfig),
    /// Bytes of a text file as tokens (vocabulary 256).
    Text(TextConfig),
    /// A token-shard file as nanoGPT or llm.c write them.
    Tokens(TokensConfig),
    /// MNIST-format image and label files.
    Idx(IdxConfig),
}

impl DataSource {
    /// Whether the source yields token sequences (for a GPT) rather than feature rows.
    pub fn yields_tokens(&self) -> bool {
        matches!(
            self,
            DataSource::SyntheticMarkov(_) | DataSource::Text(_) | DataSource::Tokens(_)
        )
    }

    /// The files the source reads, for error messages and config checks.
    pub fn files(&self) -> Vec<PathBuf> {
        match self {
            DataSource::SyntheticClassification(_) | DataSource::SyntheticMarkov(_) => vec![],
            DataSource::Text(c) => vec![c.path.clone()],
            DataSource::Tokens(c) => vec![c.path.clone()],
            DataSource::Idx(c) => {
                let mut files = vec![c.images.clone(), c.labels.clone()];
                files.extend(c.eval_images.iter().cloned());
                files.extend(c.eval_labels.iter().cloned());
                files
            }
        }
    }
}

impl DataConfig {
    /// Checks sizes and the source's own settings (files are checked when opened).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("data.batch_size", self.batch_size),
            ("data.eval_samples", self.eval_samples),
        ] {
            if !(1..=MAX_ROWS).contains(&value) {
                return Err(ConfigError::out_of_range(
                    key,
                    value,
                    format!("1..={MAX_ROWS}"),
                ));
            }
        }
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err(ConfigError::out_of_range(
                "data.shards",
                self.shards,
                format!("1..={MAX_SHARDS}"),
            ));
        }
        if self.shard >= self.shards {
            return Err(ConfigError::out_of_range(
                "data.shard",
                self.shard,
                format!("0..{} (below data.shards)", self.shards),
            ));
        }
        match &self.source {
            DataSource::SyntheticClassification(c) => c.validate(),
            DataSource::SyntheticMarkov(c) => c.validate(),
            DataSource::Tokens(c) => c.validate(),
            DataSource::Idx(c) => c.validate(),
            DataSource::Text(_) => Ok(()),
        }
    }
}

/// Which training stream a peer draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerSampling {
    /// The swarm's seed: fixes the task and the eval set.
    pub swarm_seed: u64,
    /// This peer's seed (derived from its peer id): fixes its random order.
    pub peer_seed: u64,
    /// This peer's part of the training data, `0..shards`: of a file dataset's training
    /// split, a disjoint part; of a synthetic Markov chain, the states its sequences start
    /// from (the `shard`-th of `shards` equal ranges); of synthetic classification, only its
    /// random stream.
    pub shard: u32,
    /// How many disjoint parts the training split is cut into (at least 1).
    pub shards: u32,
}

impl PeerSampling {
    /// A peer seed from a peer's identity bytes (e.g. its libp2p peer id): distinct ids give
    /// unrelated seeds, and the same id gives the same stream across restarts.
    pub fn seed_from_id(id: &[u8]) -> u64 {
        let words: Vec<u64> = id
            .chunks(8)
            .map(|chunk| {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                u64::from_le_bytes(word)
            })
            .chain(std::iter::once(id.len() as u64))
            .collect();
        crate::rng::derive_seed(&words)
    }

    /// Checks that `shard` is below `shards`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.shards == 0 || self.shard >= self.shards {
            return Err(ConfigError::out_of_range(
                "data shard",
                format!("{} of {}", self.shard, self.shards),
                "shard in 0..shards, shards at least 1",
            ));
        }
        Ok(())
    }
}

/// A source of training batches for one peer and of the eval set shared by all peers.
pub trait Dataset: Debug + Send {
    /// The dimensions the model must take.
    fn shape(&self) -> DataShape;

    /// Replaces `batch`'s contents with the next `rows` samples of this peer's stream,
    /// reusing its allocations. `batch` must have come from this dataset (or
    /// [`Dataset::empty_batch`]).
    fn fill_train_batch(&mut self, rows: usize, batch: &mut Batch);

    /// The next `rows` samples of this peer's stream in a new batch.
    fn train_batch(&mut self, rows: usize) -> Batch {
        let mut batch = self.empty_batch(rows);
        self.fill_train_batch(rows, &mut batch);
        batch
    }

    /// An empty batch of the right kind with room for `rows` samples.
    fn empty_batch(&self, rows: usize) -> Batch {
        match self.shape() {
            DataShape::Features { width, .. } => Batch::features_with_capacity(rows, width),
            DataShape::Tokens { context, .. } => Batch::tokens_with_capacity(rows, context),
        }
    }

    /// The held-out eval set: identical on every peer of the swarm, never trained on.
    fn eval_set(&self) -> &[Batch];

    /// The lowest mean eval loss any model can reach (nats), when the task knows it.
    fn loss_floor(&self) -> Option<f32>;
}

/// Opens the dataset `config` names for one peer.
///
/// `context` is the model's sequence length (required for token sources). Files are read
/// into memory once, here, and checked in full; nothing fails later.
pub fn open_dataset(
    config: &DataConfig,
    context: Option<usize>,
    sampling: PeerSampling,
) -> Result<Box<dyn Dataset>, TrainerError> {
    config.validate()?;
    sampling.validate()?;
    let need_context = || {
        context.ok_or_else(|| ConfigError::Incompatible {
            key: "data.source.kind".into(),
            reason: "token data needs a model with a context length (kind = \"gpt\")".into(),
        })
    };
    let rows = config.batch_size;
    let eval = config.eval_samples;
    Ok(match &config.source {
        DataSource::SyntheticClassification(c) => {
            Box::new(TeacherDataset::new(c, eval, rows, sampling))
        }
        DataSource::SyntheticMarkov(c) => Box::new(MarkovDataset::new(
            c,
            need_context()?,
            eval,
            rows,
            sampling,
        )?),
        DataSource::Text(c) => Box::new(text::open_text(c, need_context()?, eval, rows, sampling)?),
        DataSource::Tokens(c) => Box::new(tokens::open_tokens(
            c,
            need_context()?,
            eval,
            rows,
            sampling,
        )?),
        DataSource::Idx(c) => Box::new(IdxDataset::open(c, eval, rows, sampling)?),
    })
}

/// Cuts `samples` eval rows into batches of at most `rows`, filling each with `fill`.
pub(crate) fn build_eval_set(
    samples: usize,
    rows: usize,
    mut empty: impl FnMut(usize) -> Batch,
    mut fill: impl FnMut(&mut Batch, usize),
) -> Vec<Batch> {
    let mut batches = Vec::with_capacity(samples.div_ceil(rows));
    let mut done = 0;
    while done < samples {
        let take = rows.min(samples - done);
        let mut batch = empty(take);
        fill(&mut batch, take);
        batches.push(batch);
        done += take;
    }
    batches
}

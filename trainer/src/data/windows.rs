//! Fixed-length windows over a token file: the sampler behind `text` and `tokens` data.
//!
//! The file's last `eval_samples × (context + 1)` tokens are the eval set, cut into
//! consecutive non-overlapping windows, the same on every peer. The tokens before them are
//! cut into `shards` contiguous parts; a peer draws windows (with a uniformly random start,
//! from its own seeded generator) lying wholly inside its own part. Windows of peers with
//! different shard indices therefore share no token position, and no training window ever
//! touches the eval tail.

use std::ops::Range;
use std::path::Path;

use super::PeerSampling;
use crate::batch::Batch;
use crate::data::{Dataset, build_eval_set};
use crate::error::DataError;
use crate::model::DataShape;
use crate::rng::{Rng, tag};

/// Tokens of a file, held in memory in their on-disk width (1, 2 or 4 bytes, little-endian).
#[derive(Debug, Clone)]
pub struct TokenStore {
    bytes: Vec<u8>,
    start: usize,
    width: usize,
    count: usize,
}

impl TokenStore {
    /// Tokens of `width` bytes from byte `start` of `bytes` (a trailing partial token is
    /// ignored; callers check lengths first).
    pub(crate) fn new(bytes: Vec<u8>, start: usize, width: usize) -> Self {
        let count = bytes.len().saturating_sub(start) / width;
        Self {
            bytes,
            start,
            width,
            count,
        }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the store holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Byte offset of token `index` in the file.
    pub fn byte_offset(&self, index: usize) -> u64 {
        (self.start + index * self.width) as u64
    }

    /// Token `index`.
    ///
    /// # Panics
    ///
    /// If `index` is not below [`TokenStore::len`].
    pub fn get(&self, index: usize) -> u32 {
        let at = self.start + index * self.width;
        match self.width {
            1 => u32::from(self.bytes[at]),
            2 => u32::from(u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]])),
            _ => u32::from_le_bytes([
                self.bytes[at],
                self.bytes[at + 1],
                self.bytes[at + 2],
                self.bytes[at + 3],
            ]),
        }
    }

    /// The first token not below `vocab`, as (index, token).
    pub fn first_out_of_range(&self, vocab: usize) -> Option<(usize, u32)> {
        (0..self.count)
            .map(|i| (i, self.get(i)))
            .find(|&(_, t)| t as usize >= vocab)
    }
}

/// A token file cut into an eval tail and per-shard training parts.
#[derive(Debug)]
pub struct WindowDataset {
    store: TokenStore,
    vocab: usize,
    context: usize,
    /// Allowed window starts of this peer's shard.
    starts: Range<usize>,
    rng: Rng,
    eval: Vec<Batch>,
}

impl WindowDataset {
    /// Splits `store` for one peer; `path` names the file in errors.
    pub(crate) fn new(
        store: TokenStore,
        path: &Path,
        vocab: usize,
        context: usize,
        eval_samples: usize,
        rows: usize,
        sampling: PeerSampling,
    ) -> Result<Self, DataError> {
        let window = context + 1;
        let shards = sampling.shards as usize;
        let eval_len = eval_samples.saturating_mul(window);
        let needed = eval_len.saturating_add(shards.saturating_mul(window));
        if store.len() < needed {
            return Err(DataError::TooSmall {
                path: path.to_path_buf(),
                what: format!(
                    "holds {} tokens but the eval set needs {eval_len} ({eval_samples} windows \
                     of {window}) and each of {shards} shards at least {window}; lower \
                     `data.eval_samples`, the context or the shard count",
                    store.len()
                ),
            });
        }
        let train_len = store.len() - eval_len;
        let shard = sampling.shard as usize;
        let lo = train_len * shard / shards;
        let hi = train_len * (shard + 1) / shards;
        // hi - lo >= window because train_len >= shards * window.
        let starts = lo..hi - window + 1;

        let mut next_eval_window = 0;
        let eval = build_eval_set(
            eval_samples,
            rows,
            |n| Batch::tokens_with_capacity(n, context),
            |batch, n| {
                let mut ids = batch.take_token_ids();
                for _ in 0..n {
                    let start = train_len + next_eval_window * window;
                    push_window(&store, start, context, &mut ids, &mut batch.targets);
                    next_eval_window += 1;
                }
                batch.set_tokens(ids, context, n);
            },
        );
        let rng = Rng::for_stream(&[
            sampling.swarm_seed,
            tag::TRAIN,
            sampling.peer_seed,
            u64::from(sampling.shard),
        ]);
        Ok(Self {
            store,
            vocab,
            context,
            starts,
            rng,
            eval,
        })
    }

    /// The token store.
    pub fn store(&self) -> &TokenStore {
        &self.store
    }

    /// The window starts this peer may draw (its shard of the training split).
    pub fn train_starts(&self) -> Range<usize> {
        self.starts.clone()
    }
}

/// Appends the window at `start`: `context` inputs and the `context` tokens after each.
fn push_window(
    store: &TokenStore,
    start: usize,
    context: usize,
    ids: &mut Vec<u32>,
    targets: &mut Vec<u32>,
) {
    ids.extend((start..start + context).map(|i| store.get(i)));
    targets.extend((start + 1..start + context + 1).map(|i| store.get(i)));
}

impl Dataset for WindowDataset {
    fn shape(&self) -> DataShape {
        DataShape::Tokens {
            vocab: self.vocab,
            context: self.context,
        }
    }

    fn fill_train_batch(&mut self, rows: usize, batch: &mut Batch) {
        let mut ids = batch.take_token_ids();
        let span = self.starts.len() as u64;
        for _ in 0..rows {
            let start = self.starts.start + self.rng.below(span) as usize;
            push_window(
                &self.store,
                start,
                self.context,
                &mut ids,
                &mut batch.targets,
            );
        }
        batch.set_tokens(ids, self.context, rows);
    }

    fn eval_set(&self) -> &[Batch] {
        &self.eval
    }

    fn loss_floor(&self) -> Option<f32> {
        None
    }
}

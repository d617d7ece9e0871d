//! A batch of samples in flat buffers.

/// A batch's inputs, in the form its model reads.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchInputs {
    /// Dense feature rows for the MLP: `rows × width` values, row-major.
    Features {
        /// The values.
        values: Vec<f32>,
        /// Features per row.
        width: usize,
    },
    /// Token sequences for the GPT: `rows × context` token ids, row-major.
    Tokens {
        /// The token ids.
        ids: Vec<u32>,
        /// Tokens per row.
        context: usize,
    },
}

/// A batch of samples: inputs plus one target class per prediction.
///
/// For feature batches there is one target per row; for token batches one per input token
/// (the next token), so `targets.len() == rows × context`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The inputs.
    pub inputs: BatchInputs,
    /// Target class (or next-token id) per prediction.
    pub targets: Vec<u32>,
    /// Number of samples (rows).
    pub rows: usize,
}

impl Batch {
    /// An empty feature batch with room for `rows` rows of `width` features.
    pub fn features_with_capacity(rows: usize, width: usize) -> Self {
        Self {
            inputs: BatchInputs::Features {
                values: Vec::with_capacity(rows * width),
                width,
            },
            targets: Vec::with_capacity(rows),
            rows: 0,
        }
    }

    /// An empty token batch with room for `rows` sequences of `context` tokens.
    pub fn tokens_with_capacity(rows: usize, context: usize) -> Self {
        Self {
            inputs: BatchInputs::Tokens {
                ids: Vec::with_capacity(rows * context),
                context,
            },
            targets: Vec::with_capacity(rows * context),
            rows: 0,
        }
    }

    /// Number of predictions the loss averages over.
    pub fn predictions(&self) -> usize {
        self.targets.len()
    }

    /// Empties the batch and hands out its feature buffer (empty, capacity kept; a fresh one
    /// if the batch held tokens). Put it back with [`Batch::set_features`].
    pub(crate) fn take_feature_values(&mut self) -> Vec<f32> {
        self.targets.clear();
        self.rows = 0;
        match &mut self.inputs {
            BatchInputs::Features { values, .. } => {
                let mut values = std::mem::take(values);
                values.clear();
                values
            }
            BatchInputs::Tokens { .. } => Vec::new(),
        }
    }

    /// Empties the batch and hands out its token buffer (empty, capacity kept; a fresh one if
    /// the batch held features). Put it back with [`Batch::set_tokens`].
    pub(crate) fn take_token_ids(&mut self) -> Vec<u32> {
        self.targets.clear();
        self.rows = 0;
        match &mut self.inputs {
            BatchInputs::Tokens { ids, .. } => {
                let mut ids = std::mem::take(ids);
                ids.clear();
                ids
            }
            BatchInputs::Features { .. } => Vec::new(),
        }
    }

    /// Stores feature rows (targets are filled separately).
    pub(crate) fn set_features(&mut self, values: Vec<f32>, width: usize, rows: usize) {
        self.inputs = BatchInputs::Features { values, width };
        self.rows = rows;
    }

    /// Makes `into` hold rows `start..start + rows` of this batch (its buffers reused).
    pub(crate) fn copy_rows(&self, start: usize, rows: usize, into: &mut Batch) {
        let per_row = self.targets.len() / self.rows.max(1);
        match &self.inputs {
            BatchInputs::Features { values, width } => {
                let mut part = into.take_feature_values();
                part.extend_from_slice(&values[start * width..(start + rows) * width]);
                into.set_features(part, *width, rows);
            }
            BatchInputs::Tokens { ids, context } => {
                let mut part = into.take_token_ids();
                part.extend_from_slice(&ids[start * context..(start + rows) * context]);
                into.set_tokens(part, *context, rows);
            }
        }
        into.targets
            .extend_from_slice(&self.targets[start * per_row..(start + rows) * per_row]);
    }

    /// Stores token rows (targets are filled separately).
    pub(crate) fn set_tokens(&mut self, ids: Vec<u32>, context: usize, rows: usize) {
        self.inputs = BatchInputs::Tokens { ids, context };
        self.rows = rows;
    }
}

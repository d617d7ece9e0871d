//! text: the bytes of a file as tokens (vocabulary 256), for byte-level language modelling.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::windows::{TokenStore, WindowDataset};
use super::{PeerSampling, read_whole_file};
use crate::error::DataError;

/// Byte-level vocabulary size.
pub const BYTE_VOCAB: usize = 256;

/// The `[data.source]` section for `kind = "text"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    /// The text file (any bytes; UTF-8 is read as its bytes).
    pub path: PathBuf,
}

/// Opens a text file as byte tokens for one peer.
pub(crate) fn open_text(
    config: &TextConfig,
    context: usize,
    eval_samples: usize,
    rows: usize,
    sampling: PeerSampling,
) -> Result<WindowDataset, DataError> {
    let bytes = read_whole_file(&config.path)?;
    if bytes.starts_with(&super::GZIP_MAGIC) {
        return Err(DataError::Compressed {
            path: config.path.clone(),
        });
    }
    let store = TokenStore::new(bytes, 0, 1);
    WindowDataset::new(
        store,
        &config.path,
        BYTE_VOCAB,
        context,
        eval_samples,
        rows,
        sampling,
    )
}

//! tokens: token-shard files as nanoGPT and llm.c write them.
//!
//! - `nanogpt-u16`: raw little-endian `u16` tokens, no header (nanoGPT's `train.bin`).
//! - `raw-u32`: raw little-endian `u32` tokens, no header.
//! - `llmc`: llm.c's shards: a header of 256 little-endian `i32` (magic, version, token count,
//!   zeros) then the tokens. Magic 20240520 with version 1 holds `u16` GPT-2 tokens; magic
//!   20240801 with version 7 holds `u32` Llama 3 tokens. The token count must match the file's
//!   length exactly.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::windows::{TokenStore, WindowDataset};
use super::{GZIP_MAGIC, PeerSampling, read_whole_file};
use crate::error::{ConfigError, DataError};

/// llm.c header length in bytes (256 × i32).
pub const LLMC_HEADER_BYTES: usize = 1024;
/// llm.c magic for GPT-2 (`u16`) shards.
pub const LLMC_MAGIC_U16: i32 = 20240520;
/// llm.c version for GPT-2 (`u16`) shards.
pub const LLMC_VERSION_U16: i32 = 1;
/// llm.c magic for Llama 3 (`u32`) shards.
pub const LLMC_MAGIC_U32: i32 = 20240801;
/// llm.c version for Llama 3 (`u32`) shards.
pub const LLMC_VERSION_U32: i32 = 7;

/// How tokens are stored in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum TokenFormat {
    /// Raw little-endian `u16`, as nanoGPT's `prepare.py` writes.
    #[serde(rename = "nanogpt-u16")]
    NanoGptU16,
    /// Raw little-endian `u32`.
    #[serde(rename = "raw-u32")]
    RawU32,
    /// An llm.c shard (header, then `u16` or `u32` tokens as the header says).
    #[serde(rename = "llmc")]
    LlmC,
}

/// The `[data.source]` section for `kind = "tokens"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokensConfig {
    /// The shard file.
    pub path: PathBuf,
    /// How its tokens are stored.
    pub format: TokenFormat,
    /// Vocabulary size: every token must be below it (50257 for GPT-2).
    pub vocab: usize,
}

impl TokensConfig {
    /// Checks the vocabulary size.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(2..=1 << 24).contains(&self.vocab) {
            return Err(ConfigError::out_of_range(
                "data.source.vocab",
                self.vocab,
                "2..=16777216",
            ));
        }
        Ok(())
    }
}

fn header_i32(bytes: &[u8], index: usize) -> i32 {
    let at = index * 4;
    i32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Reads and checks a token file's framing (not the token values; see
/// [`TokenStore::first_out_of_range`]).
pub fn read_token_file(path: &Path, format: TokenFormat) -> Result<TokenStore, DataError> {
    let bytes = read_whole_file(path)?;
    if bytes.starts_with(&GZIP_MAGIC) {
        return Err(DataError::Compressed {
            path: path.to_path_buf(),
        });
    }
    let len = bytes.len() as u64;
    let (start, width) = match format {
        TokenFormat::NanoGptU16 => (0, 2),
        TokenFormat::RawU32 => (0, 4),
        TokenFormat::LlmC => {
            if bytes.len() < LLMC_HEADER_BYTES {
                return Err(DataError::Length {
                    path: path.to_path_buf(),
                    actual: len,
                    expected_what: format!(
                        "an llm.c shard starts with a {LLMC_HEADER_BYTES}-byte header"
                    ),
                });
            }
            let (magic, version, count) = (
                header_i32(&bytes, 0),
                header_i32(&bytes, 1),
                header_i32(&bytes, 2),
            );
            let (expected_version, width) = match magic {
                LLMC_MAGIC_U16 => (LLMC_VERSION_U16, 2),
                LLMC_MAGIC_U32 => (LLMC_VERSION_U32, 4),
                other => {
                    return Err(DataError::BadHeader {
                        path: path.to_path_buf(),
                        offset: 0,
                        what: format!(
                            "magic {other} is not an llm.c token shard's ({LLMC_MAGIC_U16} for \
                             u16 tokens, {LLMC_MAGIC_U32} for u32 tokens); for a raw file set \
                             `format` to \"nanogpt-u16\" or \"raw-u32\""
                        ),
                    });
                }
            };
            if version != expected_version {
                return Err(DataError::BadHeader {
                    path: path.to_path_buf(),
                    offset: 4,
                    what: format!(
                        "version {version} does not go with magic {magic} (expected \
                         {expected_version})"
                    ),
                });
            }
            let Ok(count) = u64::try_from(count) else {
                return Err(DataError::BadHeader {
                    path: path.to_path_buf(),
                    offset: 8,
                    what: format!("token count {count} is negative"),
                });
            };
            let expected = LLMC_HEADER_BYTES as u64 + count * width as u64;
            if len != expected {
                return Err(DataError::Length {
                    path: path.to_path_buf(),
                    actual: len,
                    expected_what: format!(
                        "the header at byte 8 promises {count} tokens of {width} bytes after \
                         the header ({expected} bytes in all)"
                    ),
                });
            }
            (LLMC_HEADER_BYTES, width)
        }
    };
    if (bytes.len() - start) % width != 0 {
        return Err(DataError::Length {
            path: path.to_path_buf(),
            actual: len,
            expected_what: format!("a whole number of {width}-byte tokens is needed"),
        });
    }
    Ok(TokenStore::new(bytes, start, width))
}

/// Opens a token file for one peer, checking every token against the vocabulary.
pub(crate) fn open_tokens(
    config: &TokensConfig,
    context: usize,
    eval_samples: usize,
    rows: usize,
    sampling: PeerSampling,
) -> Result<WindowDataset, DataError> {
    let store = read_token_file(&config.path, config.format)?;
    if let Some((index, token)) = store.first_out_of_range(config.vocab) {
        return Err(DataError::TokenOutOfRange {
            path: config.path.clone(),
            offset: store.byte_offset(index),
            token,
            vocab: config.vocab,
        });
    }
    WindowDataset::new(
        store,
        &config.path,
        config.vocab,
        context,
        eval_samples,
        rows,
        sampling,
    )
}

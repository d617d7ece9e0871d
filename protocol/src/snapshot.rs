//! A model's training state as one self-checking blob.
//!
//! The same bytes are a checkpoint file on disk and the state a joining peer downloads
//! through state sync (`StateSyncRequest`/`StateSyncResponse`, which carry them in
//! chunks), so a checkpoint can be served as it is and a download can be written as a
//! checkpoint.
//!
//! Layout, little-endian:
//!
//! ```text
//! magic "MRMRSNAP" | version u16 | flags u16 (0) | raw_len u64 | body_len u64
//! | digest [32] = SHA-256 of everything before it and the body | body = zstd(raw)
//! raw: step u64 | samples u64 | push_sum_weight f64 | swarm_id (u8 len, bytes)
//!      | model_fingerprint [32] | tensor count u32
//!      | per tensor: name (u16 len, UTF-8) | elements u64 | elements × f32
//! ```
//!
//! The digest names the snapshot (state sync asks for "the rest of snapshot D"), and a
//! torn or corrupted file fails its check before anything is decompressed. Decoding checks
//! every length against [`SnapshotLimits`] before it allocates, and refuses non-finite
//! parameters.

use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::snapshot_file::decode_body;
use crate::wire::{Reader, Truncated};

/// The magic bytes that open every snapshot.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"MRMRSNAP";
/// The snapshot format this build writes and reads.
pub const SNAPSHOT_VERSION: u16 = 1;
/// Bytes before the compressed body.
pub const SNAPSHOT_HEADER_LEN: usize = 8 + 2 + 2 + 8 + 8 + 32;
const DIGESTED_PREFIX_LEN: usize = SNAPSHOT_HEADER_LEN - 32;

/// One named parameter or optimizer-state tensor, flattened.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    /// The tensor's name (e.g. `params`, `adamw.m`), at most 65,535 bytes of UTF-8.
    pub name: String,
    /// The values, all finite.
    pub data: Vec<f32>,
}

/// Everything a peer needs to continue training where another left off.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Optimizer steps taken.
    pub step: u64,
    /// Training samples behind this state.
    pub samples: u64,
    /// The push-sum weight that goes with the parameters (1 outside SGP).
    pub push_sum_weight: f64,
    /// The swarm the state belongs to.
    pub swarm_id: String,
    /// A hash of the model's definition, so that state is never loaded into another model.
    pub model_fingerprint: [u8; 32],
    /// Parameters and optimizer state.
    pub tensors: Vec<NamedTensor>,
}

/// Bounds checked before a snapshot is decompressed or allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLimits {
    /// The largest uncompressed state accepted, in bytes.
    pub max_raw_len: u64,
    /// The most tensors accepted.
    pub max_tensors: u32,
}

impl Default for SnapshotLimits {
    /// 4 GiB of state in at most 4,096 tensors.
    fn default() -> Self {
        SnapshotLimits {
            max_raw_len: 4 << 30,
            max_tensors: 4096,
        }
    }
}

/// Why a snapshot could not be read or written.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// The bytes do not start with `MRMRSNAP`: not a snapshot.
    #[error("not a murmur snapshot (bad magic)")]
    BadMagic,
    /// Written by a newer murmur.
    #[error(
        "snapshot version {found} is not supported (this build reads version {SNAPSHOT_VERSION})"
    )]
    UnsupportedVersion {
        /// The version found.
        found: u16,
    },
    /// The bytes end early: a torn write or an incomplete download.
    #[error("snapshot is truncated: {0}")]
    Truncated(#[from] Truncated),
    /// The header promises a body of another length than follows it.
    #[error("snapshot body is {found} bytes, the header says {expected}")]
    BodyLength {
        /// Length from the header.
        expected: u64,
        /// Bytes present.
        found: u64,
    },
    /// The content does not match its digest: the file or the download is corrupt.
    #[error("snapshot digest mismatch: the content is corrupt")]
    DigestMismatch,
    /// The state is larger than the limits allow.
    #[error("snapshot holds {raw_len} bytes of state, more than the limit of {limit}")]
    TooLarge {
        /// Uncompressed length from the header.
        raw_len: u64,
        /// The configured limit.
        limit: u64,
    },
    /// zstd could not decompress the body.
    #[error("snapshot body does not decompress: {0}")]
    Decompress(std::io::Error),
    /// zstd could not compress the body.
    #[error("snapshot body does not compress: {0}")]
    Compress(std::io::Error),
    /// The decompressed state is malformed.
    #[error("malformed snapshot: {0}")]
    Malformed(String),
    /// A snapshot file could not be read or written.
    #[error("snapshot file: {0}")]
    Io(std::io::Error),
    /// A parameter is NaN or infinite: the state diverged and must not spread.
    #[error("tensor {tensor:?} holds a non-finite value at element {index}")]
    NonFinite {
        /// The tensor's name.
        tensor: String,
        /// The element's index.
        index: usize,
    },
}

impl Snapshot {
    /// Encodes the snapshot, compressing with zstd at `level` (1 is fast, 19 small). A
    /// checkpoint is better written with [`SnapshotView::write_to`], which needs no copy of
    /// the encoded bytes in memory.
    ///
    /// [`SnapshotView::write_to`]: crate::snapshot_file::SnapshotView::write_to
    pub fn encode(&self, level: i32) -> Result<Vec<u8>, SnapshotError> {
        self.view().encode(level)
    }

    /// Checks and decodes a snapshot.
    pub fn decode(bytes: &[u8], limits: &SnapshotLimits) -> Result<Snapshot, SnapshotError> {
        let header = SnapshotHeader::parse(bytes, limits)?;
        let body = &bytes[SNAPSHOT_HEADER_LEN..];
        if body.len() as u64 != header.body_len {
            return Err(SnapshotError::BodyLength {
                expected: header.body_len,
                found: body.len() as u64,
            });
        }
        let digest = Sha256::new()
            .chain_update(&bytes[..DIGESTED_PREFIX_LEN])
            .chain_update(body)
            .finalize();
        if digest.as_slice() != header.digest {
            return Err(SnapshotError::DigestMismatch);
        }
        // Decoded as it decompresses: the state is never held uncompressed beside it.
        decode_body(body, header.raw_len, limits)
    }

    /// The digest that names an encoded snapshot, read from its header (not recomputed).
    pub fn digest_of(bytes: &[u8]) -> Result<[u8; 32], SnapshotError> {
        let limits = SnapshotLimits {
            max_raw_len: u64::MAX,
            max_tensors: u32::MAX,
        };
        Ok(SnapshotHeader::parse(bytes, &limits)?.digest)
    }
}

/// The fixed header, parsed and checked against the limits.
pub(crate) struct SnapshotHeader {
    pub(crate) raw_len: u64,
    pub(crate) body_len: u64,
    pub(crate) digest: [u8; 32],
}

/// The header's bytes before the digest, which the digest covers.
pub(crate) fn digested_prefix(raw_len: u64, body_len: u64) -> [u8; DIGESTED_PREFIX_LEN] {
    let mut out = [0u8; DIGESTED_PREFIX_LEN];
    out[..8].copy_from_slice(&SNAPSHOT_MAGIC);
    out[8..10].copy_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    // flags: 0
    out[12..20].copy_from_slice(&raw_len.to_le_bytes());
    out[20..28].copy_from_slice(&body_len.to_le_bytes());
    out
}

/// Parses and checks the fixed header at the start of `bytes`.
pub(crate) fn parse_header(
    bytes: &[u8],
    limits: &SnapshotLimits,
) -> Result<SnapshotHeader, SnapshotError> {
    SnapshotHeader::parse(bytes, limits)
}

impl SnapshotHeader {
    fn parse(bytes: &[u8], limits: &SnapshotLimits) -> Result<SnapshotHeader, SnapshotError> {
        let mut r = Reader::new(bytes);
        if r.array::<8>("magic")? != SNAPSHOT_MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        let version = r.u16("version")?;
        if version != SNAPSHOT_VERSION {
            return Err(SnapshotError::UnsupportedVersion { found: version });
        }
        let flags = r.u16("flags")?;
        if flags != 0 {
            return Err(SnapshotError::Malformed(format!(
                "unknown flags {flags:#06x}"
            )));
        }
        let raw_len = r.u64("raw_len")?;
        if raw_len > limits.max_raw_len {
            return Err(SnapshotError::TooLarge {
                raw_len,
                limit: limits.max_raw_len,
            });
        }
        let body_len = r.u64("body_len")?;
        let digest = r.array("digest")?;
        Ok(SnapshotHeader {
            raw_len,
            body_len,
            digest,
        })
    }
}

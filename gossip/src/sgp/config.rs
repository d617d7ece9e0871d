//! Settings of the SGP state machine.

use std::time::Duration;

use murmur_protocol::codec::{Codec, CodecSpec};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::SgpError;
use super::reference::reference_bytes;
use super::schedule::OutDegree;

/// Settings of one SGP peer (`averaging.sgp` in a swarm config).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SgpConfig {
    /// Out-peers per step; each receives `1 / (d + 1)` of the peer's mass.
    pub out_degree: OutDegree,
    /// Overlap τ: how many of its own steps a peer may run ahead of shares its transport has
    /// not finished writing.
    ///
    /// Before starting local step `k`, a peer needs every share it sent at a step
    /// `≤ k − 1 − τ` to be written, returned, or timed out. Receipts settle a share's mass
    /// but do not pace steps. With τ = 0 each
    /// step's share is delivered before the next step starts; with τ = 1 one step of
    /// communication overlaps one step of compute. τ bounds only the peer's *own* pipeline:
    /// a peer never waits for shares *to* it, and a share is folded in whenever it arrives,
    /// however old, because dropping it would destroy mass. Consequently every share is
    /// folded in at most τ + 1 of its sender's steps after it was sent (or never, if its
    /// receiver crashed).
    pub staleness: u32,
    /// How long a sent share may wait for its transport to write it before the peer stops
    /// waiting for it (a share returned later is still folded back in), and then for its
    /// receiver's receipt before the peer asks to cancel it (again every period), in
    /// milliseconds.
    pub share_timeout_ms: u64,
    /// How numerator shares are encoded: `f32` (exact) or a lossy codec such as `int8`.
    ///
    /// With a lossy codec a peer quantizes the deviation of its parameters from a reference
    /// it shares with each out-peer, so the error scales with how far the parameters moved
    /// since the last share on that edge, not with their magnitude (see the [module
    /// docs](super)). Each peer then holds one reference vector per recent out-peer and
    /// per recent in-peer, up to [`SgpConfig::max_edge_references`] of each.
    #[serde(
        serialize_with = "serialize_codec",
        deserialize_with = "deserialize_codec"
    )]
    pub share_codec: CodecSpec,
    /// With a lossy share codec: at most this many out-edge and this many in-edge references
    /// are kept; the least recently used is dropped first (its next share starts it again
    /// from the zero reference).
    pub max_edge_references: usize,
    /// With a lossy share codec: at most this many bytes of edge references, both
    /// directions together. Each reference is a whole parameter vector, 16 bits an element, and an
    /// out-edge keeps its last share's payload besides, so this bounds their count by the
    /// model's size ([`SgpConfig::edge_capacity`]); one edge each way is kept whatever the
    /// budget, since every edge in use needs its reference.
    pub max_reference_bytes: u64,
}

/// The least [`SgpConfig::max_reference_bytes`] accepted.
pub const MIN_REFERENCE_BYTES: u64 = 1 << 20;

impl SgpConfig {
    /// Checks every value, naming the key that is out of range.
    pub fn validate(&self) -> Result<(), SgpError> {
        if let OutDegree::Fixed(degree) = self.out_degree
            && !(1..=16).contains(&degree)
        {
            return Err(SgpError::InvalidConfig {
                key: "out_degree",
                value: degree.to_string(),
                allowed: "1 to 16, or \"auto\"",
            });
        }
        if self.staleness > 64 {
            return Err(SgpError::InvalidConfig {
                key: "staleness",
                value: self.staleness.to_string(),
                allowed: "0 to 64",
            });
        }
        if self.share_timeout_ms == 0 {
            return Err(SgpError::InvalidConfig {
                key: "share_timeout_ms",
                value: self.share_timeout_ms.to_string(),
                allowed: "at least 1",
            });
        }
        if self.max_reference_bytes < MIN_REFERENCE_BYTES {
            return Err(SgpError::InvalidConfig {
                key: "max_reference_bytes",
                value: self.max_reference_bytes.to_string(),
                allowed: "at least 1048576",
            });
        }
        if !(1..=1024).contains(&self.max_edge_references) {
            return Err(SgpError::InvalidConfig {
                key: "max_edge_references",
                value: self.max_edge_references.to_string(),
                allowed: "1 to 1024",
            });
        }
        self.share_codec
            .validate()
            .map_err(|error| SgpError::InvalidConfig {
                key: "share_codec",
                value: format!("{} ({error})", self.share_codec),
                allowed: "f32, f16, bf16, int8[:block], int4[:block], sign1[:block], topk[:ppm]",
            })
    }

    /// References a peer keeps in each direction for a model of `len` parameters, with a
    /// lossy codec: [`SgpConfig::max_edge_references`], or fewer where the pairs would pass
    /// [`SgpConfig::max_reference_bytes`] ([`SgpConfig::edge_pair_bytes`] each); at least
    /// one.
    pub fn edge_capacity(&self, len: usize) -> usize {
        let pair = self.edge_pair_bytes(len).max(1);
        let fits = usize::try_from(self.max_reference_bytes / pair).unwrap_or(usize::MAX);
        fits.min(self.max_edge_references).max(1)
    }

    /// The bytes one out-edge and one in-edge keep for a model of `len` parameters: two
    /// references of 16 bits an element, and the out-edge's last share (the codec's
    /// largest payload).
    pub fn edge_pair_bytes(&self, len: usize) -> u64 {
        let references = reference_bytes(len).saturating_mul(2);
        let share = Codec::new(self.share_codec)
            .map_or(len.saturating_mul(4), |codec| codec.max_encoded_len(len));
        references.saturating_add(share as u64)
    }

    /// Edge references a peer keeps each way for a model of `len` parameters: `None` with
    /// exact (`f32`) shares, which keep none, else [`SgpConfig::edge_capacity`].
    pub fn references_each_way(&self, len: usize) -> Option<usize> {
        (self.share_codec != CodecSpec::F32).then(|| self.edge_capacity(len))
    }

    /// The share timeout as a duration.
    pub fn share_timeout(&self) -> Duration {
        Duration::from_millis(self.share_timeout_ms)
    }
}

impl Default for SgpConfig {
    fn default() -> SgpConfig {
        SgpConfig {
            out_degree: OutDegree::Fixed(1),
            staleness: 1,
            share_timeout_ms: 30_000,
            share_codec: CodecSpec::F32,
            max_edge_references: 32,
            max_reference_bytes: 1 << 31,
        }
    }
}

fn serialize_codec<S: Serializer>(codec: &CodecSpec, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(codec)
}

fn deserialize_codec<'de, D: Deserializer<'de>>(deserializer: D) -> Result<CodecSpec, D::Error> {
    let text = String::deserialize(deserializer)?;
    CodecSpec::parse(&text).map_err(serde::de::Error::custom)
}

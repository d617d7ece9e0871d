//! Settings of the synchronous training modes the simulator runs: butterfly and sync-ring.

use murmur_protocol::codec::CodecSpec;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::butterfly::ButterflyConfig;

use super::error::SimError;

/// Butterfly training (`kind = "butterfly"`): peers accumulate gradients until the swarm
/// has processed `target_batch` samples, then average them in butterfly all-reduce groups.
///
/// A peer keeps computing steps while it looks for a group, and contributes everything it
/// has accumulated when its round begins, weighted by samples: a straggler that is mid-step
/// contributes the steps it has finished (possibly none, at weight zero) and does not hold
/// the others back. Its step in progress runs on and counts toward the next batch; no new
/// step starts until the averaged update is applied, since it needs the new parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ButterflyTraining {
    /// Samples the swarm accumulates, all peers together, before it averages.
    pub target_batch: u64,
    /// How long the swarm's gossip (progress towards the batch, and who is looking for a
    /// group) takes to reach every peer, in milliseconds.
    pub gossip_ms: f64,
    /// How chunks are encoded.
    #[serde(
        serialize_with = "serialize_codec",
        deserialize_with = "deserialize_codec"
    )]
    pub codec: CodecSpec,
    /// Matchmaking, chunking and timeouts. A leader gathers as many members as the
    /// membership counts, up to `target_group`.
    pub butterfly: ButterflyConfig,
}

impl Default for ButterflyTraining {
    fn default() -> ButterflyTraining {
        ButterflyTraining {
            target_batch: 4096,
            gossip_ms: 0.0,
            codec: CodecSpec::F32,
            butterfly: ButterflyConfig::default(),
        }
    }
}

/// Synchronous data-parallel training (`kind = "sync-ring"`): after every step all peers
/// average in one ring all-reduce ([`crate::ring::RingAllReduce`]) and wait for it.
///
/// The ring for a step is the membership at the moment the first peer reaches that step's
/// all-reduce (a rendezvous): joins and graceful leaves take effect at step boundaries. A
/// crash stalls the ring until `round_timeout_ms`; then every member applies what reached it
/// (each segment's mean over the members before it back to the crash) and the next step's
/// ring leaves the crashed peer out once the swarm has noticed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RingTraining {
    /// Longest a ring all-reduce may take, from the moment a member starts it, in
    /// milliseconds.
    pub round_timeout_ms: u64,
    /// How segments are encoded.
    #[serde(
        serialize_with = "serialize_codec",
        deserialize_with = "deserialize_codec"
    )]
    pub codec: CodecSpec,
}

impl Default for RingTraining {
    fn default() -> RingTraining {
        RingTraining {
            round_timeout_ms: 30_000,
            codec: CodecSpec::F32,
        }
    }
}

impl ButterflyTraining {
    pub(crate) fn validate(&self) -> Result<(), SimError> {
        if self.target_batch == 0 {
            return Err(invalid("algorithm.target_batch", "0", "at least 1"));
        }
        if !(self.gossip_ms.is_finite() && self.gossip_ms >= 0.0) {
            return Err(invalid(
                "algorithm.gossip_ms",
                &self.gossip_ms.to_string(),
                ">= 0",
            ));
        }
        check_codec(self.codec)?;
        self.butterfly.validate()?;
        if self
            .codec
            .block()
            .is_some_and(|block| !self.butterfly.chunk_elements.is_multiple_of(block))
        {
            return Err(invalid(
                "algorithm.butterfly.chunk_elements",
                &self.butterfly.chunk_elements.to_string(),
                "a multiple of the codec's block size",
            ));
        }
        Ok(())
    }
}

impl RingTraining {
    pub(crate) fn validate(&self) -> Result<(), SimError> {
        if self.round_timeout_ms == 0 {
            return Err(invalid("algorithm.round_timeout_ms", "0", "at least 1"));
        }
        check_codec(self.codec)
    }
}

fn check_codec(codec: CodecSpec) -> Result<(), SimError> {
    codec.validate().map_err(|error| SimError::InvalidScenario {
        key: "algorithm.codec",
        value: format!("{codec} ({error})"),
        allowed: "f32, f16, bf16, int8[:block], int4[:block], sign1[:block], topk[:ppm]",
    })
}

fn invalid(key: &'static str, value: &str, allowed: &'static str) -> SimError {
    SimError::InvalidScenario {
        key,
        value: value.to_owned(),
        allowed,
    }
}

fn serialize_codec<S: Serializer>(codec: &CodecSpec, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(codec)
}

fn deserialize_codec<'de, D: Deserializer<'de>>(deserializer: D) -> Result<CodecSpec, D::Error> {
    let text = String::deserialize(deserializer)?;
    CodecSpec::parse(&text).map_err(serde::de::Error::custom)
}

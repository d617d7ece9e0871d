//! Settings of butterfly all-reduce: matchmaking, chunking, timeouts and clipping.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::ButterflyError;

/// Largest group the wire format can announce (`GroupBegin` lists at most 256 members).
pub const MAX_GROUP: usize = 256;

/// Settings of one butterfly peer (`averaging.butterfly` in a swarm config).
///
/// Timeouts nest: a reducer drops a silent sender after [`chunk_timeout_ms`], and a member
/// gives up on a silent reducer after [`reducer_timeout_ms`], which must be longer, so that
/// a live reducer waiting out a dead sender is not itself taken for dead.
///
/// [`chunk_timeout_ms`]: ButterflyConfig::chunk_timeout_ms
/// [`reducer_timeout_ms`]: ButterflyConfig::reducer_timeout_ms
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ButterflyConfig {
    /// Smallest group worth averaging in; a leader with fewer members at its deadline
    /// disbands its group.
    pub min_group: usize,
    /// Group size a leader gathers before it begins without waiting for its deadline.
    pub target_group: usize,
    /// Longest a peer looks for a group, from the moment it is ready, in milliseconds. A
    /// peer has begun a group or given up for this round by then.
    pub max_wait_ms: u64,
    /// How long before its deadline a leader begins (or disbands) its group, in
    /// milliseconds: time for the announcement to reach its followers before theirs.
    pub begin_margin_ms: u64,
    /// Most looking peers a peer remembers as possible leaders; the earliest deadlines are
    /// kept. Bounds memory in a large swarm.
    pub max_candidates: usize,
    /// Elements per chunk. Parts start on multiples of it, so it must be a multiple of the
    /// codec's block size.
    pub chunk_elements: u32,
    /// Chunks a member may have handed to the transport and not yet seen written, per
    /// destination: the pipeline depth, and the bound on send buffers.
    pub chunks_in_flight: u32,
    /// Sender timeout, in milliseconds: a reducer that has had no chunk of its part from a
    /// sender for this long averages the rest of the part without that sender.
    pub chunk_timeout_ms: u64,
    /// Reducer timeout, in milliseconds: a member that has had no averaged chunk from a
    /// reducer for this long keeps its local values wherever that reducer's averages had
    /// not come.
    pub reducer_timeout_ms: u64,
    /// CenteredClip at the reducer; `None` averages plainly.
    pub clip: Option<ClipConfig>,
    /// A reducer counts a sender's weight (the samples it declares) at most this many
    /// times the median weight declared to it in the round, so that a member inflating
    /// its samples cannot outweigh the others; 0 turns the bound off.
    pub max_weight_ratio: f32,
    /// `butterfly` mode: keep computing gradients while a round forms and runs, towards the
    /// next round. The trainer never idles, but every gradient applied is then one round
    /// stale (computed before the previous round's update), which lowers the learning rate
    /// at which training stays stable. Off, a peer waits for its round's update before its
    /// next gradient, as a synchronous all-reduce does. Other modes always wait.
    pub overlap: bool,
    /// `butterfly` mode: every this many rounds, one round averages the members'
    /// parameters instead of their gradients, and each member takes the average as its
    /// parameters. Averaging gradients keeps whatever difference there is between two
    /// replicas, so replicas that drifted apart (a joiner started from an older snapshot, a
    /// part whose reducer fell silent and kept local values, optimizer states that differ)
    /// never meet again without it. 0 turns it off; 1 is refused (no gradient would be
    /// averaged).
    pub average_params_every: u64,
}

/// CenteredClip at the reducer (Karimireddy, He and Jaggi, 2021).
///
/// Clipping needs every contribution to a chunk buffered until the chunk completes, so a
/// reducer holds up to `members × part` elements instead of `part`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClipConfig {
    /// Clipping radius τ as a root-mean-square per element: a chunk of `n` elements is
    /// clipped at radius `τ·√n`.
    pub tau: f32,
    /// Fixed-point iterations per chunk.
    pub iterations: u32,
    /// Before clipping, contributions farther than this many median distances from the
    /// coordinate-wise median are set aside (a minority at most, in groups of three or
    /// more); 0 turns this off.
    #[serde(default = "ClipConfig::default_reject_factor")]
    pub reject_factor: f32,
}

impl ClipConfig {
    /// The default rejection threshold: four median distances. Honest gradients differ by
    /// noise of one scale, so an honest one is rarely four times the median away.
    pub const DEFAULT_REJECT_FACTOR: f32 = 4.0;

    fn default_reject_factor() -> f32 {
        Self::DEFAULT_REJECT_FACTOR
    }
}

impl ButterflyConfig {
    /// Checks every value, naming the key that is out of range.
    pub fn validate(&self) -> Result<(), ButterflyError> {
        let invalid = |key, value: String, allowed| {
            Err(ButterflyError::InvalidConfig {
                key,
                value,
                allowed,
            })
        };
        if !(2..=MAX_GROUP).contains(&self.min_group) {
            return invalid("min_group", self.min_group.to_string(), "2 to 256");
        }
        if !(self.min_group..=MAX_GROUP).contains(&self.target_group) {
            return invalid(
                "target_group",
                self.target_group.to_string(),
                "min_group to 256",
            );
        }
        if self.max_wait_ms == 0 {
            return invalid("max_wait_ms", self.max_wait_ms.to_string(), "at least 1");
        }
        if self.begin_margin_ms >= self.max_wait_ms {
            return invalid(
                "begin_margin_ms",
                self.begin_margin_ms.to_string(),
                "less than max_wait_ms",
            );
        }
        if !(1..=4096).contains(&self.max_candidates) {
            return invalid(
                "max_candidates",
                self.max_candidates.to_string(),
                "1 to 4096",
            );
        }
        if self.chunk_elements == 0 {
            return invalid(
                "chunk_elements",
                self.chunk_elements.to_string(),
                "at least 1",
            );
        }
        if !(1..=1024).contains(&self.chunks_in_flight) {
            return invalid(
                "chunks_in_flight",
                self.chunks_in_flight.to_string(),
                "1 to 1024",
            );
        }
        if self.chunk_timeout_ms == 0 {
            return invalid(
                "chunk_timeout_ms",
                self.chunk_timeout_ms.to_string(),
                "at least 1",
            );
        }
        if self.reducer_timeout_ms <= self.chunk_timeout_ms {
            return invalid(
                "reducer_timeout_ms",
                self.reducer_timeout_ms.to_string(),
                "more than chunk_timeout_ms",
            );
        }
        if !(self.max_weight_ratio == 0.0 || (1.0..=1e6).contains(&self.max_weight_ratio)) {
            return invalid(
                "max_weight_ratio",
                self.max_weight_ratio.to_string(),
                "0 (off) or 1 to 1e6",
            );
        }
        if self.average_params_every == 1 {
            return invalid(
                "average_params_every",
                self.average_params_every.to_string(),
                "0 (off) or at least 2",
            );
        }
        if let Some(clip) = self.clip {
            // In a pair neither contribution is an outlier to the other, and one flipped
            // ×1000 gradient inflates the other member's optimizer state until it stops
            // training: a member that clips averages in groups of three or more, or alone.
            if self.min_group < 3 {
                return invalid(
                    "min_group",
                    self.min_group.to_string(),
                    "3 to 256 with clipping on (in a pair, neither member can tell the outlier)",
                );
            }
            if !(clip.tau.is_finite() && clip.tau > 0.0) {
                return invalid("clip.tau", clip.tau.to_string(), "a finite number above 0");
            }
            if !(1..=100).contains(&clip.iterations) {
                return invalid("clip.iterations", clip.iterations.to_string(), "1 to 100");
            }
            if !(clip.reject_factor == 0.0 || (1.5..=1e6).contains(&clip.reject_factor)) {
                return invalid(
                    "clip.reject_factor",
                    clip.reject_factor.to_string(),
                    "0 (off) or 1.5 to 1e6",
                );
            }
        }
        Ok(())
    }

    /// The matchmaking bound as a duration.
    pub fn max_wait(&self) -> Duration {
        Duration::from_millis(self.max_wait_ms)
    }

    /// The leader's begin margin as a duration.
    pub fn begin_margin(&self) -> Duration {
        Duration::from_millis(self.begin_margin_ms)
    }

    /// The sender timeout as a duration.
    pub fn chunk_timeout(&self) -> Duration {
        Duration::from_millis(self.chunk_timeout_ms)
    }

    /// The reducer timeout as a duration.
    pub fn reducer_timeout(&self) -> Duration {
        Duration::from_millis(self.reducer_timeout_ms)
    }
}

impl Default for ButterflyConfig {
    fn default() -> ButterflyConfig {
        ButterflyConfig {
            min_group: 2,
            target_group: 16,
            max_wait_ms: 5_000,
            begin_margin_ms: 500,
            max_candidates: 64,
            chunk_elements: 16_384,
            chunks_in_flight: 4,
            chunk_timeout_ms: 10_000,
            reducer_timeout_ms: 15_000,
            clip: None,
            max_weight_ratio: 4.0,
            overlap: false,
            average_params_every: 10,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_needs_groups_of_three() {
        let clip = Some(ClipConfig {
            tau: 1.0,
            iterations: 3,
            reject_factor: ClipConfig::DEFAULT_REJECT_FACTOR,
        });
        let pairs = ButterflyConfig {
            clip,
            ..ButterflyConfig::default()
        };
        assert!(matches!(
            pairs.validate(),
            Err(ButterflyError::InvalidConfig {
                key: "min_group",
                ..
            })
        ));
        let threes = ButterflyConfig {
            min_group: 3,
            ..pairs
        };
        assert!(threes.validate().is_ok());
        assert!(ButterflyConfig::default().validate().is_ok());
    }
}

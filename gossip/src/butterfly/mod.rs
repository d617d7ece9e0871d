//! Butterfly all-reduce: fault-tolerant group averaging for volunteer training.
//!
//! # The algorithm
//!
//! Peers that are ready at about the same time form a *group* ([`Matchmaker`]); the group's
//! leader splits the flat vector into one contiguous *part* per member, sized by bandwidth
//! ([`optimal_fractions`], [`Partition`]), and announces members and parts. Then every
//! member runs a [`ButterflyRound`]:
//!
//! 1. *Reduce-scatter.* Member `i` streams its copy of part `j` to member `j`, its
//!    *reducer*, in chunks. The reducer decode-accumulates each chunk, weighted by the
//!    samples behind the sender's contribution.
//! 2. *All-gather.* As soon as every sender's copy of a chunk has arrived, the reducer
//!    divides by the weight received and streams the averaged chunk back to every member.
//!
//! Chunks are pipelined: encoding, sending, reducing and returning overlap, and each
//! member keeps at most `chunks_in_flight` chunks per destination with the transport, so a
//! slow receiver holds back only its own stream. To each destination a member sends its
//! averages first, but never further along than its part chunks to that destination: the
//! part chunks feed the destination's reduction, which every member waits on. This is the all-reduce of Moshpit SGD
//! (Ryabinin, Gorbunov, Plokhotnyuk and Pekhimenko, "Moshpit SGD: Communication-Efficient
//! Decentralized Training on Heterogeneous Unreliable Devices", NeurIPS 2021) and DeDLOC
//! (Diskin et al., "Distributed Deep Learning in Open Collaborations", NeurIPS 2021), which
//! also sizes parts by bandwidth and gives peers behind NAT no part to reduce.
//!
//! # Every wait is bounded
//!
//! - *Matchmaking* ends by each peer's deadline, `max_wait` after it was ready; leaders are
//!   chosen by a total order so that no two peers wait on each other ([`matchmaking`]).
//! - *Sender timeout.* A reducer that has had no chunk from a sender for `chunk_timeout`
//!   stops waiting for it: the chunks still missing are averaged over the senders that
//!   delivered them, normalised by the weight actually received. Chunks the sender did
//!   deliver keep its contribution, so every element is the weighted mean of exactly the
//!   contributions that reached its reducer.
//! - *Reducer timeout.* A member that has had no averaged chunk from a reducer for
//!   `reducer_timeout` gives up on that reducer's part: the chunks of it that had arrived
//!   keep their averages, and the rest keep the member's local values. (A round averages
//!   the member's vector in place, so local values are wherever no average was written.)
//!
//! Each member reports what it got ([`CoverageReport`]): per chunk, how many contributions
//! the values average and their total weight, and whether it kept local values; and which
//! reducers' parts fell back.
//!
//! # Robust reducers
//!
//! With [`ClipConfig`] a reducer replaces the weighted mean by CenteredClip (Karimireddy,
//! He and Jaggi, "Learning from History for Byzantine Robust Optimization", ICML 2021), as
//! BTARD does at its reducers (Gorbunov, Borzunov, Diskin and Ryabinin, "Secure Distributed
//! Training at Scale", ICML 2022), so that a few peers sending garbage cannot drag the
//! average far. It costs memory: the reducer keeps every contribution to its part.

pub(crate) mod buffers;
mod clip;
mod config;
mod error;
pub(crate) mod finite;
mod group;
pub mod matchmaking;
pub(crate) mod norm;
pub mod partition;
pub(crate) mod payload;
mod reducer;
mod report;
mod round;
mod round_io;

pub use buffers::{FeedbackTally, Residuals, RoundBuffers};
pub use config::{ButterflyConfig, ClipConfig, MAX_GROUP};
pub use error::ButterflyError;
pub use group::Group;
pub use matchmaking::{JoinRequest, MatchInput, MatchOutput, Matchmaker, MemberProfile};
pub use partition::{MemberLink, Partition, member_times, optimal_fractions, round_time};
pub use payload::PayloadRef;
pub use report::{ChunkCoverage, CoverageRange, CoverageReport, PartCoverage, PartOutcome};
pub use round::ButterflyRound;
pub use round_io::{RoundInput, RoundOutput, RoundStats};

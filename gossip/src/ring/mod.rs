//! Synchronous ring all-reduce: the baseline that butterfly all-reduce is measured against.
//!
//! # The algorithm
//!
//! The `N` members stand in a ring, each sending to its successor and receiving from its
//! predecessor; the vector is cut into `N` segments (Patarasuk and Yuan, "Bandwidth Optimal
//! All-reduce Algorithms for Clusters of Workstations", JPDC 2009; the schedule Horovod and
//! NCCL made standard for data-parallel training).
//!
//! 1. *Reduce-scatter*, `N − 1` steps: at step `s` member `i` sends its partial sum of
//!    segment `i − s` and adds the partial sum of segment `i − 1 − s` that arrives from
//!    its predecessor. Afterwards member `i` holds the full sum of segment `i + 1`, divides
//!    it by the total weight, and so holds that segment's weighted mean.
//! 2. *All-gather*, `N − 1` steps: at step `s` member `i` passes segment `i + 1 − s` on and
//!    stores segment `i − s` from its predecessor.
//!
//! Contributions are weighted by the samples behind them: each member starts from
//! `w_i·x_i`, and every message carries the weight of the partial sum it holds. Each step
//! moves `S / N` bytes over every link, so on a uniform link of bandwidth `B` and latency
//! `L` a round takes `2(N − 1)·(S / (N·B) + L)`: bandwidth-optimal, latency-bound.
//!
//! # Not fault tolerant, by design
//!
//! Every step waits for the predecessor's message, with no timeout: a member that dies or
//! stalls stops the whole ring. The only bound is the round's overall deadline, after which
//! the round reports failure. This is the behaviour of the synchronous systems murmur is
//! compared against, kept as it is on purpose. What a failed member applies is each
//! segment's mean over the contributions that reached it (its own values alone where none
//! did): no copy of its contribution is kept for the case.

mod machine;

pub use machine::{RingAllReduce, RingError, RingInput, RingOutput};

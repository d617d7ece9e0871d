//! Stochastic Gradient Push: asynchronous push-sum averaging for decentralized training.
//!
//! # The algorithm
//!
//! SGP (Assran, Loizou, Ballas and Rabbat, "Stochastic Gradient Push for Distributed Deep
//! Learning", ICML 2019) interleaves local optimizer steps with *push-sum* gossip (Kempe,
//! Dobra and Gehrke, "Gossip-Based Computation of Aggregate Information", FOCS 2003).
//! Every peer `i` holds a numerator vector `x_i` and a scalar weight `w_i` (initially its
//! parameters and 1). One step of peer `i` is:
//!
//! 1. compute a stochastic gradient at the de-biased parameters `z_i = x_i / w_i` and apply
//!    the optimizer step to the numerator, `x_i ← x_i − γ·g_i`;
//! 2. keep `1 / (d + 1)` of `(x_i, w_i)` and push a share of `1 / (d + 1)` to each of its
//!    `d` out-peers (one by default, so half is kept and half is sent);
//! 3. add every share `(x, w)` that arrives, whenever it arrives.
//!
//! Mixing only moves mass: the sums `Σ x_i` and `Σ w_i` are invariant, so each `z_i`
//! converges to `Σ x_i / Σ w_i`, the average, even though the graph is directed and the
//! peers never wait for one another. The weights correct for the uneven in-degrees that a
//! directed, time-varying graph has at any moment.
//!
//! # Who sends to whom
//!
//! Out-peers come from the time-varying directed exponential graph ([`ExponentialGraph`])
//! over the peer's [`MembershipView`], which ranks peers by key so that all peers with the
//! same view derive the same graph. With `n` a power of two and peers stepping together, `log₂ n`
//! steps average exactly.
//!
//! # Overlap and staleness
//!
//! A share is folded in the moment it arrives, whatever step its sender was at (overlap
//! SGP). The staleness bound τ ([`SgpConfig::staleness`]) limits how far a peer's compute
//! may run ahead of shares its transport has not yet written; it never makes a peer wait
//! for anyone else, so a straggler slows only its own contribution.
//!
//! # Membership
//!
//! - *Join*: a joiner starts with no mass (`w = 0`) and trains once its first share has
//!   arrived; the swarm's total mass and average are unchanged by the join.
//! - *Graceful leave*: the leaver hands its whole `(x, w)` to its successor in rank order,
//!   forwards whatever still arrives, and departs once the transport wrote every hand-off
//!   (not waiting for receipts, which leavers handing to each other would never settle).
//!   No mass is lost unless a hand-off's connection dies before its heir applies it. A
//!   hand-off that comes back goes out again after [`HANDOFF_RETRY_FIRST`], a wait that
//!   doubles with each return in a row up to [`HANDOFF_RETRY_MAX`].
//! - *Crash*: the crashed peer's mass is lost. The survivors' weights stay positive (a
//!   peer always keeps part of its own mass) and `z = x / w` converges to the weighted
//!   average of the mass that remains, which is still an average of the initial values.
//! - A share its transport could not deliver is given back ([`SgpInput::ShareReturned`])
//!   and folded in again by its sender.
//! - *Receipts*: a share the transport wrote may still never be applied (its connection
//!   closed with the bytes in a buffer). The receiver answers every share it applies with a
//!   receipt ([`SgpOutput::Receipt`]); the sender keeps what it needs to take the share
//!   back until then. Without a receipt within `share_timeout_ms` it asks to cancel the
//!   share ([`SgpOutput::Cancel`]): the receiver answers "applied", or promises never to
//!   apply it, and only then is the mass taken back. A receiver out of the view is asked
//!   once it is back; one that stays away for [`GIVE_UP_AFTER`] deadlines is given up, the
//!   share's mass lost as a crashed peer's is. So a share's mass is counted at most once,
//!   by its receiver or by its sender.
//! - *Restart*: a peer that restarts under the same identity has lost its edge references,
//!   while its neighbours may not have noticed yet. It refuses their quantized shares
//!   ([`SgpError::StaleReference`]) and tells each sender, who takes the share back
//!   ([`SgpInput::ShareRefused`]) and starts that edge again from the zero reference.
//! - *Weight underflow*: crashes lose mass, so under long churn the swarm's total weight
//!   shrinks geometrically, and an `f32` numerator `x = w·z` would underflow to zero. A peer
//!   whose weight falls below [`MIN_WEIGHT`] scales its pair by a power of two before it
//!   pushes ([`PushSumState::renormalize`]): its `z` is unchanged, and so is where the
//!   swarm agrees; only how much each peer's `z` weighs in the mean shifts.

mod config;
mod error;
mod ledger;
mod machine;
mod membership;
mod quantized;
mod receipts;
mod reference;
mod schedule;
mod share;
mod state;

pub use config::{MIN_REFERENCE_BYTES, SgpConfig};
pub use error::SgpError;
pub use machine::{
    GIVE_UP_AFTER, HANDOFF_RETRY_FIRST, HANDOFF_RETRY_MAX, Replayed, SgpInput, SgpOutput, SgpPeer,
    SgpStats,
};
pub use membership::MembershipView;
pub use schedule::{ExponentialGraph, OutDegree};
pub use share::{FRESH_REFERENCE, ShareHeader};
pub use state::{MIN_WEIGHT, PushSumState};

//! murmur's averaging algorithms and the simulator that proves them.
//!
//! Every algorithm here is a sans-IO state machine: it is fed inputs (a local step finished,
//! a share arrived, a peer left) together with the current [`Time`], and it answers with
//! what to send to whom and when to wake it up. It owns no sockets, no clocks and no tasks,
//! so the same code runs under the deterministic simulator in [`sim`] and under the libp2p
//! driver ([`net::driver`]) that `murmur run` uses.
//!
//! - [`sgp`]: Stochastic Gradient Push, asynchronous push-sum averaging over a time-varying
//!   directed exponential graph, with dynamic membership and graceful hand-off on leave.
//! - [`butterfly`]: butterfly all-reduce in groups formed on the fly, with parts sized by
//!   bandwidth, pipelined chunks, sender and reducer timeouts, per-round coverage reports
//!   and optional CenteredClip at the reducers.
//! - [`ring`]: synchronous ring all-reduce, the baseline the benchmarks compare against.
//! - [`engine`]: one averaging engine per training mode, built on the three above:
//!   membership and liveness, matchmaking, the push-sum update, the local-SGD outer step
//!   and error feedback, everything a peer decides about averaging.
//! - [`sim`]: a discrete-event simulator with virtual time, per-direction link bandwidth,
//!   latency and loss, per-peer compute speed and churn schedules. Runs are seeded and
//!   reproducible bit for bit.
//! - [`net`]: the libp2p shell: QUIC transport, DHT and mDNS discovery, invite-based
//!   authorization, signed heartbeat gossip, control requests and backpressured tensor
//!   streams, owned by one task behind a cloneable handle; and [`net::driver`], which runs
//!   an engine over it.
//!
//! Peers are named by any small copyable, ordered key ([`PeerKey`]): the simulator uses
//! integers so that thousands of peers fit in one process, the network layer maps libp2p
//! peer ids onto the same trait.

pub mod butterfly;
pub mod engine;
pub mod net;
pub mod ring;
pub mod sgp;
pub mod sim;

mod parcel;
mod peer;
mod time;
mod vector16;

pub use parcel::{Parcel, ParcelError};
pub use peer::PeerKey;
pub use time::Time;

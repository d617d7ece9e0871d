//! Averaging engines: everything one peer decides about averaging, for one training mode,
//! as a sans-IO state machine.
//!
//! An engine owns the membership view and liveness ([`Membership`]), matchmaking and
//! bandwidth-sized parts, the push-sum update, the local-SGD outer step and error feedback.
//! It is fed [`EngineInput`]s (the trainer's answers, parcels from peers, send reports,
//! membership events, timers) with the current [`Time`], and answers with
//! [`EngineOutput`]s: parcels to send, work for the trainer, heartbeats to publish, peers
//! to disconnect, and [`EngineEvent`]s to report. It reads no clock and owns no socket or
//! task, so the same engine runs under the simulator ([`crate::sim`]) and under the
//! network driver (`net::driver`), which `murmur run` and `murmur bench allreduce` use.
//!
//! One engine per mode, chosen once by [`ModeEngine::new`]:
//!
//! - [`SgpEngine`] (`sgp`): Stochastic Gradient Push every step ([`crate::sgp`]).
//! - [`RoundEngine`] with [`RoundPolicy::Butterfly`] (`butterfly`): gradients accumulate
//!   until the swarm reaches its target batch, then members found by matchmaking average
//!   them in a butterfly all-reduce ([`crate::butterfly`]) and every member applies the
//!   same update.
//! - [`RoundEngine`] with [`RoundPolicy::SyncRing`] (`sync-ring`): every step, the whole
//!   swarm averages its gradients in a ring all-reduce ([`crate::ring`]); the baseline.
//! - [`RoundEngine`] with [`RoundPolicy::LocalSgd`] (`local-sgd`): H local steps, then a
//!   butterfly average of the parameters and an outer Nesterov step on the pseudo-gradient
//!   ([`local_sgd`]).
//!
//! # A gradient's way
//!
//! The trainer's answer ([`WorkDone`]) moves its buffers into the engine; the engine
//! accumulates, encodes the parts with error feedback, and hands [`Parcel`]s to the driver,
//! which writes them to streams. Parcels that arrive are decoded into the engine's
//! reduction buffers as they come; the averaged vector goes back to the trainer in a
//! [`Work::Apply`], in the buffer it came in.

mod collective;
mod early;
mod gathering;
pub mod local_sgd;
mod membership;
mod mode;
pub mod rounds;
pub mod sgp;
mod sgp_pieces;

pub use sgp_pieces::MAX_PIECES as MAX_SHARE_PIECES;
pub mod solo;
mod work;

use std::time::Duration;

use crate::butterfly::ButterflyError;
use crate::parcel::Parcel;
use crate::ring::RingError;
use crate::sgp::SgpError;
use crate::{PeerKey, Time};

pub use collective::RoundReport;
pub use local_sgd::{LocalSgdSettings, OuterStep};
pub use membership::{Beat, Change, Looking, MemberEvent, Membership, SILENCE_INTERVALS};
pub use mode::{AveragingMode, EngineSetup, ModeEngine, ModeSettings, Start};
pub use rounds::{RoundEngine, RoundPolicy, RoundSettings};
pub use sgp::SgpEngine;
pub use solo::SoloEngine;
pub use work::{Work, WorkDone};

/// What happened, as told to an engine.
#[derive(Debug)]
pub enum EngineInput<P> {
    /// The trainer answered the last [`Work`] request.
    WorkDone(WorkDone),
    /// A parcel arrived from `from` (the transport authenticated it). Its buffer becomes
    /// the engine's: it is reused for a send, or comes back in
    /// [`EngineOutput::Recycle`].
    Parcel {
        /// The sender.
        from: P,
        /// The message.
        parcel: Parcel<P>,
    },
    /// The transport is done with a parcel this engine sent: written (`delivered`), or
    /// abandoned. Every [`EngineOutput::Send`] is answered this way, with its tag.
    Sent {
        /// The destination.
        to: P,
        /// The tag of the send.
        tag: u64,
        /// Whether the transport wrote it.
        delivered: bool,
        /// The parcel, handed back.
        parcel: Parcel<P>,
    },
    /// The network layer saw a membership change.
    Member(MemberEvent<P>),
    /// The time [`Engine::poll_timeout`] asked for has come.
    Tick,
    /// Stop: finish the work in flight, emit [`EngineOutput::Finished`], hand off what the
    /// mode must not lose (SGP's mass), then [`EngineOutput::Departed`].
    Finish,
}

/// What an engine asks its caller to do.
#[derive(Debug)]
pub enum EngineOutput<P> {
    /// Send `parcel` to `to`; answer with [`EngineInput::Sent`] and the same tag.
    Send {
        /// The destination.
        to: P,
        /// The engine's tag for the send report.
        tag: u64,
        /// The message.
        parcel: Parcel<P>,
    },
    /// Give the trainer this work; answer with [`EngineInput::WorkDone`].
    Work(Work),
    /// Publish this peer's heartbeat now.
    Heartbeat(Beat),
    /// Close the connections to a peer given up on as silent, so that it must reconnect
    /// (and be admitted again) if it is alive.
    Disconnect(P),
    /// Something to count or log.
    Event(EngineEvent<P>),
    /// Training stopped: the final parameters (SGP: de-biased). The engine may still be
    /// handing off; keep driving it until [`EngineOutput::Departed`]. An SGP joiner stopped
    /// before its first share holds no parameters of the swarm and departs without it.
    Finished(Vec<f32>),
    /// Nothing is left to do: the engine can be dropped.
    Departed,
    /// A payload buffer the engine has no use for, for the caller's pool.
    Recycle(Vec<u8>),
}

/// What a share's refusal led to (SGP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalFate {
    /// This peer refused a share and told its sender.
    Refused,
    /// A share this peer sent was refused, and its mass taken back.
    TakenBack,
    /// A share this peer sent was refused, and its mass could not be taken back.
    Lost,
    /// A share this peer sent had no receipt; asked, its receiver said it never applied it
    /// and never will, and the mass was taken back.
    Cancelled,
}

/// Something an engine reports for metrics and logs.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent<P> {
    /// A round finished (butterfly, sync-ring, local-sgd).
    Round(RoundReport<P>),
    /// A round this peer was due for found no group: it applied its own contribution.
    Alone {
        /// The round.
        round: u64,
    },
    /// A push-sum share's fate (SGP).
    Share {
        /// Its destination.
        to: P,
        /// Whether the transport wrote it.
        delivered: bool,
        /// How long it took.
        took: Duration,
    },
    /// A refused share (SGP).
    Refusal {
        /// The peer on the other side.
        peer: P,
        /// What became of the mass.
        fate: RefusalFate,
    },
    /// A parcel from a peer was refused as bad input; the engine goes on without it.
    BadParcel {
        /// The sender.
        from: P,
        /// Why.
        reason: String,
    },
    /// A peer left the membership (its connection closed, or it fell silent).
    PeerGone {
        /// The peer.
        peer: P,
        /// Other members left in the view.
        remaining: usize,
    },
    /// The relative distance between this peer's parameters and another's (SGP, from an
    /// exact share) or between its contribution and the average (rounds).
    Drift(f64),
    /// This peer's contribution held NaN or infinity (its training diverged): it averaged
    /// with no weight of its own and took the group's result.
    NonFiniteContribution {
        /// The round.
        round: u64,
    },
    /// This peer was behind the swarm's round number and caught up.
    CaughtUp {
        /// Its round before.
        from: u64,
        /// The swarm's.
        to: u64,
    },
}

/// A snapshot of an engine's state, for metrics and status.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineStatus {
    /// The round or SGP step the engine is at.
    pub step: u64,
    /// Other members in the membership view.
    pub peers: usize,
    /// SGP: the push-sum weight `w`.
    pub push_sum_weight: Option<f64>,
    /// SGP: shares sent and received so far.
    pub shares_sent: u64,
    /// SGP: shares received so far.
    pub shares_received: u64,
    /// SGP: shares of this peer's given back to it (by the transport, or refused by their
    /// receiver), their mass folded back in.
    pub shares_returned: u64,
    /// SGP: shares a step kept instead of sending, their edge still waiting for the
    /// receipt of its last one.
    pub shares_held: u64,
    /// SGP: shares sent that no receipt has settled yet.
    pub shares_unsettled: u64,
    /// SGP with a lossy codec: shares that started an edge from the zero reference
    /// ([`crate::sgp::SgpStats::edges_started`]).
    pub edges_started: u64,
    /// Rounds finished (in a group or alone).
    pub rounds: u64,
}

/// An engine failed: a bug or a broken invariant, never a peer's bad input (that is an
/// [`EngineEvent::BadParcel`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The SGP state machine refused an input of this peer's own.
    #[error("SGP: {0}")]
    Sgp(#[from] SgpError),
    /// A butterfly round could not be built or refused an input of this peer's own.
    #[error("butterfly: {0}")]
    Butterfly(#[from] ButterflyError),
    /// A ring round could not be built or refused an input of this peer's own.
    #[error("ring: {0}")]
    Ring(#[from] RingError),
    /// The trainer answered with something the engine did not ask for.
    #[error("the trainer answered a {got} request while the engine waited for {expected}")]
    UnexpectedWork {
        /// What the engine waited for.
        expected: &'static str,
        /// What came.
        got: &'static str,
    },
    /// The trainer's vectors do not have the model's length.
    #[error("the trainer's vector has {got} elements, the model {expected}")]
    LengthMismatch {
        /// The model's length.
        expected: usize,
        /// What came.
        got: usize,
    },
}

/// One peer's averaging, whatever the mode: the interface the simulator and the network
/// driver drive.
pub trait Engine<P: PeerKey> {
    /// Feeds one input at time `now`.
    fn handle(&mut self, now: Time, input: EngineInput<P>) -> Result<(), EngineError>;
    /// The next output, if any.
    fn poll_output(&mut self) -> Option<EngineOutput<P>>;
    /// When the engine wants an [`EngineInput::Tick`].
    fn poll_timeout(&self) -> Option<Time>;
    /// The membership view.
    fn membership(&self) -> &Membership<P>;
    /// A snapshot for metrics.
    fn status(&self) -> EngineStatus;
    /// The upload bandwidth measured on this peer's links, in bytes per second (round modes
    /// size parts by it).
    fn set_measured_upload(&mut self, _bytes_per_s: u64) {}
    /// Whether others found this peer unreachable (AutoNAT: private). Round modes then
    /// declare that it accepts no connections, so it is given no part to reduce.
    fn set_unreachable(&mut self, _unreachable: bool) {}
}

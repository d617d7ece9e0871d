//! The SGP state machine of one peer: inputs in, shares and step permissions out.

use std::collections::VecDeque;
use std::time::Duration;

use murmur_protocol::codec::{Codec, CodecSpec};
use murmur_protocol::message::ShareOutcome;

use crate::{PeerKey, Time};

use super::config::SgpConfig;
use super::error::SgpError;
use super::ledger::{Entry, Ledger, MAX_UNACKNOWLEDGED_EXACT};
use super::membership::MembershipView;
use super::quantized::EdgeReferences;
use super::receipts::Receipts;
use super::schedule::ExponentialGraph;
use super::share::{FRESH_REFERENCE, ShareHeader};
use super::state::{Debias, PushSumState, f32_from_le};

#[path = "lent.rs"]
mod lent;

use self::lent::Deferred;
pub use self::lent::Replayed;

/// What happened, as told to an [`SgpPeer`].
#[derive(Debug, Clone, Copy)]
pub enum SgpInput<'a, P> {
    /// The trainer finished the step it was allowed to start with [`SgpOutput::StartStep`],
    /// having applied its update to the numerator through [`SgpPeer::numerator_mut`], or
    /// to the parameters it was lent and given back ([`SgpPeer::return_parameters`]).
    LocalStepDone,
    /// A share arrived from another peer.
    ShareReceived {
        /// The sender, as the transport authenticated it.
        from: P,
        /// The share's weight, step and sequence number.
        header: ShareHeader,
        /// The numerator share, encoded as the swarm's share codec says.
        payload: &'a [u8],
    },
    /// The transport gave a share back: its receiver is gone (the connection was refused
    /// or closed before the share was taken), or it refused the share with an error for
    /// which [`SgpError::returns_share`] holds. The peer takes the mass back, so that none
    /// is lost.
    ShareReturned {
        /// The receiver that did not take it.
        to: P,
        /// The header the share was sent with.
        header: ShareHeader,
        /// The payload the share was sent with.
        payload: &'a [u8],
        /// The receiver is gone. The peer then drops it from its view at once, before the
        /// membership layer says so; otherwise a leaver could keep handing its mass to a
        /// departed heir.
        receiver_gone: bool,
    },
    /// The receiver of a quantized share refused it after the transport delivered it: it
    /// does not hold the reference the share was built on (it restarted, or dropped the
    /// edge). The peer takes the share back and starts its edge to `by` again from zero;
    /// [`SgpError::NotTakenBack`] when a later share on that edge already replaced it.
    ShareRefused {
        /// The receiver that refused it, as the transport authenticated it.
        by: P,
        /// The refused share's step.
        step: u64,
    },
    /// The receiver of a share this peer sent says what became of it: applied (settled), or
    /// cancelled at this peer's request (the peer takes the mass back).
    ReceiptReceived {
        /// The share's receiver, as the transport authenticated it.
        from: P,
        /// The share's step.
        step: u64,
        /// What the receiver did with it.
        outcome: ShareOutcome,
    },
    /// The sender of a share asks what became of it, having had no receipt; the peer answers
    /// with [`SgpOutput::Receipt`], and never applies the share if it has not yet.
    CancelAsked {
        /// The share's sender, as the transport authenticated it.
        from: P,
        /// The share's step.
        step: u64,
    },
    /// The membership layer saw a new peer.
    PeerJoined(P),
    /// The membership layer saw a peer leave gracefully.
    PeerLeft(P),
    /// The membership layer declared a peer crashed.
    PeerCrashed(P),
    /// The operator asked this peer to leave: hand all mass to a neighbour, then depart.
    Leave,
    /// The time returned by [`SgpPeer::poll_timeout`] has come.
    Tick,
}

/// What an [`SgpPeer`] asks its caller to do.
#[derive(Debug, Clone, PartialEq)]
pub enum SgpOutput<P> {
    /// Send this share to `to`, then report it written with its payload
    /// ([`SgpPeer::delivered`]), or given back ([`SgpInput::ShareReturned`], then hand the
    /// payload buffer back with [`SgpPeer::recycle`]), so that steady-state sharing does not
    /// allocate.
    SendShare {
        /// The receiver.
        to: P,
        /// Weight, step and sequence number.
        header: ShareHeader,
        /// The numerator share.
        payload: Vec<u8>,
    },
    /// Tell `to` what became of its share of `step` (a `ShareReceipt` message).
    Receipt {
        /// The share's sender.
        to: P,
        /// The share's step.
        step: u64,
        /// Applied, or cancelled for good.
        outcome: ShareOutcome,
    },
    /// Ask `to` what became of this peer's share of `step`, which it has not acknowledged (a
    /// `ShareCancel` message).
    Cancel {
        /// The share's receiver.
        to: P,
        /// The share's step.
        step: u64,
    },
    /// The trainer may now compute local step `step` at `z = x / w`.
    StartStep {
        /// The step to compute, counted from zero on this peer.
        step: u64,
    },
    /// The peer has handed off all its mass and may shut down.
    Departed,
}

/// Counters of one peer's sharing, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SgpStats {
    /// Shares sent, hand-offs included.
    pub shares_sent: u64,
    /// Shares received from other peers and acknowledged: folded in, or kept to fold in
    /// when the parameters lent for a step come back.
    pub shares_received: u64,
    /// Shares given back (by the transport, or refused by their receiver), folded back in.
    pub shares_returned: u64,
    /// Shares the peer stopped waiting for after `share_timeout_ms`, the transport never
    /// having reported them.
    pub shares_timed_out: u64,
    /// Shares whose receiver said it applied them.
    pub shares_acknowledged: u64,
    /// Shares taken back after their receiver promised never to apply them.
    pub shares_cancelled: u64,
    /// Shares given up unsettled: their receiver stayed out of the view, unasked, for
    /// [`GIVE_UP_AFTER`] receipt deadlines. Their mass is lost, as a crashed peer's is.
    pub shares_abandoned: u64,
    /// Cancel requests sent.
    pub cancels_sent: u64,
    /// Shares rejected as malformed.
    pub shares_rejected: u64,
    /// Shares a step kept instead of sending, their edge still waiting for the receipt of
    /// its last one (a quantized edge carries one share at a time, an exact edge four):
    /// their mass stays here for a later step.
    pub shares_held: u64,
    /// Quantized shares that started an edge from the zero reference: the first on each
    /// edge, and the first after the edge was dropped (its reference evicted by
    /// `max_edge_references` or `max_reference_bytes`, refused, or timed out). Such a share
    /// quantizes the parameters themselves, not a deviation from them, so a count that
    /// keeps climbing says the edges' references do not last.
    pub edges_started: u64,
}

/// Receipt deadlines (`share_timeout_ms` each) an unsettled share waits for a receiver out
/// of the view before it is given up.
pub const GIVE_UP_AFTER: u32 = 12;

/// How long a leaving peer waits before it hands off again mass whose hand-off came back
/// (the transport could not write it, or its heir refused it). The wait doubles with each
/// return in a row, up to [`HANDOFF_RETRY_MAX`], so that an heir too busy to read its
/// streams is not sent the whole state again within milliseconds, over and over.
pub const HANDOFF_RETRY_FIRST: Duration = Duration::from_millis(50);

/// The longest wait between two hand-offs of returned mass.
pub const HANDOFF_RETRY_MAX: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Holds no mass yet: a joiner waiting for its first share.
    Waiting,
    /// Training and sharing.
    Training,
    /// Handing everything it holds or receives to a neighbour.
    Leaving,
    /// Holds no mass and expects no confirmation.
    Departed,
}

/// Shares' worth of bytes the spare payload buffers may hold in all.
const SPARE_SHARES: usize = 3;

/// The most bytes the spare payload buffers hold in all, whatever a share's size. A peer
/// whose shares are larger (an `int8` share of more than about 63M parameters) allocates
/// each payload afresh: faulting a fresh buffer in costs a fraction of a second, the step
/// before each share far more, and three kept shares would hold 0.8 of the parameters'
/// `f32` bytes through every step.
const SPARE_BYTES: usize = 64 << 20;

/// Where mass folded back into the state came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Absorbed {
    /// A share another peer sent.
    Received,
    /// One of this peer's own shares, taken back.
    Returned,
}

/// How much of the peer's mass a share takes.
#[derive(Debug, Clone, Copy)]
enum Portion {
    Fraction(f32),
    All,
}

/// One peer running Stochastic Gradient Push, as a sans-IO state machine.
///
/// Feed it [`SgpInput`]s with [`SgpPeer::handle`], then drain [`SgpPeer::poll_output`] and
/// call `handle(now, SgpInput::Tick)` at [`SgpPeer::poll_timeout`]. See the [module
/// docs](super) for the algorithm.
#[derive(Debug)]
pub struct SgpPeer<P> {
    me: P,
    config: SgpConfig,
    graph: ExponentialGraph,
    view: MembershipView<P>,
    state: PushSumState,
    /// References of the quantized edges; `None` when shares travel as exact `f32`.
    edges: Option<EdgeReferences<P>>,
    phase: Phase,
    next_step: u64,
    /// Hand-offs sent while leaving; each takes the step `next_step + handoffs`, so that
    /// every share on an edge has its own step for receipts to name.
    handoffs: u64,
    /// When mass whose hand-off came back goes out again, and the wait after that one.
    handoff_retry: Option<Time>,
    handoff_backoff: Duration,
    computing: bool,
    next_seq: u64,
    ledger: Ledger<P>,
    receipts: Receipts<P>,
    outputs: VecDeque<SgpOutput<P>>,
    spare_payloads: Vec<Vec<u8>>,
    /// The bytes of a share of the whole vector in this peer's codec (see [`SgpPeer::recycle`]).
    share_bytes: usize,
    stats: SgpStats,
    /// What arrived while the parameters were lent for a step, in order ([`lent`]).
    deferred: VecDeque<Deferred<P>>,
}

impl<P: PeerKey> SgpPeer<P> {
    /// A founding peer: it holds its own parameters with weight 1 and may start step 0.
    pub fn new(
        me: P,
        members: impl IntoIterator<Item = P>,
        parameters: Vec<f32>,
        config: SgpConfig,
    ) -> Result<SgpPeer<P>, SgpError> {
        let mut peer = SgpPeer::with_state(me, members, PushSumState::new(parameters), config)?;
        peer.phase = Phase::Training;
        peer.maybe_start_step();
        Ok(peer)
    }

    /// A joining peer: it holds no mass, and may start training once a share reaches it.
    ///
    /// Joiners bring no mass of their own, so a join leaves the swarm's total weight and
    /// average unchanged; the first share a joiner receives is its state sync.
    pub fn joining(
        me: P,
        members: impl IntoIterator<Item = P>,
        len: usize,
        config: SgpConfig,
    ) -> Result<SgpPeer<P>, SgpError> {
        SgpPeer::with_state(me, members, PushSumState::empty(len), config)
    }

    fn with_state(
        me: P,
        members: impl IntoIterator<Item = P>,
        state: PushSumState,
        config: SgpConfig,
    ) -> Result<SgpPeer<P>, SgpError> {
        config.validate()?;
        let mut view = MembershipView::new(members);
        view.insert(me);
        let edges = if config.share_codec == CodecSpec::F32 {
            None
        } else {
            // `validate` checked the spec, so this cannot fail; map the error anyway.
            let codec =
                Codec::new(config.share_codec).map_err(|error| SgpError::InvalidConfig {
                    key: "share_codec",
                    value: error.to_string(),
                    allowed: "a valid codec",
                })?;
            let capacity = config.edge_capacity(state.len());
            Some(EdgeReferences::new(codec, capacity, state.len()))
        };
        let share_bytes = match &edges {
            Some(edges) => edges.max_encoded_len(state.len()),
            None => state.len() * std::mem::size_of::<f32>(),
        };
        Ok(SgpPeer {
            me,
            edges,
            share_bytes,
            graph: ExponentialGraph::new(config.out_degree),
            config,
            view,
            state,
            phase: Phase::Waiting,
            next_step: 0,
            handoffs: 0,
            handoff_retry: None,
            handoff_backoff: HANDOFF_RETRY_FIRST,
            computing: false,
            next_seq: 0,
            ledger: Ledger::new(),
            receipts: Receipts::new(),
            outputs: VecDeque::new(),
            spare_payloads: Vec::new(),
            stats: SgpStats::default(),
            deferred: VecDeque::new(),
        })
    }

    /// This peer's key.
    pub fn key(&self) -> P {
        self.me
    }

    /// The push-sum mass this peer holds.
    pub fn state(&self) -> &PushSumState {
        &self.state
    }

    /// The numerator, writable only while a step is in progress (between
    /// [`SgpOutput::StartStep`] and [`SgpInput::LocalStepDone`]).
    ///
    /// SGP applies the optimizer step to the numerator, `x ← x − γ·∇f(z)` (Assran et al.,
    /// 2019, Alg. 1); outside a step the numerator belongs to the mixing.
    pub fn numerator_mut(&mut self) -> Option<&mut [f32]> {
        if self.computing && self.phase == Phase::Training {
            Some(self.state.numerator_mut())
        } else {
            None
        }
    }

    /// Writes the de-biased parameters `z = x / w` into `out`.
    pub fn debiased_into(&self, out: &mut [f32]) -> Result<(), SgpError> {
        self.state.debiased_into(out)
    }

    /// The membership as this peer sees it.
    pub fn view(&self) -> &MembershipView<P> {
        &self.view
    }

    /// Number of local steps completed.
    pub fn steps_done(&self) -> u64 {
        self.next_step
    }

    /// Whether a step is in progress.
    pub fn is_computing(&self) -> bool {
        self.computing
    }

    /// Whether the peer has finished leaving.
    pub fn has_departed(&self) -> bool {
        self.phase == Phase::Departed
    }

    /// Number of sent shares not yet settled: the transport has not reported them, or their
    /// receiver has not acknowledged them.
    pub fn shares_in_flight(&self) -> usize {
        self.ledger.len()
    }

    /// Sharing counters.
    pub fn stats(&self) -> SgpStats {
        self.stats
    }

    /// Shares sent and not settled yet: no receipt has said what became of them.
    pub fn unsettled(&self) -> usize {
        self.ledger.len()
    }

    /// The next output, if any.
    pub fn poll_output(&mut self) -> Option<SgpOutput<P>> {
        self.outputs.pop_front()
    }

    /// When the peer wants an [`SgpInput::Tick`]: the earliest share deadline, or the next
    /// hand-off of returned mass while leaving.
    pub fn poll_timeout(&self) -> Option<Time> {
        match (self.ledger.next_deadline(), self.handoff_retry) {
            (Some(deadline), Some(retry)) => Some(deadline.min(retry)),
            (deadline, retry) => deadline.or(retry),
        }
    }

    /// Bytes the edges of a quantized codec hold (references, and shares not yet applied
    /// by their receivers, kept to take them back); 0 with `f32` shares.
    pub fn edge_bytes(&self) -> usize {
        self.edges.as_ref().map_or(0, EdgeReferences::held_bytes)
    }

    /// An empty buffer from those given back with [`SgpPeer::recycle`], or a new one.
    pub fn spare_buffer(&mut self) -> Vec<u8> {
        self.spare_payloads.pop().unwrap_or_default()
    }

    /// Takes back a payload buffer from a sent or received share, to reuse for the next send.
    ///
    /// The spare buffers hold at most three shares' worth of bytes in all, a
    /// share being what this peer's codec encodes the whole vector into, and at most 64 MiB.
    /// A buffer larger than a share (an `f32` hand-off in a quantized
    /// swarm) is freed rather than kept: reused for quantized shares it would hold four
    /// times their bytes.
    pub fn recycle(&mut self, mut payload: Vec<u8>) {
        // Enough to cover a step's shares and pieces plus a few returns.
        const KEEP: usize = 8;
        let budget = (SPARE_SHARES * self.share_bytes).min(SPARE_BYTES);
        let held: usize = self.spare_payloads.iter().map(Vec::capacity).sum();
        if self.spare_payloads.len() < KEEP
            && payload.capacity() <= self.share_bytes
            && held + payload.capacity() <= budget
        {
            payload.clear();
            self.spare_payloads.push(payload);
        }
    }

    /// The transport wrote every byte of the share `seq` to `to`, sent as `payload`. Its
    /// receiver may still never apply it: the share stays unsettled until a receipt says so.
    /// An exact share (`f32`: an exact swarm's, or a hand-off) is taken back, should it be
    /// cancelled, from its own payload, kept here until then, so that no copy of it is made
    /// when it is sent; any other payload goes back to the spare buffers.
    ///
    /// A share its receiver cancelled before this report (it was given up as crashed, and
    /// came back to answer) is taken back now; [`SgpError`] if that fails, its mass lost.
    pub fn delivered(
        &mut self,
        now: Time,
        to: P,
        seq: u64,
        payload: Vec<u8>,
    ) -> Result<(), SgpError> {
        if self.phase == Phase::Departed {
            self.recycle(payload);
            return Ok(());
        }
        let timeout = self.config.share_timeout();
        let mut payload = Some(payload);
        let mut cancelled = None;
        if let Some(entry) = self.ledger.by_seq(to, seq) {
            if !entry.written {
                entry.written = true;
                entry.deadline = now + timeout;
            }
            if entry.exact && entry.kept.is_none() {
                entry.kept = payload.take();
            }
            if entry.cancelled {
                cancelled = Some(entry.step);
            }
        }
        if let Some(payload) = payload {
            self.recycle(payload);
        }
        if let Some(step) = cancelled {
            // The receipt again, now that the payload can take the share back (kept for
            // when the parameters come back, if they are lent).
            self.handle(
                now,
                SgpInput::ReceiptReceived {
                    from: to,
                    step,
                    outcome: ShareOutcome::Cancelled,
                },
            )?;
        }
        self.hand_off_what_came_meanwhile(now);
        self.maybe_start_step();
        self.maybe_depart();
        Ok(())
    }

    /// Feeds one input at time `now`.
    ///
    /// A share the peer cannot use is refused with an error and leaves the state untouched;
    /// [`SgpError::returns_share`] says whether the transport should give it back to its
    /// sender (so that no mass is lost) or drop it.
    pub fn handle(&mut self, now: Time, input: SgpInput<'_, P>) -> Result<(), SgpError> {
        if self.phase == Phase::Departed {
            return match input {
                // Membership news and late timers are harmless after departure.
                SgpInput::PeerJoined(_)
                | SgpInput::PeerLeft(_)
                | SgpInput::PeerCrashed(_)
                | SgpInput::ReceiptReceived { .. }
                | SgpInput::Tick
                | SgpInput::Leave => Ok(()),
                // What it applied before departing still needs a true answer.
                SgpInput::CancelAsked { from, step } => {
                    self.answer_cancel(from, step);
                    Ok(())
                }
                _ => Err(SgpError::Departed),
            };
        }
        if self.state.is_lent() && self.taken_while_lent(&input)? {
            return Ok(());
        }
        match input {
            SgpInput::LocalStepDone => self.on_local_step_done(now)?,
            SgpInput::ShareReceived {
                from,
                header,
                payload,
            } => {
                if self.receipts.is_cancelled(from, header.step) {
                    return Err(SgpError::Cancelled { step: header.step });
                }
                self.absorb(from, header, payload)?;
                self.receipts.applied(from, header.step);
                self.outputs.push_back(SgpOutput::Receipt {
                    to: from,
                    step: header.step,
                    outcome: ShareOutcome::Applied,
                });
                self.stats.shares_received += 1;
                self.after_absorb(now, Absorbed::Received);
            }
            SgpInput::ShareReturned {
                to,
                header,
                payload,
                receiver_gone,
            } => {
                // The transport could not write every byte: the receiver cannot have applied
                // it, so the mass comes back from the payload itself.
                if let Some(entry) = self.ledger.remove_seq(to, header.seq) {
                    self.recycle_kept(entry.kept);
                }
                self.reclaim(to, header, payload)?;
                if receiver_gone {
                    self.forget(to);
                }
                self.stats.shares_returned += 1;
                self.after_absorb(now, Absorbed::Returned);
            }
            SgpInput::ShareRefused { by, step } => {
                match self.ledger.remove_step(by, step) {
                    Some(entry) => self.take_back(entry)?,
                    // Settled already (its deadline passed): the edge may still hold it.
                    None => {
                        let edges = self.edges.as_mut().ok_or(SgpError::NotTakenBack { step })?;
                        edges.take_back_refused(&mut self.state, by, step)?;
                    }
                }
                self.stats.shares_returned += 1;
                self.after_absorb(now, Absorbed::Returned);
            }
            SgpInput::ReceiptReceived {
                from,
                step,
                outcome,
            } => self.on_receipt(now, from, step, outcome)?,
            SgpInput::CancelAsked { from, step } => self.answer_cancel(from, step),
            SgpInput::PeerJoined(peer) => {
                self.view.insert(peer);
                // Back in the view: ask about its overdue shares now.
                self.ledger.overdue_now(peer, now);
            }
            SgpInput::PeerLeft(peer) => self.forget(peer),
            SgpInput::PeerCrashed(peer) => {
                self.forget(peer);
                // A crashed peer acknowledges nothing: pacing stops waiting for its shares,
                // which are taken back at their deadline unless it returns and answers.
                self.ledger.stop_pacing_on(peer);
            }
            SgpInput::Leave => {
                if self.phase != Phase::Leaving {
                    self.phase = Phase::Leaving;
                    self.computing = false;
                    self.hand_off(now);
                }
            }
            SgpInput::Tick => {
                self.expire(now);
                if self.handoff_retry.is_some_and(|at| at <= now) {
                    self.handoff_retry = None;
                    self.hand_off(now);
                } else {
                    self.hand_off_what_came_meanwhile(now);
                }
            }
        }
        self.maybe_start_step();
        self.maybe_depart();
        Ok(())
    }

    fn on_local_step_done(&mut self, now: Time) -> Result<(), SgpError> {
        if self.phase == Phase::Leaving {
            // The step was abandoned when the peer decided to leave.
            return Ok(());
        }
        if !self.computing {
            return Err(SgpError::NoStepInProgress);
        }
        self.computing = false;
        let step = self.next_step;
        self.next_step += 1;
        self.push_shares(now, step);
        Ok(())
    }

    /// Sends this step's shares along the exponential graph, keeping `1 / (d + 1)`.
    fn push_shares(&mut self, now: Time, step: u64) {
        self.state.renormalize();
        let n = self.view.len();
        let Some(rank) = self.view.rank_of(self.me) else {
            return;
        };
        let degree = self.graph.out_degree(n);
        for (j, target) in self.graph.out_ranks(n, rank, step).enumerate() {
            let Some(to) = self.view.at_rank(target) else {
                continue;
            };
            // Share j takes 1 / (d + 1 − j) of what is left, so each out-peer gets
            // 1 / (d + 1) of the mass the step started with.
            let fraction = 1.0 / (degree + 1 - j) as f32;
            self.send(now, to, step, Portion::Fraction(fraction));
        }
    }

    /// A leaver hands on the mass that reached it while its last hand-off was with the
    /// transport, once the transport has written every share (and no retry waits): one
    /// hand-off at a time is in memory as a payload, where handing on each share as it came
    /// held a payload and a kept copy of the whole vector per share (two leavers handing to
    /// each other at the end of a 10M-element benchmark held three of each at once).
    fn hand_off_what_came_meanwhile(&mut self, now: Time) {
        if self.phase == Phase::Leaving && self.handoff_retry.is_none() && self.ledger.all_written()
        {
            self.hand_off(now);
        }
    }

    /// Hands everything this peer holds to its successor in rank order.
    fn hand_off(&mut self, now: Time) {
        if self.state.weight() <= 0.0 {
            return;
        }
        // Alone, a peer has nobody to hand to: its mass leaves with the swarm's last peer.
        if let Some(heir) = self.view.successor(self.me) {
            let step = self.next_step + self.handoffs;
            self.handoffs += 1;
            self.send(now, heir, step, Portion::All);
        }
    }

    /// Leaves ([`SgpInput::Leave`]) and returns the parameters this peer held, `z = x / w`,
    /// as [`SgpPeer::debiased_into`] computes them; `None` if it held no mass. The hand-off
    /// carries `x` exactly, so `z` is computed from its payload once `x` is gone: the peer
    /// holds the hand-off and `z`, never `x` beside both.
    pub fn leave_with_parameters(&mut self, now: Time) -> Result<Option<Vec<f32>>, SgpError> {
        let weight = self.state.weight();
        if weight <= 0.0 || self.phase != Phase::Training {
            self.handle(now, SgpInput::Leave)?;
            return Ok(None);
        }
        let before = self.outputs.len();
        self.handle(now, SgpInput::Leave)?;
        let handed = self
            .outputs
            .iter()
            .skip(before)
            .find_map(|output| match output {
                SgpOutput::SendShare {
                    header, payload, ..
                } if header.reference.is_none() && header.weight == weight => Some(payload),
                _ => None,
            });
        let mut z = vec![0.0; self.state.len()];
        match handed {
            Some(payload) => {
                let debias = Debias::new(weight);
                for (z, bytes) in z.iter_mut().zip(payload.chunks_exact(4)) {
                    *z = debias.apply(f32_from_le(bytes));
                }
            }
            // Alone, it keeps its mass.
            None => self.state.debiased_into(&mut z)?,
        }
        Ok(Some(z))
    }

    fn send(&mut self, now: Time, to: P, step: u64, portion: Portion) {
        let exact_edge = self.edges.is_none() && matches!(portion, Portion::Fraction(_));
        if exact_edge && self.ledger.unsettled_to(to) >= MAX_UNACKNOWLEDGED_EXACT {
            // The receiver is behind with its receipts: keep this share's mass.
            self.stats.shares_held += 1;
            return;
        }
        let mut payload = self.spare_payloads.pop().unwrap_or_default();
        let seq = self.next_seq;
        let exact = |weight| Some((weight, None, CodecSpec::F32));
        let split = match (portion, &mut self.edges) {
            (Portion::All, _) => exact(self.state.drain_f32(&mut payload)),
            (Portion::Fraction(fraction), None) => {
                exact(self.state.split_f32(fraction, &mut payload))
            }
            (Portion::Fraction(fraction), Some(edges)) => edges
                .split(&mut self.state, to, fraction, step, seq, &mut payload)
                .map(|share| (share.weight, share.reference, share.codec)),
        };
        let Some((weight, reference, codec)) = split else {
            // The edge still waits for its last share: keep this one.
            self.spare_payloads.push(payload);
            self.stats.shares_held += 1;
            return;
        };
        self.next_seq += 1;
        if reference == Some(FRESH_REFERENCE) {
            self.stats.edges_started += 1;
        }
        // An exact share is taken back from its payload, kept once written
        // ([`SgpPeer::delivered`]); a quantized edge's reference suffices.
        let exact = self.edges.is_none() || matches!(portion, Portion::All);
        self.ledger.push(Entry {
            seq,
            to,
            step,
            weight,
            exact,
            kept: None,
            written: false,
            deadline: now + self.config.share_timeout(),
            cancels: 0,
            cancelled: false,
        });
        let header = ShareHeader {
            seq,
            step,
            weight,
            reference,
            codec,
        };
        self.outputs.push_back(SgpOutput::SendShare {
            to,
            header,
            payload,
        });
        self.stats.shares_sent += 1;
    }

    fn absorb(&mut self, from: P, header: ShareHeader, payload: &[u8]) -> Result<(), SgpError> {
        let result = match &mut self.edges {
            Some(edges) => edges.absorb(&mut self.state, from, header, payload),
            None => match header.reference {
                None if header.codec == CodecSpec::F32 => {
                    self.state.absorb_f32(header.weight, payload)
                }
                _ => Err(SgpError::UnexpectedCodec {
                    expected: CodecSpec::F32,
                    got: header.codec,
                }),
            },
        };
        result.inspect_err(|_| self.stats.shares_rejected += 1)
    }

    fn reclaim(&mut self, to: P, header: ShareHeader, payload: &[u8]) -> Result<(), SgpError> {
        match &mut self.edges {
            Some(edges) => edges.reclaim(&mut self.state, to, header, payload),
            None => self.state.absorb_f32(header.weight, payload),
        }
    }

    fn after_absorb(&mut self, now: Time, absorbed: Absorbed) {
        match (self.phase, absorbed) {
            (Phase::Waiting, _) => self.phase = Phase::Training,
            // Mass that came back goes out again after a wait; every return in a row
            // doubles it. Mass received meanwhile joins that hand-off.
            (Phase::Leaving, Absorbed::Returned) => {
                if self.handoff_retry.is_none() {
                    self.handoff_retry = Some(now + self.handoff_backoff);
                    self.handoff_backoff = (self.handoff_backoff * 2).min(HANDOFF_RETRY_MAX);
                }
            }
            (Phase::Leaving, Absorbed::Received) => self.hand_off_what_came_meanwhile(now),
            (Phase::Training | Phase::Departed, _) => {}
        }
    }

    /// Drops `peer` from the view and from the edge references.
    fn forget(&mut self, peer: P) {
        if peer == self.me {
            return;
        }
        self.view.remove(peer);
        if let Some(edges) = &mut self.edges {
            edges.forget(peer);
        }
    }

    fn recycle_kept(&mut self, kept: Option<Vec<u8>>) {
        if let Some(kept) = kept {
            self.recycle(kept);
        }
    }

    /// Folds an unsettled share back in: from its kept copy, or from its edge's reference.
    fn take_back(&mut self, entry: Entry<P>) -> Result<(), SgpError> {
        let result = match (&entry.kept, &mut self.edges) {
            (Some(kept), _) => self.state.absorb_f32(entry.weight, kept),
            (None, Some(edges)) if !entry.exact => edges
                .take_back_refused(&mut self.state, entry.to, entry.step)
                .map(|_| ()),
            // An exact share whose payload the transport has not reported yet.
            (None, _) => Err(SgpError::NotTakenBack { step: entry.step }),
        };
        self.recycle_kept(entry.kept);
        result
    }

    fn on_receipt(
        &mut self,
        now: Time,
        from: P,
        step: u64,
        outcome: ShareOutcome,
    ) -> Result<(), SgpError> {
        if outcome == ShareOutcome::Cancelled
            && self
                .ledger
                .await_payload(from, step, now + self.config.share_timeout())
        {
            // Taken back once the transport reports its payload ([`SgpPeer::delivered`]).
            return Ok(());
        }
        // A receipt for nothing unsettled (a repeated answer) changes nothing.
        let Some(entry) = self.ledger.remove_step(from, step) else {
            return Ok(());
        };
        match outcome {
            ShareOutcome::Applied => {
                if let Some(edges) = &mut self.edges {
                    edges.confirm(from, entry.seq);
                }
                self.recycle_kept(entry.kept);
                self.stats.shares_acknowledged += 1;
            }
            ShareOutcome::Cancelled => {
                self.take_back(entry)?;
                self.stats.shares_cancelled += 1;
                self.stats.shares_returned += 1;
                self.after_absorb(now, Absorbed::Returned);
            }
        }
        Ok(())
    }

    fn answer_cancel(&mut self, from: P, step: u64) {
        let outcome = self.receipts.cancel(from, step);
        self.outputs.push_back(SgpOutput::Receipt {
            to: from,
            step,
            outcome,
        });
    }

    /// Acts on shares past their deadline: stops waiting for a transport that never
    /// reported; asks the receiver of an unacknowledged share to cancel it (again, every
    /// `share_timeout_ms`). A receiver out of the view cannot be asked: a frozen or cut-off
    /// process may still have applied the share, so it is waited for, and given up (its
    /// mass lost, as a crashed peer's is) only after [`GIVE_UP_AFTER`] deadlines.
    fn expire(&mut self, now: Time) {
        let mut requeued = 0;
        while let Some(mut entry) = self.ledger.remove_due(now) {
            // A share not reported by the transport in time (or cancelled, and its payload
            // still not reported) is dropped: nothing can take it back.
            if !entry.written || entry.cancelled {
                self.stats.shares_timed_out += 1;
                if let Some(edges) = &mut self.edges {
                    edges.expire(entry.to, entry.seq);
                }
                self.recycle_kept(entry.kept);
                continue;
            }
            let reachable = self.view.contains(entry.to);
            if !reachable && entry.cancels >= GIVE_UP_AFTER {
                self.stats.shares_abandoned += 1;
                if let Some(edges) = &mut self.edges {
                    edges.expire(entry.to, entry.seq);
                }
                self.recycle_kept(entry.kept);
                continue;
            }
            entry.cancels += 1;
            entry.deadline = now + self.config.share_timeout();
            if reachable {
                self.outputs.push_back(SgpOutput::Cancel {
                    to: entry.to,
                    step: entry.step,
                });
                self.stats.cancels_sent += 1;
            }
            self.ledger.push(entry);
            // Re-queued entries have later deadlines; this only bounds the loop.
            requeued += 1;
            if requeued > self.ledger.len() {
                break;
            }
        }
    }

    /// Starts the next step if the overlap bound τ allows it.
    fn maybe_start_step(&mut self) {
        if self.phase != Phase::Training || self.computing {
            return;
        }
        let staleness = u64::from(self.config.staleness);
        // Step k may start once the transport wrote every share from a step ≤ k − 1 − τ;
        // receipts settle mass, not pace.
        let blocked = self
            .ledger
            .unwritten_before(self.next_step.saturating_sub(staleness));
        if !blocked {
            self.computing = true;
            self.outputs.push_back(SgpOutput::StartStep {
                step: self.next_step,
            });
        }
    }

    /// A leaver departs once it holds no mass and the transport wrote every hand-off. It
    /// does not wait for receipts: leavers hand to leavers when a swarm ends together, and
    /// each one waiting for its heir's receipt while forwarding what its predecessor hands
    /// it would pass the mass around until the leave bound.
    fn maybe_depart(&mut self) {
        if self.phase == Phase::Leaving && self.ledger.all_written() {
            let handed_off = self.state.weight() <= 0.0;
            let alone = self.view.successor(self.me).is_none();
            if handed_off || alone {
                self.phase = Phase::Departed;
                self.handoff_retry = None;
                self.outputs.push_back(SgpOutput::Departed);
            }
        }
    }
}

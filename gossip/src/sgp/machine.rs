//! The SGP state machine of one peer: inputs in, shares and step permissions out.

use std::collections::VecDeque;

use murmur_protocol::codec::{Codec, CodecSpec};

use crate::{PeerKey, Time};

use super::config::SgpConfig;
use super::error::SgpError;
use super::membership::MembershipView;
use super::quantized::EdgeReferences;
use super::schedule::ExponentialGraph;
use super::share::ShareHeader;
use super::state::PushSumState;

/// What happened, as told to an [`SgpPeer`].
#[derive(Debug, Clone, Copy)]
pub enum SgpInput<'a, P> {
    /// The trainer finished the step it was allowed to start with [`SgpOutput::StartStep`],
    /// having applied its update to the numerator through [`SgpPeer::numerator_mut`].
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
    /// The transport confirmed that a share this peer sent was taken by its receiver.
    ShareDelivered {
        /// The share's receiver.
        to: P,
        /// The share's sequence number.
        seq: u64,
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
    /// edge). The peer takes the share back and sends its next share to `by` exactly;
    /// [`SgpError::NotTakenBack`] when a later share on that edge already replaced it.
    ShareRefused {
        /// The receiver that refused it, as the transport authenticated it.
        by: P,
        /// The refused share's step.
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
    /// Send this share to `to`, then report [`SgpInput::ShareDelivered`] or
    /// [`SgpInput::ShareReturned`]. Hand the payload buffer back with [`SgpPeer::recycle`]
    /// once sent, so that steady-state sharing does not allocate.
    SendShare {
        /// The receiver.
        to: P,
        /// Weight, step and sequence number.
        header: ShareHeader,
        /// The numerator share.
        payload: Vec<u8>,
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
    /// Shares received from other peers and folded in.
    pub shares_received: u64,
    /// Shares given back (by the transport, or refused by their receiver), folded back in.
    pub shares_returned: u64,
    /// Shares the peer stopped waiting for after `share_timeout_ms`.
    pub shares_timed_out: u64,
    /// Shares rejected as malformed.
    pub shares_rejected: u64,
}

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

/// A sent share not yet confirmed.
#[derive(Debug, Clone, Copy)]
struct InFlight<P> {
    seq: u64,
    to: P,
    step: u64,
    deadline: Time,
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
    computing: bool,
    next_seq: u64,
    in_flight: VecDeque<InFlight<P>>,
    outputs: VecDeque<SgpOutput<P>>,
    spare_payloads: Vec<Vec<u8>>,
    stats: SgpStats,
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
            let capacity = config.max_edge_references;
            Some(EdgeReferences::new(codec, capacity, state.len()))
        };
        Ok(SgpPeer {
            me,
            edges,
            graph: ExponentialGraph::new(config.out_degree),
            config,
            view,
            state,
            phase: Phase::Waiting,
            next_step: 0,
            computing: false,
            next_seq: 0,
            in_flight: VecDeque::new(),
            outputs: VecDeque::new(),
            spare_payloads: Vec::new(),
            stats: SgpStats::default(),
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

    /// Number of sent shares not yet confirmed.
    pub fn shares_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Sharing counters.
    pub fn stats(&self) -> SgpStats {
        self.stats
    }

    /// The next output, if any.
    pub fn poll_output(&mut self) -> Option<SgpOutput<P>> {
        self.outputs.pop_front()
    }

    /// When the peer wants an [`SgpInput::Tick`]: the earliest share deadline.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.in_flight.iter().map(|share| share.deadline).min()
    }

    /// Takes back a payload buffer from a sent or received share, to reuse for the next send.
    pub fn recycle(&mut self, mut payload: Vec<u8>) {
        // Enough to cover a step's shares plus a few returns; more would only hold memory.
        const KEEP: usize = 8;
        if self.spare_payloads.len() < KEEP {
            payload.clear();
            self.spare_payloads.push(payload);
        }
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
                | SgpInput::Tick
                | SgpInput::Leave => Ok(()),
                _ => Err(SgpError::Departed),
            };
        }
        match input {
            SgpInput::LocalStepDone => self.on_local_step_done(now)?,
            SgpInput::ShareReceived {
                from,
                header,
                payload,
            } => {
                self.absorb(from, header, payload)?;
                self.stats.shares_received += 1;
                self.after_absorb(now);
            }
            SgpInput::ShareDelivered { to, seq } => {
                self.remove_in_flight(to, seq);
                if let Some(edges) = &mut self.edges {
                    edges.confirm(to, seq);
                }
            }
            SgpInput::ShareReturned {
                to,
                header,
                payload,
                receiver_gone,
            } => {
                self.remove_in_flight(to, header.seq);
                self.reclaim(to, header, payload)?;
                if receiver_gone {
                    self.forget(to);
                }
                self.stats.shares_returned += 1;
                self.after_absorb(now);
            }
            SgpInput::ShareRefused { by, step } => {
                let edges = self.edges.as_mut().ok_or(SgpError::NotTakenBack { step })?;
                if let Some(seq) = edges.take_back_refused(&mut self.state, by, step)? {
                    self.remove_in_flight(by, seq);
                }
                self.stats.shares_returned += 1;
                self.after_absorb(now);
            }
            SgpInput::PeerJoined(peer) => {
                self.view.insert(peer);
            }
            SgpInput::PeerLeft(peer) => self.forget(peer),
            SgpInput::PeerCrashed(peer) => {
                self.forget(peer);
                // A crashed peer confirms nothing; shares to it come back or are lost.
                self.in_flight.retain(|share| share.to != peer);
            }
            SgpInput::Leave => {
                if self.phase != Phase::Leaving {
                    self.phase = Phase::Leaving;
                    self.computing = false;
                    self.hand_off(now);
                }
            }
            SgpInput::Tick => self.expire(now),
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

    /// Hands everything this peer holds to its successor in rank order.
    fn hand_off(&mut self, now: Time) {
        if self.state.weight() <= 0.0 {
            return;
        }
        // Alone, a peer has nobody to hand to: its mass leaves with the swarm's last peer.
        if let Some(heir) = self.view.successor(self.me) {
            self.send(now, heir, self.next_step, Portion::All);
        }
    }

    fn send(&mut self, now: Time, to: P, step: u64, portion: Portion) {
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
            return;
        };
        self.next_seq += 1;
        self.in_flight.push_back(InFlight {
            seq,
            to,
            step,
            deadline: now + self.config.share_timeout(),
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

    fn after_absorb(&mut self, now: Time) {
        match self.phase {
            Phase::Waiting => self.phase = Phase::Training,
            Phase::Leaving => self.hand_off(now),
            Phase::Training | Phase::Departed => {}
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

    fn remove_in_flight(&mut self, to: P, seq: u64) {
        if let Some(at) = self
            .in_flight
            .iter()
            .position(|share| share.seq == seq && share.to == to)
        {
            self.in_flight.remove(at);
        }
    }

    /// Stops waiting for shares past their deadline.
    fn expire(&mut self, now: Time) {
        while let Some(at) = self
            .in_flight
            .iter()
            .position(|share| share.deadline <= now)
        {
            if let Some(share) = self.in_flight.remove(at) {
                self.stats.shares_timed_out += 1;
                if let Some(edges) = &mut self.edges {
                    edges.expire(share.to, share.seq);
                }
            }
        }
    }

    /// Starts the next step if the overlap bound τ allows it.
    fn maybe_start_step(&mut self) {
        if self.phase != Phase::Training || self.computing {
            return;
        }
        let staleness = u64::from(self.config.staleness);
        // Step k may start once every share from a step ≤ k − 1 − τ is confirmed.
        let blocked = self
            .in_flight
            .iter()
            .any(|share| share.step + staleness < self.next_step);
        if !blocked {
            self.computing = true;
            self.outputs.push_back(SgpOutput::StartStep {
                step: self.next_step,
            });
        }
    }

    fn maybe_depart(&mut self) {
        if self.phase == Phase::Leaving && self.in_flight.is_empty() {
            let handed_off = self.state.weight() <= 0.0;
            let alone = self.view.successor(self.me).is_none();
            if handed_off || alone {
                self.phase = Phase::Departed;
                self.outputs.push_back(SgpOutput::Departed);
            }
        }
    }
}

//! The engine of the modes that average in rounds: `butterfly`, `sync-ring` and
//! `local-sgd`.
//!
//! # A round
//!
//! 1. **Due.** Butterfly: the swarm's samples towards this round (this peer's, and the
//!    others' from their heartbeats) reach `target_batch`. Sync-ring: after every step.
//!    Local SGD: after every `H` local steps.
//! 2. **Matchmaking.** The peer is ready and looks for a group with the [`Matchmaker`],
//!    announcing in its heartbeat that it looks; `JoinGroup`, `GroupReject` and
//!    `GroupBegin` go as parcels. The leader sizes the parts by the bandwidth each member
//!    declared (a member that cannot accept connections reduces nothing), so every member
//!    of a group holds the same members, partition and group id: members agree on the
//!    round without any further message. A peer that finds no group by `max_wait` averages
//!    alone.
//! 3. **Round.** Butterfly and local SGD run a [`ButterflyRound`](crate::butterfly) in the
//!    group; sync-ring runs a [`RingAllReduce`](crate::ring) over the group's members. Chunks
//!    that arrive before this peer's `GroupBegin` wait for it. Error feedback, when on, carries
//!    what each round's encoding lost into the next.
//! 4. **Apply.** Butterfly and sync-ring hand the averaged gradient to the trainer
//!    ([`Work::Apply`]); local SGD, which averages parameters, takes its outer step on the
//!    pseudo-gradient `anchor − average` ([`OuterStep`]).
//!
//! In butterfly mode with [`RoundSettings::overlap`] a peer keeps computing gradients while
//! it looks for a group and while its round runs: those steps count towards the next round,
//! and every gradient applied is one round stale. Without it (the default), and in the
//! other modes, a peer waits for its round's update.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use murmur_protocol::codec::CodecSpec;
use murmur_protocol::message::{GroupReject, JoinGroup};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

use crate::butterfly::finite::first_non_finite;
use crate::butterfly::{
    ButterflyConfig, Group, JoinRequest, MatchInput, MatchOutput, Matchmaker, MemberProfile,
    Partition, Residuals, RoundBuffers,
};
use crate::parcel::Parcel;
use crate::{PeerKey, Time};

use super::collective::Collective;
use super::early::{Early, Spares, group_of};
use super::gathering::Gathering;
use super::local_sgd::{LocalSgdSettings, OuterStep};
use super::membership::{Beat, Change, Looking, MemberEvent, Membership};
use super::{
    Engine, EngineError, EngineEvent, EngineInput, EngineOutput, EngineStatus, Work, WorkDone,
};

/// Heartbeat intervals of silence after which a member is not waited for in a round, nor
/// expected in a group: a peer heartbeats every interval, so one heard less recently has
/// most likely crashed. The membership gives it up later ([`super::SILENCE_INTERVALS`]).
pub const QUIET_INTERVALS: f64 = 1.25;

/// Heartbeat intervals after its group began from which a member heard still looking for
/// a group of the round is taken for not in it ([`RoundEngine`]'s `looking_elsewhere`).
pub const LOOKING_ELSEWHERE_INTERVALS: f64 = 3.0;
/// The least time after its group began from which a member heard still looking for a
/// group of the round is taken for not in it.
pub const LOOKING_ELSEWHERE_MIN: Duration = Duration::from_secs(2);

/// When a round is due and what it averages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RoundPolicy {
    /// Gradients, once the swarm has `target_batch` samples towards the round.
    Butterfly {
        /// Samples the swarm gathers, all peers together, before it averages.
        target_batch: u64,
    },
    /// Gradients, every step, in a ring over the whole swarm.
    SyncRing,
    /// Parameters, every `H` local steps, then an outer step.
    LocalSgd(LocalSgdSettings),
}

/// How a [`RoundEngine`] runs.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundSettings {
    /// The mode.
    pub policy: RoundPolicy,
    /// The codec of every chunk.
    pub codec: CodecSpec,
    /// Matchmaking, chunking, timeouts and clipping.
    pub butterfly: ButterflyConfig,
    /// The longest a ring round may take.
    pub ring_timeout: Duration,
    /// Carry each round's quantization error into the next (lossy codecs).
    pub error_feedback: bool,
    /// Butterfly: keep computing gradients while looking for a group and while the round
    /// runs, towards the next round (`[averaging.butterfly] overlap`,
    /// [`ButterflyConfig::overlap`]). Off, a peer waits for its round's update.
    pub overlap: bool,
    /// Size the parts of a group this peer leads by the bandwidth each member declares
    /// (the measured upload, capped by the declared cap); off, a peer declares none, and
    /// parts are equal. Benchmarks compare the two.
    pub size_parts_by_bandwidth: bool,
    /// Samples in one local step's batch.
    pub batch_size: u64,
    /// Upload bandwidth this peer declares, in bytes per second (its cap); 0 = none
    /// declared, so the measured bandwidth alone sizes its part.
    pub upload_cap: u64,
    /// Whether other peers can open connections to this one; one that cannot reduces no
    /// part.
    pub accepts_connections: bool,
    /// The wall clock at [`Time::ZERO`], in milliseconds since the Unix epoch: group
    /// requests carry deadlines on it.
    pub wall_ms_at_zero: u64,
    /// Seeds the group ids this peer picks as a leader.
    pub seed: u64,
}

/// Where the engine is in its round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Computing towards the next round.
    Training,
    /// Looking for a group, since this time.
    Matching { since: Time },
    /// In a round.
    Averaging,
    /// The round's result is in; waiting for the trainer to be free to apply it.
    Applying,
}

/// The engine of `butterfly`, `sync-ring` and `local-sgd`. See the [module docs](self).
#[derive(Debug)]
pub struct RoundEngine<P> {
    me: P,
    settings: RoundSettings,
    membership: Membership<P>,
    matchmaker: Matchmaker<P>,
    len: usize,
    /// The parameters, unless the trainer holds them.
    params: Option<Vec<f32>>,
    /// The gradient buffer, unless the trainer or a round holds it.
    grad: Option<Vec<f32>>,
    /// `Σ samples · gradient` since the last contribution (butterfly, sync-ring), divided by
    /// `accumulated_scale`. While `samples` is 0 it holds nothing: its memory may be stale,
    /// or empty, until the next gradient takes its place.
    accumulated: Vec<f32>,
    /// What `accumulated` is to be multiplied by: the first gradient's weight, which is not
    /// applied to it (the gradient's own buffer becomes the accumulation, without a copy).
    accumulated_scale: f32,
    /// Samples behind `accumulated`, or behind the local steps since the last outer step.
    samples: u64,
    /// Local steps taken, this run and before it (the schedule's step for local SGD).
    local_step: u64,
    /// Local steps since the last outer step (local SGD).
    since_outer: u64,
    /// The round: the optimizer step (outer step for local SGD).
    round: u64,
    phase: Phase,
    /// The kind of work the trainer holds, if any.
    working: Option<&'static str>,
    outer: Option<OuterStep>,
    collective: Option<Collective<P>>,
    /// Rounds whose result is in, still sending averages to slower members.
    draining: Vec<Collective<P>>,
    /// A finished round's averaged vector, until it is applied.
    result: Option<Vec<f32>>,
    /// A parameter round's contribution: the parameters as they were when it became due
    /// (with `overlap` the trainer may hold them when the group begins; only an applied
    /// update changes them).
    params_taken: Option<Vec<f32>>,
    /// The error-feedback residuals of the gradient rounds, set aside while a parameter
    /// round runs: what a gradient's encoding lost belongs to the next gradient.
    feedback_aside: Option<Residuals>,
    /// Vector memory for the next round.
    spare: RoundBuffers,
    /// Gradient buffers lent to rounds as their sums and not yet back
    /// ([`RoundEngine::lend_gradient_buffer`]).
    sums_lent: usize,
    early: Early<P>,
    spares: Spares,
    next_tag: u64,
    upload_measured: u64,
    /// AutoNAT found this peer private: it declares that it accepts no connections.
    unreachable: bool,
    rng: Xoshiro256PlusPlus,
    outputs: VecDeque<EngineOutput<P>>,
    finishing: bool,
    finished: bool,
    departed: bool,
    rounds_done: u64,
    silent: Vec<P>,
    /// The round each member was last heard looking for a group of.
    looked: HashMap<P, u64>,
    /// Members heard looking for a group of this round and then no longer looking while
    /// still at it: they are in a group, which a leader does not wait for unless it is its
    /// own.
    engaged: HashSet<P>,
    /// Members of the running round it stopped waiting for, as quiet too long.
    quiet_in_round: HashSet<P>,
    /// The time of the input being handled.
    now: Time,
    /// Samples per second over recent steps (exponential average).
    rate: f64,
    /// How long this peer's last local step took.
    step_took: Duration,
    /// When this peer's current round began, and how long its last one took from there to
    /// its update applied.
    round_began: Time,
    round_took: Duration,
    /// Butterfly without overlap: the trainer waits until then for the others' steps in
    /// progress to make the round due, instead of starting a step the round would wait for.
    hold_until: Option<Time>,
}

impl<P: PeerKey> RoundEngine<P> {
    /// The engine of `membership.me()`, starting from `params` at round `round`, with
    /// `local_step` local steps taken before (a resumed or joining peer). `memory` is the
    /// rounds' memory made ahead ([`RoundBuffers::resident`]), or empty buffers to be
    /// allocated as the first round needs them.
    pub fn new(
        membership: Membership<P>,
        params: Vec<f32>,
        (round, local_step): (u64, u64),
        memory: RoundBuffers,
        settings: RoundSettings,
    ) -> Result<RoundEngine<P>, EngineError> {
        let me = membership.me();
        let len = params.len();
        let matchmaker = Matchmaker::new(me, len, settings.butterfly.clone())?;
        let outer = match settings.policy {
            RoundPolicy::LocalSgd(local) => Some(OuterStep::new(&params, local)),
            _ => None,
        };
        let mut spare = memory;
        let made = spare.feedback.take();
        spare.feedback = settings
            .error_feedback
            .then(|| made.unwrap_or_else(|| Residuals::zeros(len)));
        let mut engine = RoundEngine {
            me,
            rng: Xoshiro256PlusPlus::seed_from_u64(settings.seed),
            membership,
            matchmaker,
            len,
            params: Some(params),
            grad: Some(vec![0.0; len]),
            accumulated: Vec::new(),
            accumulated_scale: 1.0,
            samples: 0,
            local_step,
            since_outer: 0,
            round,
            phase: Phase::Training,
            working: None,
            outer,
            collective: None,
            draining: Vec::new(),
            result: None,
            params_taken: None,
            feedback_aside: None,
            spare,
            sums_lent: 0,
            early: Early::default(),
            spares: Spares::default(),
            next_tag: 0,
            upload_measured: 0,
            unreachable: false,
            outputs: VecDeque::new(),
            finishing: false,
            finished: false,
            departed: false,
            rounds_done: 0,
            silent: Vec::new(),
            looked: HashMap::new(),
            engaged: HashSet::new(),
            quiet_in_round: HashSet::new(),
            now: Time::ZERO,
            rate: 0.0,
            step_took: Duration::ZERO,
            round_began: Time::ZERO,
            round_took: Duration::ZERO,
            hold_until: None,
            settings,
        };
        engine.announce(Time::ZERO);
        engine.next_work();
        Ok(engine)
    }

    fn overlaps(&self) -> bool {
        self.settings.overlap && matches!(self.settings.policy, RoundPolicy::Butterfly { .. })
    }

    /// What this peer's heartbeat says now.
    fn beat(&self) -> Beat {
        let looking = match self.phase {
            Phase::Matching { .. } if self.matchmaker.is_looking() => Some(Looking {
                round: self.round,
                until: self.matchmaker.deadline(),
            }),
            _ => None,
        };
        Beat {
            step: self.round,
            samples_accumulated: self.samples,
            // A finishing peer steps no more: no rate, so nobody takes its silence for a
            // missed step.
            samples_per_s: if self.finishing {
                0.0
            } else {
                self.rate as f32
            },
            upload_bytes_per_s: self.upload_offered(),
            looking,
            incarnation: 0,
        }
    }

    fn announce(&mut self, now: Time) {
        let beat = self.beat();
        self.membership.announce(now, beat);
    }

    /// The bandwidth this peer offers its group: the measured one, capped by the declared
    /// cap; the cap alone while nothing is measured.
    fn upload_offered(&self) -> u64 {
        if !self.settings.size_parts_by_bandwidth {
            return 0;
        }
        match (self.settings.upload_cap, self.upload_measured) {
            (0, measured) => measured,
            (cap, 0) => cap,
            (cap, measured) => cap.min(measured),
        }
    }

    /// Gives the trainer its next work, if it is free and there is any.
    fn next_work(&mut self) {
        if self.working.is_some() || self.finished {
            return;
        }
        if self.phase == Phase::Applying {
            self.apply_result();
            return;
        }
        if self.finishing {
            return;
        }
        let computing = match self.phase {
            Phase::Training => true,
            Phase::Matching { .. } | Phase::Averaging => self.overlaps(),
            Phase::Applying => false,
        };
        if !computing || self.holds_for_the_swarm() {
            return;
        }
        let Some(params) = self.params.take() else {
            return;
        };
        let work = match self.settings.policy {
            RoundPolicy::LocalSgd(_) => Work::Step {
                params,
                // Local SGD takes no gradients of its own: the buffer kept for them serves
                // the trainer's steps, and their updates are not needed.
                update: self
                    .grad
                    .take()
                    .filter(|g| g.capacity() >= self.len)
                    .unwrap_or_else(|| vec![0.0; self.len]),
                step: self.local_step,
                swarm_batch: self.settings.batch_size * (self.membership.len() as u64 + 1),
            },
            _ => Work::Gradient {
                params,
                grad: self.gradient_buffer(),
            },
        };
        self.working = Some(work.kind());
        self.outputs.push_back(EngineOutput::Work(work));
    }

    fn on_work_done(&mut self, now: Time, done: WorkDone) -> Result<(), EngineError> {
        let expected = self.working.take().unwrap_or("nothing");
        if expected != done.kind() {
            return Err(EngineError::UnexpectedWork {
                expected,
                got: done.kind(),
            });
        }
        match done {
            WorkDone::Gradient {
                params,
                grad,
                samples,
                took,
            } => {
                self.note_rate(samples, took);
                self.check_len(&params)?;
                self.check_len(&grad)?;
                let spare = self.accumulate(grad, samples);
                self.samples += samples;
                self.local_step += 1;
                self.params = Some(params);
                self.keep_gradient_buffer(spare);
            }
            WorkDone::Stepped {
                params,
                update,
                samples,
                took,
            } => {
                self.note_rate(samples, took);
                self.check_len(&params)?;
                self.grad = Some(update);
                self.samples += samples;
                self.local_step += 1;
                self.since_outer += 1;
                self.params = Some(params);
            }
            WorkDone::Applied { params, grad } => {
                self.check_len(&params)?;
                self.params = Some(params);
                self.keep_spare(grad);
                self.end_round(now);
            }
        }
        self.hold_until = None;
        self.announce(now);
        self.maybe_ready(now)?;
        self.next_work();
        Ok(())
    }

    /// Butterfly without overlap, between rounds: whether to leave the trainer idle for up
    /// to one step rather than start another. A peer that has contributed, but whose round
    /// is not due yet, would otherwise start a step whenever the others' reports of the
    /// steps they are finishing have not arrived; the round then waits for that step, and
    /// takes two step times instead of one. It holds while the samples reported, plus what
    /// the members heard at this round produce at their rates within one and a half steps of
    /// its own reach the target; the round becomes due when their reports come, and if they never
    /// do, the hold ends after that one step. Hivemind projects the swarm's progress from
    /// the members' reported rates the same way to time its averaging rounds.
    fn holds_for_the_swarm(&mut self) -> bool {
        let RoundPolicy::Butterfly { target_batch } = self.settings.policy else {
            return false;
        };
        if self.phase != Phase::Training || self.overlaps() || self.samples == 0 {
            return false;
        }
        if let Some(until) = self.hold_until {
            return self.now < until;
        }
        // Half a step of slack: steps of equal length would otherwise sit on the edge of the
        // projection, where a rate a hair below this peer's own tips it over.
        let window = 1.5 * self.step_took.as_secs_f64();
        let (round, now) = (self.round, self.now);
        let coming: f64 = self
            .membership
            .heard()
            .filter(|(peer, beat)| {
                beat.step == round && self.membership.fresh(peer, now, QUIET_INTERVALS)
            })
            .map(|(_, beat)| f64::from(beat.samples_per_s) * window)
            .sum();
        let expected = (self.samples + self.membership.samples_at(round)) as f64 + coming;
        if expected < target_batch as f64 {
            return false;
        }
        self.hold_until = Some(now + self.step_took);
        true
    }

    /// Adds `samples · grad` to the accumulation, and returns the buffer to compute the next
    /// gradient in. The first gradient after a contribution was taken becomes the
    /// accumulation itself, its weight kept in `accumulated_scale` rather than multiplied
    /// in: a peer that contributes one gradient per round then never copies its gradient,
    /// and holds two vectors for it and the round's result instead of four.
    fn accumulate(&mut self, mut grad: Vec<f32>, samples: u64) -> Vec<f32> {
        let weight = samples as f32;
        if self.samples == 0 {
            std::mem::swap(&mut self.accumulated, &mut grad);
            self.accumulated_scale = weight;
        } else {
            let scale = weight / self.accumulated_scale;
            for (a, &g) in self.accumulated.iter_mut().zip(&grad) {
                *a += scale * g;
            }
        }
        grad
    }

    /// Keeps a whole vector that is free again (a result the trainer applied, parameters
    /// a parameter round replaced) for the next contribution or gradient, rather than
    /// allocating one then; a vector that neither needs is dropped.
    fn keep_spare(&mut self, vector: Vec<f32>) {
        if self.spare.local.capacity() < self.len {
            self.spare.local = vector;
        } else if self.grad.as_ref().is_none_or(|g| g.capacity() < self.len) {
            self.grad = Some(vector);
        }
    }

    /// Keeps `buffer` for the trainer's next gradient, unless the one kept already is at
    /// least as large; the smaller is dropped.
    fn keep_gradient_buffer(&mut self, buffer: Vec<f32>) {
        if self
            .grad
            .as_ref()
            .is_none_or(|g| g.capacity() < buffer.capacity())
        {
            self.grad = Some(buffer);
        }
    }

    /// Without overlap the trainer computes nothing while a round runs, so the gradient
    /// buffer the engine keeps for its next step is idle until the round's update is
    /// applied: the round keeps its sums there (a reduction overwrites the memory it is
    /// given), and the memory kept for the sums is let go. Between rounds a member then
    /// holds the parameters, the accumulation and one gradient buffer, with no sums'
    /// memory beside them: half the parameters' bytes less in a group of two. The buffer
    /// comes back as the round's sums ([`RoundEngine::take_back_sums`]).
    fn lend_gradient_buffer(&mut self, sum: &mut Vec<f32>) {
        if self.settings.overlap {
            return;
        }
        if let Some(grad) = self.grad.take_if(|g| g.capacity() >= self.len) {
            *sum = grad;
            self.sums_lent += 1;
        }
    }

    /// A round's sums' memory, once the round is done with it: a lent gradient buffer
    /// (whole-vector capacity, while one is lent) goes back to be one, any other is kept for
    /// the next round's sums if larger than what is kept.
    fn take_back_sums(&mut self, sum: Vec<f32>) {
        if self.sums_lent > 0 && sum.capacity() >= self.len {
            self.sums_lent -= 1;
            self.keep_gradient_buffer(sum);
        } else if self.spare.sum.capacity() < sum.capacity() {
            self.spare.sum = sum;
        }
    }

    /// A buffer for the trainer's next gradient: the one kept for it, or else the spare
    /// vector ([`RoundEngine::keep_spare`]). Its contents are overwritten by the trainer.
    fn gradient_buffer(&mut self) -> Vec<f32> {
        let mut grad = match self.grad.take() {
            Some(grad) if grad.capacity() >= self.len => grad,
            _ => std::mem::take(&mut self.spare.local),
        };
        grad.resize(self.len, 0.0);
        grad
    }

    fn note_rate(&mut self, samples: u64, took: Duration) {
        self.step_took = took;
        let rate = samples as f64 / took.as_secs_f64().max(1e-6);
        self.rate = if self.rate == 0.0 {
            rate
        } else {
            0.8 * self.rate + 0.2 * rate
        };
    }

    fn check_len(&self, v: &[f32]) -> Result<(), EngineError> {
        if v.len() == self.len {
            Ok(())
        } else {
            Err(EngineError::LengthMismatch {
                expected: self.len,
                got: v.len(),
            })
        }
    }

    /// Whether this peer's next round is due.
    fn due(&self) -> bool {
        if self.averages_params() {
            // Nothing to gather; the parameters must be here to be taken.
            return self.params.is_some();
        }
        match self.settings.policy {
            RoundPolicy::Butterfly { target_batch } => {
                let gathered = self.samples + self.membership.samples_at(self.round);
                self.samples > 0
                    && (gathered >= target_batch
                        || self.gathering().nearer_now(gathered, target_batch))
            }
            RoundPolicy::SyncRing => self.samples > 0,
            RoundPolicy::LocalSgd(_) => self
                .outer
                .as_ref()
                .is_some_and(|o| self.since_outer >= o.local_steps()),
        }
    }

    /// What this peer knows of the swarm's gathering towards its round.
    fn gathering(&self) -> Gathering<'_, P> {
        Gathering {
            membership: &self.membership,
            round: self.round,
            now: self.now,
            batch_size: self.settings.batch_size,
            round_took: self.round_took,
            steps_announced: self.overlaps(),
        }
    }

    /// Starts looking for a group when the round is due.
    fn maybe_ready(&mut self, now: Time) -> Result<(), EngineError> {
        if self.phase != Phase::Training || self.finishing {
            return Ok(());
        }
        // A peer cut off from the rest counted rounds on its own and may come back behind
        // the others' number, and a joiner may have started from a state one round old;
        // groups form only among peers at the same round, and a peer left behind would
        // gather towards its old round alone while the others wait for it (it heartbeats
        // at the round before theirs). It moves to the swarm's round, keeping what it
        // gathered. At a parameter round it holds nothing to wait with: it moves at once.
        let swarm = self.membership.swarm_step();
        if swarm > self.round && (self.samples > 0 || self.averages_params()) {
            self.outputs
                .push_back(EngineOutput::Event(EngineEvent::CaughtUp {
                    from: self.round,
                    to: swarm,
                }));
            self.round = swarm;
            self.engaged.clear();
            self.announce(now);
        }
        if !self.due() {
            return Ok(());
        }
        // The synchronous modes step and average in turn: the trainer must be done.
        if !self.overlaps() && self.working.is_some() {
            return Ok(());
        }
        if self.averages_params() {
            let params = self
                .params
                .as_deref()
                .expect("a parameter round is due with them");
            let mut taken = std::mem::take(&mut self.spare.local);
            taken.clear();
            taken.extend_from_slice(params);
            self.params_taken = Some(taken);
        }
        self.phase = Phase::Matching { since: now };
        self.matchmaker.set_target_group(self.expected_group());
        let profile = MemberProfile {
            bandwidth_bytes_per_s: self.upload_offered(),
            accepts_connections: self.settings.accepts_connections && !self.unreachable,
            samples: self.samples,
        };
        let group_id = self.rng.random();
        self.match_input(
            now,
            MatchInput::Ready {
                round: self.round,
                group_id,
                profile,
            },
        )
    }

    /// The group a leader waits for before its deadline: `target_group`, or this peer and
    /// every member whose heartbeat says it is at this round or the one before (it will be
    /// ready soon), if fewer. A member not heard since it (re)joined or for longer than
    /// [`QUIET_INTERVALS`] (an idle peer heartbeats once an interval: a shorter bound
    /// would leave out live peers that are still finishing a round), far behind, already
    /// past this round, looking for a group of a later round, or in another group of this
    /// one is not waited for: it joins a later round. One whose last heartbeat says it
    /// looks at the round before is waited for: that heartbeat may be stale (rounds can be
    /// shorter than gossip's delay), and if it is not, the peer is about to finish that
    /// round, or to leave it for this one when it finds itself alone there.
    fn expected_group(&self) -> usize {
        let round = self.round;
        let near = self
            .membership
            .heard()
            .filter(|(peer, _)| self.membership.fresh(peer, self.now, QUIET_INTERVALS))
            .filter(|(peer, beat)| !self.gathering().missed_a_step(peer, beat))
            .filter(|(_, beat)| beat.step == round || beat.step + 1 == round)
            // One looking at a later round is bound to it until its own deadline.
            .filter(|(_, beat)| beat.looking.is_none_or(|l| l.round <= round))
            .filter(|(peer, _)| !self.engaged.contains(peer) || self.matchmaker.has_follower(*peer))
            .count();
        self.settings.butterfly.target_group.min(near + 1)
    }

    fn match_input(&mut self, now: Time, input: MatchInput<P>) -> Result<(), EngineError> {
        if !matches!(input, MatchInput::Tick) {
            tracing::trace!(me = ?self.me, round = self.round, ?input, "matchmaking input");
        }
        self.matchmaker.handle(now, input);
        while let Some(output) = self.matchmaker.poll_output() {
            tracing::debug!(me = ?self.me, round = self.round, ?output, "matchmaking");
            match output {
                MatchOutput::AnnounceLooking { .. } | MatchOutput::AnnounceNotLooking => {
                    self.announce(now);
                }
                MatchOutput::SendJoin { to, request } => {
                    let join = JoinGroup {
                        round: request.round,
                        deadline_ms: self.wall_ms(request.deadline),
                        bandwidth_bytes_per_s: request.bandwidth_bytes_per_s,
                        accepts_connections: request.accepts_connections,
                        samples: request.samples,
                    };
                    self.send(to, Parcel::JoinGroup(join));
                }
                MatchOutput::SendReject { to, round, reason } => {
                    self.send(to, Parcel::GroupReject(GroupReject { round, reason }));
                }
                MatchOutput::SendBegin { to, group } => {
                    let members = group
                        .members()
                        .iter()
                        .zip(group.partition().sizes())
                        .map(|(&p, size)| (p, size as u64))
                        .collect();
                    self.send(
                        to,
                        Parcel::GroupBegin {
                            round: group.round,
                            group_id: group.group_id,
                            members,
                        },
                    );
                }
                MatchOutput::Formed(group) => self.begin_round(now, group)?,
                MatchOutput::NoGroup => self.average_alone(now)?,
            }
        }
        Ok(())
    }

    fn wall_ms(&self, at: Time) -> u64 {
        self.settings.wall_ms_at_zero.saturating_add(at.as_millis())
    }

    fn time_of_wall(&self, wall_ms: u64) -> Time {
        Time::from_millis(wall_ms.saturating_sub(self.settings.wall_ms_at_zero))
    }

    fn send(&mut self, to: P, parcel: Parcel<P>) {
        let tag = self.next_tag;
        self.next_tag += 1;
        self.outputs
            .push_back(EngineOutput::Send { to, tag, parcel });
    }

    /// In butterfly mode with parameter rounds on: the last of every this many rounds
    /// averages parameters (`average_params_every`).
    fn params_every(&self) -> Option<u64> {
        let every = self.settings.butterfly.average_params_every;
        (matches!(self.settings.policy, RoundPolicy::Butterfly { .. }) && every >= 2)
            .then_some(every)
    }

    /// Whether this round averages parameters rather than gradients. Members agree by the
    /// round's number, and groups form only among members at the same round.
    fn averages_params(&self) -> bool {
        self.params_every()
            .is_some_and(|every| (self.round + 1).is_multiple_of(every))
    }

    /// Gradient rounds before this one: the rounds the optimizer has stepped in.
    fn gradient_rounds(&self) -> u64 {
        self.round - self.params_every().map_or(0, |every| self.round / every)
    }

    /// A parameter round's contribution goes back to the spare memory unused (its search
    /// was cancelled, or found no group: the parameters stay as they are).
    fn put_back_params_taken(&mut self) {
        if let Some(taken) = self.params_taken.take() {
            self.spare.local = taken;
        }
    }

    /// Takes the contribution out of the accumulation: the mean gradient (butterfly,
    /// sync-ring) or the parameters (local SGD, see [`super::local_sgd`]), into `out`;
    /// returns its weight.
    fn take_contribution(&mut self, out: &mut Vec<f32>) -> f32 {
        let weight = self.samples as f32;
        match (&self.settings.policy, &self.params) {
            (RoundPolicy::LocalSgd(_), Some(params)) => {
                out.clear();
                out.extend_from_slice(params);
                self.since_outer = 0;
            }
            _ if self.samples == 0 => {
                out.clear();
                out.resize(self.len, 0.0);
            }
            _ => {
                // The accumulation is the contribution: its memory moves, and `out`'s takes
                // its place until the next gradient does.
                std::mem::swap(out, &mut self.accumulated);
                let scale = self.accumulated_scale / self.samples as f32;
                if scale != 1.0 {
                    for x in out.iter_mut() {
                        *x *= scale;
                    }
                }
            }
        }
        self.samples = 0;
        weight
    }

    fn begin_round(&mut self, now: Time, group: Group<P>) -> Result<(), EngineError> {
        let Phase::Matching { since } = self.phase else {
            return Ok(());
        };
        let matchmaking = now.saturating_since(since);
        let mut buffers = std::mem::take(&mut self.spare);
        let (mut local, mut weight) = match self.params_taken.take() {
            // Every member's parameters count alike; the gradient gathered meanwhile waits
            // for the next round, and so do the gradients' residuals.
            Some(params) => {
                self.feedback_aside = buffers.feedback.take();
                (params, 1.0)
            }
            None => {
                let mut local = std::mem::take(&mut buffers.local);
                let weight = self.take_contribution(&mut local);
                (local, weight)
            }
        };
        if first_non_finite(&local).is_some() {
            // A trainer that diverged has nothing to give: this member takes the group's
            // average with no weight of its own, which also brings it back.
            self.outputs
                .push_back(EngineOutput::Event(EngineEvent::NonFiniteContribution {
                    round: self.round,
                }));
            local.fill(0.0);
            weight = 0.0;
        }
        let group_id = group.group_id;
        let gone: Vec<P> = group
            .members()
            .iter()
            .copied()
            .filter(|m| *m != self.me && !self.membership.contains(m))
            .collect();
        let mut collective = match self.settings.policy {
            RoundPolicy::SyncRing => {
                let feedback = buffers.feedback.take();
                self.spare = buffers;
                Collective::ring(
                    self.me,
                    &group,
                    local,
                    weight,
                    self.settings.codec,
                    self.settings.ring_timeout,
                    now,
                    matchmaking,
                    feedback,
                )?
            }
            _ => {
                // The round averages the contribution in place: it becomes the result.
                buffers.local = local;
                self.lend_gradient_buffer(&mut buffers.sum);
                Collective::butterfly(
                    self.me,
                    group,
                    buffers,
                    weight,
                    self.settings.codec,
                    &self.settings.butterfly,
                    now,
                    matchmaking,
                )?
            }
        };
        // The transport cannot reach members this peer already knows are gone.
        for member in gone {
            collective.member_lost(now, member)?;
        }
        let mut waiting = Vec::new();
        self.early.take(group_id, &mut waiting);
        for (from, parcel) in waiting {
            self.feed_chunk(now, &mut collective, from, parcel);
        }
        self.phase = Phase::Averaging;
        self.round_began = now;
        self.quiet_in_round.clear();
        self.collective = Some(collective);
        self.announce(now);
        self.after_round_input(now)
    }

    fn feed_chunk(
        &mut self,
        now: Time,
        collective: &mut Collective<P>,
        from: P,
        parcel: Parcel<P>,
    ) {
        if let Err(reason) = collective.chunk(now, from, &parcel) {
            self.outputs
                .push_back(EngineOutput::Event(EngineEvent::BadParcel { from, reason }));
        }
        self.recycle(parcel.into_payload());
    }

    /// No group: this peer's contribution is its result.
    fn average_alone(&mut self, now: Time) -> Result<(), EngineError> {
        if !matches!(self.phase, Phase::Matching { .. }) {
            return Ok(());
        }
        if self.params_taken.is_some() {
            // Alone, the average of the parameters is this peer's own.
            self.put_back_params_taken();
            self.outputs
                .push_back(EngineOutput::Event(EngineEvent::Alone {
                    round: self.round,
                }));
            self.end_round(now);
            self.next_work();
            return Ok(());
        }
        let mut local = std::mem::take(&mut self.spare.local);
        self.take_contribution(&mut local);
        self.outputs
            .push_back(EngineOutput::Event(EngineEvent::Alone {
                round: self.round,
            }));
        self.result = Some(local);
        self.phase = Phase::Applying;
        self.announce(now);
        self.next_work();
        Ok(())
    }

    /// Drains the round's outputs, and takes its result once it is in.
    fn after_round_input(&mut self, now: Time) -> Result<(), EngineError> {
        if let Some(collective) = &mut self.collective {
            collective.drain(now, &mut self.next_tag, &mut self.spares, &mut self.outputs);
            if collective.is_finished() {
                let mut collective = self.collective.take().expect("checked above");
                let (mut buffers, mut report) = collective.take_result(now);
                report.parameters = self.averages_params()
                    || matches!(self.settings.policy, RoundPolicy::LocalSgd(_));
                // A ring that did not finish hands over each segment's mean over what
                // reached this member (see `RingOutput::Failed`).
                let result = std::mem::take(&mut buffers.result);
                if let Some(feedback) = collective.take_feedback() {
                    buffers.feedback = Some(feedback);
                }
                if let Some(feedback) = self.feedback_aside.take() {
                    buffers.feedback = Some(feedback);
                }
                if let Some(drift) = report.drift {
                    self.outputs
                        .push_back(EngineOutput::Event(EngineEvent::Drift(drift)));
                }
                self.outputs
                    .push_back(EngineOutput::Event(EngineEvent::Round(report)));
                let sum = std::mem::take(&mut buffers.sum);
                self.spare = buffers;
                self.take_back_sums(sum);
                self.result = Some(result);
                self.phase = Phase::Applying;
                self.draining.push(collective);
                self.next_work();
            }
        }
        // A finished round still owes the others the averages its windows held back.
        for collective in &mut self.draining {
            collective.drain(now, &mut self.next_tag, &mut self.spares, &mut self.outputs);
        }
        self.collect_drained();
        Ok(())
    }

    /// Drops the rounds that have nothing left in flight, keeping their memory.
    fn collect_drained(&mut self) {
        let mut i = 0;
        while i < self.draining.len() {
            if self.draining[i].is_spent() {
                let done = self.draining.swap_remove(i);
                let group = done.group_id();
                let (averages, sum) = done.into_send_memory();
                if self.spare.averages.capacity() < averages.capacity() {
                    self.spare.averages = averages;
                }
                self.take_back_sums(sum);
                let outputs = &mut self.outputs;
                let spares = &mut self.spares;
                self.early.ended(group, &mut |p: Parcel<P>| {
                    spares.give(p.into_payload(), |b| {
                        outputs.push_back(EngineOutput::Recycle(b));
                    });
                });
            } else {
                i += 1;
            }
        }
    }

    /// Hands the round's result to the trainer (or takes the outer step).
    fn apply_result(&mut self) {
        let Some(result) = self.result.take() else {
            return;
        };
        let Some(mut params) = self.params.take() else {
            self.result = Some(result);
            return;
        };
        if self.averages_params() {
            // The average is the parameters: no optimizer step.
            let old = std::mem::replace(&mut params, result);
            self.keep_spare(old);
            self.params = Some(params);
            self.end_round(self.now);
            self.next_work();
            return;
        }
        match (&self.settings.policy, &mut self.outer) {
            (RoundPolicy::LocalSgd(_), Some(outer)) => {
                outer.apply(&result, &mut params);
                self.params = Some(params);
                self.keep_spare(result);
                self.end_round(self.now);
                self.next_work();
            }
            _ => {
                let group = self.last_group_size();
                let work = Work::Apply {
                    params,
                    grad: result,
                    step: self.schedule_step(group),
                    swarm_batch: self.settings.batch_size * group as u64,
                };
                self.working = Some(work.kind());
                self.outputs.push_back(EngineOutput::Work(work));
            }
        }
    }

    /// The learning-rate schedule's step for the update of this round, in local steps.
    ///
    /// Butterfly: the gradient rounds before this one (parameter rounds take no step) times
    /// the local steps one round holds per member (`target_batch / (batch_size × group)`),
    /// so that every member of a round applies its update at the same rate, and the
    /// replicas stay identical; members' own local step counts differ by the steps each
    /// took towards each round. Sync-ring: the local
    /// step, which every member shares.
    fn schedule_step(&self, group: usize) -> u64 {
        match self.settings.policy {
            RoundPolicy::Butterfly { target_batch } => {
                let per_round = self.settings.batch_size.saturating_mul(group as u64);
                if per_round == 0 {
                    return self.local_step;
                }
                let step = u128::from(self.gradient_rounds()) * u128::from(target_batch)
                    / u128::from(per_round);
                u64::try_from(step).unwrap_or(u64::MAX)
            }
            _ => self.local_step,
        }
    }

    fn last_group_size(&self) -> usize {
        self.draining.last().map_or(1, |c| c.members().len()).max(1)
    }

    /// The round's update is applied: on to the next round.
    fn end_round(&mut self, now: Time) {
        self.hold_until = None;
        self.round_took = now.saturating_since(self.round_began);
        self.round += 1;
        self.engaged.clear();
        self.rounds_done += 1;
        self.phase = Phase::Training;
        self.announce(now);
        if self.finishing {
            self.maybe_finish();
        }
    }

    fn on_parcel(&mut self, now: Time, from: P, parcel: Parcel<P>) -> Result<(), EngineError> {
        if let Some(group) = group_of(&parcel) {
            if let Some(mut collective) = self.collective.take() {
                if collective.group_id() == group {
                    self.feed_chunk(now, &mut collective, from, parcel);
                    self.collective = Some(collective);
                    return self.after_round_input(now);
                }
                self.collective = Some(collective);
            }
            if self.draining.iter().any(|c| c.group_id() == group) {
                self.recycle(parcel.into_payload());
                return Ok(());
            }
            if let Some(old) = self.early.keep(now, group, from, parcel) {
                self.recycle(old.into_payload());
            }
            return Ok(());
        }
        let input = match &parcel {
            Parcel::JoinGroup(j) => Some(MatchInput::JoinRequest {
                from,
                request: JoinRequest {
                    round: j.round,
                    deadline: self.time_of_wall(j.deadline_ms),
                    bandwidth_bytes_per_s: j.bandwidth_bytes_per_s,
                    accepts_connections: j.accepts_connections,
                    samples: j.samples,
                },
            }),
            Parcel::GroupReject(r) => Some(MatchInput::Rejected {
                from,
                round: r.round,
                reason: r.reason,
            }),
            Parcel::GroupBegin {
                round,
                group_id,
                members,
            } => {
                let sizes = members.iter().map(|&(_, size)| size as usize);
                let group = Partition::from_sizes(sizes)
                    .ok()
                    .filter(|p| p.len() == self.len)
                    .and_then(|partition| {
                        let peers = members.iter().map(|&(p, _)| p).collect();
                        Group::new(*round, *group_id, peers, partition).ok()
                    });
                match group {
                    Some(group) => Some(MatchInput::GroupBegan { from, group }),
                    None => {
                        self.outputs
                            .push_back(EngineOutput::Event(EngineEvent::BadParcel {
                                from,
                                reason: "a group start that does not fit the model".to_owned(),
                            }));
                        None
                    }
                }
            }
            _ => None,
        };
        self.recycle(parcel.into_payload());
        match input {
            Some(input) => self.match_input(now, input),
            None => Ok(()),
        }
    }

    fn on_member(&mut self, now: Time, event: MemberEvent<P>) -> Result<(), EngineError> {
        if let MemberEvent::Heartbeat(peer, beat) = event {
            self.restarted(now, peer, &beat)?;
            match beat.looking {
                Some(looking) => {
                    self.looked.insert(peer, looking.round);
                    self.engaged.remove(&peer);
                }
                None if beat.step == self.round && self.looked.get(&peer) == Some(&self.round) => {
                    self.engaged.insert(peer);
                }
                None => {}
            }
        }
        let looking = match event {
            MemberEvent::Heartbeat(peer, beat) => Some(match beat.looking {
                Some(looking) => MatchInput::PeerLooking {
                    peer,
                    round: looking.round,
                    deadline: looking.until,
                },
                None => MatchInput::PeerNotLooking(peer),
            }),
            _ => None,
        };
        if let Some(Change::Left(peer)) = self.membership.note(now, event) {
            self.lost(now, peer)?;
        }
        if matches!(self.phase, Phase::Matching { .. }) {
            // Who is near this round may have changed: a leader waits for them alone.
            self.matchmaker.set_target_group(self.expected_group());
        }
        if let Some(input) = looking {
            self.match_input(now, input)?;
        }
        self.leave_a_round_left_behind(now)?;
        // Heartbeats move the swarm's samples: the round may be due now.
        self.maybe_ready(now)
    }

    /// A member whose heartbeat names another process than its last one
    /// ([`Beat::incarnation`]), or says a lower round, runs a new process: killed and
    /// started again under the same key before anyone judged it quiet. A live process keeps
    /// its incarnation and never moves back in rounds (heartbeats from one signer arrive in
    /// order; the network layer refuses older ones). The new one holds nothing of the rounds
    /// and groups the old one was in, even when it resumed at the same round or a later one
    /// (from a checkpoint, or the swarm's state): nobody waits for it there, or a running
    /// round it was in runs to the reducer timeout while its new process heartbeats on. It
    /// stays a member.
    fn restarted(&mut self, now: Time, peer: P, beat: &Beat) -> Result<(), EngineError> {
        let Some(last) = self.membership.news(&peer) else {
            return Ok(());
        };
        let (from, was) = (last.step, last.incarnation);
        let new_process = was != 0 && beat.incarnation != 0 && beat.incarnation != was;
        if !new_process && beat.step >= from {
            return Ok(());
        }
        tracing::info!(
            ?peer,
            from,
            to = beat.step,
            "a member started again: not waited for in its old process's rounds"
        );
        self.looked.remove(&peer);
        self.engaged.remove(&peer);
        self.stop_waiting_for(now, peer)
    }

    /// `peer` takes no more part in this peer's matchmaking or rounds: gone, or a new process.
    fn stop_waiting_for(&mut self, now: Time, peer: P) -> Result<(), EngineError> {
        self.match_input(now, MatchInput::PeerGone(peer))?;
        if let Some(collective) = &mut self.collective {
            collective.member_lost(now, peer)?;
        }
        for collective in &mut self.draining {
            collective.member_lost(now, peer)?;
        }
        Ok(())
    }

    fn lost(&mut self, now: Time, peer: P) -> Result<(), EngineError> {
        self.looked.remove(&peer);
        self.engaged.remove(&peer);
        self.outputs
            .push_back(EngineOutput::Event(EngineEvent::PeerGone {
                peer,
                remaining: self.membership.len(),
            }));
        // A smaller swarm needs a smaller group: a leader holding every member left begins.
        self.matchmaker.set_target_group(self.expected_group());
        self.stop_waiting_for(now, peer)?;
        self.after_round_input(now)
    }

    fn on_tick(&mut self, now: Time) -> Result<(), EngineError> {
        if self.membership.beat_due(now) {
            let beat = self.beat();
            self.membership.set_own(beat);
            self.outputs.push_back(EngineOutput::Heartbeat(beat));
        }
        let mut silent = std::mem::take(&mut self.silent);
        self.membership.silent(now, &mut silent);
        for peer in silent.drain(..) {
            self.outputs.push_back(EngineOutput::Disconnect(peer));
            self.lost(now, peer)?;
        }
        self.silent = silent;
        if matches!(self.phase, Phase::Matching { .. }) {
            // A member that missed its step is no longer waited for.
            self.matchmaker.set_target_group(self.expected_group());
        }
        self.match_input(now, MatchInput::Tick)?;
        self.stop_waiting_for_quiet(now)?;
        self.leave_quiet_leader(now)?;
        if let Some(collective) = &mut self.collective {
            collective.tick(now)?;
        }
        for collective in &mut self.draining {
            collective.tick(now)?;
        }
        let max_age = self.early_max_age();
        let outputs = &mut self.outputs;
        let spares = &mut self.spares;
        self.early.expire(now, max_age, &mut |p: Parcel<P>| {
            spares.give(p.into_payload(), |b| {
                outputs.push_back(EngineOutput::Recycle(b));
            });
        });
        self.after_round_input(now)?;
        self.maybe_ready(now)?;
        // A hold that ran out lets the trainer take its next step.
        self.next_work();
        Ok(())
    }

    /// Whether `peer` has most likely crashed: silent for [`QUIET_INTERVALS`] heartbeat
    /// intervals, or, with `overlap`, for three of the steps its last heartbeat said it was
    /// taking towards this round ([`Gathering::missed_a_step`]).
    fn gone_quiet(&self, peer: &P, now: Time) -> bool {
        let limit = self.membership.interval().mul_f64(QUIET_INTERVALS);
        self.membership
            .quiet_for(peer, now)
            .is_some_and(|quiet| quiet > limit)
            || self
                .membership
                .news(peer)
                .is_some_and(|beat| self.gathering().missed_a_step(peer, beat))
    }

    /// Whether `peer`, a member of `collective`, is not in it: its heartbeat, heard
    /// [`LOOKING_ELSEWHERE_INTERVALS`] intervals (at least [`LOOKING_ELSEWHERE_MIN`]) after
    /// the group began here, says it is still looking for a group of that round. It never
    /// began this group (its `GroupBegin` reached a process that was still joining the
    /// swarm, say) and will not send its chunks; it heartbeats on, so it never goes quiet,
    /// and the round would wait the chunk timeout for it. A member that began the group
    /// stops looking as soon as its engine takes the `GroupBegin`, and its heartbeats say so
    /// from then on; the bound leaves a busy member's engine that long to take it (with
    /// 100 ms heartbeats, one interval was too short: a member left out of its own group
    /// kept local values where the others averaged).
    fn looking_elsewhere(&self, peer: &P, now: Time, collective: &Collective<P>) -> bool {
        let (Some(beat), Some(quiet)) = (
            self.membership.news(peer),
            self.membership.quiet_for(peer, now),
        ) else {
            return false;
        };
        let heard_after_begin = now
            .saturating_since(collective.started())
            .saturating_sub(quiet);
        let bound = self
            .membership
            .interval()
            .mul_f64(LOOKING_ELSEWHERE_INTERVALS)
            .max(LOOKING_ELSEWHERE_MIN);
        beat.looking
            .is_some_and(|looking| looking.round == collective.round())
            && heard_after_begin >= bound
    }

    /// A member of the running round that went quiet ([`Self::gone_quiet`]), or that is
    /// still looking for a group of its round ([`Self::looking_elsewhere`]), is not
    /// waited for in it (its part keeps local values where its averages had not come, its
    /// contribution is left out), before the membership gives it up: a crashed member
    /// costs the round that much, not the sender and reducer timeouts. It is still sent its
    /// share: a member whose heartbeats are merely late (a busy host, a congested link)
    /// finishes the round with the others instead of waiting out its reducer timeout.
    fn stop_waiting_for_quiet(&mut self, now: Time) -> Result<(), EngineError> {
        let Some(collective) = &self.collective else {
            return Ok(());
        };
        let newly: Vec<(P, bool)> = collective
            .members()
            .iter()
            .copied()
            .filter(|member| *member != self.me && !self.quiet_in_round.contains(member))
            .filter_map(|member| {
                if self.gone_quiet(&member, now) {
                    Some((member, false))
                } else if self.looking_elsewhere(&member, now, collective) {
                    Some((member, true))
                } else {
                    None
                }
            })
            .collect();
        let Some(collective) = &mut self.collective else {
            return Ok(());
        };
        for (member, elsewhere) in newly {
            if elsewhere {
                tracing::info!(
                    ?member,
                    round = self.round,
                    "a member of this round is still looking for a group of it: not waited for"
                );
            } else {
                tracing::debug!(
                    ?member,
                    round = self.round,
                    "not waiting for a quiet member"
                );
            }
            self.quiet_in_round.insert(member);
            collective.member_quiet(now, member)?;
        }
        Ok(())
    }

    /// A follower whose leader went quiet ([`Self::gone_quiet`]) stops waiting for it: a
    /// crashed leader costs its followers that much, not the rest of their `max_wait`.
    /// Without `overlap` not before [`QUIET_INTERVALS`]: a gathering leader may then have
    /// nothing to say between its heartbeats (a bench peer, or a synchronous mode's trainer,
    /// is idle while it gathers), and a follower that left a live leader would split the
    /// round.
    fn leave_quiet_leader(&mut self, now: Time) -> Result<(), EngineError> {
        let quiet = self
            .matchmaker
            .leader()
            .filter(|leader| self.gone_quiet(leader, now));
        match quiet {
            Some(leader) => self.match_input(now, MatchInput::PeerGone(leader)),
            None => Ok(()),
        }
    }

    /// A peer still gathering alone at a round the swarm has left (its heartbeats say so)
    /// stops looking and joins the swarm's round, keeping what it accumulated: nobody
    /// would join it, and its own update would wait for its whole `max_wait`.
    fn leave_a_round_left_behind(&mut self, now: Time) -> Result<(), EngineError> {
        let behind = matches!(self.phase, Phase::Matching { .. })
            && self.matchmaker.gathering_alone()
            && self.membership.swarm_step() > self.round;
        if !behind {
            return Ok(());
        }
        // Out of `Matching` first, so that the cancelled search applies nothing alone.
        self.phase = Phase::Training;
        self.put_back_params_taken();
        self.match_input(now, MatchInput::Cancel)?;
        self.maybe_ready(now)
    }

    /// How long a chunk may wait for its group: matchmaking and a round at most.
    fn early_max_age(&self) -> Duration {
        let b = &self.settings.butterfly;
        b.max_wait() + b.reducer_timeout()
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        let outputs = &mut self.outputs;
        self.spares
            .give(buf, |b| outputs.push_back(EngineOutput::Recycle(b)));
    }

    fn on_sent(&mut self, now: Time, tag: u64, parcel: Parcel<P>) -> Result<(), EngineError> {
        self.recycle(parcel.into_payload());
        if let Some(collective) = self.collective.as_mut().filter(|c| c.owns(tag)) {
            collective.sent(now, tag)?;
        } else if let Some(collective) = self.draining.iter_mut().find(|c| c.owns(tag)) {
            collective.sent(now, tag)?;
        }
        self.after_round_input(now)
    }

    /// Stops: a peer still looking for a group gives up (a leader hands its followers
    /// back at once), and a round under way goes on only to serve the other members; the
    /// final parameters come as soon as the trainer is free.
    fn begin_finish(&mut self, now: Time) -> Result<(), EngineError> {
        if self.finishing {
            return Ok(());
        }
        self.finishing = true;
        if matches!(self.phase, Phase::Matching { .. }) {
            // What was accumulated for this round is not applied.
            self.phase = Phase::Training;
            self.put_back_params_taken();
            self.match_input(now, MatchInput::Cancel)?;
        }
        self.announce(now);
        Ok(())
    }

    /// Emits the final parameters once the trainer is free: those of the last update
    /// applied (a round still running or not yet applied changes nothing of them).
    fn maybe_finish(&mut self) {
        if self.finished || self.working.is_some() {
            return;
        }
        // Local SGD ends on its anchor, the swarm's last average: the local steps since
        // moved this peer towards its own data alone.
        // The parameters move out: a finished engine computes and applies nothing more.
        let params = match (&self.outer, self.params.take()) {
            (Some(outer), Some(_)) if self.rounds_done > 0 => outer.anchor().to_vec(),
            (_, Some(params)) => params,
            (_, None) => return,
        };
        self.finished = true;
        self.outputs.push_back(EngineOutput::Finished(params));
    }

    /// Departs once finished and no round has anything left to send.
    fn maybe_depart(&mut self) {
        if self.finished && !self.departed && self.collective.is_none() && self.draining.is_empty()
        {
            self.departed = true;
            self.outputs.push_back(EngineOutput::Departed);
        }
    }
}

impl<P: PeerKey> Engine<P> for RoundEngine<P> {
    fn handle(&mut self, now: Time, input: EngineInput<P>) -> Result<(), EngineError> {
        self.now = now;
        match input {
            EngineInput::WorkDone(done) => self.on_work_done(now, done)?,
            EngineInput::Parcel { from, parcel } => {
                self.membership.heard_from(&from, now);
                self.on_parcel(now, from, parcel)?
            }
            EngineInput::Sent {
                to,
                tag,
                delivered,
                parcel,
            } => {
                let undelivered_join = !delivered && matches!(parcel, Parcel::JoinGroup(_));
                self.on_sent(now, tag, parcel)?;
                if undelivered_join {
                    // The leader asked cannot be reached: look on now, not at its deadline.
                    self.match_input(now, MatchInput::PeerGone(to))?;
                }
            }
            EngineInput::Member(event) => self.on_member(now, event)?,
            EngineInput::Tick => self.on_tick(now)?,
            EngineInput::Finish => self.begin_finish(now)?,
        }
        if self.finishing {
            self.maybe_finish();
            self.maybe_depart();
        }
        Ok(())
    }

    fn poll_output(&mut self) -> Option<EngineOutput<P>> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Time> {
        let mut next = Some(self.membership.poll_timeout());
        let mut consider = |t: Option<Time>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n: Time| n.min(t)));
            }
        };
        consider(self.matchmaker.poll_timeout());
        consider(self.collective.as_ref().and_then(Collective::poll_timeout));
        for collective in &self.draining {
            consider(collective.poll_timeout());
        }
        consider(self.early.next_expiry(self.early_max_age()));
        consider(self.hold_until.filter(|&until| until > self.now));
        next
    }

    fn membership(&self) -> &Membership<P> {
        &self.membership
    }

    fn set_measured_upload(&mut self, bytes_per_s: u64) {
        self.upload_measured = bytes_per_s;
    }

    fn set_unreachable(&mut self, unreachable: bool) {
        if self.unreachable != unreachable {
            tracing::info!(
                unreachable,
                "reachability changed: this peer {} butterfly parts",
                if unreachable { "takes no" } else { "may take" }
            );
        }
        self.unreachable = unreachable;
    }

    fn status(&self) -> EngineStatus {
        EngineStatus {
            step: self.round,
            peers: self.membership.len(),
            push_sum_weight: None,
            shares_sent: 0,
            shares_received: 0,
            shares_returned: 0,
            shares_held: 0,
            edges_started: 0,
            shares_unsettled: 0,
            rounds: self.rounds_done,
        }
    }
}

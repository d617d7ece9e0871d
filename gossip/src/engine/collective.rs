//! One running collective (a butterfly all-reduce or a ring all-reduce) inside an engine:
//! the one place where a round's outputs become parcels and parcels become its inputs.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use murmur_protocol::codec::CodecSpec;
use murmur_protocol::message::{AveragedChunk, ChunkAddress, TensorPartChunk};

use crate::butterfly::norm::squared_norm;
use crate::butterfly::{
    ButterflyConfig, ButterflyRound, Group, PayloadRef, Residuals, RoundBuffers, RoundInput,
    RoundOutput,
};
use crate::parcel::Parcel;
use crate::ring::{RingAllReduce, RingInput, RingOutput};
use crate::{PeerKey, Time};

use super::early::Spares;
use super::{EngineError, EngineOutput};

/// What a finished round achieved, as this member saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundReport<P> {
    /// The round (optimizer step, or outer step for local SGD).
    pub round: u64,
    /// The group's id.
    pub group_id: u64,
    /// Members of the group, this one included.
    pub group_size: usize,
    /// Elements of the part this member reduced (0: it reduced none, e.g. it accepts no
    /// connections).
    pub part_elements: usize,
    /// Fraction of the vector averaged over every member still alive (senders a reducer
    /// dropped for silence are not counted against it).
    pub coverage: f64,
    /// Fraction of the vector averaged over every member of the group.
    pub coverage_all: f64,
    /// Senders this member's reduction dropped for silence (butterfly).
    pub stragglers_dropped: u32,
    /// Parts whose reducer fell silent and kept local values (butterfly).
    pub parts_timed_out: u32,
    /// Those reducers.
    pub silent_reducers: Vec<P>,
    /// From the group's start until this member's result was complete.
    pub finished_after: Duration,
    /// From the moment this peer was ready until its group began.
    pub matchmaking: Duration,
    /// Relative distance between this member's contribution and the result (butterfly).
    pub drift: Option<f64>,
    /// The round averaged parameters (local SGD, butterfly's parameter rounds), not
    /// gradients.
    pub parameters: bool,
    /// Senders whose declared weight this member's reduction cut to its bound.
    pub weights_capped: u64,
    /// Contributions this member's CenteredClip set aside as outliers, summed over chunks.
    pub contributions_rejected: u64,
    /// With error feedback and a lossy codec, the fraction of what this member sent that
    /// the codec lost and the residuals carry into its next round (`‖r‖ / ‖x + r‖` over its
    /// sends: [`FeedbackTally::carried_ratio`](crate::butterfly::FeedbackTally::carried_ratio));
    /// `None` when nothing was sent with feedback.
    pub feedback_carried: Option<f64>,
}

impl<P> RoundReport<P> {
    /// `complete`, `partial` or `failed`, by coverage.
    pub fn outcome(&self) -> &'static str {
        if self.coverage >= 1.0 {
            "complete"
        } else if self.coverage > 0.0 {
            "partial"
        } else {
            "failed"
        }
    }
}

/// Either machine.
#[derive(Debug)]
enum Machine<P> {
    Butterfly(Box<ButterflyRound<P>>),
    Ring(Box<RingAllReduce<P>>),
}

/// How a round ended, before its vectors are taken out.
#[derive(Debug, Clone)]
struct Ending<P> {
    coverage: f64,
    coverage_all: f64,
    stragglers_dropped: u32,
    parts_timed_out: u32,
    silent_reducers: Vec<P>,
}

impl<P> Ending<P> {
    fn whole(coverage: f64) -> Ending<P> {
        Ending {
            coverage,
            coverage_all: coverage,
            stragglers_dropped: 0,
            parts_timed_out: 0,
            silent_reducers: Vec::new(),
        }
    }
}

/// A round in progress, and after its result is in, until its last sends are reported.
#[derive(Debug)]
pub(crate) struct Collective<P> {
    machine: Machine<P>,
    round: u64,
    group_id: u64,
    members: Vec<P>,
    /// Elements this member reduces.
    part_elements: usize,
    codec: CodecSpec,
    started: Time,
    deadline: Time,
    matchmaking: Duration,
    /// Sends in flight: tag → destination and payload.
    sends: HashMap<u64, (P, PayloadRef)>,
    ending: Option<Ending<P>>,
    finished_at: Option<Time>,
    /// The result was taken out.
    taken: bool,
}

impl<P: PeerKey> Collective<P> {
    /// A butterfly round of `me` in `group`.
    #[allow(clippy::too_many_arguments)] // the round's own arguments, and its bookkeeping
    pub(crate) fn butterfly(
        me: P,
        group: Group<P>,
        buffers: RoundBuffers,
        weight: f32,
        codec: CodecSpec,
        config: &ButterflyConfig,
        now: Time,
        matchmaking: Duration,
    ) -> Result<Collective<P>, EngineError> {
        let members = group.members().to_vec();
        let (round, group_id) = (group.round, group.group_id);
        let part_elements = group
            .index_of(me)
            .map_or(0, |i| group.partition().range(i).len());
        let bound = config.reducer_timeout() + config.chunk_timeout() * 2;
        let machine = ButterflyRound::new(me, group, buffers, weight, codec, config, now)?;
        Ok(Collective {
            machine: Machine::Butterfly(Box::new(machine)),
            round,
            group_id,
            members,
            part_elements,
            codec,
            started: now,
            deadline: now + bound,
            matchmaking,
            sends: HashMap::new(),
            ending: None,
            finished_at: None,
            taken: false,
        })
    }

    /// A ring round of `me` over `group`'s members, bounded by `bound`, with error
    /// feedback when `feedback` holds the residuals.
    #[allow(clippy::too_many_arguments)] // the round's own arguments, and its bookkeeping
    pub(crate) fn ring(
        me: P,
        group: &Group<P>,
        local: Vec<f32>,
        weight: f32,
        codec: CodecSpec,
        bound: Duration,
        now: Time,
        matchmaking: Duration,
        feedback: Option<Residuals>,
    ) -> Result<Collective<P>, EngineError> {
        let members = group.members().to_vec();
        let mut machine = RingAllReduce::new(
            me,
            members.clone(),
            group.group_id,
            local,
            weight,
            codec,
            now + bound,
        )?;
        if let Some(residuals) = feedback {
            machine = machine.with_feedback(residuals);
        }
        let part_elements = machine.segment_len();
        Ok(Collective {
            machine: Machine::Ring(Box::new(machine)),
            round: group.round,
            group_id: group.group_id,
            members,
            part_elements,
            codec,
            started: now,
            deadline: now + bound,
            matchmaking,
            sends: HashMap::new(),
            ending: None,
            finished_at: None,
            taken: false,
        })
    }

    pub(crate) fn group_id(&self) -> u64 {
        self.group_id
    }

    pub(crate) fn members(&self) -> &[P] {
        &self.members
    }

    /// The round it averages for.
    pub(crate) fn round(&self) -> u64 {
        self.round
    }

    /// When its group began, on this member.
    pub(crate) fn started(&self) -> Time {
        self.started
    }

    /// Whether this member's result is complete (or the round gave up at its bound).
    pub(crate) fn is_finished(&self) -> bool {
        self.ending.is_some()
    }

    /// Whether the result was taken and nothing is left in flight to a live member.
    pub(crate) fn is_spent(&self) -> bool {
        self.taken
            && match &self.machine {
                Machine::Butterfly(r) => r.is_idle(),
                Machine::Ring(_) => self.sends.is_empty(),
            }
    }

    /// Whether a send with `tag` belongs to this round.
    pub(crate) fn owns(&self, tag: u64) -> bool {
        self.sends.contains_key(&tag)
    }

    /// When the round wants a tick.
    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        if self.ending.is_some() {
            return None;
        }
        let machine = match &self.machine {
            Machine::Butterfly(r) => r.poll_timeout(),
            Machine::Ring(r) => r.poll_timeout(),
        };
        Some(machine.map_or(self.deadline, |t| t.min(self.deadline)))
    }

    /// Feeds a chunk of this round; a malformed chunk is refused with the reason, and
    /// costs its sender its contribution, never the round.
    pub(crate) fn chunk(&mut self, now: Time, from: P, parcel: &Parcel<P>) -> Result<(), String> {
        let result = match (parcel, &mut self.machine) {
            (Parcel::PartChunk(m, payload), Machine::Butterfly(r)) => r
                .handle(
                    now,
                    RoundInput::PartChunk {
                        from,
                        address: m.address,
                        weight: m.weight,
                        codec: m.codec,
                        payload,
                    },
                )
                .map_err(|e| e.to_string()),
            (Parcel::Averaged(m, payload), Machine::Butterfly(r)) => r
                .handle(
                    now,
                    RoundInput::AveragedChunk {
                        from,
                        address: m.address,
                        contributors: m.contributors,
                        total_weight: m.total_weight,
                        codec: m.codec,
                        payload,
                    },
                )
                .map_err(|e| e.to_string()),
            (Parcel::PartChunk(m, payload), Machine::Ring(r)) => r
                .handle(
                    now,
                    RingInput::Segment {
                        from,
                        address: m.address,
                        weight: m.weight,
                        codec: m.codec,
                        payload,
                    },
                )
                .map_err(|e| e.to_string()),
            _ => Err("a chunk of the wrong kind for this round".to_owned()),
        };
        self.note_end(now);
        result
    }

    /// The transport is done with send `tag`.
    pub(crate) fn sent(&mut self, now: Time, tag: u64) -> Result<(), EngineError> {
        if let Some((to, payload)) = self.sends.remove(&tag) {
            match &mut self.machine {
                Machine::Butterfly(r) => r.handle(now, RoundInput::Sent { to, payload })?,
                Machine::Ring(r) => r.handle(now, RingInput::Sent { payload })?,
            }
        }
        self.note_end(now);
        Ok(())
    }

    /// A member is gone: stop waiting for it (butterfly; the ring waits out its bound).
    pub(crate) fn member_lost(&mut self, now: Time, peer: P) -> Result<(), EngineError> {
        self.stop_waiting(now, peer, RoundInput::MemberLost(peer))
    }

    /// A member went quiet: stop waiting for it, but keep serving it (butterfly; the ring
    /// waits out its bound).
    pub(crate) fn member_quiet(&mut self, now: Time, peer: P) -> Result<(), EngineError> {
        self.stop_waiting(now, peer, RoundInput::MemberQuiet(peer))
    }

    fn stop_waiting(
        &mut self,
        now: Time,
        peer: P,
        input: RoundInput<'_, P>,
    ) -> Result<(), EngineError> {
        if let Machine::Butterfly(r) = &mut self.machine
            && self.members.contains(&peer)
        {
            r.handle(now, input)?;
        }
        self.note_end(now);
        Ok(())
    }

    /// Timers.
    pub(crate) fn tick(&mut self, now: Time) -> Result<(), EngineError> {
        match &mut self.machine {
            Machine::Butterfly(r) => r.handle(now, RoundInput::Tick)?,
            Machine::Ring(r) => r.handle(now, RingInput::Tick)?,
        }
        if self.ending.is_none() && now >= self.deadline {
            // The round ran past its bound: it keeps what it has.
            self.ending = Some(Ending::whole(0.0));
            self.finished_at = Some(now);
        }
        self.note_end(now);
        Ok(())
    }

    fn note_end(&mut self, now: Time) {
        if self.ending.is_some() && self.finished_at.is_none() {
            self.finished_at = Some(now);
        }
    }

    /// Turns every queued output of the machine into a parcel to send. `tags` numbers the
    /// sends; payload buffers come from `spares`.
    pub(crate) fn drain(
        &mut self,
        now: Time,
        next_tag: &mut u64,
        spares: &mut Spares,
        out: &mut VecDeque<EngineOutput<P>>,
    ) {
        loop {
            let (to, parcel, payload) = match &mut self.machine {
                Machine::Butterfly(r) => match r.poll_output() {
                    None => break,
                    Some(RoundOutput::SendPartChunk {
                        to,
                        address,
                        weight,
                        payload,
                    }) => (to, part_chunk(address, weight, self.codec), payload),
                    Some(RoundOutput::SendAveragedChunk {
                        to,
                        address,
                        contributors,
                        total_weight,
                        payload,
                    }) => {
                        let head = Parcel::Averaged(
                            AveragedChunk {
                                address,
                                contributors,
                                total_weight,
                                codec: self.codec,
                                payload: &[],
                            },
                            Vec::new(),
                        );
                        (to, head, payload)
                    }
                    Some(RoundOutput::Finished(report)) => {
                        let members = u32::try_from(self.members.len()).unwrap_or(u32::MAX);
                        let dropped = u32::try_from(report.dropped_senders.len()).unwrap_or(0);
                        let alive = members.saturating_sub(dropped).max(1);
                        let silent = report.fallback_reducers();
                        self.ending = Some(Ending {
                            coverage: report.fraction_covered_by(alive),
                            coverage_all: report.fraction_covered_by(members),
                            stragglers_dropped: dropped,
                            parts_timed_out: u32::try_from(silent.len()).unwrap_or(u32::MAX),
                            silent_reducers: silent,
                        });
                        self.note_end(now);
                        continue;
                    }
                },
                Machine::Ring(r) => match r.poll_output() {
                    None => break,
                    Some(RingOutput::Send {
                        to,
                        address,
                        weight,
                        payload,
                    }) => (to, part_chunk(address, weight, self.codec), payload),
                    Some(RingOutput::Finished) => {
                        self.ending = Some(Ending::whole(1.0));
                        self.note_end(now);
                        continue;
                    }
                    Some(RingOutput::Failed { .. }) => {
                        self.ending = Some(Ending::whole(0.0));
                        self.note_end(now);
                        continue;
                    }
                },
            };
            let bytes = match &self.machine {
                Machine::Butterfly(r) => r.payload(payload),
                Machine::Ring(r) => r.payload(payload),
            };
            let mut buf = spares.take();
            buf.extend_from_slice(bytes.unwrap_or_default());
            let parcel = match parcel {
                Parcel::PartChunk(m, _) => Parcel::PartChunk(m, buf),
                Parcel::Averaged(m, _) => Parcel::Averaged(m, buf),
                other => other,
            };
            let tag = *next_tag;
            *next_tag += 1;
            self.sends.insert(tag, (to, payload));
            out.push_back(EngineOutput::Send { to, tag, parcel });
        }
    }

    /// The ring's residuals, once its result was taken (a butterfly round's come back in
    /// its buffers).
    pub(crate) fn take_feedback(&mut self) -> Option<Residuals> {
        match &mut self.machine {
            Machine::Butterfly(_) => None,
            Machine::Ring(r) => r.take_feedback(),
        }
    }

    /// The memory a spent butterfly round sent its averages from (encoded averages, and
    /// sums), for the next round.
    pub(crate) fn into_send_memory(self) -> (Vec<u8>, Vec<f32>) {
        match self.machine {
            Machine::Butterfly(r) => r.into_send_memory(),
            Machine::Ring(_) => (Vec::new(), Vec::new()),
        }
    }

    /// Takes the round's result out: the buffers (the result in `result`, local values
    /// where the round could not average) and the report. The round stays to finish its
    /// sends; call once.
    pub(crate) fn take_result(&mut self, now: Time) -> (RoundBuffers, RoundReport<P>) {
        self.taken = true;
        let ending = self.ending.clone().unwrap_or_else(|| Ending::whole(0.0));
        let (weights_capped, contributions_rejected) = match &self.machine {
            Machine::Butterfly(r) => (r.stats().weights_capped, r.stats().contributions_rejected),
            Machine::Ring(_) => (0, 0),
        };
        let (buffers, drift, tally) = match &mut self.machine {
            Machine::Butterfly(r) => {
                // The machine keeps running on an empty round (it only sends averages that
                // are already encoded), so swap its buffers out.
                let buffers = r.take_buffers();
                let drift = relative_drift(r.moved_squared(), &buffers.result);
                (buffers, drift, r.feedback_tally())
            }
            Machine::Ring(r) => {
                let result = r.take_result();
                (
                    RoundBuffers {
                        result,
                        ..RoundBuffers::default()
                    },
                    None,
                    r.feedback_tally(),
                )
            }
        };
        let finished_at = self.finished_at.unwrap_or(now);
        let report = RoundReport {
            round: self.round,
            group_id: self.group_id,
            group_size: self.members.len(),
            part_elements: self.part_elements,
            coverage: ending.coverage,
            coverage_all: ending.coverage_all,
            stragglers_dropped: ending.stragglers_dropped,
            parts_timed_out: ending.parts_timed_out,
            silent_reducers: ending.silent_reducers,
            finished_after: finished_at.saturating_since(self.started),
            matchmaking: self.matchmaking,
            drift,
            parameters: false,
            weights_capped,
            contributions_rejected,
            feedback_carried: tally.carried_ratio(),
        };
        (buffers, report)
    }
}

/// A part chunk's head, its payload still empty.
fn part_chunk<P>(address: ChunkAddress, weight: f32, codec: CodecSpec) -> Parcel<P> {
    Parcel::PartChunk(
        TensorPartChunk {
            address,
            weight,
            codec,
            payload: &[],
        },
        Vec::new(),
    )
}

/// The consensus drift of a member whose vector its round moved by `moved_squared` (the
/// squared L2 distance) to `result`: `‖local − result‖ / ‖result‖`, or `None` when the
/// result is zero.
pub(crate) fn relative_drift(moved_squared: f64, result: &[f32]) -> Option<f64> {
    let norm = squared_norm(result);
    (norm > 0.0).then(|| (moved_squared / norm).sqrt())
}

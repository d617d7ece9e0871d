//! The ring all-reduce state machine of one member.

use std::collections::VecDeque;

use murmur_protocol::codec::{Codec, CodecError, CodecSpec};
use murmur_protocol::message::ChunkAddress;
use thiserror::Error;

use crate::butterfly::buffers::encode_corrected;
use crate::butterfly::payload::PayloadPool;
use crate::butterfly::{FeedbackTally, Partition, PayloadRef, Residuals};
use crate::{PeerKey, Time};

/// Why a ring all-reduce refused a setup or a message.
///
/// Errors caused by a message from the network leave the state untouched.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RingError {
    /// The ring is empty, lists a peer twice, or does not include this member.
    #[error("invalid ring: {reason}")]
    InvalidRing {
        /// What was wrong.
        reason: &'static str,
    },
    /// The local vector is empty or holds NaN or infinity, or its weight is negative or
    /// not finite.
    #[error("invalid local contribution: {reason}")]
    InvalidLocal {
        /// What was wrong.
        reason: &'static str,
    },
    /// A segment came from a peer other than this member's predecessor, for another
    /// group, or with an address that does not match its step.
    #[error("unexpected segment (step {step}): {reason}")]
    UnexpectedSegment {
        /// The step it claimed.
        step: u32,
        /// What was wrong.
        reason: &'static str,
    },
    /// A payload failed to decode.
    #[error("tensor codec: {0}")]
    Codec(#[from] CodecError),
}

/// What happened, as told to a [`RingAllReduce`].
#[derive(Debug, Clone, Copy)]
pub enum RingInput<'a, P> {
    /// A segment from the predecessor. `address.part` is the segment, `address.chunk` the
    /// step (reduce-scatter steps first, then all-gather), as a `TensorPartChunk`.
    Segment {
        /// The sender.
        from: P,
        /// Segment and step.
        address: ChunkAddress,
        /// Weight of the partial sum (reduce-scatter) or of the average (all-gather).
        weight: f32,
        /// How the payload is encoded.
        codec: CodecSpec,
        /// The encoded elements.
        payload: &'a [u8],
    },
    /// The transport is done with a payload.
    Sent {
        /// The payload's reference from the send output.
        payload: PayloadRef,
    },
    /// The time returned by [`RingAllReduce::poll_timeout`] has come.
    Tick,
}

/// What a [`RingAllReduce`] asks its caller to do.
#[derive(Debug, Clone, PartialEq)]
pub enum RingOutput<P> {
    /// Send a segment to the successor, then answer with [`RingInput::Sent`].
    Send {
        /// The successor.
        to: P,
        /// Segment and step.
        address: ChunkAddress,
        /// Weight of what the segment holds.
        weight: f32,
        /// The encoded elements; read them with [`RingAllReduce::payload`].
        payload: PayloadRef,
    },
    /// Every segment is averaged: [`RingAllReduce::result`] holds the weighted mean.
    Finished,
    /// The round deadline passed first. [`RingAllReduce::result`] then holds, segment by
    /// segment, the weighted mean of the contributions that reached this member (the
    /// others' averages where the all-gather brought them, partial sums divided by their
    /// weight, or its own values alone), not the mean over the whole ring.
    Failed {
        /// Steps whose segment had arrived by then, out of `2(N − 1)`.
        steps_received: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Finished,
    Failed,
}

/// One member's synchronous ring all-reduce, as a sans-IO state machine.
///
/// See the [module docs](super). Feed it [`RingInput`]s with [`RingAllReduce::handle`],
/// drain [`RingAllReduce::poll_output`], and tick it at [`RingAllReduce::poll_timeout`]
/// (the round deadline).
#[derive(Debug)]
pub struct RingAllReduce<P> {
    me: usize,
    ring: Vec<P>,
    group_id: u64,
    codec: Codec,
    segments: Partition,
    values: Vec<f32>,
    segment_weights: Vec<f64>,
    /// Segments that hold a mean rather than a weighted sum: the owned one once reduced,
    /// and those the all-gather brought.
    averaged: Vec<bool>,
    received: Vec<bool>,
    sent: usize,
    deadline: Time,
    phase: Phase,
    pool: PayloadPool,
    outputs: VecDeque<RingOutput<P>>,
    /// Error feedback with a lossy codec: `parts` for the reduce-scatter's partial sums,
    /// `averages` for the all-gather's averages, both indexed like the vector.
    feedback: Option<(Residuals, Vec<f32>)>,
    /// What the sends encoded with error feedback, and what they carried.
    tally: FeedbackTally,
}

impl<P: PeerKey> RingAllReduce<P> {
    /// Starts `me`'s round: `ring` in ring order, `local` weighted by `weight`, segments
    /// encoded with `codec`, the whole round bounded by `deadline`.
    pub fn new(
        me: P,
        ring: Vec<P>,
        group_id: u64,
        mut local: Vec<f32>,
        weight: f32,
        codec: CodecSpec,
        deadline: Time,
    ) -> Result<RingAllReduce<P>, RingError> {
        let index = ring
            .iter()
            .position(|&p| p == me)
            .ok_or(RingError::InvalidRing {
                reason: "this member is not in the ring",
            })?;
        let mut sorted = ring.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(RingError::InvalidRing {
                reason: "a peer is listed twice",
            });
        }
        if local.iter().any(|x| !x.is_finite()) {
            return Err(RingError::InvalidLocal {
                reason: "the vector holds NaN or infinity",
            });
        }
        if !(weight.is_finite() && weight >= 0.0) {
            return Err(RingError::InvalidLocal {
                reason: "the weight must be finite and not negative",
            });
        }
        let codec = Codec::new(codec)?;
        let align = codec.spec().block().map_or(1, |b| b as usize);
        let segments = Partition::equal(local.len(), ring.len(), align).map_err(|_| {
            RingError::InvalidLocal {
                reason: "the vector cannot be split into segments",
            }
        })?;
        local.iter_mut().for_each(|x| *x *= weight);
        let steps = 2 * (ring.len() - 1);
        let mut machine = RingAllReduce {
            me: index,
            segment_weights: vec![f64::from(weight); ring.len()],
            averaged: vec![false; ring.len()],
            ring,
            group_id,
            codec,
            segments,
            values: local,
            received: vec![false; steps],
            sent: 0,
            deadline,
            phase: Phase::Running,
            pool: PayloadPool::default(),
            outputs: VecDeque::new(),
            feedback: None,
            tally: FeedbackTally::default(),
        };
        if steps == 0 {
            machine.average_owned_segment();
        }
        machine.advance();
        Ok(machine)
    }

    /// The weighted mean, once [`RingOutput::Finished`] was emitted; after
    /// [`RingOutput::Failed`], each segment's mean over the contributions that reached it.
    pub fn result(&self) -> &[f32] {
        &self.values
    }

    /// Turns error feedback on, carrying `residuals` (from the last round, or zeros) into
    /// this round's sends. Call before the first input; the first step's send is encoded
    /// again with the correction. A lossless codec (`f32`) leaves them untouched.
    pub fn with_feedback(mut self, mut residuals: Residuals) -> RingAllReduce<P> {
        let len = self.values.len();
        residuals.resize(len);
        if self.codec.spec() == CodecSpec::F32 {
            self.feedback = Some((residuals, Vec::new()));
            return self;
        }
        let corrected = Vec::with_capacity(self.segments.sizes().max().unwrap_or(0));
        self.feedback = Some((residuals, corrected));
        // Sends made by `new` went out uncorrected: make them again.
        let unsent: Vec<RingOutput<P>> = self.outputs.drain(..).collect();
        for output in unsent {
            if let RingOutput::Send { payload, .. } = output {
                self.pool.release(payload);
            }
        }
        self.sent = 0;
        self.advance();
        self
    }

    /// What the sends encoded with error feedback so far, and what their encoding lost
    /// and the residuals carry into the next round.
    pub fn feedback_tally(&self) -> FeedbackTally {
        self.tally
    }

    /// The residuals, once the round is over, for the next round.
    pub fn take_feedback(&mut self) -> Option<Residuals> {
        self.feedback.take().map(|(r, _)| r)
    }

    /// Takes the values out (the weighted mean once finished, partial means once failed),
    /// leaving the round empty; it still takes send reports.
    pub fn take_result(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.values)
    }

    /// Elements of the segment this member averages.
    pub fn segment_len(&self) -> usize {
        self.segments.range(self.segment(1)).len()
    }

    /// Whether every segment is averaged.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    /// The bytes of a payload named by a send output, until it is reported sent.
    pub fn payload(&self, payload: PayloadRef) -> Option<&[u8]> {
        self.pool.get(payload)
    }

    /// The next output, if any.
    pub fn poll_output(&mut self) -> Option<RingOutput<P>> {
        self.outputs.pop_front()
    }

    /// The round deadline while the round runs.
    pub fn poll_timeout(&self) -> Option<Time> {
        (self.phase == Phase::Running).then_some(self.deadline)
    }

    /// Feeds one input at time `now`.
    pub fn handle(&mut self, now: Time, input: RingInput<'_, P>) -> Result<(), RingError> {
        match input {
            RingInput::Segment {
                from,
                address,
                weight,
                codec,
                payload,
            } => self.on_segment(from, address, weight, codec, payload)?,
            RingInput::Sent { payload } => {
                self.pool.release(payload);
            }
            RingInput::Tick => {
                if self.phase == Phase::Running && now >= self.deadline {
                    self.phase = Phase::Failed;
                    self.average_what_arrived();
                    let steps_received = self.received.iter().filter(|&&r| r).count() as u32;
                    self.outputs
                        .push_back(RingOutput::Failed { steps_received });
                }
            }
        }
        self.advance();
        Ok(())
    }

    fn n(&self) -> usize {
        self.ring.len()
    }

    /// Segment `offset` places after this member's index, modulo the ring.
    fn segment(&self, offset: isize) -> usize {
        let n = self.n() as isize;
        (self.me as isize + offset).rem_euclid(n) as usize
    }

    /// The segment sent at `step`.
    fn sent_segment(&self, step: usize) -> usize {
        let n = self.n();
        if step < n - 1 {
            self.segment(-(step as isize))
        } else {
            self.segment(1 - (step - (n - 1)) as isize)
        }
    }

    /// The segment received at `step`.
    fn received_segment(&self, step: usize) -> usize {
        let n = self.n();
        if step < n - 1 {
            self.segment(-1 - step as isize)
        } else {
            self.segment(-((step - (n - 1)) as isize))
        }
    }

    fn on_segment(
        &mut self,
        from: P,
        address: ChunkAddress,
        weight: f32,
        codec: CodecSpec,
        payload: &[u8],
    ) -> Result<(), RingError> {
        let unexpected = |reason| RingError::UnexpectedSegment {
            step: address.chunk,
            reason,
        };
        let predecessor = self.ring[self.segment(-1)];
        if from != predecessor || self.n() < 2 {
            return Err(unexpected("not from this member's predecessor"));
        }
        if address.group_id != self.group_id {
            return Err(unexpected("for another group"));
        }
        if codec != self.codec.spec() {
            return Err(unexpected("encoded with another codec"));
        }
        if !(weight.is_finite() && weight >= 0.0) {
            return Err(unexpected("weight not finite and non-negative"));
        }
        let step = address.chunk as usize;
        if step >= self.received.len() {
            return Err(unexpected("step past the end of the round"));
        }
        let segment = self.received_segment(step);
        let range = self.segments.range(segment);
        if address.part as usize != segment
            || address.offset != 0
            || address.elements as usize != range.len()
        {
            return Err(unexpected("segment does not match the step"));
        }
        if self.received[step] || self.phase != Phase::Running {
            return Ok(());
        }
        if step < self.n() - 1 {
            self.codec
                .decode_accumulate(payload, 1.0, &mut self.values[range])?;
            self.segment_weights[segment] += f64::from(weight);
        } else {
            self.codec.decode_into(payload, &mut self.values[range])?;
            self.segment_weights[segment] = f64::from(weight);
            self.averaged[segment] = true;
        }
        self.received[step] = true;
        if step == self.n() - 2 {
            self.average_owned_segment();
        }
        Ok(())
    }

    /// After the reduce-scatter this member holds the full sum of segment `i + 1`.
    fn average_owned_segment(&mut self) {
        self.average_segment(self.segment(1));
    }

    /// Divides segment `segment`'s weighted sum by its weight (a sum of no weight holds
    /// zeros and stays so).
    fn average_segment(&mut self, segment: usize) {
        if self.averaged[segment] {
            return;
        }
        self.averaged[segment] = true;
        let total = self.segment_weights[segment];
        if total > 0.0 {
            let scale = (1.0 / total) as f32;
            self.values[self.segments.range(segment)]
                .iter_mut()
                .for_each(|x| *x *= scale);
        }
    }

    /// A failed round: every segment still holding a weighted sum (this member's own
    /// values, or a partial sum of the members before it in the ring) becomes that sum's
    /// mean, so the caller applies a usable vector without having kept a copy of its own.
    fn average_what_arrived(&mut self) {
        for segment in 0..self.n() {
            self.average_segment(segment);
        }
    }

    /// Sends every step whose input has arrived, and finishes when all have.
    fn advance(&mut self) {
        if self.phase != Phase::Running {
            return;
        }
        let steps = self.received.len();
        while self.sent < steps && (self.sent == 0 || self.received[self.sent - 1]) {
            let step = self.sent;
            let segment = self.sent_segment(step);
            let range = self.segments.range(segment);
            let capacity = self.codec.max_encoded_len(range.len());
            let (payload, buffer) = self.pool.acquire(capacity);
            // The values are finite (checked at the start, and sums of finite decoded
            // values); an overflowing sum goes out empty and its receiver rejects it.
            let values = &self.values[range.clone()];
            let len = match &mut self.feedback {
                Some((residuals, corrected)) if self.codec.spec() != CodecSpec::F32 => {
                    let residual = if step < self.ring.len() - 1 {
                        &mut residuals.parts
                    } else {
                        &mut residuals.averages
                    };
                    let residual = (residual, range.start);
                    let scratch = (corrected, &mut self.tally);
                    encode_corrected(&mut self.codec, values, residual, scratch, buffer)
                }
                _ => self.codec.encode(values, buffer).unwrap_or(0),
            };
            self.pool.set_len(payload, len);
            self.outputs.push_back(RingOutput::Send {
                to: self.ring[self.segment(1)],
                address: ChunkAddress {
                    group_id: self.group_id,
                    part: segment as u32,
                    chunk: step as u32,
                    offset: 0,
                    elements: range.len() as u32,
                },
                weight: self.segment_weights[segment] as f32,
                payload,
            });
            self.sent += 1;
        }
        if self.sent == steps && self.received.iter().all(|&r| r) {
            self.phase = Phase::Finished;
            self.outputs.push_back(RingOutput::Finished);
        }
    }
}

//! One member's butterfly all-reduce round, as a sans-IO state machine.

use std::collections::VecDeque;
use std::time::Duration;

use murmur_protocol::codec::{Codec, CodecSpec};
use murmur_protocol::message::ChunkAddress;

use crate::{PeerKey, Time};

use super::buffers::{FeedbackTally, Residuals, RoundBuffers, encode_corrected};
use super::config::ButterflyConfig;
use super::error::ButterflyError;
use super::finite::first_non_finite;
use super::group::{ChunkLayout, Group};
use super::payload::{EncodedAverages, PayloadPool, PayloadRef};
use super::reducer::{Reduction, squared_distance};
use super::report::{ChunkCoverage, CoverageReport, PartCoverage, PartOutcome};
use super::round_io::{RoundInput, RoundOutput, RoundStats};

/// The most bytes of part chunks a round encodes ahead for quiet members when its vectors
/// are taken out ([`ButterflyRound::take_buffers`]). Without a bound, a member whose peer
/// went quiet early in a round of 500M `f32` elements encoded the peer's whole 1 GB part
/// at once: a second gigabyte in small buffers, written in one turn of seconds.
const OWED_BYTES_MAX: usize = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartState {
    Pending,
    Averaged,
    LocalFallback,
    Empty,
}

#[derive(Debug)]
struct Part {
    layout: ChunkLayout,
    state: PartState,
    received: usize,
    last_activity: Time,
    /// Index of the part's first chunk in the round's per-chunk tables.
    first: usize,
}

#[derive(Debug, Clone, Copy, Default)]
struct Destination {
    in_flight: u32,
    next_part_chunk: usize,
    next_average: usize,
    lost: bool,
    /// Quiet, not known gone: not waited for, but still sent its part chunks.
    quiet: bool,
}

/// One member's butterfly all-reduce round, as a sans-IO state machine.
///
/// Created when the group begins, with the member's local vector and weight. It streams
/// the member's copy of every part to that part's reducer, reduces its own part, streams
/// the averages back, and writes every average into the member's vector, in place: the
/// vector it was given becomes its result, and a round holds no second copy of it. Feed it
/// [`RoundInput`]s with [`ButterflyRound::handle`], drain [`ButterflyRound::poll_output`],
/// and call `handle(now, RoundInput::Tick)` at [`ButterflyRound::poll_timeout`]. See the
/// [module docs](super) for the algorithm and its guarantees.
#[derive(Debug)]
pub struct ButterflyRound<P> {
    me: usize,
    group: Group<P>,
    codec: Codec,
    window: u32,
    chunk_timeout: Duration,
    reducer_timeout: Duration,
    weight: f32,
    /// The member's vector: its own values until an average is written over them.
    local: Vec<f32>,
    /// Memory handed in as the buffers' `result`, unused, and given back as the next
    /// round's `local`.
    spare: Vec<f32>,
    /// The squared L2 distance the averages moved `local`, so far.
    moved: f64,
    /// One chunk of scratch space: an averaged chunk is decoded here before it replaces
    /// the member's values, so that the distance it moved them is known.
    decoded: Vec<f32>,
    parts: Vec<Part>,
    received: Vec<bool>,
    coverage: Vec<(u32, f32)>,
    reduction: Reduction,
    ready: Vec<u32>,
    destinations: Vec<Destination>,
    /// Part chunks still owed to quiet members once the vectors were taken out, encoded
    /// then, per destination: chunk index and payload.
    owed: Vec<VecDeque<(usize, PayloadRef)>>,
    /// The bound on `owed`'s bytes: [`OWED_BYTES_MAX`].
    owed_bytes_max: usize,
    pool: PayloadPool,
    averages: EncodedAverages,
    /// The own part's averages are sent from the reducer's sums, where they are kept as
    /// they are written into `local`: with `f32` their encoding is their bytes, so the
    /// round holds no second copy of them, and the sums' memory stays with the round until
    /// it is spent ([`ButterflyRound::into_send_memory`]).
    averages_in_sum: bool,
    outputs: VecDeque<RoundOutput<P>>,
    finished: bool,
    dropped_senders: Vec<P>,
    stats: RoundStats,
    /// Error feedback, when on and the codec is lossy.
    feedback: Option<Feedback>,
    /// What this round's sends encoded with error feedback, and what they carried.
    tally: FeedbackTally,
    /// The vectors were taken out ([`ButterflyRound::take_buffers`]): only averages and
    /// part chunks already encoded still go out.
    closed: bool,
}

/// A round's error feedback: the residuals it carries, and a chunk of scratch space for
/// the corrected values.
#[derive(Debug)]
struct Feedback {
    residuals: Residuals,
    corrected: Vec<f32>,
}

impl<P: PeerKey> ButterflyRound<P> {
    /// Starts `me`'s round in `group` at `now`, contributing `local` with `weight` (the
    /// samples behind it), encoded with `codec`.
    ///
    /// `local` is the member's vector, or [`RoundBuffers`] holding it together with the
    /// memory an earlier round gave back ([`ButterflyRound::into_buffers`]).
    pub fn new(
        me: P,
        group: Group<P>,
        local: impl Into<RoundBuffers>,
        weight: f32,
        codec: CodecSpec,
        config: &ButterflyConfig,
        now: Time,
    ) -> Result<ButterflyRound<P>, ButterflyError> {
        let RoundBuffers {
            local,
            result: spare,
            sum,
            averages,
            feedback,
        } = local.into();
        config.validate()?;
        let index = group.index_of(me).ok_or(ButterflyError::InvalidGroup {
            reason: "this peer is not a member of the group",
        })?;
        if local.len() != group.partition().len() {
            return Err(ButterflyError::LengthMismatch {
                expected: group.partition().len(),
                got: local.len(),
            });
        }
        if !(weight.is_finite() && weight >= 0.0) {
            return Err(ButterflyError::BadLocalWeight { weight });
        }
        if let Some(index) = first_non_finite(&local) {
            return Err(ButterflyError::NonFiniteLocal { index });
        }
        let chunk = config.chunk_elements as usize;
        if codec
            .block()
            .is_some_and(|block| !chunk.is_multiple_of(block as usize))
        {
            return Err(ButterflyError::InvalidConfig {
                key: "chunk_elements",
                value: chunk.to_string(),
                allowed: "a multiple of the codec's block size",
            });
        }
        let codec = Codec::new(codec)?;
        // A lossless codec loses nothing to feed back; the residuals are kept for the
        // next round all the same.
        let feedback = feedback.map(|mut residuals| {
            residuals.resize(local.len());
            Feedback {
                residuals,
                corrected: Vec::with_capacity(chunk),
            }
        });
        let mut parts = Vec::with_capacity(group.len());
        let mut first = 0;
        for j in 0..group.len() {
            let layout = ChunkLayout::new(group.partition().range(j), chunk);
            let chunks = layout.chunks();
            parts.push(Part {
                state: if chunks == 0 {
                    PartState::Empty
                } else {
                    PartState::Pending
                },
                layout,
                received: 0,
                last_activity: now,
                first,
            });
            first += chunks;
        }
        let mut reduction = Reduction::new(
            parts[index].layout.clone(),
            group.len(),
            config.clip,
            config.max_weight_ratio,
            now,
            sum,
        );
        let own = &parts[index].layout;
        reduction.begin_with_local(index, &local[own.range.clone()], weight);
        // `f32`'s encoding is the values' little-endian bytes.
        let averages_in_sum = codec.spec() == CodecSpec::F32
            && cfg!(target_endian = "little")
            && reduction.keeping_averages();
        let averages = if averages_in_sum {
            EncodedAverages::elsewhere(averages, own.chunks())
        } else {
            EncodedAverages::new(
                averages,
                own.chunks(),
                codec.max_encoded_len(own.local(0).len()),
            )
        };
        let mut round = ButterflyRound {
            me: index,
            codec,
            window: config.chunks_in_flight,
            chunk_timeout: config.chunk_timeout(),
            reducer_timeout: config.reducer_timeout(),
            weight,
            local,
            spare,
            moved: 0.0,
            decoded: Vec::with_capacity(chunk),
            parts,
            received: vec![false; first],
            coverage: vec![(0, 0.0); first],
            reduction,
            ready: Vec::new(),
            destinations: vec![Destination::default(); group.len()],
            owed: (0..group.len()).map(|_| VecDeque::new()).collect(),
            owed_bytes_max: OWED_BYTES_MAX,
            pool: PayloadPool::default(),
            averages,
            averages_in_sum,
            outputs: VecDeque::new(),
            finished: false,
            dropped_senders: Vec::new(),
            stats: RoundStats::default(),
            feedback,
            tally: FeedbackTally::default(),
            closed: false,
            group,
        };
        round.finalize_ready();
        round.pump();
        round.check_finished(now);
        Ok(round)
    }

    /// The group this round averages in.
    pub fn group(&self) -> &Group<P> {
        &self.group
    }

    /// The codec chunks are encoded with.
    pub fn codec_spec(&self) -> CodecSpec {
        self.codec.spec()
    }

    /// The result, complete once [`RoundOutput::Finished`] was emitted: the member's
    /// vector with every average written over its values, and its own values wherever the
    /// round could not average. Before that, the averages received so far and local values
    /// everywhere else.
    pub fn result(&self) -> &[f32] {
        &self.local
    }

    /// The squared L2 distance the averages moved this member's values, so far: with the
    /// result's norm, how far this member was from its group (consensus drift). Own-part
    /// chunks count with their exact averages, before any lossy encoding of them.
    pub fn moved_squared(&self) -> f64 {
        self.moved
    }

    /// What this round's sends encoded with error feedback so far, and what their encoding
    /// lost and the residuals carry into the next round.
    pub fn feedback_tally(&self) -> FeedbackTally {
        self.tally
    }

    /// Whether the result is complete.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether nothing is left to send or in flight to a member still in the round: the
    /// round can be dropped. Chunks still on their way to a lost member are not waited for
    /// (a send to a dead host can take a connection timeout to fail); their
    /// [`RoundInput::Sent`] may come after the round is gone.
    pub fn is_idle(&self) -> bool {
        self.finished
            && self
                .destinations
                .iter()
                .enumerate()
                .all(|(d, dest)| dest.lost || (dest.in_flight == 0 && !self.has_work(d)))
    }

    /// The spare memory handed in (see [`ButterflyRound::into_buffers`]) and the result, to
    /// reuse their memory for the next round.
    pub fn into_vectors(self) -> (Vec<f32>, Vec<f32>) {
        let buffers = self.into_buffers();
        (buffers.local, buffers.result)
    }

    /// The round's memory, for the next round: the result (the vector the round was given,
    /// averaged in place; a round given up before it finished keeps local values wherever
    /// no average arrived), and as `local` whatever memory was handed in as `result`,
    /// untouched, for the next contribution.
    pub fn into_buffers(self) -> RoundBuffers {
        RoundBuffers {
            local: self.spare,
            result: self.local,
            sum: self.reduction.into_sum(),
            averages: self.averages.into_bytes(),
            feedback: self.feedback.map(|f| f.residuals),
        }
    }

    /// Takes the round's vectors out while it goes on sending the averages of its part to
    /// members that have not had them: the result (local values wherever no average
    /// arrived, for a round not finished), the spare memory as
    /// [`ButterflyRound::into_buffers`] gives it, and the residuals.
    /// Every average ready is encoded first; the round then takes no more chunks, and
    /// sends only those averages. [`ButterflyRound::into_send_memory`] gives their memory
    /// back once the round is idle.
    pub fn take_buffers(&mut self) -> RoundBuffers {
        for i in 0..self.ready.len() {
            self.encode_average(self.ready[i] as usize);
        }
        // A quiet member may be alive: it still gets the rest of its part, up to
        // `OWED_BYTES_MAX` in all. Past that it is served no more, and its reduction does
        // without this member's contribution once its sender timeout passes, as for a
        // member that left.
        let mut budget = self.owed_bytes_max;
        for d in 0..self.destinations.len() {
            while !self.destinations[d].lost && self.owes_part_chunks(d) {
                let chunk = self.destinations[d].next_part_chunk;
                let elements = self.parts[d].layout.global(chunk).len();
                let Some(left) = budget.checked_sub(self.codec.max_encoded_len(elements)) else {
                    break;
                };
                budget = left;
                self.destinations[d].next_part_chunk += 1;
                let payload = self.encode_part_chunk(d, chunk);
                self.owed[d].push_back((chunk, payload));
            }
        }
        self.closed = true;
        self.finished = true;
        RoundBuffers {
            local: std::mem::take(&mut self.spare),
            result: std::mem::take(&mut self.local),
            // Averages still to be sent may be in the sums.
            sum: if self.averages_in_sum {
                Vec::new()
            } else {
                std::mem::take(self.reduction.sum_mut())
            },
            averages: Vec::new(),
            feedback: self.feedback.take().map(|f| f.residuals),
        }
    }

    /// The memory the round sent its averages from, once a round whose buffers were taken
    /// is idle: the encoded averages', and the sums' when the averages were sent from there.
    pub fn into_send_memory(self) -> (Vec<u8>, Vec<f32>) {
        let sum = if self.averages_in_sum {
            self.reduction.into_sum()
        } else {
            Vec::new()
        };
        (self.averages.into_bytes(), sum)
    }

    /// Round counters.
    pub fn stats(&self) -> RoundStats {
        RoundStats {
            buffers_allocated: self.pool.allocated() as u64,
            contributions_rejected: self.reduction.contributions_rejected(),
            weights_capped: u64::from(self.reduction.weights_capped()),
            ..self.stats
        }
    }

    /// The bytes of a payload named by a send output, until it is reported sent.
    pub fn payload(&self, payload: PayloadRef) -> Option<&[u8]> {
        match payload.average_chunk() {
            Some(chunk) if self.averages_in_sum => {
                let len = self.averages.len_of(chunk)?;
                let values = self.reduction.averages(chunk);
                Some(&as_le_bytes(values)[..len])
            }
            Some(chunk) => self.averages.get(chunk),
            None => self.pool.get(payload),
        }
    }

    /// The next output, if any.
    pub fn poll_output(&mut self) -> Option<RoundOutput<P>> {
        self.outputs.pop_front()
    }

    /// When the round wants a [`RoundInput::Tick`]: the earliest sender or reducer timeout.
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.finished {
            return None;
        }
        let senders = self.reduction.next_deadline(self.me, self.chunk_timeout);
        let reducers = self
            .parts
            .iter()
            .enumerate()
            .filter(|(j, part)| *j != self.me && part.state == PartState::Pending)
            .map(|(_, part)| part.last_activity + self.reducer_timeout)
            .min();
        senders.into_iter().chain(reducers).min()
    }

    /// Feeds one input at time `now`. A malformed chunk is rejected with an error and
    /// leaves the round untouched.
    pub fn handle(&mut self, now: Time, input: RoundInput<'_, P>) -> Result<(), ButterflyError> {
        if self.closed {
            return self.handle_closed(input);
        }
        match input {
            RoundInput::PartChunk {
                from,
                address,
                weight,
                codec,
                payload,
            } => self.on_part_chunk(now, from, address, weight, codec, payload)?,
            RoundInput::AveragedChunk {
                from,
                address,
                contributors,
                total_weight,
                codec,
                payload,
            } => self.on_averaged_chunk(
                now,
                from,
                address,
                contributors,
                total_weight,
                codec,
                payload,
            )?,
            RoundInput::Sent { to, payload } => {
                // An average stays for the whole round, shared by every destination.
                let current = match payload.average_chunk() {
                    Some(chunk) => self.averages.len_of(chunk).is_some(),
                    None => self.pool.release(payload),
                };
                if current && let Some(d) = self.group.index_of(to) {
                    let dest = &mut self.destinations[d];
                    dest.in_flight = dest.in_flight.saturating_sub(1);
                }
            }
            RoundInput::MemberLost(peer) => {
                if let Some(d) = self.group.index_of(peer).filter(|&d| d != self.me) {
                    self.destinations[d].lost = true;
                    self.drop_sender(d);
                    self.fall_back(d);
                }
            }
            RoundInput::MemberQuiet(peer) => {
                if let Some(d) = self.group.index_of(peer).filter(|&d| d != self.me) {
                    self.destinations[d].quiet = true;
                    self.drop_sender(d);
                    self.fall_back(d);
                }
            }
            RoundInput::Tick => {
                let silent: Vec<usize> = self
                    .reduction
                    .silent_senders(self.me, now, self.chunk_timeout)
                    .collect();
                for sender in silent {
                    self.drop_sender(sender);
                }
                for j in 0..self.parts.len() {
                    let part = &self.parts[j];
                    if j != self.me
                        && part.state == PartState::Pending
                        && part.last_activity + self.reducer_timeout <= now
                    {
                        self.fall_back(j);
                    }
                }
            }
        }
        self.pump();
        self.check_finished(now);
        Ok(())
    }

    /// After [`ButterflyRound::take_buffers`]: send reports and lost members still count,
    /// chunks are ignored.
    fn handle_closed(&mut self, input: RoundInput<'_, P>) -> Result<(), ButterflyError> {
        match input {
            RoundInput::Sent { to, payload } => {
                let current = match payload.average_chunk() {
                    Some(chunk) => self.averages.len_of(chunk).is_some(),
                    None => self.pool.release(payload),
                };
                if current && let Some(d) = self.group.index_of(to) {
                    let dest = &mut self.destinations[d];
                    dest.in_flight = dest.in_flight.saturating_sub(1);
                }
            }
            RoundInput::MemberLost(peer) => {
                if let Some(d) = self.group.index_of(peer).filter(|&d| d != self.me) {
                    self.destinations[d].lost = true;
                    while let Some((_, payload)) = self.owed[d].pop_front() {
                        self.pool.release(payload);
                    }
                }
            }
            RoundInput::PartChunk { .. } | RoundInput::AveragedChunk { .. } => {
                self.stats.chunks_ignored += 1;
            }
            RoundInput::MemberQuiet(_) | RoundInput::Tick => {}
        }
        self.pump();
        Ok(())
    }

    fn on_part_chunk(
        &mut self,
        now: Time,
        from: P,
        address: ChunkAddress,
        weight: f32,
        codec: CodecSpec,
        payload: &[u8],
    ) -> Result<(), ButterflyError> {
        let sender = self.check_sender(from, address, codec)?;
        if address.part as usize != self.me {
            return Err(bad(address, "the part is not reduced by this member"));
        }
        if sender == self.me {
            return Err(bad(
                address,
                "a member does not send its own part to itself",
            ));
        }
        if !(weight.is_finite() && weight >= 0.0) {
            return Err(ButterflyError::BadWeight { weight });
        }
        let chunk = self
            .reduction
            .layout()
            .check(address.chunk, address.offset, address.elements)
            .map_err(|reason| bad(address, reason))?;
        if !self
            .reduction
            .accept(&mut self.codec, sender, chunk, weight, payload, now)?
        {
            self.stats.chunks_ignored += 1;
            return Ok(());
        }
        self.stats.part_chunks_received += 1;
        let own = self.parts[self.me].layout.range.clone();
        if let Some(moved) = self.reduction.try_finalize(chunk, &mut self.local[own]) {
            self.moved += moved;
            self.ready.push(chunk as u32);
            self.note_own_part_progress();
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)] // one per field of the wire message
    fn on_averaged_chunk(
        &mut self,
        now: Time,
        from: P,
        address: ChunkAddress,
        contributors: u32,
        total_weight: f32,
        codec: CodecSpec,
        payload: &[u8],
    ) -> Result<(), ButterflyError> {
        let reducer = self.check_sender(from, address, codec)?;
        let j = address.part as usize;
        if j != reducer {
            return Err(bad(
                address,
                "a reducer sends averages of its own part only",
            ));
        }
        if j == self.me {
            return Err(bad(address, "this member reduces that part itself"));
        }
        if !(total_weight.is_finite() && total_weight >= 0.0) {
            return Err(ButterflyError::BadWeight {
                weight: total_weight,
            });
        }
        let part = &self.parts[j];
        let chunk = part
            .layout
            .check(address.chunk, address.offset, address.elements)
            .map_err(|reason| bad(address, reason))?;
        let slot = part.first + chunk;
        if part.state != PartState::Pending || self.received[slot] {
            self.stats.chunks_ignored += 1;
            return Ok(());
        }
        let range = part.layout.global(chunk);
        self.decoded.clear();
        self.decoded.resize(range.len(), 0.0);
        self.codec.decode_into(payload, &mut self.decoded)?;
        let values = &mut self.local[range];
        self.moved += squared_distance(&self.decoded, values);
        values.copy_from_slice(&self.decoded);
        self.received[slot] = true;
        self.coverage[slot] = (contributors, total_weight);
        self.stats.averaged_chunks_received += 1;
        let part = &mut self.parts[j];
        part.received += 1;
        part.last_activity = now;
        if part.received == part.layout.chunks() {
            part.state = PartState::Averaged;
        }
        Ok(())
    }

    /// Checks group and codec, and returns the sender's index.
    fn check_sender(
        &self,
        from: P,
        address: ChunkAddress,
        codec: CodecSpec,
    ) -> Result<usize, ButterflyError> {
        if address.group_id != self.group.group_id {
            return Err(ButterflyError::WrongGroup {
                expected: self.group.group_id,
                got: address.group_id,
            });
        }
        let sender = self
            .group
            .index_of(from)
            .ok_or_else(|| ButterflyError::NotAMember {
                peer: format!("{from:?}"),
            })?;
        if codec != self.codec.spec() {
            return Err(bad(address, "encoded with a codec other than the round's"));
        }
        Ok(sender)
    }

    fn drop_sender(&mut self, sender: usize) {
        if self.parts[self.me].state == PartState::Pending && self.reduction.drop_sender(sender) {
            self.dropped_senders.push(self.group.members()[sender]);
            self.finalize_ready();
        }
    }

    fn finalize_ready(&mut self) {
        let own = self.parts[self.me].layout.range.clone();
        let before = self.ready.len();
        self.moved += self
            .reduction
            .finalize_ready(&mut self.local[own], &mut self.ready);
        // Encoding at once makes this member's own result what the others will decode.
        if self.group.len() > 1 {
            for i in before..self.ready.len() {
                self.encode_average(self.ready[i] as usize);
            }
        }
        self.note_own_part_progress();
    }

    fn note_own_part_progress(&mut self) {
        let part = &mut self.parts[self.me];
        if part.state == PartState::Pending && self.reduction.is_complete() {
            part.state = PartState::Averaged;
        }
    }

    /// The reducer of part `j` fell silent: the part keeps local values where no average
    /// arrived (no average is taken from it after this).
    fn fall_back(&mut self, j: usize) {
        let part = &mut self.parts[j];
        if j == self.me || part.state != PartState::Pending {
            return;
        }
        part.state = PartState::LocalFallback;
    }

    /// Whether destination `d` still has chunks to be sent.
    fn has_work(&self, d: usize) -> bool {
        let dest = &self.destinations[d];
        if self.closed {
            return d != self.me
                && (dest.next_average < self.ready.len() || !self.owed[d].is_empty());
        }
        d != self.me && (dest.next_average < self.ready.len() || self.owes_part_chunks(d))
    }

    /// Whether part chunks are left to send to `d`: while its part is pending here, or
    /// while it is quiet (its part fell back here, but it may be alive and reducing).
    fn owes_part_chunks(&self, d: usize) -> bool {
        let dest = &self.destinations[d];
        (self.parts[d].state == PartState::Pending || dest.quiet)
            && dest.next_part_chunk < self.parts[d].layout.chunks()
    }

    /// Whether the next chunk for destination `d` is an average rather than a part chunk.
    ///
    /// Averages go first, as other members wait for them to finish, but never ahead of
    /// the part chunks already sent to `d` (each counted as a fraction of its part): a
    /// part chunk feeds `d`'s own reduction, which every member waits on for the averages
    /// of `d`'s part. A member whose reduction ran ahead would otherwise spend its uplink
    /// on its averages while the others' reductions starve for its part chunks, and end
    /// the round with its part chunks going out alone.
    fn average_next(&self, d: usize) -> bool {
        let dest = &self.destinations[d];
        if dest.next_average >= self.ready.len() {
            return false;
        }
        if self.closed {
            return true;
        }
        let part_chunks = self.parts[d].layout.chunks();
        let parts_left = self.owes_part_chunks(d);
        // averages sent / own chunks ≤ part chunks sent / part chunks, cross-multiplied.
        !parts_left
            || dest.next_average * part_chunks
                <= dest.next_part_chunk * self.parts[self.me].layout.chunks()
    }

    /// Hands chunks to the transport while destinations have room in their windows, one
    /// chunk per destination per pass so that every reducer's stream starts at once, in the
    /// order [`Self::average_next`] gives.
    fn pump(&mut self) {
        // Each pass sends at least one chunk or stops; a destination takes at most
        // `window` chunks, so this ends after `window` passes plus one.
        loop {
            let mut progress = false;
            for d in 0..self.destinations.len() {
                if !self.destinations[d].lost
                    && self.destinations[d].in_flight < self.window
                    && self.has_work(d)
                {
                    if self.average_next(d) {
                        self.send_average(d);
                    } else if self.closed {
                        self.send_owed(d);
                    } else {
                        self.send_part_chunk(d);
                    }
                    progress = true;
                }
            }
            if !progress {
                break;
            }
        }
    }

    fn send_average(&mut self, d: usize) {
        let dest = &mut self.destinations[d];
        let chunk = self.ready[dest.next_average] as usize;
        dest.next_average += 1;
        dest.in_flight += 1;
        let layout = &self.parts[self.me].layout;
        let address = address(self.group.group_id, self.me, chunk, layout);
        let (contributors, total_weight) = self.reduction.coverage(chunk);
        let payload = self.encode_average(chunk);
        self.stats.averaged_chunks_sent += 1;
        self.outputs.push_back(RoundOutput::SendAveragedChunk {
            to: self.group.members()[d],
            address,
            contributors,
            total_weight,
            payload,
        });
    }

    /// The encoded average of chunk `chunk` of this member's part, encoded on first use
    /// (with error feedback when on), then shared by every destination.
    fn encode_average(&mut self, chunk: usize) -> PayloadRef {
        if let Some(payload) = self.averages.encoded(chunk) {
            return payload;
        }
        if self.averages_in_sum {
            // Their bytes are their encoding; one that is not finite goes out empty, as
            // `f32`'s encoder would refuse it (see `encode`).
            let values = self.reduction.averages(chunk);
            let len = if first_non_finite(values).is_none() {
                std::mem::size_of_val(values)
            } else {
                0
            };
            return self.averages.mark(chunk, len);
        }
        let range = self.parts[self.me].layout.global(chunk);
        let (codec, values, tally) = (&mut self.codec, &self.local[range.clone()], &mut self.tally);
        let feedback = self
            .feedback
            .as_mut()
            .filter(|_| codec.spec() != CodecSpec::F32);
        // See `encode` for why a failed encoding goes out empty.
        let payload = self.averages.get_or_encode(chunk, |buffer| match feedback {
            Some(f) => encode_corrected(
                codec,
                values,
                (&mut f.residuals.averages, range.start),
                (&mut f.corrected, tally),
                buffer,
            ),
            None => codec.encode(values, buffer).unwrap_or(0),
        });
        // Every other member applies the decoded average; so does this one, so that the
        // group's replicas stay bit-identical (their updates must be, or they drift apart
        // by the codec's error each round with nothing to pull them back). The exact
        // average's loss is carried into the next round by error feedback, when on.
        if codec.spec() != CodecSpec::F32
            && let Some(bytes) = self.averages.get(chunk).filter(|b| !b.is_empty())
        {
            // The bytes were just encoded from a chunk of this length: decoding them
            // cannot fail, and if it did the exact values would stay, as before.
            let _ = codec.decode_into(bytes, &mut self.local[range]);
        }
        payload
    }

    fn send_part_chunk(&mut self, d: usize) {
        let chunk = self.destinations[d].next_part_chunk;
        self.destinations[d].next_part_chunk += 1;
        let payload = self.encode_part_chunk(d, chunk);
        self.push_part_chunk(d, chunk, payload);
    }

    /// Sends the next part chunk encoded for `d` when the vectors were taken out.
    fn send_owed(&mut self, d: usize) {
        if let Some((chunk, payload)) = self.owed[d].pop_front() {
            self.push_part_chunk(d, chunk, payload);
        }
    }

    fn push_part_chunk(&mut self, d: usize, chunk: usize, payload: PayloadRef) {
        self.destinations[d].in_flight += 1;
        let address = address(self.group.group_id, d, chunk, &self.parts[d].layout);
        self.stats.part_chunks_sent += 1;
        self.outputs.push_back(RoundOutput::SendPartChunk {
            to: self.group.members()[d],
            address,
            weight: self.weight,
            payload,
        });
    }

    /// This member's copy of chunk `chunk` of part `d`, encoded (with error feedback when
    /// on).
    fn encode_part_chunk(&mut self, d: usize, chunk: usize) -> PayloadRef {
        let range = self.parts[d].layout.global(chunk);
        let values = &self.local[range.clone()];
        match self
            .feedback
            .as_mut()
            .filter(|_| self.codec.spec() != CodecSpec::F32)
        {
            Some(f) => {
                let capacity = self.codec.max_encoded_len(values.len());
                let (reference, buffer) = self.pool.acquire(capacity);
                let len = encode_corrected(
                    &mut self.codec,
                    values,
                    (&mut f.residuals.parts, range.start),
                    (&mut f.corrected, &mut self.tally),
                    buffer,
                );
                self.pool.set_len(reference, len);
                reference
            }
            None => encode(&mut self.codec, &mut self.pool, values),
        }
    }

    fn check_finished(&mut self, now: Time) {
        if self.finished || self.parts.iter().any(|p| p.state == PartState::Pending) {
            return;
        }
        self.finished = true;
        let report = self.report(now);
        self.outputs.push_back(RoundOutput::Finished(report));
    }

    fn report(&self, now: Time) -> CoverageReport<P> {
        let parts = self
            .parts
            .iter()
            .enumerate()
            .map(|(j, part)| {
                let outcome = match part.state {
                    PartState::Averaged | PartState::Pending => PartOutcome::Averaged,
                    PartState::LocalFallback => PartOutcome::LocalFallback,
                    PartState::Empty => PartOutcome::Empty,
                };
                let chunks = (0..part.layout.chunks())
                    .map(|c| {
                        let local =
                            outcome == PartOutcome::LocalFallback && !self.received[part.first + c];
                        let (contributors, total_weight) = match outcome {
                            _ if local => (1, self.weight),
                            _ if j == self.me => self.reduction.coverage(c),
                            _ => self.coverage[part.first + c],
                        };
                        ChunkCoverage {
                            elements: part.layout.global(c),
                            contributors,
                            total_weight,
                            local,
                        }
                    })
                    .collect();
                PartCoverage {
                    part: j,
                    reducer: self.group.members()[j],
                    elements: part.layout.range.clone(),
                    outcome,
                    chunks,
                }
            })
            .collect();
        CoverageReport {
            group_id: self.group.group_id,
            finished_at: now,
            parts,
            dropped_senders: self.dropped_senders.clone(),
        }
    }
}

fn address(group_id: u64, part: usize, chunk: usize, layout: &ChunkLayout) -> ChunkAddress {
    let local = layout.local(chunk);
    ChunkAddress {
        group_id,
        part: part as u32,
        chunk: chunk as u32,
        offset: local.start as u64,
        // At most `chunk_elements`, a u32.
        elements: local.len() as u32,
    }
}

/// Encodes `values` into a pooled buffer.
///
/// The local vector was checked finite when the round began, and an average of finite
/// values weighted by finite weights is finite unless it overflows; a chunk that cannot be
/// encoded goes out empty, which its receiver rejects as malformed and so treats as lost.
fn encode(codec: &mut Codec, pool: &mut PayloadPool, values: &[f32]) -> PayloadRef {
    let capacity = codec.max_encoded_len(values.len());
    let (reference, buffer) = pool.acquire(capacity);
    let len = codec.encode(values, buffer).unwrap_or(0);
    pool.set_len(reference, len);
    reference
}

fn bad(address: ChunkAddress, reason: &'static str) -> ButterflyError {
    ButterflyError::BadChunk {
        part: address.part,
        chunk: address.chunk,
        reason,
    }
}

/// `values` as the bytes of `f32`'s encoding: each value's little-endian bytes (the round
/// sends from here only on a little-endian host).
fn as_le_bytes(values: &[f32]) -> &[u8] {
    bytemuck::cast_slice(values)
}

#[cfg(test)]
mod tests {
    use murmur_protocol::codec::CodecSpec;

    use super::*;
    use crate::butterfly::Partition;

    const LEN: usize = 3 * 40 * 64;
    const CHUNK: u32 = 64;

    /// Members 0 and 1 of a group of three, member 2 quiet to both and never heard from:
    /// they exchange everything between them, and their sends to member 2 stay unanswered
    /// (in flight) until the round is taken apart.
    fn finished_without_member_2() -> (Vec<ButterflyRound<u32>>, Vec<PayloadRef>) {
        let partition = Partition::equal(LEN, 3, CHUNK as usize).expect("valid");
        let group = Group::new(1, 42, vec![0, 1, 2], partition).expect("valid");
        let config = ButterflyConfig {
            chunk_elements: CHUNK,
            chunks_in_flight: 2,
            ..ButterflyConfig::default()
        };
        let mut rounds: Vec<ButterflyRound<u32>> = (0..2u32)
            .map(|i| {
                let local: Vec<f32> = (0..LEN).map(|e| (e as f32 + i as f32) * 0.01).collect();
                let mut round = ButterflyRound::new(
                    i,
                    group.clone(),
                    local,
                    1.0,
                    CodecSpec::F32,
                    &config,
                    Time::ZERO,
                )
                .expect("valid round");
                round
                    .handle(Time::ZERO, RoundInput::MemberQuiet(2))
                    .expect("quiet");
                round
            })
            .collect();
        // Member 0's sends to member 2.
        let mut held = Vec::new();
        // Each chunk moves once; the bound only stops a runaway loop.
        for _ in 0..10_000 {
            let mut wires = Vec::new();
            for (from, round) in rounds.iter_mut().enumerate() {
                while let Some(output) = round.poll_output() {
                    let (to, address, weight, averaged, payload) = match output {
                        RoundOutput::SendPartChunk {
                            to,
                            address,
                            weight,
                            payload,
                        } => (to, address, weight, false, payload),
                        RoundOutput::SendAveragedChunk {
                            to,
                            address,
                            total_weight,
                            payload,
                            ..
                        } => (to, address, total_weight, true, payload),
                        RoundOutput::Finished(_) => continue,
                    };
                    if to == 2 {
                        if from == 0 {
                            held.push(payload);
                        }
                        continue;
                    }
                    let bytes = round.payload(payload).expect("current").to_vec();
                    round
                        .handle(Time::ZERO, RoundInput::Sent { to, payload })
                        .expect("ack");
                    wires.push((from as u32, to as usize, address, weight, averaged, bytes));
                }
            }
            if wires.is_empty() {
                break;
            }
            for (from, to, address, weight, averaged, payload) in wires {
                let contributors = averaged.then_some(2);
                let input = RoundInput::arrived(
                    from,
                    address,
                    weight,
                    contributors,
                    CodecSpec::F32,
                    &payload,
                );
                rounds[to].handle(Time::ZERO, input).expect("delivered");
            }
        }
        assert!(rounds.iter().all(ButterflyRound::is_finished));
        (rounds, held)
    }

    /// What a member owes a quiet member once its vectors are taken out is bounded in
    /// bytes; past the bound it is not served, and the round still goes idle once what it
    /// did encode went out. With a bound above the part it is served the whole part.
    #[test]
    fn part_chunks_owed_to_a_quiet_member_are_bounded_in_bytes() {
        let chunk_bytes = CHUNK as usize * 4;
        let part_chunks = LEN / 3 / CHUNK as usize;
        for (bound_chunks, owed) in [(5, 5), (part_chunks + 10, part_chunks - 2)] {
            let (mut rounds, held) = finished_without_member_2();
            // The window's two part chunks went out before member 2 fell quiet.
            assert_eq!(held.len(), 2);
            let round = &mut rounds[0];
            round.owed_bytes_max = bound_chunks * chunk_bytes;
            round.take_buffers();
            assert_eq!(round.owed[2].len(), owed, "bound of {bound_chunks} chunks");
            assert!(!round.is_idle());
            // Member 2 wakes and takes what is sent to it: the round sends what it owes,
            // and is done.
            for payload in held {
                round
                    .handle(Time::ZERO, RoundInput::Sent { to: 2, payload })
                    .expect("ack");
            }
            let mut sent = 0;
            for _ in 0..10_000 {
                let Some(output) = round.poll_output() else {
                    break;
                };
                let (to, payload) = match output {
                    RoundOutput::SendPartChunk { to, payload, .. } => {
                        sent += 1;
                        (to, payload)
                    }
                    // The averages of member 0's part go to member 2 too.
                    RoundOutput::SendAveragedChunk { to, payload, .. } => (to, payload),
                    RoundOutput::Finished(_) => continue,
                };
                round
                    .handle(Time::ZERO, RoundInput::Sent { to, payload })
                    .expect("ack");
            }
            assert_eq!(sent, owed);
            assert!(round.is_idle(), "bound of {bound_chunks} chunks");
        }
    }
}

//! Matchmaking and butterfly rounds in a simulated butterfly swarm: feeding the state
//! machines and carrying out what they ask for.

use murmur_protocol::message::ChunkAddress;
use rand::RngExt;

use crate::Time;
use crate::butterfly::{
    ButterflyRound, Group, MatchInput, MatchOutput, MemberProfile, PayloadRef, RoundInput,
    RoundOutput,
};

use crate::sim::error::SimError;
use crate::sim::queue::Lane;

use super::{ButterflySwarm, Chunk, ChunkKind, Event, Phase, Status};

/// A send a round asked for, its payload copied out of the round's buffer.
struct Send {
    to: u32,
    address: ChunkAddress,
    kind: ChunkKind,
    reference: PayloadRef,
    payload: Vec<u8>,
}

impl ButterflySwarm {
    /// Peer `id` becomes ready if it has heard that its batch is due.
    pub(super) fn maybe_look(&mut self, id: u32) -> Result<(), SimError> {
        let peer = &mut self.peers[id as usize];
        if peer.phase != Phase::Training || peer.heard_due < peer.epoch {
            return Ok(());
        }
        match peer.status {
            Status::Live => {}
            Status::Leaving => return self.maybe_depart(id),
            Status::Syncing | Status::Gone => return Ok(()),
        }
        peer.phase = Phase::Matching;
        let config = &self.training.butterfly;
        peer.matchmaker
            .set_target_group(self.membership.min(config.target_group));
        let input = MatchInput::Ready {
            round: peer.epoch,
            group_id: self.run.rng.random(),
            profile: MemberProfile {
                bandwidth_bytes_per_s: self.bandwidth,
                accepts_connections: true,
                samples: peer.learner.samples(),
            },
        };
        self.feed_matchmaker(id, input)
    }

    pub(super) fn on_gossip(
        &mut self,
        subject: u32,
        looking: Option<(u64, Time)>,
    ) -> Result<(), SimError> {
        for id in 0..self.peers.len() as u32 {
            if id == subject || self.peers[id as usize].status == Status::Gone {
                continue;
            }
            let input = match looking {
                Some((round, deadline)) => MatchInput::PeerLooking {
                    peer: subject,
                    round,
                    deadline,
                },
                None => MatchInput::PeerNotLooking(subject),
            };
            self.feed_matchmaker(id, input)?;
        }
        Ok(())
    }

    /// Hands `input` to peer `id`'s matchmaker (if the peer still runs) and acts on what
    /// it asks for.
    pub(super) fn feed_matchmaker(
        &mut self,
        id: u32,
        input: MatchInput<u32>,
    ) -> Result<(), SimError> {
        let peer = &mut self.peers[id as usize];
        if peer.status == Status::Gone {
            return Ok(());
        }
        peer.matchmaker.handle(self.run.now, input);
        while let Some(output) = self.peers[id as usize].matchmaker.poll_output() {
            let now = self.run.now;
            let latency = self.run.network.latency();
            let gossip = now + self.gossip_delay();
            match output {
                MatchOutput::AnnounceLooking { round, deadline } => {
                    let looking = Some((round, deadline));
                    let event = Event::Gossip {
                        subject: id,
                        looking,
                    };
                    self.run.queue.push(gossip, Lane::Normal, event);
                }
                MatchOutput::AnnounceNotLooking => {
                    let event = Event::Gossip {
                        subject: id,
                        looking: None,
                    };
                    self.run.queue.push(gossip, Lane::Normal, event);
                }
                // Control messages are small and ride their own streams: they pay one
                // latency and do not queue behind tensor chunks.
                MatchOutput::SendJoin { to, request } => {
                    let input = MatchInput::JoinRequest { from: id, request };
                    let event = Event::Control { to, input };
                    self.run.queue.push(now + latency, Lane::Normal, event);
                }
                MatchOutput::SendReject { to, round, reason } => {
                    let input = MatchInput::Rejected {
                        from: id,
                        round,
                        reason,
                    };
                    let event = Event::Control { to, input };
                    self.run.queue.push(now + latency, Lane::Normal, event);
                }
                MatchOutput::SendBegin { to, group } => {
                    let input = MatchInput::GroupBegan { from: id, group };
                    let event = Event::Control { to, input };
                    self.run.queue.push(now + latency, Lane::Normal, event);
                }
                MatchOutput::Formed(group) => self.start_round(id, group)?,
                MatchOutput::NoGroup => self.average_alone(id)?,
            }
        }
        self.arm(id);
        Ok(())
    }

    /// Peer `id`'s group began: it contributes what it has accumulated.
    fn start_round(&mut self, id: u32, group: Group<u32>) -> Result<(), SimError> {
        let now = self.run.now;
        let mut local = self.spare_vectors.pop().unwrap_or_default();
        let peer = &mut self.peers[id as usize];
        if peer.phase != Phase::Matching {
            return Ok(());
        }
        let weight = peer
            .learner
            .take_contribution(self.learning_rate, &mut local);
        let group_id = group.group_id;
        let lost: Vec<u32> = group
            .members()
            .iter()
            .copied()
            .filter(|&member| self.peers[member as usize].known_gone)
            .collect();
        let mut round = ButterflyRound::new(
            id,
            group,
            local,
            weight,
            self.training.codec,
            &self.training.butterfly,
            now,
        )?;
        // The transport cannot reach members the swarm already knows are gone.
        for member in lost {
            round.handle(now, RoundInput::MemberLost(member))?;
        }
        let peer = &mut self.peers[id as usize];
        peer.phase = Phase::Averaging;
        peer.round_started = now;
        peer.rounds.push(round);
        self.pump_round(id, group_id)
    }

    /// No group this batch: peer `id` applies its own contribution.
    fn average_alone(&mut self, id: u32) -> Result<(), SimError> {
        let mut local = self.spare_vectors.pop().unwrap_or_default();
        let peer = &mut self.peers[id as usize];
        peer.learner
            .take_contribution(self.learning_rate, &mut local);
        peer.learner.adopt(&local);
        self.spare_vectors.push(local);
        self.run.tally.local();
        self.next_batch(id)
    }

    /// Peer `id` applied the update of its batch: on to the next.
    fn next_batch(&mut self, id: u32) -> Result<(), SimError> {
        let peer = &mut self.peers[id as usize];
        peer.epoch += 1;
        peer.phase = Phase::Training;
        if peer.status == Status::Live && !peer.stepping {
            self.start_step(id);
        }
        self.maybe_look(id)?;
        self.maybe_depart(id)
    }

    /// Carries out what the round `group_id` of peer `id` asks for.
    pub(super) fn pump_round(&mut self, id: u32, group_id: u64) -> Result<(), SimError> {
        let peer = &mut self.peers[id as usize];
        let Some(index) = peer
            .rounds
            .iter()
            .position(|round| round.group().group_id == group_id)
        else {
            return Ok(());
        };
        let round = &mut peer.rounds[index];
        let mut sends = Vec::new();
        let mut finished = None;
        while let Some(output) = round.poll_output() {
            let (to, address, kind, reference) = match output {
                RoundOutput::SendPartChunk {
                    to,
                    address,
                    weight,
                    payload,
                } => (to, address, ChunkKind::Part { weight }, payload),
                RoundOutput::SendAveragedChunk {
                    to,
                    address,
                    contributors,
                    total_weight,
                    payload,
                } => {
                    let kind = ChunkKind::Averaged {
                        contributors,
                        total_weight,
                    };
                    (to, address, kind, payload)
                }
                RoundOutput::Finished(report) => {
                    finished = Some(report);
                    continue;
                }
            };
            let mut payload = self.spare_buffers.pop().unwrap_or_default();
            payload.clear();
            payload.extend_from_slice(round.payload(reference).unwrap_or_default());
            sends.push(Send {
                to,
                address,
                kind,
                reference,
                payload,
            });
        }
        let done = finished.is_some();
        if let Some(report) = finished {
            let members = round.group().len();
            peer.learner.adopt(round.result());
            let secs = self.run.now.saturating_since(peer.round_started);
            let fraction = report.fraction_covered_by(2);
            self.run
                .tally
                .averaged(members, fraction, secs.as_secs_f64());
        }
        let idle = round.is_idle();
        if idle {
            let (local, result) = peer.rounds.remove(index).into_vectors();
            self.spare_vectors.push(local);
            self.spare_vectors.push(result);
        }
        for send in sends {
            self.send_chunk(id, group_id, send);
        }
        if done {
            self.next_batch(id)?;
        } else if idle {
            self.maybe_depart(id)?;
        }
        self.arm(id);
        Ok(())
    }

    fn send_chunk(&mut self, from: u32, group_id: u64, send: Send) {
        let departure = self
            .run
            .network
            .depart(self.run.now, from as usize, send.payload.len());
        let sent = Event::Sent {
            peer: from,
            group_id,
            to: send.to,
            payload: send.reference,
        };
        self.run.queue.push(departure.sent, Lane::Normal, sent);
        let chunk = Chunk {
            from,
            to: send.to,
            address: send.address,
            kind: send.kind,
            departure,
            payload: send.payload,
        };
        self.run
            .queue
            .push(departure.reaches, Lane::Normal, Event::Reach(chunk));
    }

    /// A chunk's first byte reaches its receiver, unless its sender died before it left.
    pub(super) fn on_reach(&mut self, chunk: Chunk) {
        let sender = &self.peers[chunk.from as usize];
        if sender
            .crashed_at
            .is_some_and(|at| at <= chunk.departure.departs)
        {
            // The connection reset took the bytes that had not left.
            self.spare_buffers.push(chunk.payload);
            return;
        }
        let arrival =
            self.run
                .network
                .arrive(&chunk.departure, chunk.to as usize, &mut self.run.rng);
        self.run
            .queue
            .push(arrival, Lane::Normal, Event::Arrive(chunk));
    }

    pub(super) fn on_arrive(&mut self, chunk: Chunk) -> Result<(), SimError> {
        let now = self.run.now;
        let group_id = chunk.address.group_id;
        let peer = &mut self.peers[chunk.to as usize];
        let round = peer
            .rounds
            .iter_mut()
            .find(|round| round.group().group_id == group_id);
        let Some(round) = round.filter(|_| peer.status != Status::Gone) else {
            self.spare_buffers.push(chunk.payload);
            return Ok(());
        };
        let codec = round.codec_spec();
        let input = match chunk.kind {
            ChunkKind::Part { weight } => RoundInput::PartChunk {
                from: chunk.from,
                address: chunk.address,
                weight,
                codec,
                payload: &chunk.payload,
            },
            ChunkKind::Averaged {
                contributors,
                total_weight,
            } => RoundInput::AveragedChunk {
                from: chunk.from,
                address: chunk.address,
                contributors,
                total_weight,
                codec,
                payload: &chunk.payload,
            },
        };
        let before = round.stats().chunks_ignored;
        let refused = round.handle(now, input).is_err() || round.stats().chunks_ignored > before;
        if refused {
            self.run.tally.refused();
        }
        self.spare_buffers.push(chunk.payload);
        self.pump_round(chunk.to, group_id)
    }

    pub(super) fn on_sent(
        &mut self,
        id: u32,
        group_id: u64,
        to: u32,
        payload: PayloadRef,
    ) -> Result<(), SimError> {
        let now = self.run.now;
        let peer = &mut self.peers[id as usize];
        if peer.status == Status::Gone {
            return Ok(());
        }
        let Some(round) = peer
            .rounds
            .iter_mut()
            .find(|round| round.group().group_id == group_id)
        else {
            return Ok(());
        };
        round.handle(now, RoundInput::Sent { to, payload })?;
        self.pump_round(id, group_id)
    }

    pub(super) fn on_tick(&mut self, id: u32) -> Result<(), SimError> {
        let now = self.run.now;
        let peer = &mut self.peers[id as usize];
        // Only the latest armed tick counts; earlier ones were superseded.
        if peer.status == Status::Gone || peer.armed != Some(now) {
            return Ok(());
        }
        peer.armed = None;
        let due: Vec<u64> = peer
            .rounds
            .iter()
            .filter(|round| round.poll_timeout().is_some_and(|at| at <= now))
            .map(|round| round.group().group_id)
            .collect();
        for group_id in due {
            if let Some(round) = self.peers[id as usize]
                .rounds
                .iter_mut()
                .find(|round| round.group().group_id == group_id)
            {
                round.handle(now, RoundInput::Tick)?;
            }
            self.pump_round(id, group_id)?;
        }
        if self.peers[id as usize]
            .matchmaker
            .poll_timeout()
            .is_some_and(|at| at <= now)
        {
            self.feed_matchmaker(id, MatchInput::Tick)?;
        }
        self.arm(id);
        Ok(())
    }

    /// Tells the rounds and the matchmaker of every peer that `lost` is gone.
    pub(super) fn member_lost(&mut self, lost: u32) -> Result<(), SimError> {
        let now = self.run.now;
        for id in 0..self.peers.len() as u32 {
            if id == lost || self.peers[id as usize].status == Status::Gone {
                continue;
            }
            let affected: Vec<u64> = self.peers[id as usize]
                .rounds
                .iter()
                .filter(|round| round.group().index_of(lost).is_some())
                .map(|round| round.group().group_id)
                .collect();
            for group_id in affected {
                if let Some(round) = self.peers[id as usize]
                    .rounds
                    .iter_mut()
                    .find(|round| round.group().group_id == group_id)
                {
                    round.handle(now, RoundInput::MemberLost(lost))?;
                }
                self.pump_round(id, group_id)?;
            }
            self.feed_matchmaker(id, MatchInput::PeerGone(lost))?;
        }
        Ok(())
    }

    /// Queues a tick for the earliest timeout of peer `id`'s matchmaker and rounds.
    pub(super) fn arm(&mut self, id: u32) {
        let peer = &mut self.peers[id as usize];
        if peer.status == Status::Gone {
            return;
        }
        let next = peer
            .rounds
            .iter()
            .filter_map(ButterflyRound::poll_timeout)
            .chain(peer.matchmaker.poll_timeout())
            .min();
        if let Some(at) = next
            && peer.armed.is_none_or(|armed| at < armed)
        {
            let at = at.max(self.run.now);
            peer.armed = Some(at);
            self.run
                .queue
                .push(at, Lane::Normal, Event::Tick { peer: id });
        }
    }
}

//! Synchronous ring training in simulation: after every step all peers average in one
//! ring all-reduce, driving the real [`RingAllReduce`] state machine over the simulated
//! links, and wait for it before the next step.

mod churn;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use murmur_protocol::message::ChunkAddress;

use crate::Time;
use crate::butterfly::PayloadRef;
use crate::ring::{RingAllReduce, RingInput, RingOutput};

use super::error::SimError;
use super::learner::{Learner, learning_rate};
use super::network::Departure;
use super::queue::Lane;
use super::report::{RoundRecord, SimReport};
use super::scenario::{ChurnEvent, Scenario};
use super::training::RingTraining;
use super::training_run::{
    self, Lifecycle, RunEvent, Status, TrainingPeer, TrainingRun, TrainingSwarm, live_params,
};

/// Frozen rings kept behind the newest, for peers that lag a step or two behind.
const RINGS_KEPT: u64 = 8;

/// A segment on the wire.
#[derive(Debug)]
struct Segment {
    from: u32,
    to: u32,
    address: ChunkAddress,
    weight: f32,
    departure: Departure,
    payload: Vec<u8>,
}

#[derive(Debug)]
enum Event {
    /// What every training swarm has: steps, churn, downloads, records.
    Run(RunEvent),
    Reach(Segment),
    Arrive(Segment),
    Sent {
        peer: u32,
        step: u64,
        payload: PayloadRef,
    },
    Tick {
        peer: u32,
    },
    CrashNoticed {
        subject: u32,
    },
}

impl From<RunEvent> for Event {
    fn from(event: RunEvent) -> Event {
        Event::Run(event)
    }
}

/// A step's ring and the deadline every member's all-reduce shares.
#[derive(Debug, Clone)]
struct Rendezvous {
    ring: Vec<u32>,
    deadline: Time,
}

#[derive(Debug)]
struct Peer {
    status: Status,
    learner: Learner,
    /// The step this peer computes or all-reduces (1 for the first).
    step: u64,
    machine: Option<RingAllReduce<u32>>,
    /// What this peer put into the current all-reduce: its update should the ring fail.
    contribution: Vec<f32>,
    started: Time,
    /// Segments of steps this peer has not begun to all-reduce.
    early: Vec<Segment>,
    armed: Option<Time>,
    crashed_at: Option<Time>,
}

/// A simulated synchronous ring training swarm, for tests that want to step it.
///
/// [`run`](super::run) drives one to the end of its scenario; tests can instead call
/// [`RingSwarm::run_until`] and inspect the peers in between.
///
/// After every step all peers average in one [`RingAllReduce`] whose segments cross the
/// simulated links, and wait for it before the next step. The ring of a step is fixed by a rendezvous: the membership at the moment the first peer
/// reaches that step's all-reduce, with one deadline for every member, `round_timeout_ms`
/// later. Segments that reach a peer still computing the step wait in its transport buffer.
/// A crash stalls the ring until that deadline; every member then applies what reached it
/// (each segment's mean over the members before it back to the crash), all start the next
/// step together, and the next step's ring leaves the crashed peer out
/// once the swarm has noticed (`detect_ms`). A joiner downloads the parameters from a live
/// peer and starts computing with the others at the next step boundary; a peer that leaves
/// finishes its step's all-reduce first. A restart is a crash followed at once by a join.
#[derive(Debug)]
pub struct RingSwarm {
    run: TrainingRun<Event>,
    training: RingTraining,
    peers: Vec<Peer>,
    learning_rate: f32,
    /// The rendezvous' membership, in ring order.
    members: BTreeSet<u32>,
    /// The ring of each step, fixed when the first peer reached its all-reduce.
    rings: BTreeMap<u64, Rendezvous>,
    /// Joiners waiting for the others to start their step.
    parked: Vec<u32>,
    spare_buffers: Vec<Vec<u8>>,
}

impl RingSwarm {
    /// Builds the swarm of `scenario` at time zero, training with `training`.
    pub fn new(scenario: &Scenario, training: &RingTraining) -> Result<RingSwarm, SimError> {
        scenario.validate()?;
        training.validate()?;
        let (run, learners) = TrainingRun::new(scenario);
        let peers: Vec<Peer> = learners.into_iter().map(Peer::new).collect();
        let mut swarm = RingSwarm {
            learning_rate: learning_rate(scenario),
            training: training.clone(),
            members: (0..peers.len() as u32).collect(),
            rings: BTreeMap::new(),
            parked: Vec::new(),
            peers,
            run,
            spare_buffers: Vec::new(),
        };
        for id in 0..swarm.peers.len() as u32 {
            swarm.peers[id as usize].status = Status::Live;
            swarm.start_step(id);
        }
        Ok(swarm)
    }

    /// Runs every event due at or before `until`.
    pub fn run_until(&mut self, until: Time) -> Result<(), SimError> {
        training_run::run_until(self, until)
    }

    /// Runs the scenario's rounds to the end and reports.
    pub fn run_to_end(mut self) -> Result<SimReport, SimError> {
        let end = self.run.end();
        self.run_until(end)?;
        Ok(self.report())
    }

    /// The end of round `round` in virtual time.
    pub fn round_end(&self, round: u64) -> Time {
        self.run.round_end(round)
    }

    /// The parameters of peer `id`, unless it crashed, left or is still downloading them.
    pub fn parameters(&self, id: u32) -> Option<&[f32]> {
        self.peers
            .get(id as usize)
            .filter(|peer| peer.status.trains())
            .map(|peer| peer.learner.params())
    }

    /// The step peer `id` computes or all-reduces, under the same conditions.
    pub fn step(&self, id: u32) -> Option<u64> {
        self.parameters(id).map(|_| self.peers[id as usize].step)
    }

    /// The run's churn, random churn drawn, sorted by time.
    pub fn churn(&self) -> &[ChurnEvent] {
        &self.run.churn
    }

    /// Measures the swarm now, as a [`RoundRecord`] for round `round`.
    pub fn measure(&mut self, round: u64) -> RoundRecord {
        let params = live_params(&self.peers);
        self.run.measure(round, params)
    }

    /// The report of the run so far.
    pub fn report(&self) -> SimReport {
        let live = live_params(&self.peers).count();
        self.run.report("sync-ring", live)
    }

    fn start_step(&mut self, id: u32) {
        let peer = &mut self.peers[id as usize];
        self.run.start_step(id, &mut peer.learner);
    }

    fn on_step_done(&mut self, id: u32) -> Result<(), SimError> {
        let now = self.run.now;
        let samples = self.run.scenario.compute.samples_per_step;
        let peer = &mut self.peers[id as usize];
        if !peer.status.trains() {
            return Ok(());
        }
        peer.learner.end_step(samples);
        self.run.steps += 1;
        let step = peer.step;
        let members = &self.members;
        let deadline = now + Duration::from_millis(self.training.round_timeout_ms);
        let Rendezvous { ring, deadline } = self
            .rings
            .entry(step)
            .or_insert_with(|| Rendezvous {
                ring: members.iter().copied().collect(),
                deadline,
            })
            .clone();
        while let Some((&oldest, _)) = self.rings.first_key_value() {
            if oldest + RINGS_KEPT >= step {
                break;
            }
            self.rings.remove(&oldest);
        }
        let peer = &mut self.peers[id as usize];
        let weight = peer
            .learner
            .take_contribution(self.learning_rate, &mut peer.contribution);
        if !ring.contains(&id) {
            // Not in this step's rendezvous: the update stays local.
            peer.learner.adopt(&peer.contribution);
            self.run.tally.local();
            return self.end_round(id);
        }
        let machine = RingAllReduce::new(
            id,
            ring,
            step,
            peer.contribution.clone(),
            weight,
            self.training.codec,
            deadline,
        )?;
        peer.machine = Some(machine);
        peer.started = now;
        // Segments that arrived while this peer computed were waiting in its transport.
        let early = std::mem::take(&mut peer.early);
        for segment in early {
            if segment.address.group_id == step {
                self.deliver(segment)?;
            } else if segment.address.group_id > step {
                self.peers[id as usize].early.push(segment);
            } else {
                self.spare_buffers.push(segment.payload);
            }
        }
        self.pump(id)
    }

    fn on_arrive(&mut self, segment: Segment) -> Result<(), SimError> {
        let peer = &mut self.peers[segment.to as usize];
        let step = segment.address.group_id;
        if peer.status == Status::Gone {
            self.spare_buffers.push(segment.payload);
            return Ok(());
        }
        if step > peer.step || (step == peer.step && peer.machine.is_none()) {
            peer.early.push(segment);
            return Ok(());
        }
        if step < peer.step {
            self.run.tally.refused();
            self.spare_buffers.push(segment.payload);
            return Ok(());
        }
        self.deliver(segment)
    }

    /// Feeds a segment of the receiver's current all-reduce.
    fn deliver(&mut self, segment: Segment) -> Result<(), SimError> {
        let now = self.run.now;
        let to = segment.to;
        if let Some(machine) = self.peers[to as usize].machine.as_mut() {
            let input = RingInput::Segment {
                from: segment.from,
                address: segment.address,
                weight: segment.weight,
                codec: self.training.codec,
                payload: &segment.payload,
            };
            if machine.handle(now, input).is_err() {
                // A ring that disagrees on its members: the segment is refused and the
                // round runs into its deadline.
                self.run.tally.refused();
            }
        }
        self.spare_buffers.push(segment.payload);
        self.pump(to)
    }

    /// Carries out what peer `id`'s ring all-reduce asks for.
    fn pump(&mut self, id: u32) -> Result<(), SimError> {
        let now = self.run.now;
        let peer = &mut self.peers[id as usize];
        let step = peer.step;
        let Some(machine) = peer.machine.as_mut() else {
            return Ok(());
        };
        let mut sends = Vec::new();
        let mut outcome = None;
        while let Some(output) = machine.poll_output() {
            match output {
                RingOutput::Send {
                    to,
                    address,
                    weight,
                    payload,
                } => {
                    let mut bytes = self.spare_buffers.pop().unwrap_or_default();
                    bytes.clear();
                    bytes.extend_from_slice(machine.payload(payload).unwrap_or_default());
                    sends.push((to, address, weight, payload, bytes));
                }
                RingOutput::Finished => outcome = Some(true),
                RingOutput::Failed { .. } => outcome = Some(false),
            }
        }
        let timeout = machine.poll_timeout();
        for (to, address, weight, reference, payload) in sends {
            let departure = self.run.network.depart(now, id as usize, payload.len());
            let sent = Event::Sent {
                peer: id,
                step,
                payload: reference,
            };
            self.run.queue.push(departure.sent, Lane::Normal, sent);
            let segment = Segment {
                from: id,
                to,
                address,
                weight,
                departure,
                payload,
            };
            self.run
                .queue
                .push(departure.reaches, Lane::Normal, Event::Reach(segment));
        }
        let peer = &mut self.peers[id as usize];
        match outcome {
            Some(true) => {
                let machine = peer.machine.take();
                if let Some(machine) = &machine {
                    peer.learner.adopt(machine.result());
                }
                let members = self.rings.get(&step).map_or(1, |r| r.ring.len());
                let fraction = if members >= 2 { 1.0 } else { 0.0 };
                let secs = now.saturating_since(peer.started).as_secs_f64();
                self.run.tally.averaged(members, fraction, secs);
                self.end_round(id)
            }
            Some(false) => {
                // What reached this member, segment by segment (`RingOutput::Failed`).
                if let Some(machine) = peer.machine.take() {
                    peer.learner.adopt(machine.result());
                }
                self.run.tally.local();
                self.end_round(id)
            }
            None => {
                if let Some(at) = timeout
                    && peer.armed.is_none_or(|armed| at < armed)
                {
                    let at = at.max(now);
                    peer.armed = Some(at);
                    self.run
                        .queue
                        .push(at, Lane::Normal, Event::Tick { peer: id });
                }
                Ok(())
            }
        }
    }

    /// Peer `id`'s all-reduce is over: on to the next step, or out of the swarm.
    fn end_round(&mut self, id: u32) -> Result<(), SimError> {
        let peer = &mut self.peers[id as usize];
        peer.step += 1;
        peer.armed = None;
        if peer.status == Status::Leaving {
            peer.status = Status::Gone;
            self.members.remove(&id);
            return Ok(());
        }
        self.start_step(id);
        // Joiners waiting for this step start with the first peer that does.
        let step = self.peers[id as usize].step;
        let mut index = 0;
        while index < self.parked.len() {
            let joiner = self.parked[index];
            if self.peers[joiner as usize].step == step {
                self.parked.swap_remove(index);
                if self.peers[joiner as usize].status == Status::Live {
                    self.members.insert(joiner);
                    self.start_step(joiner);
                }
            } else {
                index += 1;
            }
        }
        Ok(())
    }
}

impl TrainingSwarm<Event> for RingSwarm {
    fn dispatch(&mut self, event: Event) -> Result<(), SimError> {
        match event {
            Event::Reach(segment) => {
                let sender = &self.peers[segment.from as usize];
                if sender
                    .crashed_at
                    .is_some_and(|at| at <= segment.departure.departs)
                {
                    self.spare_buffers.push(segment.payload);
                    return Ok(());
                }
                let to = segment.to as usize;
                let arrival = self
                    .run
                    .network
                    .arrive(&segment.departure, to, &mut self.run.rng);
                self.run
                    .queue
                    .push(arrival, Lane::Normal, Event::Arrive(segment));
                Ok(())
            }
            Event::Arrive(segment) => self.on_arrive(segment),
            Event::Sent {
                peer,
                step,
                payload,
            } => {
                let now = self.run.now;
                let sender = &mut self.peers[peer as usize];
                if sender.status != Status::Gone
                    && sender.step == step
                    && let Some(machine) = sender.machine.as_mut()
                {
                    machine.handle(now, RingInput::Sent { payload })?;
                    self.pump(peer)?;
                }
                Ok(())
            }
            Event::Tick { peer } => {
                let now = self.run.now;
                let sim_peer = &mut self.peers[peer as usize];
                if sim_peer.status == Status::Gone || sim_peer.armed != Some(now) {
                    return Ok(());
                }
                sim_peer.armed = None;
                if let Some(machine) = sim_peer.machine.as_mut() {
                    machine.handle(now, RingInput::Tick)?;
                    self.pump(peer)?;
                }
                Ok(())
            }
            Event::CrashNoticed { subject } => {
                self.members.remove(&subject);
                Ok(())
            }
            Event::Run(event) => match self.run.handle(event, &self.peers) {
                Some(Lifecycle::StepDone { peer }) => self.on_step_done(peer),
                Some(Lifecycle::Churn(event)) => self.on_churn(event),
                Some(Lifecycle::Synced { peer, source }) => self.on_synced(peer, source),
                None => Ok(()),
            },
        }
    }

    fn training_run(&mut self) -> &mut TrainingRun<Event> {
        &mut self.run
    }
}

impl Peer {
    fn new(learner: Learner) -> Peer {
        Peer {
            status: Status::Syncing,
            learner,
            step: 1,
            machine: None,
            contribution: Vec::new(),
            started: Time::ZERO,
            early: Vec::new(),
            armed: None,
            crashed_at: None,
        }
    }
}

impl TrainingPeer for Peer {
    fn trainer(&self) -> (Status, &Learner) {
        (self.status, &self.learner)
    }
}

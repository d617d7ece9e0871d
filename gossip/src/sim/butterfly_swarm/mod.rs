//! Butterfly training in simulation: peers accumulate gradients to a target batch, then
//! average them with the real [`Matchmaker`] and [`ButterflyRound`] state machines.

mod churn;
mod rounds;

use std::time::Duration;

use murmur_protocol::message::ChunkAddress;

use crate::Time;
use crate::butterfly::{ButterflyRound, MatchInput, Matchmaker, PayloadRef};

use super::error::SimError;
use super::learner::{Learner, learning_rate};
use super::network::Departure;
use super::queue::Lane;
use super::report::{RoundRecord, SimReport};
use super::scenario::{ChurnEvent, Scenario};
use super::training::ButterflyTraining;
use super::training_run::{
    self, Lifecycle, RunEvent, Status, TrainingPeer, TrainingRun, TrainingSwarm, live_params,
};

/// A membership change as the swarm hears of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Joined,
    Gone,
}

/// Where a peer is in its current batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Accumulating; the batch is not known to be due.
    Training,
    /// Looking for a group; still accumulating.
    Matching,
    /// In a round; a step in progress counts toward the next batch.
    Averaging,
}

/// What a chunk on the wire is.
#[derive(Debug, Clone, Copy)]
enum ChunkKind {
    Part {
        weight: f32,
    },
    Averaged {
        contributors: u32,
        total_weight: f32,
    },
}

/// A chunk on the wire.
#[derive(Debug)]
struct Chunk {
    from: u32,
    to: u32,
    address: ChunkAddress,
    kind: ChunkKind,
    departure: Departure,
    payload: Vec<u8>,
}

#[derive(Debug)]
enum Event {
    /// What every training swarm has: steps, churn, downloads, records.
    Run(RunEvent),
    /// Every peer hears that batch `epoch` is due.
    BatchDue {
        epoch: u64,
    },
    /// Every peer hears that `subject` is looking for a group of `round` (or no longer is).
    Gossip {
        subject: u32,
        looking: Option<(u64, Time)>,
    },
    /// A matchmaking message reaches `to`.
    Control {
        to: u32,
        input: MatchInput<u32>,
    },
    Reach(Chunk),
    Arrive(Chunk),
    Sent {
        peer: u32,
        group_id: u64,
        to: u32,
        payload: PayloadRef,
    },
    Tick {
        peer: u32,
    },
    Detected {
        subject: u32,
        change: Change,
    },
}

impl From<RunEvent> for Event {
    fn from(event: RunEvent) -> Event {
        Event::Run(event)
    }
}

#[derive(Debug)]
struct Peer {
    status: Status,
    learner: Learner,
    matchmaker: Matchmaker<u32>,
    phase: Phase,
    /// The batch this peer accumulates for (1 for the first); one more than the updates
    /// it has applied, for a peer that started with the swarm.
    epoch: u64,
    /// The latest batch this peer has heard is due.
    heard_due: u64,
    stepping: bool,
    /// The round of the current batch, last, after rounds still sending their averages.
    rounds: Vec<ButterflyRound<u32>>,
    round_started: Time,
    /// The time of the pending `Tick` event, if one is queued.
    armed: Option<Time>,
    crashed_at: Option<Time>,
    /// The swarm has noticed that this peer left or crashed.
    known_gone: bool,
}

/// A simulated butterfly training swarm, for tests that want to step it and look inside.
///
/// [`run`](super::run) drives one to the end of its scenario; tests can instead call
/// [`ButterflySwarm::run_until`] and inspect the peers in between.
///
/// # The model
///
/// - **Compute.** Every peer runs local steps back to back (its own step time, stragglers
///   included) and accumulates their gradients and samples.
/// - **Progress.** Every finished step adds its samples to the swarm's count toward the
///   next batch. When the count reaches `target_batch`, the batch is *due*, and every peer
///   hears so `gossip_ms` later, as it would from the membership's heartbeats.
/// - **Matchmaking.** A peer that hears its batch is due becomes ready and looks for a
///   group; it keeps computing meanwhile, since its parameters have not changed yet.
///   Looking and not-looking announcements reach the swarm after `gossip_ms`; join,
///   reject and begin messages are small and pay one latency. A leader gathers as many
///   members as the membership counts (capped at `target_group`).
/// - **Round.** When its group begins, a member contributes what it has accumulated,
///   weighted by samples (see [`ButterflyTraining`] for stragglers), and runs a
///   [`ButterflyRound`] whose chunks cross the simulated links. The result replaces its
///   parameters and it starts on the next batch. A peer that found no group applies its own
///   contribution alone.
/// - **Churn.** A joiner downloads the parameters from a live peer over the network, then
///   trains from the next batch on. A crash kills a peer's rounds mid-flight: the other
///   members stop waiting for it at their sender and reducer timeouts, or when the swarm
///   notices (`detect_ms`) and the transport reports the member lost. A peer that leaves
///   finishes the round it is in, then goes. A restart is a crash followed at once by a
///   join.
#[derive(Debug)]
pub struct ButterflySwarm {
    run: TrainingRun<Event>,
    training: ButterflyTraining,
    peers: Vec<Peer>,
    learning_rate: f32,
    /// The latest batch that is due.
    announced: u64,
    /// Samples toward batch `announced + 1`.
    progress: u64,
    /// Peers the membership counts: live or leaving, as far as the swarm has noticed.
    membership: usize,
    /// Bandwidth each peer advertises to its leader, in bytes per second.
    bandwidth: u64,
    spare_buffers: Vec<Vec<u8>>,
    spare_vectors: Vec<Vec<f32>>,
}

impl ButterflySwarm {
    /// Builds the swarm of `scenario` at time zero, training with `training`.
    pub fn new(
        scenario: &Scenario,
        training: &ButterflyTraining,
    ) -> Result<ButterflySwarm, SimError> {
        scenario.validate()?;
        training.validate()?;
        let (run, learners) = TrainingRun::new(scenario);
        let mut peers = Vec::with_capacity(learners.len());
        for (id, learner) in learners.into_iter().enumerate() {
            peers.push(Peer::new(
                id as u32,
                learner,
                scenario,
                training,
                Status::Live,
            )?);
        }
        let link = &scenario.link;
        let mbps = match (link.uplink_mbps, link.downlink_mbps) {
            (Some(up), Some(down)) => up.min(down),
            (Some(one), None) | (None, Some(one)) => one,
            // Unlimited: any large equal number gives every member an equal part.
            (None, None) => 1e6,
        };
        let mut swarm = ButterflySwarm {
            learning_rate: learning_rate(scenario),
            training: training.clone(),
            announced: 0,
            progress: 0,
            membership: peers.len(),
            bandwidth: (mbps * 1e6 / 8.0) as u64,
            peers,
            run,
            spare_buffers: Vec::new(),
            spare_vectors: Vec::new(),
        };
        for id in 0..swarm.peers.len() as u32 {
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

    /// The current virtual time.
    pub fn now(&self) -> Time {
        self.run.now
    }

    /// The parameters of peer `id`, unless it crashed, left or is still downloading them.
    pub fn parameters(&self, id: u32) -> Option<&[f32]> {
        self.training_peer(id).map(|peer| peer.learner.params())
    }

    /// The batch peer `id` accumulates for (1 for the first), under the same conditions.
    pub fn epoch(&self, id: u32) -> Option<u64> {
        self.training_peer(id).map(|peer| peer.epoch)
    }

    /// Whether peer `id` is in a butterfly round now.
    pub fn is_averaging(&self, id: u32) -> bool {
        self.training_peer(id)
            .is_some_and(|peer| peer.phase == Phase::Averaging)
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
        self.run.report("butterfly", live)
    }

    fn training_peer(&self, id: u32) -> Option<&Peer> {
        self.peers
            .get(id as usize)
            .filter(|peer| peer.status.trains())
    }

    fn start_step(&mut self, id: u32) {
        let peer = &mut self.peers[id as usize];
        peer.stepping = true;
        self.run.start_step(id, &mut peer.learner);
    }

    fn on_step_done(&mut self, id: u32) -> Result<(), SimError> {
        let samples = self.run.scenario.compute.samples_per_step;
        let peer = &mut self.peers[id as usize];
        if !peer.status.trains() {
            return Ok(());
        }
        peer.stepping = false;
        peer.learner.end_step(samples);
        self.run.steps += 1;
        // A step that ends during a round was computed for the next batch.
        let batch = match peer.phase {
            Phase::Averaging => peer.epoch + 1,
            Phase::Training | Phase::Matching => peer.epoch,
        };
        let keep_going = peer.phase != Phase::Averaging && peer.status == Status::Live;
        if batch == self.announced + 1 {
            self.progress += samples;
            if self.progress >= self.training.target_batch {
                self.announced += 1;
                self.progress = 0;
                let at = self.run.now + self.gossip_delay();
                let epoch = self.announced;
                self.run
                    .queue
                    .push(at, Lane::Normal, Event::BatchDue { epoch });
            }
        }
        if keep_going {
            self.start_step(id);
        }
        Ok(())
    }

    fn gossip_delay(&self) -> Duration {
        Duration::from_secs_f64(self.training.gossip_ms * 1e-3)
    }
}

impl TrainingSwarm<Event> for ButterflySwarm {
    fn dispatch(&mut self, event: Event) -> Result<(), SimError> {
        match event {
            Event::BatchDue { epoch } => {
                for id in 0..self.peers.len() as u32 {
                    let peer = &mut self.peers[id as usize];
                    if peer.status.trains() {
                        peer.heard_due = peer.heard_due.max(epoch);
                        self.maybe_look(id)?;
                    }
                }
                Ok(())
            }
            Event::Gossip { subject, looking } => self.on_gossip(subject, looking),
            Event::Control { to, input } => self.feed_matchmaker(to, input),
            Event::Reach(chunk) => {
                self.on_reach(chunk);
                Ok(())
            }
            Event::Arrive(chunk) => self.on_arrive(chunk),
            Event::Sent {
                peer,
                group_id,
                to,
                payload,
            } => self.on_sent(peer, group_id, to, payload),
            Event::Tick { peer } => self.on_tick(peer),
            Event::Detected { subject, change } => self.on_detected(subject, change),
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
    fn new(
        id: u32,
        learner: Learner,
        scenario: &Scenario,
        training: &ButterflyTraining,
        status: Status,
    ) -> Result<Peer, SimError> {
        Ok(Peer {
            status,
            learner,
            matchmaker: Matchmaker::new(id, scenario.vector_len, training.butterfly.clone())?,
            phase: Phase::Training,
            epoch: 1,
            heard_due: 0,
            stepping: false,
            rounds: Vec::new(),
            round_started: Time::ZERO,
            armed: None,
            crashed_at: None,
            known_gone: false,
        })
    }
}

impl TrainingPeer for Peer {
    fn trainer(&self) -> (Status, &Learner) {
        (self.status, &self.learner)
    }
}

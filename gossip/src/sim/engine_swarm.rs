//! The daemon's averaging engines ([`crate::engine`]) in virtual time.
//!
//! Every peer is a [`ModeEngine`], the very type `murmur run` builds, fed by this
//! simulator instead of the network driver: parcels cross the simulated links
//! ([`Network`]: per-direction bandwidth, latency, loss), heartbeats reach every other live
//! peer after `gossip_ms`, the trainer is a simulated learner whose steps take the
//! scenario's compute time, and a crash is noticed after `link.detect_ms`. What an engine
//! test proves here is what the daemon does with the same inputs.
//!
//! The learner: the quadratic workload's gradient of peer `i` at `x` is `x − bᵢ`, so the
//! swarm's optimum is the mean of the `bᵢ`; an optimizer step is plain SGD at the
//! workload's learning rate (`Apply` and `Step` alike). Every peer starts from the same
//! parameters, as the daemon's peers start from the model's seeded initialization, and
//! each has its own `bᵢ`. Under the consensus workload the gradient is zero and each peer
//! starts from its own vector: only averaging moves them (SGP).

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

use crate::Time;
use crate::engine::{
    Beat, Engine, EngineEvent, EngineInput, EngineOutput, EngineSetup, MemberEvent, Membership,
    ModeEngine, ModeSettings, RoundReport, Start, Work, WorkDone,
};
use crate::parcel::Parcel;

use super::error::SimError;
use super::learner::{random_vector, step_duration};
use super::metrics::{self, MassView};
use super::network::Network;
use super::queue::{EventQueue, Lane};
use super::report::{RoundRecord, SimReport, SimSummary, Work as Tally};
use super::scenario::{AlgorithmSpec, ChurnEvent, Scenario, Workload};
use crate::butterfly::{ButterflyConfig, RoundBuffers};

/// How an engine swarm runs besides its scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSwarmConfig {
    /// The mode every peer runs.
    pub mode: ModeSettings,
    /// Codec, error feedback and the rest of every engine's setup (the seed is mixed with
    /// each peer's index, the wall clock is zero).
    pub setup: EngineSetup,
    /// Milliseconds between heartbeats.
    pub heartbeat_ms: u64,
    /// How long a heartbeat takes to reach every peer, in milliseconds.
    pub gossip_ms: f64,
    /// Per peer, an upload cap in bytes per second it declares (empty: none).
    pub upload_caps: Vec<u64>,
    /// Peers that accept no connections (behind a NAT): they reduce no part.
    pub unreachable: Vec<u32>,
}

#[derive(Debug)]
enum Event {
    /// A parcel reaches `to`.
    Deliver {
        from: u32,
        to: u32,
        parcel: Parcel<u32>,
    },
    /// The transport is done with a parcel of `peer`'s.
    Sent {
        peer: u32,
        incarnation: u32,
        to: u32,
        tag: u64,
        delivered: bool,
        parcel: Parcel<u32>,
    },
    /// `peer`'s trainer finished its work.
    WorkDone { peer: u32, incarnation: u32 },
    /// `peer` hears of a membership change.
    Member { peer: u32, event: MemberEvent<u32> },
    /// `peer`'s engine asked for a tick at this time.
    Tick { peer: u32, incarnation: u32 },
    /// Churn event `index` is due.
    Churn { index: usize },
}

/// One simulated peer.
#[derive(Debug)]
struct SimPeer {
    engine: ModeEngine<u32>,
    alive: bool,
    target: Vec<f32>,
    slowdown: f64,
    /// The work the trainer holds, and its answer once computed.
    work: Option<WorkDone>,
    /// When the pending tick event is due, if one is queued.
    armed: Option<Time>,
    /// The final parameters, once the engine finished.
    finished: Option<Vec<f32>>,
    /// The latest parameters seen passing through the trainer.
    params: Vec<f32>,
    samples: u64,
    departed: bool,
    crashed: bool,
    /// How many times the peer restarted: the transport's reports, the trainer's answers
    /// and the timers of an earlier process are not the new one's. Its heartbeats name it
    /// (one more, as 0 means unknown), as the network layer stamps a process's own.
    incarnation: u32,
}

/// Peer `id`'s engine as its process starts at `now` with `params`, at `round`, every
/// other of the `n` peers admitted.
fn fresh_engine(
    config: &EngineSwarmConfig,
    id: u32,
    n: usize,
    now: Time,
    params: Vec<f32>,
    round: u64,
) -> Result<ModeEngine<u32>, SimError> {
    let interval = Duration::from_millis(config.heartbeat_ms.max(1));
    let mut membership = Membership::new(id, interval, now);
    for other in 0..n as u32 {
        membership.note(now, MemberEvent::Admitted(other));
    }
    let setup = EngineSetup {
        seed: config.setup.seed ^ (u64::from(id) << 32 | u64::from(id)),
        upload_cap: config.upload_caps.get(id as usize).copied().unwrap_or(0),
        accepts_connections: config.setup.accepts_connections && !config.unreachable.contains(&id),
        wall_ms_at_zero: 0,
        ..config.setup.clone()
    };
    let start = Start {
        len: params.len(),
        params: Some(params),
        round,
        local_steps: 0,
        round_memory: RoundBuffers::default(),
    };
    Ok(ModeEngine::new(&config.mode, &setup, membership, start)?)
}

/// A swarm of the daemon's engines in virtual time: see [`crate::sim`].
#[derive(Debug)]
pub struct EngineSwarm {
    scenario: Scenario,
    config: EngineSwarmConfig,
    peers: Vec<SimPeer>,
    queue: EventQueue<Event>,
    network: Network,
    rng: Xoshiro256PlusPlus,
    now: Time,
    learning_rate: f32,
    /// Every round report, by peer.
    rounds: Vec<(u32, RoundReport<u32>)>,
    /// Rounds a peer averaged alone.
    alone: u64,
    /// Parcels an engine refused as bad input.
    bad_parcels: u64,
    churn: Vec<ChurnEvent>,
}

impl EngineSwarm {
    /// Builds the swarm of `scenario` at time zero: every founder admitted by every other.
    pub fn new(scenario: &Scenario, config: EngineSwarmConfig) -> Result<EngineSwarm, SimError> {
        scenario.validate()?;
        for event in &scenario.churn {
            if matches!(event, ChurnEvent::Join { .. }) {
                return Err(SimError::InvalidScenario {
                    key: "churn.action",
                    value: format!("{event:?}"),
                    allowed: "crash, leave or restart (an engine swarm has no joiners yet)",
                });
            }
        }
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(scenario.seed);
        let learning_rate = match scenario.workload {
            Workload::Consensus => 0.0,
            Workload::Quadratic { learning_rate } => learning_rate,
        };
        let n = scenario.peers;
        let shared = random_vector(&mut rng, scenario, scenario.vector_len);
        let mut peers = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let own = random_vector(&mut rng, scenario, scenario.vector_len);
            let (initial, target) = match scenario.workload {
                Workload::Consensus => (own, vec![0.0; scenario.vector_len]),
                Workload::Quadratic { .. } => (shared.clone(), own),
            };
            let engine = fresh_engine(&config, id, n, Time::ZERO, initial.clone(), 0)?;
            let slowdown = scenario
                .compute
                .stragglers
                .iter()
                .find(|s| s.peer == id)
                .map_or(1.0, |s| s.slowdown);
            peers.push(SimPeer {
                engine,
                alive: true,
                target,
                slowdown,
                work: None,
                armed: None,
                finished: None,
                params: initial,
                samples: 0,
                departed: false,
                crashed: false,
                incarnation: 0,
            });
        }
        let mut swarm = EngineSwarm {
            network: Network::new(&scenario.link, n),
            scenario: scenario.clone(),
            config,
            peers,
            queue: EventQueue::new(),
            rng,
            now: Time::ZERO,
            learning_rate,
            rounds: Vec::new(),
            alone: 0,
            bad_parcels: 0,
            churn: scenario.churn.clone(),
        };
        for (index, event) in swarm.churn.iter().enumerate() {
            let at = Time::from_secs_f64(event.at_ms() * 1e-3);
            swarm.queue.push(at, Lane::Normal, Event::Churn { index });
        }
        for id in 0..n as u32 {
            swarm.carry_out(id)?;
        }
        Ok(swarm)
    }

    /// Runs every event due at or before `until`.
    pub fn run_until(&mut self, until: Time) -> Result<(), SimError> {
        while let Some((at, event)) = self.queue.pop_until(until) {
            self.now = at;
            self.dispatch(event)?;
        }
        self.now = self.now.max(until);
        Ok(())
    }

    /// The current virtual time.
    pub fn now(&self) -> Time {
        self.now
    }

    /// The latest parameters of peer `id` seen by its trainer (its final ones once it
    /// finished), unless it crashed.
    pub fn parameters(&self, id: u32) -> Option<&[f32]> {
        let peer = self.peers.get(id as usize)?;
        (!peer.crashed).then(|| peer.finished.as_deref().unwrap_or(&peer.params))
    }

    /// The engine of peer `id`.
    pub fn engine(&self, id: u32) -> &ModeEngine<u32> {
        &self.peers[id as usize].engine
    }

    /// Peer `id`'s engine, to change what its network tells it (reachability, say).
    pub fn engine_mut(&mut self, id: u32) -> &mut ModeEngine<u32> {
        &mut self.peers[id as usize].engine
    }

    /// Samples peer `id` processed.
    pub fn samples(&self, id: u32) -> u64 {
        self.peers[id as usize].samples
    }

    /// Samples every peer processed, all together.
    pub fn total_samples(&self) -> u64 {
        self.peers.iter().map(|p| p.samples).sum()
    }

    /// Every round report so far, with the peer that made it.
    pub fn round_reports(&self) -> &[(u32, RoundReport<u32>)] {
        &self.rounds
    }

    /// Rounds a peer averaged alone.
    pub fn rounds_alone(&self) -> u64 {
        self.alone
    }

    /// Parcels refused as bad input.
    pub fn bad_parcels(&self) -> u64 {
        self.bad_parcels
    }

    /// The quadratic workload's optimum for the live peers: the mean of their targets.
    pub fn optimum(&self) -> Vec<f32> {
        let live: Vec<&SimPeer> = self.peers.iter().filter(|p| !p.crashed).collect();
        let n = live.len().max(1) as f32;
        let mut mean = vec![0.0; self.scenario.vector_len];
        for peer in live {
            for (m, t) in mean.iter_mut().zip(&peer.target) {
                *m += t / n;
            }
        }
        mean
    }

    /// Peer `id`'s own optimum (its target), where it would end training alone.
    pub fn target(&self, id: u32) -> &[f32] {
        &self.peers[id as usize].target
    }

    /// The swarm of an `engine = true` scenario: its algorithm's mode and codec, the
    /// daemon's defaults for the rest (heartbeats every second, error feedback on).
    pub fn from_scenario(scenario: &Scenario) -> Result<EngineSwarm, SimError> {
        let (mode, codec, gossip_ms) = match &scenario.algorithm {
            AlgorithmSpec::Sgp(config) => (
                ModeSettings::Sgp(config.clone()),
                config.share_codec,
                scenario.link.latency_ms,
            ),
            AlgorithmSpec::Butterfly(training) => (
                ModeSettings::Butterfly {
                    target_batch: training.target_batch,
                    butterfly: training.butterfly.clone(),
                },
                training.codec,
                training.gossip_ms,
            ),
            AlgorithmSpec::SyncRing(training) => (
                ModeSettings::SyncRing {
                    timeout: Duration::from_millis(training.round_timeout_ms),
                    butterfly: ButterflyConfig {
                        target_group: crate::butterfly::MAX_GROUP,
                        ..ButterflyConfig::default()
                    },
                },
                training.codec,
                scenario.link.latency_ms,
            ),
            AlgorithmSpec::SyncAllReduce { .. } => {
                return Err(SimError::InvalidScenario {
                    key: "engine",
                    value: "true".to_owned(),
                    allowed: "sgp, butterfly or sync-ring (sync-all-reduce is a cost model)",
                });
            }
        };
        if !scenario.byzantine.is_empty() || scenario.random_churn.is_some() {
            return Err(SimError::InvalidScenario {
                key: "engine",
                value: "true".to_owned(),
                allowed: "without byzantine peers or random churn",
            });
        }
        let config = EngineSwarmConfig {
            mode,
            setup: EngineSetup {
                codec,
                error_feedback: true,
                size_parts_by_bandwidth: true,
                batch_size: scenario.compute.samples_per_step,
                upload_cap: 0,
                accepts_connections: true,
                wall_ms_at_zero: 0,
                seed: scenario.seed,
                max_share_piece: 0,
            },
            heartbeat_ms: 1000,
            gossip_ms,
            upload_caps: Vec::new(),
            unreachable: Vec::new(),
        };
        EngineSwarm::new(scenario, config)
    }

    /// Runs the scenario's rounds, recording every `record_every` rounds, and reports.
    pub fn run_to_end(mut self) -> Result<SimReport, SimError> {
        let step = Duration::from_secs_f64(self.scenario.compute.step_ms * 1e-3);
        let len = self.scenario.vector_len;
        let initial: Vec<&[f32]> = (0..self.peers.len() as u32)
            .filter_map(|id| self.parameters(id))
            .collect();
        let (reference, spread) = metrics::average_and_spread(initial.iter().copied(), len);
        let scale = metrics::error_scale(spread);
        let mut held = vec![0.0; len];
        let mut records = Vec::new();
        let every = self.scenario.record_every.max(1);
        let mut round = 0;
        while round <= self.scenario.rounds {
            let at = Time::ZERO + step * u32::try_from(round).unwrap_or(u32::MAX);
            self.run_until(at)?;
            let live = (0..self.peers.len() as u32).filter_map(|id| self.parameters(id));
            let views = live.map(|numerator| MassView {
                numerator,
                weight: 1.0,
            });
            let agreement = metrics::agreement(views, &reference, scale, &mut held);
            let tally = Tally {
                steps: self.steps(),
                samples: self.total_samples(),
                bytes_sent: self.network.bytes_sent(),
            };
            records.push(RoundRecord::new(
                round,
                self.now,
                &agreement,
                agreement.weight,
                tally,
            ));
            round += every;
        }
        let secs = self.now.as_secs_f64();
        let last = records.last();
        let summary = SimSummary {
            name: self.scenario.name.clone(),
            algorithm: format!("{} (engine)", self.config.mode.mode()),
            peers_start: self.scenario.peers,
            peers_end: last.map_or(0, |r| r.live_peers),
            rounds: last.map_or(0, |r| r.round),
            virtual_secs: secs,
            samples_per_sec: if secs > 0.0 {
                self.total_samples() as f64 / secs
            } else {
                0.0
            },
            final_consensus_error: last.map_or(f64::NAN, |r| r.consensus_error),
            final_average_error: last.map_or(f64::NAN, |r| r.average_error),
            initial_total_weight: self.scenario.peers as f64,
            final_total_weight: last.map_or(0.0, |r| r.total_weight),
            crashed_weight: 0.0,
            dropped_weight: 0.0,
            bytes_sent: self.network.bytes_sent(),
            messages: self.network.messages_sent(),
            events: self.queue.pushed(),
            averaging: None,
            share_refusals: None,
        };
        Ok(SimReport {
            summary,
            rounds: records,
        })
    }

    /// Local steps every peer completed, all together.
    pub fn steps(&self) -> u64 {
        let per_step = self.scenario.compute.samples_per_step.max(1);
        self.total_samples() / per_step
    }

    /// Asks peer `id` to finish; it hands off and departs.
    pub fn finish(&mut self, id: u32) -> Result<(), SimError> {
        self.input(id, EngineInput::Finish)
    }

    fn dispatch(&mut self, event: Event) -> Result<(), SimError> {
        match event {
            Event::Deliver { from, to, parcel } => {
                if self.peers[to as usize].alive {
                    self.input(to, EngineInput::Parcel { from, parcel })?;
                }
            }
            Event::Sent {
                peer,
                incarnation,
                to,
                tag,
                delivered,
                parcel,
            } => {
                if self.is_running(peer, incarnation) {
                    let input = EngineInput::Sent {
                        to,
                        tag,
                        delivered: delivered && self.peers[to as usize].alive,
                        parcel,
                    };
                    self.input(peer, input)?;
                }
            }
            Event::WorkDone { peer, incarnation } => {
                if self.is_running(peer, incarnation)
                    && let Some(done) = self.peers[peer as usize].work.take()
                {
                    self.input(peer, EngineInput::WorkDone(done))?;
                }
            }
            Event::Member { peer, event } => {
                if self.peers[peer as usize].alive {
                    self.input(peer, EngineInput::Member(event))?;
                }
            }
            Event::Tick { peer, incarnation } => {
                let p = &mut self.peers[peer as usize];
                if p.incarnation == incarnation && p.armed == Some(self.now) {
                    p.armed = None;
                    if p.alive {
                        self.input(peer, EngineInput::Tick)?;
                    }
                }
            }
            Event::Churn { index } => match self.churn[index].clone() {
                ChurnEvent::Crash { peer, .. } => self.crash(peer),
                ChurnEvent::Leave { peer, .. } => self.finish(peer)?,
                ChurnEvent::Restart { peer, .. } => self.restart(peer)?,
                ChurnEvent::Join { .. } => {}
            },
        }
        Ok(())
    }

    /// Whether `incarnation` of peer `id` is the process running now.
    fn is_running(&self, id: u32, incarnation: u32) -> bool {
        let peer = &self.peers[id as usize];
        peer.alive && peer.incarnation == incarnation
    }

    /// Peer `id`'s process is killed and started again under the same index before anyone
    /// notices, as `murmur run` restarts under the same key: a fresh engine with the peer's
    /// last parameters, at the round its old process announced (a restarted round-mode peer
    /// starts at the swarm's round, which its heartbeats tell), which knows nothing of
    /// the rounds and groups the old one was in. Parcels in flight to it reach the new one.
    fn restart(&mut self, id: u32) -> Result<(), SimError> {
        let n = self.peers.len();
        let peer = &mut self.peers[id as usize];
        if !peer.alive || peer.departed {
            return Ok(());
        }
        let round = peer.engine.membership().own().step;
        peer.engine = fresh_engine(&self.config, id, n, self.now, peer.params.clone(), round)?;
        peer.incarnation += 1;
        peer.work = None;
        peer.armed = None;
        peer.finished = None;
        self.carry_out(id)
    }

    fn crash(&mut self, id: u32) {
        let Some(peer) = self.peers.get_mut(id as usize) else {
            return;
        };
        if !peer.alive {
            return;
        }
        peer.alive = false;
        peer.crashed = true;
        let detect = Duration::from_secs_f64(self.scenario.link.detect_ms * 1e-3);
        for other in 0..self.peers.len() as u32 {
            if other != id && self.peers[other as usize].alive {
                let event = Event::Member {
                    peer: other,
                    event: MemberEvent::Left(id),
                };
                self.queue.push(self.now + detect, Lane::Normal, event);
            }
        }
    }

    fn input(&mut self, id: u32, input: EngineInput<u32>) -> Result<(), SimError> {
        self.peers[id as usize].engine.handle(self.now, input)?;
        self.carry_out(id)
    }

    /// Carries out what peer `id`'s engine asks for.
    fn carry_out(&mut self, id: u32) -> Result<(), SimError> {
        while let Some(output) = self.peers[id as usize].engine.poll_output() {
            match output {
                EngineOutput::Send { to, tag, parcel } => self.send(id, to, tag, parcel),
                EngineOutput::Work(work) => self.compute(id, work),
                EngineOutput::Heartbeat(beat) => {
                    let beat = Beat {
                        incarnation: u64::from(self.peers[id as usize].incarnation) + 1,
                        ..beat
                    };
                    let delay = Duration::from_secs_f64(self.config.gossip_ms * 1e-3);
                    for other in 0..self.peers.len() as u32 {
                        if other != id && self.peers[other as usize].alive {
                            let event = Event::Member {
                                peer: other,
                                event: MemberEvent::Heartbeat(id, beat),
                            };
                            self.queue.push(self.now + delay, Lane::Normal, event);
                        }
                    }
                }
                EngineOutput::Disconnect(_) | EngineOutput::Recycle(_) => {}
                EngineOutput::Event(EngineEvent::Round(report)) => self.rounds.push((id, report)),
                EngineOutput::Event(EngineEvent::Alone { .. }) => self.alone += 1,
                EngineOutput::Event(EngineEvent::BadParcel { .. }) => self.bad_parcels += 1,
                EngineOutput::Event(_) => {}
                EngineOutput::Finished(params) => {
                    self.peers[id as usize].finished = Some(params);
                }
                EngineOutput::Departed => {
                    let peer = &mut self.peers[id as usize];
                    if !peer.departed {
                        peer.departed = true;
                        // Its connections close: the others hear of it at once.
                        for other in 0..self.peers.len() as u32 {
                            if other != id && self.peers[other as usize].alive {
                                let event = Event::Member {
                                    peer: other,
                                    event: MemberEvent::Left(id),
                                };
                                self.queue.push(self.now, Lane::Normal, event);
                            }
                        }
                        self.peers[id as usize].alive = false;
                    }
                }
            }
        }
        self.arm(id);
        Ok(())
    }

    fn arm(&mut self, id: u32) {
        let peer = &mut self.peers[id as usize];
        if !peer.alive {
            return;
        }
        let Some(at) = peer.engine.poll_timeout() else {
            return;
        };
        let at = at.max(self.now);
        if peer.armed.is_some_and(|armed| armed <= at) {
            return;
        }
        peer.armed = Some(at);
        let incarnation = peer.incarnation;
        self.queue.push(
            at,
            Lane::Normal,
            Event::Tick {
                peer: id,
                incarnation,
            },
        );
    }

    fn send(&mut self, from: u32, to: u32, tag: u64, parcel: Parcel<u32>) {
        let reachable = (to as usize) < self.peers.len() && self.peers[to as usize].alive;
        let incarnation = self.peers[from as usize].incarnation;
        if !reachable {
            let event = Event::Sent {
                peer: from,
                incarnation,
                to,
                tag,
                delivered: false,
                parcel,
            };
            self.queue.push(self.now, Lane::Normal, event);
            return;
        }
        let departure = self
            .network
            .depart(self.now, from as usize, parcel.payload_len());
        let arrival = self.network.arrive(&departure, to as usize, &mut self.rng);
        // The transport hands the parcel back once written; the receiver gets a copy of
        // its bytes, as a stream would.
        let copy = parcel.clone();
        self.queue.push(
            departure.sent,
            Lane::Normal,
            Event::Sent {
                peer: from,
                incarnation,
                to,
                tag,
                delivered: true,
                parcel,
            },
        );
        self.queue.push(
            arrival,
            Lane::Normal,
            Event::Deliver {
                from,
                to,
                parcel: copy,
            },
        );
    }

    /// The simulated trainer takes `work`; its answer comes after the step's compute time
    /// (an optimizer step alone takes none).
    fn compute(&mut self, id: u32, work: Work) {
        let lr = self.learning_rate;
        let samples = self.scenario.compute.samples_per_step;
        let spec = self.scenario.compute.clone();
        let peer = &mut self.peers[id as usize];
        let incarnation = peer.incarnation;
        let took = step_duration(&spec, peer.slowdown, &mut self.rng);
        let (done, at) = match work {
            Work::Gradient { params, mut grad } => {
                grad.clear();
                grad.extend(params.iter().zip(&peer.target).map(|(x, b)| x - b));
                if lr == 0.0 {
                    grad.fill(0.0);
                }
                peer.samples += samples;
                peer.params.clone_from(&params);
                let done = WorkDone::Gradient {
                    params,
                    grad,
                    samples,
                    took,
                };
                (done, self.now + took)
            }
            Work::Step {
                mut params,
                mut update,
                ..
            } => {
                update.resize(params.len(), 0.0);
                for ((x, b), moved) in params.iter_mut().zip(&peer.target).zip(&mut update) {
                    let before = *x;
                    *x -= lr * (*x - b);
                    *moved = *x - before;
                }
                peer.samples += samples;
                peer.params.clone_from(&params);
                let done = WorkDone::Stepped {
                    params,
                    update,
                    samples,
                    took,
                };
                (done, self.now + took)
            }
            Work::Apply {
                mut params, grad, ..
            } => {
                for (x, g) in params.iter_mut().zip(&grad) {
                    *x -= lr * g;
                }
                peer.params.clone_from(&params);
                (WorkDone::Applied { params, grad }, self.now)
            }
        };
        peer.work = Some(done);
        self.queue.push(
            at,
            Lane::Normal,
            Event::WorkDone {
                peer: id,
                incarnation,
            },
        );
    }

    /// The relative spread of the live peers' parameters around their mean,
    /// `√(Σᵢ‖xᵢ − x̄‖² / Σᵢ‖x̄‖²)`, or `None` with fewer than two.
    pub fn consensus_distance(&self) -> Option<f64> {
        let live: Vec<&[f32]> = (0..self.peers.len() as u32)
            .filter_map(|id| self.parameters(id))
            .collect();
        if live.len() < 2 {
            return None;
        }
        let len = self.scenario.vector_len;
        let mut mean = vec![0f64; len];
        for p in &live {
            for (m, &x) in mean.iter_mut().zip(p.iter()) {
                *m += f64::from(x) / live.len() as f64;
            }
        }
        let norm: f64 = mean.iter().map(|m| m * m).sum::<f64>() * live.len() as f64;
        let spread: f64 = live
            .iter()
            .map(|p| {
                p.iter()
                    .zip(&mean)
                    .map(|(&x, m)| (f64::from(x) - m).powi(2))
                    .sum::<f64>()
            })
            .sum();
        Some((spread / norm.max(f64::MIN_POSITIVE)).sqrt())
    }
}

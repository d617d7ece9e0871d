//! A swarm of simulated SGP peers, driven event by event in virtual time.

use std::collections::HashMap;

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

use murmur_protocol::message::{ShareCancel, ShareReceipt};

use crate::Time;
use crate::sgp::{MembershipView, SgpConfig, SgpInput, SgpOutput, SgpPeer};

use super::error::SimError;
use super::learner::{random_vector, step_duration};
use super::metrics::{self, MassView};
use super::network::Network;
use super::queue::{EventQueue, Lane};
use super::report::{RoundRecord, ShareRefusals, SimReport, SimSummary, Work};
use super::scenario::{ChurnEvent, Scenario, Workload};
use super::schedule::expand_churn;

mod churn;
mod transport;

use transport::{Body, Message};

/// A membership change as the swarm hears of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Joined,
    Left,
    Crashed,
}

/// Events that concern one incarnation of a peer (the end of its step, the confirmation of
/// a share it sent) carry it: a peer that restarted since is not the one they were for.
#[derive(Debug, Clone, Copy)]
enum Event {
    StepDone {
        peer: u32,
        incarnation: u32,
    },
    Reach {
        slot: u32,
    },
    Arrive {
        slot: u32,
    },
    Delivered {
        from: u32,
        incarnation: u32,
        to: u32,
        seq: u64,
    },
    Return {
        slot: u32,
    },
    Tick {
        peer: u32,
    },
    Churn {
        index: u32,
    },
    Announce {
        subject: u32,
        change: Change,
    },
    Record {
        round: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Live,
    Leaving,
    Gone,
}

#[derive(Debug)]
struct SimPeer {
    /// `None` once the peer crashed or departed.
    machine: Option<SgpPeer<u32>>,
    status: Status,
    /// How many times the peer restarted: which process under this index runs `machine`.
    incarnation: u32,
    slowdown: f64,
    sign_flip_scale: Option<f32>,
    /// The time of the pending `Tick` event, if one is queued.
    armed: Option<Time>,
    /// Quadratic workload: this peer's optimum `b_i` and the gradient of its current step.
    target: Vec<f32>,
    gradient: Vec<f32>,
}

impl SimPeer {
    /// A live, honest peer at full speed running `machine`, with optimum `target`.
    fn live(machine: SgpPeer<u32>, target: Vec<f32>) -> SimPeer {
        SimPeer {
            machine: Some(machine),
            status: Status::Live,
            incarnation: 0,
            slowdown: 1.0,
            sign_flip_scale: None,
            armed: None,
            gradient: vec![0.0; target.len()],
            target,
        }
    }
}

/// A simulated SGP swarm, for tests that want to step it and look inside.
///
/// [`run`](super::run) drives one to the end of its scenario; tests can instead call
/// [`SgpSwarm::run_until`] and inspect the peers in between.
#[derive(Debug)]
pub struct SgpSwarm {
    scenario: Scenario,
    config: SgpConfig,
    rng: Xoshiro256PlusPlus,
    queue: EventQueue<Event>,
    network: Network,
    peers: Vec<SimPeer>,
    /// Who is in the swarm, as an omniscient observer sees it.
    live: MembershipView<u32>,
    churn: Vec<ChurnEvent>,
    slots: Vec<Option<Message>>,
    free_slots: Vec<u32>,
    /// The payloads of exact shares written and not yet reported so, by sender, its
    /// incarnation and sequence number: the sender keeps them to take the shares back.
    written_payloads: HashMap<(u32, u32, u64), Vec<u8>>,
    outputs: Vec<SgpOutput<u32>>,
    /// While a peer handles a share or a cancel request: the incarnation of the process
    /// that sent it, which its receipt is for.
    answering: Option<u32>,
    now: Time,
    round_nanos: u64,
    initial_average: Vec<f64>,
    initial_spread: f64,
    initial_weight: f64,
    crashed_weight: f64,
    /// Weight of shares dropped as malformed, or returned or refused to a sender that could
    /// not take them back.
    dropped_weight: f64,
    refusals: ShareRefusals,
    steps: u64,
    records: Vec<RoundRecord>,
    held_average: Vec<f64>,
}

impl SgpSwarm {
    /// Builds the swarm of `scenario` at time zero, with `config` for every peer.
    pub fn new(scenario: &Scenario, config: &SgpConfig) -> Result<SgpSwarm, SimError> {
        scenario.validate()?;
        config.validate()?;
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(scenario.seed);
        let n = scenario.peers;
        let len = scenario.vector_len;
        let founders = 0..n as u32;
        let mut peers = Vec::with_capacity(n);
        for id in founders.clone() {
            let initial = random_vector(&mut rng, scenario, len);
            let target = match scenario.workload {
                Workload::Consensus => Vec::new(),
                Workload::Quadratic { .. } => initial.clone(),
            };
            let machine = SgpPeer::new(id, founders.clone(), initial, config.clone())?;
            peers.push(SimPeer::live(machine, target));
        }
        for straggler in &scenario.compute.stragglers {
            if let Some(peer) = peers.get_mut(straggler.peer as usize) {
                peer.slowdown = straggler.slowdown;
            }
        }
        for byzantine in &scenario.byzantine {
            if let Some(peer) = peers.get_mut(byzantine.peer as usize) {
                peer.sign_flip_scale = Some(byzantine.sign_flip_scale);
            }
        }
        let (initial_average, initial_spread) = metrics::average_and_spread(
            peers
                .iter()
                .filter_map(|peer| peer.machine.as_ref())
                .map(|machine| machine.state().numerator()),
            len,
        );
        let churn = expand_churn(scenario, &mut rng);
        let mut swarm = SgpSwarm {
            config: config.clone(),
            rng,
            queue: EventQueue::new(),
            network: Network::new(&scenario.link, n),
            peers,
            live: MembershipView::new(founders.clone()),
            churn,
            slots: Vec::new(),
            free_slots: Vec::new(),
            outputs: Vec::new(),
            answering: None,
            written_payloads: HashMap::new(),
            now: Time::ZERO,
            round_nanos: scenario.round_nanos(),
            initial_average,
            initial_spread: metrics::error_scale(initial_spread),
            initial_weight: n as f64,
            crashed_weight: 0.0,
            dropped_weight: 0.0,
            refusals: ShareRefusals::default(),
            steps: 0,
            records: Vec::new(),
            held_average: vec![0.0; len],
            scenario: scenario.clone(),
        };
        for index in 0..swarm.churn.len() {
            let at = Time::from_secs_f64(swarm.churn[index].at_ms() * 1e-3);
            swarm.queue.push(
                at,
                Lane::Normal,
                Event::Churn {
                    index: index as u32,
                },
            );
        }
        swarm
            .queue
            .push(Time::ZERO, Lane::Late, Event::Record { round: 0 });
        for id in founders {
            swarm.pump(id)?;
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

    /// Runs the scenario's rounds to the end and reports.
    pub fn run_to_end(mut self) -> Result<SimReport, SimError> {
        let end = Time::from_nanos(self.scenario.rounds.saturating_mul(self.round_nanos));
        self.run_until(end)?;
        Ok(self.report())
    }

    /// The end of round `round` in virtual time.
    pub fn round_end(&self, round: u64) -> Time {
        Time::from_nanos(round.saturating_mul(self.round_nanos))
    }

    /// The current virtual time.
    pub fn now(&self) -> Time {
        self.now
    }

    /// The peer with index `id`, unless it crashed or departed.
    pub fn peer(&self, id: u32) -> Option<&SgpPeer<u32>> {
        self.peers.get(id as usize)?.machine.as_ref()
    }

    /// Peers alive (not crashed, not departed), leavers included.
    pub fn live_peers(&self) -> impl Iterator<Item = &SgpPeer<u32>> {
        self.peers.iter().filter_map(|peer| peer.machine.as_ref())
    }

    /// Total weight: held by live peers plus carried by shares in flight, refused ones on
    /// their way back to their sender included.
    pub fn total_weight(&self) -> f64 {
        let held: f64 = self.live_peers().map(|peer| peer.state().weight()).sum();
        let in_flight: f64 = self.slots.iter().flatten().map(Message::weight).sum();
        held + in_flight
    }

    /// The run's churn, random churn drawn, sorted by time.
    pub fn churn(&self) -> &[ChurnEvent] {
        &self.churn
    }

    /// Weight lost with crashed peers so far, restarted ones included: what a peer held
    /// when it restarted, and what came back to it (returned or refused) for the process it
    /// replaced.
    pub fn crashed_weight(&self) -> f64 {
        self.crashed_weight
    }

    /// Weight of shares dropped: malformed ones, and returned or refused ones their sender
    /// could not take back.
    pub fn dropped_weight(&self) -> f64 {
        self.dropped_weight
    }

    /// What became of the quantized shares refused for a stale reference so far.
    pub fn share_refusals(&self) -> ShareRefusals {
        self.refusals
    }

    /// The founding peers' initial average, in `f64`.
    pub fn initial_average(&self) -> &[f64] {
        &self.initial_average
    }

    /// The initial disagreement `D₀` errors are relative to (see [`RoundRecord`]).
    pub fn initial_spread(&self) -> f64 {
        self.initial_spread
    }

    /// Measures the swarm now, as a [`RoundRecord`] for round `round`.
    pub fn measure(&mut self, round: u64) -> RoundRecord {
        let holding = self
            .peers
            .iter()
            .filter(|peer| peer.status != Status::Gone)
            .filter_map(|peer| peer.machine.as_ref())
            .filter(|machine| machine.state().weight() > 0.0)
            .map(|machine| MassView {
                numerator: machine.state().numerator(),
                weight: machine.state().weight(),
            });
        let agreement = metrics::agreement(
            holding,
            &self.initial_average,
            self.initial_spread,
            &mut self.held_average,
        );
        let work = Work {
            steps: self.steps,
            samples: self.steps * self.scenario.compute.samples_per_step,
            bytes_sent: self.network.bytes_sent(),
        };
        RoundRecord::new(round, self.now, &agreement, self.total_weight(), work)
    }

    /// The report of the run so far.
    pub fn report(&self) -> SimReport {
        let last = self.records.last();
        let secs = self.now.as_secs_f64();
        let samples = self.steps * self.scenario.compute.samples_per_step;
        SimReport {
            summary: SimSummary {
                name: self.scenario.name.clone(),
                algorithm: "sgp".into(),
                peers_start: self.scenario.peers,
                peers_end: self.live.len(),
                rounds: last.map_or(0, |record| record.round),
                virtual_secs: secs,
                samples_per_sec: if secs > 0.0 {
                    samples as f64 / secs
                } else {
                    0.0
                },
                final_consensus_error: last.map_or(f64::NAN, |r| r.consensus_error),
                final_average_error: last.map_or(f64::NAN, |r| r.average_error),
                initial_total_weight: self.initial_weight,
                final_total_weight: self.total_weight(),
                crashed_weight: self.crashed_weight,
                dropped_weight: self.dropped_weight,
                bytes_sent: self.network.bytes_sent(),
                messages: self.network.messages_sent(),
                events: self.queue.pushed(),
                averaging: None,
                share_refusals: Some(self.refusals),
            },
            rounds: self.records.clone(),
        }
    }

    fn dispatch(&mut self, event: Event) -> Result<(), SimError> {
        match event {
            Event::StepDone { peer, incarnation } => self.on_step_done(peer, incarnation),
            Event::Reach { slot } => {
                self.on_reach(slot);
                Ok(())
            }
            Event::Arrive { slot } => self.on_arrive(slot),
            Event::Delivered {
                from,
                incarnation,
                to,
                seq,
            } => {
                let payload = self
                    .written_payloads
                    .remove(&(from, incarnation, seq))
                    .unwrap_or_default();
                if self.incarnation(from) != Some(incarnation) {
                    // The peer restarted since: the new process never sent that share.
                    return Ok(());
                }
                let Some(machine) = self
                    .peers
                    .get_mut(from as usize)
                    .and_then(|peer| peer.machine.as_mut())
                else {
                    return Ok(());
                };
                // Taking back a share cancelled before this report cannot fail in the
                // simulator: the payload is the one the share was sent with.
                machine.delivered(self.now, to, seq, payload)?;
                self.pump(from)
            }
            Event::Return { slot } => self.on_return(slot),
            Event::Tick { peer } => {
                let Some(sim_peer) = self.peers.get_mut(peer as usize) else {
                    return Ok(());
                };
                // Only the latest armed tick counts; earlier ones were superseded.
                if sim_peer.armed != Some(self.now) {
                    return Ok(());
                }
                sim_peer.armed = None;
                self.feed(peer, SgpInput::Tick)
            }
            Event::Churn { index } => self.on_churn(index as usize),
            Event::Announce { subject, change } => self.announce(subject, change),
            Event::Record { round } => {
                let record = self.measure(round);
                self.records.push(record);
                let next = round + self.scenario.record_every;
                if next <= self.scenario.rounds {
                    let at = self.round_end(next);
                    self.queue
                        .push(at, Lane::Late, Event::Record { round: next });
                }
                Ok(())
            }
        }
    }

    fn on_step_done(&mut self, id: u32, incarnation: u32) -> Result<(), SimError> {
        let Some(peer) = self.peers.get_mut(id as usize) else {
            return Ok(());
        };
        if peer.status != Status::Live || peer.incarnation != incarnation {
            return Ok(());
        }
        let Some(machine) = peer.machine.as_mut() else {
            return Ok(());
        };
        if let Workload::Quadratic { learning_rate } = self.scenario.workload
            && let Some(numerator) = machine.numerator_mut()
        {
            for (x, &g) in numerator.iter_mut().zip(&peer.gradient) {
                *x -= learning_rate * g;
            }
        }
        self.steps += 1;
        self.feed(id, SgpInput::LocalStepDone)
    }

    /// The incarnation of peer `id` that runs now, unless it crashed or departed.
    fn incarnation(&self, id: u32) -> Option<u32> {
        let peer = self.peers.get(id as usize)?;
        peer.machine.as_ref().map(|_| peer.incarnation)
    }

    /// Hands `input` to peer `id` (if it still runs) and acts on what it asks for.
    fn feed(&mut self, id: u32, input: SgpInput<'_, u32>) -> Result<(), SimError> {
        let Some(machine) = self
            .peers
            .get_mut(id as usize)
            .and_then(|peer| peer.machine.as_mut())
        else {
            return Ok(());
        };
        machine.handle(self.now, input)?;
        self.pump(id)
    }

    /// Carries out everything peer `id` asked for.
    fn pump(&mut self, id: u32) -> Result<(), SimError> {
        let mut outputs = std::mem::take(&mut self.outputs);
        let peer = &mut self.peers[id as usize];
        let Some(machine) = peer.machine.as_mut() else {
            self.outputs = outputs;
            return Ok(());
        };
        while let Some(output) = machine.poll_output() {
            outputs.push(output);
        }
        let timeout = machine.poll_timeout();
        if let Some(at) = timeout
            && peer.armed.is_none_or(|armed| at < armed)
        {
            peer.armed = Some(at);
            self.queue.push(at, Lane::Normal, Event::Tick { peer: id });
        }
        for output in outputs.drain(..) {
            match output {
                SgpOutput::SendShare {
                    to,
                    header,
                    mut payload,
                } => {
                    let peer = &self.peers[id as usize];
                    if let Some(scale) = peer.sign_flip_scale {
                        sign_flip(&mut payload, scale);
                    }
                    let incarnation = peer.incarnation;
                    let body = Body::Share {
                        header,
                        payload,
                        receiver_gone: false,
                    };
                    self.post(id, to, incarnation, body);
                }
                SgpOutput::Receipt { to, step, outcome } => {
                    let Some(incarnation) = self.answering.or_else(|| self.incarnation(to)) else {
                        continue;
                    };
                    let body = Body::Receipt(ShareReceipt { step, outcome });
                    self.post(id, to, incarnation, body);
                }
                SgpOutput::Cancel { to, step } => {
                    let incarnation = self.peers[id as usize].incarnation;
                    self.post(id, to, incarnation, Body::Cancel(ShareCancel { step }));
                }
                SgpOutput::StartStep { .. } => self.start_step(id)?,
                SgpOutput::Departed => {
                    let peer = &mut self.peers[id as usize];
                    peer.status = Status::Gone;
                    peer.machine = None;
                }
            }
        }
        self.outputs = outputs;
        Ok(())
    }

    /// Schedules the end of peer `id`'s next step, computing its gradient at `z` now.
    fn start_step(&mut self, id: u32) -> Result<(), SimError> {
        let peer = &mut self.peers[id as usize];
        if let (Workload::Quadratic { .. }, Some(machine)) =
            (&self.scenario.workload, peer.machine.as_ref())
        {
            // ∇ ½‖z − b‖² = z − b, taken at the parameters the step starts from.
            machine.debiased_into(&mut peer.gradient)?;
            for (g, &b) in peer.gradient.iter_mut().zip(&peer.target) {
                *g -= b;
            }
        }
        let at = self.now + step_duration(&self.scenario.compute, peer.slowdown, &mut self.rng);
        let incarnation = peer.incarnation;
        self.queue.push(
            at,
            Lane::Normal,
            Event::StepDone {
                peer: id,
                incarnation,
            },
        );
        Ok(())
    }
}

/// Rewrites every little-endian `f32` of `payload` as `−scale · v`.
fn sign_flip(payload: &mut [u8], scale: f32) {
    for bytes in payload.chunks_exact_mut(4) {
        let mut raw = [0u8; 4];
        raw.copy_from_slice(bytes);
        let flipped = -scale * f32::from_le_bytes(raw);
        bytes.copy_from_slice(&flipped.to_le_bytes());
    }
}

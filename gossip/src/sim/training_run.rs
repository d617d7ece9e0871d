//! What the synchronous training modes (butterfly, sync-ring) share: the clock and event
//! queue, the network, the churn schedule, and the records and report of a run; the life
//! of a peer as far as it does not depend on the averaging (local steps, the download of
//! the parameters when it joins); and the event loop.
//!
//! Each mode wraps the shared [`RunEvent`]s in its own event type, handles them with
//! [`TrainingRun::handle`], and carries out the [`Lifecycle`] events it gets back.

use std::time::Duration;

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

use crate::Time;

use super::error::SimError;
use super::learner::{self, Learner};
use super::metrics::{self, MassView};
use super::network::{Departure, Network};
use super::queue::{EventQueue, Lane};
use super::report::{AveragingTally, RoundRecord, SimReport, SimSummary, Work};
use super::scenario::{ChurnEvent, Scenario};
use super::schedule::expand_churn;

/// Bytes per parameter in a state download (`f32`).
const PARAM_BYTES: usize = 4;

/// Where a peer of a training swarm is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// A joiner downloading the parameters.
    Syncing,
    Live,
    /// Finishes the averaging it is in, then goes.
    Leaving,
    Gone,
}

impl Status {
    /// Whether the peer trains: live or leaving, not downloading.
    pub(crate) fn trains(self) -> bool {
        matches!(self, Status::Live | Status::Leaving)
    }
}

/// The events every training swarm has, whatever its averaging; a swarm's own event type
/// wraps them (`From<RunEvent>`).
#[derive(Debug)]
pub(crate) enum RunEvent {
    /// Peer `peer` finished its local step.
    StepDone { peer: u32 },
    /// Churn event `index` of the run's schedule is due.
    Churn { index: u32 },
    /// The first byte of `source`'s parameters reaches joiner `peer`.
    StateReach {
        peer: u32,
        source: u32,
        departure: Departure,
    },
    /// Joiner `peer` has downloaded `source`'s parameters.
    Synced { peer: u32, source: u32 },
    /// The record of `round` is due.
    Record { round: u64 },
}

/// A run event that changes a peer's life, for the swarm to carry out.
#[derive(Debug)]
pub(crate) enum Lifecycle {
    /// Peer `peer` finished its local step.
    StepDone { peer: u32 },
    /// A join, leave or crash is due.
    Churn(ChurnEvent),
    /// Joiner `peer` has downloaded `source`'s parameters.
    Synced { peer: u32, source: u32 },
}

/// A peer of a training swarm, as the shared run sees it.
pub(crate) trait TrainingPeer {
    /// Where the peer is in its life, and its trainer.
    fn trainer(&self) -> (Status, &Learner);
}

/// A training swarm: a run of its own events `E`, and how it handles each.
pub(crate) trait TrainingSwarm<E> {
    /// Handles one event at the run's current time.
    fn dispatch(&mut self, event: E) -> Result<(), SimError>;
    /// The shared half of the swarm.
    fn training_run(&mut self) -> &mut TrainingRun<E>;
}

/// Runs every event of `swarm` due at or before `until`.
pub(crate) fn run_until<E, S: TrainingSwarm<E>>(
    swarm: &mut S,
    until: Time,
) -> Result<(), SimError> {
    while let Some((at, event)) = swarm.training_run().queue.pop_until(until) {
        swarm.training_run().now = at;
        swarm.dispatch(event)?;
    }
    let run = swarm.training_run();
    run.now = run.now.max(until);
    Ok(())
}

/// Peer `id` of `peers`, unless it is unknown or already gone: one a crash can hit.
pub(crate) fn crashable<P: TrainingPeer>(peers: &mut [P], id: u32) -> Option<&mut P> {
    peers
        .get_mut(id as usize)
        .filter(|peer| peer.trainer().0 != Status::Gone)
}

/// The parameters of the peers that train: live or leaving, not downloading.
pub(crate) fn live_params<P: TrainingPeer>(peers: &[P]) -> impl Iterator<Item = &[f32]> + Clone {
    peers
        .iter()
        .map(TrainingPeer::trainer)
        .filter(|(status, _)| status.trains())
        .map(|(_, learner)| learner.params())
}

/// The shared half of a training swarm, generic over the swarm's events.
#[derive(Debug)]
pub(crate) struct TrainingRun<E> {
    pub(crate) scenario: Scenario,
    pub(crate) rng: Xoshiro256PlusPlus,
    pub(crate) queue: EventQueue<E>,
    pub(crate) network: Network,
    pub(crate) churn: Vec<ChurnEvent>,
    pub(crate) now: Time,
    /// Local steps completed, all peers together.
    pub(crate) steps: u64,
    pub(crate) tally: AveragingTally,
    round_nanos: u64,
    initial_average: Vec<f64>,
    initial_spread: f64,
    held_average: Vec<f64>,
    records: Vec<RoundRecord>,
}

impl<E: From<RunEvent>> TrainingRun<E> {
    /// The run of `scenario` at time zero and its founding learners. Queues the churn and
    /// the first record.
    pub(crate) fn new(scenario: &Scenario) -> (TrainingRun<E>, Vec<Learner>) {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(scenario.seed);
        let learners = learner::founders(scenario, &mut rng);
        let (initial_average, initial_spread) =
            metrics::average_and_spread(learners.iter().map(Learner::params), scenario.vector_len);
        let churn = expand_churn(scenario, &mut rng);
        let mut run = TrainingRun {
            rng,
            queue: EventQueue::new(),
            network: Network::new(&scenario.link, scenario.peers),
            churn,
            now: Time::ZERO,
            steps: 0,
            tally: AveragingTally::default(),
            round_nanos: scenario.round_nanos(),
            initial_average,
            initial_spread: metrics::error_scale(initial_spread),
            held_average: vec![0.0; scenario.vector_len],
            records: Vec::new(),
            scenario: scenario.clone(),
        };
        for index in 0..run.churn.len() {
            let at = Time::from_secs_f64(run.churn[index].at_ms() * 1e-3);
            let index = index as u32;
            run.queue
                .push(at, Lane::Normal, E::from(RunEvent::Churn { index }));
        }
        run.queue.push(
            Time::ZERO,
            Lane::Late,
            E::from(RunEvent::Record { round: 0 }),
        );
        (run, learners)
    }

    /// Carries out what `event` asks of the run itself (a download's arrival, a record of
    /// `peers`) and returns what it asks of the swarm.
    pub(crate) fn handle<P: TrainingPeer>(
        &mut self,
        event: RunEvent,
        peers: &[P],
    ) -> Option<Lifecycle> {
        match event {
            RunEvent::StepDone { peer } => Some(Lifecycle::StepDone { peer }),
            RunEvent::Churn { index } => self
                .churn
                .get(index as usize)
                .cloned()
                .map(Lifecycle::Churn),
            RunEvent::StateReach {
                peer,
                source,
                departure,
            } => {
                // The first byte reached the joiner; the rest crosses its downlink.
                let arrival = self
                    .network
                    .arrive(&departure, peer as usize, &mut self.rng);
                let synced = RunEvent::Synced { peer, source };
                self.queue.push(arrival, Lane::Normal, E::from(synced));
                None
            }
            RunEvent::Synced { peer, source } => Some(Lifecycle::Synced { peer, source }),
            RunEvent::Record { round } => {
                self.record(round, live_params(peers));
                None
            }
        }
    }

    /// Starts peer `id`'s next local step on `learner`.
    pub(crate) fn start_step(&mut self, id: u32, learner: &mut Learner) {
        learner.begin_step();
        let at = self.now + learner.step_duration(&self.scenario.compute, &mut self.rng);
        self.queue
            .push(at, Lane::Normal, E::from(RunEvent::StepDone { peer: id }));
    }

    /// Starts joiner `id`'s download of the parameters from a live peer chosen at random.
    /// When no peer can serve it, returns fresh parameters for the joiner to train alone
    /// from instead.
    pub(crate) fn download<P: TrainingPeer>(&mut self, id: u32, peers: &[P]) -> Option<Vec<f32>> {
        let sources: Vec<u32> = (0..peers.len() as u32)
            .filter(|&p| p != id && peers[p as usize].trainer().0 == Status::Live)
            .collect();
        if sources.is_empty() {
            let len = self.scenario.vector_len;
            return Some(learner::random_vector(&mut self.rng, &self.scenario, len));
        }
        let source = sources[self.rng.random_range(0..sources.len())];
        let bytes = self.scenario.vector_len * PARAM_BYTES;
        let departure = self.network.depart(self.now, source as usize, bytes);
        let event = RunEvent::StateReach {
            peer: id,
            source,
            departure,
        };
        self.queue
            .push(departure.reaches, Lane::Normal, E::from(event));
        None
    }

    /// Takes the record of `round` and queues the next one, if any.
    fn record<'a>(&mut self, round: u64, params: impl Iterator<Item = &'a [f32]> + Clone) {
        let record = self.measure(round, params);
        self.records.push(record);
        let next = round + self.scenario.record_every;
        if next <= self.scenario.rounds {
            let at = self.round_end(next);
            self.queue
                .push(at, Lane::Late, E::from(RunEvent::Record { round: next }));
        }
    }
}

impl<E> TrainingRun<E> {
    /// The end of round `round` in virtual time.
    pub(crate) fn round_end(&self, round: u64) -> Time {
        Time::from_nanos(round.saturating_mul(self.round_nanos))
    }

    /// The end of the run.
    pub(crate) fn end(&self) -> Time {
        self.round_end(self.scenario.rounds)
    }

    /// How long the swarm takes to notice a join, leave or crash.
    pub(crate) fn detect(&self) -> Duration {
        Duration::from_secs_f64(self.scenario.link.detect_ms * 1e-3)
    }

    /// Samples processed so far.
    pub(crate) fn samples(&self) -> u64 {
        self.steps * self.scenario.compute.samples_per_step
    }

    /// Measures the live peers' parameters as the record of `round`.
    pub(crate) fn measure<'a>(
        &mut self,
        round: u64,
        params: impl Iterator<Item = &'a [f32]> + Clone,
    ) -> RoundRecord {
        let views = params.map(|numerator| MassView {
            numerator,
            weight: 1.0,
        });
        let agreement = metrics::agreement(
            views,
            &self.initial_average,
            self.initial_spread,
            &mut self.held_average,
        );
        let work = Work {
            steps: self.steps,
            samples: self.samples(),
            bytes_sent: self.network.bytes_sent(),
        };
        RoundRecord::new(round, self.now, &agreement, agreement.weight, work)
    }

    /// The report of the run so far.
    pub(crate) fn report(&self, algorithm: &str, peers_end: usize) -> SimReport {
        let last = self.records.last();
        let secs = self.now.as_secs_f64();
        let live = last.map_or(0.0, |record| record.total_weight);
        SimReport {
            summary: SimSummary {
                name: self.scenario.name.clone(),
                algorithm: algorithm.into(),
                peers_start: self.scenario.peers,
                peers_end,
                rounds: last.map_or(0, |record| record.round),
                virtual_secs: secs,
                samples_per_sec: if secs > 0.0 {
                    self.samples() as f64 / secs
                } else {
                    0.0
                },
                final_consensus_error: last.map_or(f64::NAN, |r| r.consensus_error),
                final_average_error: last.map_or(f64::NAN, |r| r.average_error),
                // Every live peer counts once: there is no mass to conserve.
                initial_total_weight: self.scenario.peers as f64,
                final_total_weight: live,
                crashed_weight: 0.0,
                dropped_weight: 0.0,
                bytes_sent: self.network.bytes_sent(),
                messages: self.network.messages_sent(),
                events: self.queue.pushed(),
                averaging: Some(self.tally.summary()),
                share_refusals: None,
            },
            rounds: self.records.clone(),
        }
    }
}

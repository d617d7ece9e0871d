//! What the synchronous training modes (butterfly, sync-ring) share: the clock and event
//! queue, the network, the churn schedule, and the records and report of a run.

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

use crate::Time;

use super::learner::{self, Learner};
use super::metrics::{self, MassView};
use super::network::Network;
use super::queue::{EventQueue, Lane};
use super::report::{AveragingTally, RoundRecord, SimReport, SimSummary};
use super::scenario::{ChurnEvent, Scenario};
use super::schedule::expand_churn;

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

impl<E> TrainingRun<E> {
    /// The run of `scenario` at time zero and its founding learners. Queues the churn
    /// (as `churn(index)`) and the first record (as `record(0)`).
    pub(crate) fn new(
        scenario: &Scenario,
        churn_event: impl Fn(u32) -> E,
        record: impl Fn(u64) -> E,
    ) -> (TrainingRun<E>, Vec<Learner>) {
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
            // A swarm that starts in agreement has nothing to converge; measure in absolute terms.
            initial_spread: if initial_spread > 0.0 {
                initial_spread
            } else {
                1.0
            },
            held_average: vec![0.0; scenario.vector_len],
            records: Vec::new(),
            scenario: scenario.clone(),
        };
        for index in 0..run.churn.len() {
            let at = Time::from_secs_f64(run.churn[index].at_ms() * 1e-3);
            run.queue.push(at, Lane::Normal, churn_event(index as u32));
        }
        run.queue.push(Time::ZERO, Lane::Late, record(0));
        (run, learners)
    }

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
        RoundRecord {
            round,
            time_s: self.now.as_secs_f64(),
            live_peers: agreement.peers,
            consensus_error: agreement.consensus_error,
            average_error: agreement.reference_error,
            total_weight: agreement.weight,
            min_weight: agreement.min_weight,
            steps: self.steps,
            samples: self.samples(),
            bytes_sent: self.network.bytes_sent(),
        }
    }

    /// Takes the record of `round` and returns the next record's round and time, if any.
    pub(crate) fn record<'a>(
        &mut self,
        round: u64,
        params: impl Iterator<Item = &'a [f32]> + Clone,
    ) -> Option<(u64, Time)> {
        let record = self.measure(round, params);
        self.records.push(record);
        let next = round + self.scenario.record_every;
        (next <= self.scenario.rounds).then(|| (next, self.round_end(next)))
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
            },
            rounds: self.records.clone(),
        }
    }
}

//! What every training mode shares: the network, the mailbox and outbox, the trainer
//! thread, membership news, signals, counters and progress lines.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use murmur_gossip::Time;
use murmur_gossip::net::exchange::{Mailbox, Outbox, Parcel};
use murmur_gossip::net::{NetEvent, NetHandle};
use murmur_protocol::frame::FrameKind;
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::{AveragingMode, HeartbeatBody};
use murmur_protocol::snapshot::{NamedTensor, Snapshot};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::broadcast;

use super::collective::RoundOutcome as CollectiveOutcome;
use super::progress::{Counters, EvalLosses, Progress};
use super::settings::RunSettings;
use super::state_sync::StateCell;
use super::worker::Worker;
use super::worker::{Done, Job, OptimizerState, SharedOptimizer};
use crate::checkpoint::CheckpointStore;
use crate::observe::{Metrics, RoundOutcome, RoundSummary, StatusBoard};

/// What the operating system asked of the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// SIGINT or SIGTERM: leave cleanly.
    Stop,
    /// SIGUSR1: stop training, keep serving.
    Pause,
    /// SIGUSR2: train again.
    Resume,
}

/// The signals a peer answers.
#[derive(Debug)]
pub(crate) struct Signals {
    interrupt: Signal,
    terminate: Signal,
    pause: Signal,
    resume: Signal,
}

impl Signals {
    pub(crate) fn install() -> anyhow::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            pause: signal(SignalKind::user_defined1())?,
            resume: signal(SignalKind::user_defined2())?,
        })
    }

    /// The next request; pending forever once every signal stream has ended.
    pub(crate) async fn next(&mut self) -> Request {
        tokio::select! {
            Some(()) = self.interrupt.recv() => Request::Stop,
            Some(()) = self.terminate.recv() => Request::Stop,
            Some(()) = self.pause.recv() => Request::Pause,
            Some(()) = self.resume.recv() => Request::Resume,
            else => std::future::pending().await,
        }
    }
}

/// What a peer knows of another from its heartbeats.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerNews {
    pub(crate) last: HeartbeatBody,
}

/// The parts of a running peer every mode uses.
#[derive(Debug)]
pub(crate) struct Peer {
    pub(crate) settings: RunSettings,
    pub(crate) me: PeerId,
    pub(crate) net: NetHandle,
    pub(crate) mailbox: Mailbox,
    pub(crate) outbox: Outbox,
    pub(crate) events: broadcast::Receiver<NetEvent>,
    pub(crate) worker: Worker,
    pub(crate) signals: Signals,
    pub(crate) progress: Progress,
    pub(crate) counters: Counters,
    /// Authorized peers and their latest heartbeat, if any.
    pub(crate) peers: BTreeMap<PeerId, Option<PeerNews>>,
    /// A hash of the model's definition, stamped on checkpoints so that state is never
    /// loaded into another model.
    pub(crate) model_fingerprint: [u8; 32],
    /// The state snapshot this peer serves to joiners.
    pub(crate) state: StateCell,
    /// The optimizer's state as the trainer last shared it.
    pub(crate) optimizer: SharedOptimizer,
    /// Optimizer state found in a checkpoint or a download, to load before training.
    pub(crate) pending_optimizer: Option<OptimizerState>,
    /// When each peer's last heartbeat arrived (only peers heard at least once).
    pub(crate) last_heard: HashMap<PeerId, Instant>,
    /// When the next heartbeat goes out and silent peers are next looked for.
    pub(crate) next_heartbeat: tokio::time::Instant,
    pub(crate) next_liveness: tokio::time::Instant,
    /// When the bootstrap addresses are next dialed again, while too few peers are known.
    pub(crate) redial: Redial,
    /// What the next heartbeat says: the mode's step and samples gathered.
    pub(crate) heartbeat_step: u64,
    pub(crate) heartbeat_samples: u64,
    pub(crate) metrics: Metrics,
    pub(crate) board: StatusBoard,
    /// The learning rate of the last update, for the metrics.
    pub(crate) learning_rate: f32,
    pub(crate) clock: Instant,
    pub(crate) initial_eval_loss: f32,
    pub(crate) last_eval_loss: f32,
    pub(crate) loss_floor: Option<f32>,
    pub(crate) mode: AveragingMode,
    /// Samples per second over the recent steps (exponential average).
    pub(crate) rate: f64,
}

impl Peer {
    /// Now on the state machines' clock.
    pub(crate) fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.clock.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// The instant a state-machine time stands for.
    pub(crate) fn instant_of(&self, at: Time) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.clock + Duration::from_nanos(at.as_nanos()))
    }

    /// Whether training is paused (SIGUSR1 or `POST /pause`).
    pub(crate) fn is_paused(&self) -> bool {
        self.board.is_paused()
    }

    /// Pauses or resumes training.
    pub(crate) fn set_paused(&mut self, paused: bool) {
        if self.board.set_paused(paused) != paused {
            tracing::info!(
                paused,
                "training {}",
                if paused { "paused" } else { "resumed" }
            );
        }
    }

    /// Notes an eval loss everywhere it is reported.
    pub(crate) fn record_eval(&mut self, step: u64, loss: f32) {
        self.last_eval_loss = loss;
        self.metrics.training.set_eval_loss(f64::from(loss));
        self.board.set_eval_loss(f64::from(loss));
        self.progress.eval(step, loss);
    }

    /// Notes a finished averaging round in the metrics, `/status` and the progress counters.
    pub(crate) fn record_round(&mut self, outcome: &CollectiveOutcome) {
        let summary = RoundSummary {
            mode: self.mode,
            outcome: match outcome.outcome() {
                "complete" => RoundOutcome::Complete,
                "partial" => RoundOutcome::Partial,
                _ => RoundOutcome::Failed,
            },
            duration: outcome.duration,
            coverage: outcome.coverage,
            group_size: u32::try_from(outcome.group).unwrap_or(u32::MAX),
            out_peer: None,
            stragglers_dropped: outcome.stragglers_dropped,
            parts_timed_out: outcome.parts_timed_out,
        };
        self.metrics.averaging.record_round(&summary);
        self.board.record_round(&summary);
        if let Some(drift) = outcome.drift {
            self.metrics.averaging.set_consensus_drift(drift);
            self.counters.drift = Some(drift);
        }
    }

    /// Counts a parcel's bytes by codec and message kind, sent or received.
    pub(crate) fn record_parcel(&self, sent: bool, parcel: &Parcel) {
        let (codec, kind) = match parcel {
            Parcel::Share(m, _) => (Some(m.codec), FrameKind::PushSumShare),
            Parcel::ShareRefused(_) => (None, FrameKind::ShareRefused),
            Parcel::PartChunk(m, _) => (Some(m.codec), FrameKind::TensorPartChunk),
            Parcel::Averaged(m, _) => (Some(m.codec), FrameKind::AveragedChunk),
            Parcel::JoinGroup(_) => (None, FrameKind::JoinGroup),
            Parcel::GroupBegin { .. } => (None, FrameKind::GroupBegin),
            Parcel::GroupReject(_) => (None, FrameKind::GroupReject),
            Parcel::StateSyncRequest(_) => (None, FrameKind::StateSyncRequest),
            Parcel::StateSyncResponse(..) => (None, FrameKind::StateSyncResponse),
        };
        let bytes = parcel.payload_len() as u64;
        if sent {
            self.metrics.network.record_sent(codec, kind, bytes);
        } else {
            self.metrics.network.record_received(codec, kind, bytes);
        }
    }

    /// Notes a push-sum share's fate (SGP's unit of averaging).
    pub(crate) fn record_share(&self, to: PeerId, delivered: bool, took: Duration) {
        let summary = RoundSummary {
            mode: self.mode,
            outcome: if delivered {
                RoundOutcome::Complete
            } else {
                RoundOutcome::Failed
            },
            duration: took,
            coverage: if delivered { 1.0 } else { 0.0 },
            group_size: 2,
            out_peer: Some(to),
            stragglers_dropped: 0,
            parts_timed_out: 0,
        };
        self.metrics.averaging.record_round(&summary);
        self.board.record_round(&summary);
    }

    /// Notes one finished local step for the counters and the progress line.
    pub(crate) fn count_step(&mut self, samples: u64, loss: f32, took: Duration) {
        self.counters.step += 1;
        self.counters.samples += samples;
        self.counters.loss = loss;
        let rate = samples as f64 / took.as_secs_f64().max(1e-6);
        self.rate = if self.rate == 0.0 {
            rate
        } else {
            0.8 * self.rate + 0.2 * rate
        };
        self.counters.samples_per_s = self.rate;
        let c = &self.counters;
        self.metrics.training.record_step(
            c.step,
            samples,
            f64::from(loss),
            f64::from(self.learning_rate),
        );
        self.metrics.training.set_samples_per_second(self.rate);
        self.board
            .record_step(c.step, c.samples, f64::from(loss), self.rate);
    }

    /// Updates the network counters and writes a progress line (rate-limited).
    pub(crate) fn report_progress(&mut self) {
        let snapshot = self.net.metrics().snapshot();
        self.counters.bytes_sent = snapshot.tensor_bytes_sent;
        self.counters.bytes_received = snapshot.tensor_bytes_received;
        self.counters.peers = self.peers.len();
        self.progress.progress(&self.counters);
    }

    /// Says what the next heartbeat carries and sends it at once (the round-based modes
    /// announce their samples after every step, so the swarm's sum is fresh).
    pub(crate) fn announce(&mut self, step: u64, samples_accumulated: u64) {
        self.heartbeat_step = step;
        self.heartbeat_samples = samples_accumulated;
        self.next_heartbeat = tokio::time::Instant::now();
        self.maintain();
    }

    fn heartbeat_body(&self, step: u64, samples_accumulated: u64) -> HeartbeatBody {
        let bandwidth = self.net.bandwidth_estimator().all();
        let mean = |pick: fn(&murmur_gossip::net::PeerBandwidth) -> Option<f64>| {
            let rates: Vec<f64> = bandwidth.iter().filter_map(|(_, b)| pick(b)).collect();
            if rates.is_empty() {
                0
            } else {
                (rates.iter().sum::<f64>() / rates.len() as f64) as u64
            }
        };
        HeartbeatBody {
            step,
            timestamp_ms: crate::clock::unix_ms(),
            samples_per_s: self.rate as f32,
            upload_bytes_per_s: mean(|b| b.upload_bytes_per_s),
            download_bytes_per_s: mean(|b| b.download_bytes_per_s),
            mode: self.mode,
            samples_accumulated,
        }
    }

    /// Applies a network event to the peer table. Returns a peer that (re)appeared through
    /// its heartbeat after it had been given up as silent, for the mode to take back in.
    pub(crate) fn note_event(&mut self, event: &NetEvent) -> Option<PeerId> {
        let mut returned = None;
        match event {
            NetEvent::PeerAuthorized { peer, .. } => {
                self.peers.entry(*peer).or_insert(None);
            }
            NetEvent::PeerDisconnected { peer } | NetEvent::PeerRejected { peer, .. } => {
                self.peers.remove(peer);
                self.last_heard.remove(peer);
                self.board.forget_peer(peer);
            }
            NetEvent::Heartbeat { peer, body } => {
                // Gossip only delivers heartbeats of authorized peers.
                if !self.peers.contains_key(peer) {
                    returned = Some(*peer);
                }
                self.peers.insert(*peer, Some(PeerNews { last: *body }));
                self.last_heard.insert(*peer, Instant::now());
                self.board.record_heartbeat(*peer, body);
            }
        }
        self.metrics.network.set_connected_peers(self.peers.len());
        returned
    }

    /// The eval losses a summary reports.
    pub(crate) fn eval_losses(&self) -> EvalLosses {
        EvalLosses {
            initial: self.initial_eval_loss,
            last: self.last_eval_loss,
            floor: self.loss_floor,
        }
    }

    /// The earliest time [`Peer::maintain`] has work.
    pub(crate) fn next_maintenance(&self) -> tokio::time::Instant {
        self.next_heartbeat.min(self.next_liveness)
    }

    /// Publishes the heartbeat when due, and gives up on peers whose heartbeats stopped
    /// for 1.6 intervals (a crashed peer's connection can take the QUIC idle timeout to
    /// close; its heartbeats stop at once). Returns the peers given up on.
    pub(crate) fn maintain(&mut self) -> Vec<PeerId> {
        let now = tokio::time::Instant::now();
        let interval = self.settings.heartbeat_interval;
        if now >= self.next_heartbeat {
            self.next_heartbeat = now + interval;
            let body = self.heartbeat_body(self.heartbeat_step, self.heartbeat_samples);
            let net = self.net.clone();
            tokio::spawn(async move {
                if let Err(e) = net.publish_heartbeat(&body).await {
                    tracing::debug!(error = %e, "heartbeat not published");
                }
            });
            self.report_progress();
        }
        let mut silent = Vec::new();
        if now >= self.next_liveness {
            self.next_liveness = now + interval / 4;
            let limit = interval.mul_f64(1.6);
            let std_now = Instant::now();
            for (peer, heard) in &self.last_heard {
                if std_now.duration_since(*heard) > limit {
                    silent.push(*peer);
                }
            }
            for peer in &silent {
                tracing::warn!(%peer, "no heartbeat for 1.6 intervals: treating the peer as gone");
                self.last_heard.remove(peer);
                self.peers.remove(peer);
                self.board.forget_peer(peer);
                // If it crashed and comes back, it must find a fresh connection (see
                // `NetHandle::disconnect`); if it is alive, it reconnects and is taken back.
                let net = self.net.clone();
                let gone = *peer;
                tokio::spawn(async move {
                    if let Err(e) = net.disconnect(&gone).await {
                        tracing::debug!(peer = %gone, error = %e, "silent peer not disconnected");
                    }
                });
            }
            if !silent.is_empty() {
                self.metrics.network.set_connected_peers(self.peers.len());
            }
            self.redial_when_short(std::time::Instant::now());
        }
        silent
    }

    /// Dials the bootstrap addresses again while fewer peers are known than the swarm is
    /// expected to have (`training.min_peers`, at least one). A dial that failed at start
    /// (the bootstrap peer was busy or unreachable) is otherwise never retried, and after a
    /// network partition heals the two sides would never meet again: connections across it
    /// timed out, and nothing else dials across.
    pub(crate) fn redial_when_short(&mut self, now: Instant) {
        let bootstrap = &self.settings.net.bootstrap;
        let expected = self.settings.min_peers.max(1);
        if bootstrap.is_empty() || !self.redial.due(now, self.peers.len(), expected) {
            return;
        }
        tracing::debug!(
            known = self.peers.len(),
            expected,
            "fewer peers than expected: dialing the bootstrap addresses again"
        );
        let net = self.net.clone();
        let addresses = bootstrap.clone();
        tokio::spawn(async move {
            for text in addresses {
                // Checked when the config was loaded; a connected peer is not dialed again.
                let result = match text.parse() {
                    Ok(address) => net.dial(address).await.map_err(|e| e.to_string()),
                    Err(e) => Err(format!("{e}")),
                };
                if let Err(e) = result {
                    tracing::debug!(address = %text, error = %e, "bootstrap address not dialed");
                }
            }
        });
    }

    /// The highest step any peer's heartbeat reported.
    pub(crate) fn swarm_step(&self) -> u64 {
        self.peers
            .values()
            .filter_map(|n| n.map(|n| n.last.step))
            .max()
            .unwrap_or(0)
    }
}

impl Peer {
    /// Writes a checkpoint after every `checkpoint.every_steps` local steps; a failure is
    /// logged, not fatal (training goes on; the next one may succeed).
    pub(crate) fn maybe_checkpoint(&self, params: &[f32]) {
        if self.counters.step.is_multiple_of(STATE_EVERY)
            && let Err(e) = self.state.publish(&self.snapshot(params))
        {
            tracing::warn!(error = format!("{e:#}"), "state snapshot not refreshed");
        }
        let every = self.settings.checkpoint_every;
        if every > 0
            && self.counters.step.is_multiple_of(every)
            && let Err(e) = self.write_checkpoint(params)
        {
            tracing::warn!(error = format!("{e:#}"), "checkpoint not written");
        }
    }

    /// The state at `params`, as checkpoints and joiners receive it: the parameters and
    /// the optimizer's state as the trainer last shared it (at most
    /// `OPTIMIZER_SHARE_EVERY` optimizer steps old).
    pub(crate) fn snapshot(&self, params: &[f32]) -> Snapshot {
        let mut tensors = vec![NamedTensor {
            name: "params".into(),
            data: params.to_vec(),
        }];
        if let Ok(optimizer) = self.optimizer.lock()
            && !optimizer.slots.is_empty()
        {
            // Two exact f32 integers of 24 bits each: steps up to 2^48.
            let steps = optimizer.steps_taken;
            tensors.push(NamedTensor {
                name: STEPS_TENSOR.into(),
                data: vec![
                    (steps & 0xff_ffff) as f32,
                    ((steps >> 24) & 0xff_ffff) as f32,
                ],
            });
            for (name, values) in &optimizer.slots {
                tensors.push(NamedTensor {
                    name: format!("{OPTIMIZER_PREFIX}{name}"),
                    data: values.clone(),
                });
            }
        }
        Snapshot {
            step: self.counters.step,
            samples: self.counters.samples,
            push_sum_weight: 1.0,
            swarm_id: self.settings.swarm_id.clone(),
            model_fingerprint: self.model_fingerprint,
            tensors,
        }
    }

    /// Loads optimizer state found at start (checkpoint or download) into the trainer.
    pub(crate) async fn load_pending_optimizer(&mut self) {
        let Some(state) = self.pending_optimizer.take() else {
            return;
        };
        let steps = state.steps_taken;
        if let Err(e) = self.worker.submit(Job::LoadOptimizer(state)) {
            tracing::warn!(error = format!("{e:#}"), "optimizer state not loaded");
            return;
        }
        let answer = tokio::time::timeout(Duration::from_secs(30), self.worker.done.recv()).await;
        self.worker.finished();
        match answer {
            Ok(Some(Ok(Done::OptimizerLoaded))) => {
                tracing::info!(steps, "optimizer state loaded");
            }
            Ok(Some(Err(e))) => {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "optimizer state not loaded; starting it fresh"
                );
            }
            _ => tracing::warn!("the trainer did not load the optimizer state; starting it fresh"),
        }
    }

    /// Writes the current state into the checkpoint folder (atomically; the oldest beyond
    /// `checkpoint.keep` are removed).
    pub(crate) fn write_checkpoint(&self, params: &[f32]) -> anyhow::Result<()> {
        let store =
            CheckpointStore::open(&self.settings.checkpoint_dir, self.settings.checkpoint_keep)
                .context("cannot open the checkpoint folder")?;
        let path = store
            .write(&self.snapshot(params))
            .context("cannot write the checkpoint")?;
        tracing::info!(path = %path.display(), step = self.counters.step, "checkpoint written");
        Ok(())
    }
}

/// How often the bootstrap addresses are dialed again while too few peers are known.
const REDIAL_EVERY: Duration = Duration::from_secs(5);

/// When a peer that knows too few peers dials its bootstrap addresses again: at once when it
/// falls short, then every [`REDIAL_EVERY`] while it stays short.
#[derive(Debug, Default)]
pub(crate) struct Redial {
    next: Option<Instant>,
}

impl Redial {
    /// Whether to dial now, knowing `known` peers of `expected`.
    pub(crate) fn due(&mut self, now: Instant, known: usize, expected: usize) -> bool {
        if known >= expected {
            self.next = None;
            return false;
        }
        if self.next.is_some_and(|next| now < next) {
            return false;
        }
        self.next = Some(now + REDIAL_EVERY);
        true
    }
}

/// Snapshot tensor holding the optimizer's step count.
const STEPS_TENSOR: &str = "optimizer.steps_taken";
/// Prefix of the snapshot tensors holding optimizer slots.
const OPTIMIZER_PREFIX: &str = "optimizer.slot.";

/// The optimizer state a snapshot holds, if any.
pub(crate) fn optimizer_of(snapshot: &Snapshot) -> Option<OptimizerState> {
    let steps = snapshot.tensors.iter().find(|t| t.name == STEPS_TENSOR)?;
    let [lo, hi] = steps.data.as_slice() else {
        return None;
    };
    let steps_taken = (*lo as u64) | ((*hi as u64) << 24);
    let slots = snapshot
        .tensors
        .iter()
        .filter_map(|t| {
            t.name
                .strip_prefix(OPTIMIZER_PREFIX)
                .map(|name| (name.to_owned(), t.data.clone()))
        })
        .collect();
    Some(OptimizerState { steps_taken, slots })
}

/// Local steps between refreshes of the state served to joiners.
const STATE_EVERY: u64 = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_peer_redials_at_once_then_at_most_every_interval() {
        let mut redial = Redial::default();
        let start = Instant::now();
        assert!(!redial.due(start, 3, 3), "enough peers: no dial");
        assert!(redial.due(start, 2, 3), "short: dial at once");
        assert!(
            !redial.due(start + REDIAL_EVERY / 2, 2, 3),
            "not again so soon"
        );
        assert!(
            redial.due(start + REDIAL_EVERY, 0, 3),
            "still short an interval later"
        );
        // Back to enough peers, then short again (a partition): dial at once.
        let later = start + REDIAL_EVERY + Duration::from_secs(1);
        assert!(!redial.due(later, 3, 3));
        assert!(redial.due(later, 1, 3));
    }
}

//! What the daemon keeps of a running peer besides its averaging: the trainer thread,
//! signals, counters, progress lines, metrics, status, checkpoints and the state served to
//! joiners. The averaging engine (`murmur_gossip::engine`) runs behind its driver's handle.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use murmur_gossip::Parcel;
use murmur_gossip::engine::{EngineEvent, RefusalFate, RoundReport};
use murmur_gossip::net::NetHandle;
use murmur_gossip::net::driver::ParcelObserver;
use murmur_protocol::frame::FrameKind;
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::AveragingMode;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::checkpointing::{
    self, CheckpointTarget, CheckpointWriter, StateMeta, try_with_state_view,
};
use super::progress::{Counters, EvalLosses, Progress};
use super::settings::RunSettings;
use super::state_sync::{RoundCadence, StateCell};
use super::worker::Worker;
use super::worker::{Done, Job, OptimizerState, SharedOptimizer};
use crate::checkpoint::SetAside;
use crate::observe::{Metrics, Refusal, RoundOutcome, RoundSummary, StatusBoard};

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

/// Counts the averaging traffic the driver moves: bytes by codec and kind for the metrics,
/// and the raw `f32` bytes the encoded tensors stand for, for the progress summary.
pub(crate) struct Traffic {
    metrics: Metrics,
    raw_bytes: AtomicU64,
}

impl Traffic {
    pub(crate) fn new(metrics: Metrics) -> Arc<Traffic> {
        Arc::new(Traffic {
            metrics,
            raw_bytes: AtomicU64::new(0),
        })
    }

    /// Raw `f32` bytes sent, encoded.
    pub(crate) fn raw_bytes(&self) -> u64 {
        self.raw_bytes.load(Ordering::Relaxed)
    }

    fn record(&self, sent: bool, parcel: &Parcel) {
        let (codec, kind, elements) = match parcel {
            Parcel::Share(m, _) => (Some(m.codec), FrameKind::PushSumShare, m.elements),
            Parcel::ShareRefused(_) => (None, FrameKind::ShareRefused, 0),
            Parcel::ShareReceipt(_) => (None, FrameKind::ShareReceipt, 0),
            Parcel::ShareCancel(_) => (None, FrameKind::ShareCancel, 0),
            Parcel::PartChunk(m, _) => (
                Some(m.codec),
                FrameKind::TensorPartChunk,
                m.address.elements,
            ),
            Parcel::Averaged(m, _) => (Some(m.codec), FrameKind::AveragedChunk, m.address.elements),
            Parcel::JoinGroup(_) => (None, FrameKind::JoinGroup, 0),
            Parcel::GroupBegin { .. } => (None, FrameKind::GroupBegin, 0),
            Parcel::GroupReject(_) => (None, FrameKind::GroupReject, 0),
            Parcel::StateSyncRequest(_) => (None, FrameKind::StateSyncRequest, 0),
            Parcel::StateSyncResponse(..) => (None, FrameKind::StateSyncResponse, 0),
        };
        let bytes = parcel.payload_len() as u64;
        if sent {
            self.metrics.network.record_sent(codec, kind, bytes);
            self.raw_bytes
                .fetch_add(u64::from(elements) * 4, Ordering::Relaxed);
        } else {
            self.metrics.network.record_received(codec, kind, bytes);
        }
    }
}

impl std::fmt::Debug for Traffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traffic")
            .field("raw_bytes", &self.raw_bytes())
            .finish()
    }
}

impl ParcelObserver for Traffic {
    fn sent(&self, _to: &PeerId, parcel: &Parcel) {
        self.record(true, parcel);
    }

    fn received(&self, _from: &PeerId, parcel: &Parcel) {
        self.record(false, parcel);
    }
}

/// The daemon's side of a running peer.
#[derive(Debug)]
pub(crate) struct Peer {
    pub(crate) settings: RunSettings,
    pub(crate) net: NetHandle,
    pub(crate) worker: Worker,
    pub(crate) signals: Signals,
    pub(crate) progress: Progress,
    pub(crate) counters: Counters,
    /// A hash of the model's definition, stamped on checkpoints so that state is never
    /// loaded into another model.
    pub(crate) model_fingerprint: [u8; 32],
    /// The state snapshot this peer serves to joiners.
    pub(crate) state: StateCell,
    /// The last refresh of it was skipped (the optimizer's state was held): try again at
    /// the next step rather than [`STATE_EVERY`] steps later.
    pub(crate) state_skipped: bool,
    /// When a butterfly member publishes its state (after rounds, not steps).
    pub(crate) round_cadence: RoundCadence,
    /// The optimizer's state, which the trainer holds only while it steps.
    pub(crate) optimizer: SharedOptimizer,
    /// Optimizer state found in a checkpoint or a download, to load before training.
    pub(crate) pending_optimizer: Option<OptimizerState>,
    pub(crate) metrics: Metrics,
    pub(crate) board: StatusBoard,
    pub(crate) traffic: Arc<Traffic>,
    /// The learning rate of the last update, for the metrics.
    pub(crate) learning_rate: f32,
    pub(crate) initial_eval_loss: f32,
    pub(crate) last_eval_loss: f32,
    pub(crate) loss_floor: Option<f32>,
    /// Samples per second over the recent steps (exponential average).
    pub(crate) rate: f64,
    /// The checkpoint being written beside training, if any.
    pub(crate) checkpoints: CheckpointWriter,
}

impl Peer {
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
    pub(crate) fn report_progress(&mut self, peers: usize) {
        let snapshot = self.net.metrics().snapshot();
        self.counters.bytes_sent = snapshot.tensor_bytes_sent;
        self.counters.bytes_received = snapshot.tensor_bytes_received;
        self.counters.raw_bytes = self.traffic.raw_bytes();
        self.counters.peers = peers;
        self.metrics.network.set_connected_peers(peers);
        self.progress.progress(&self.counters);
    }

    /// Notes one SGP share's fate as a round of a group of two: delivered or not.
    fn record_share(&mut self, to: PeerId, delivered: bool, took: Duration) {
        let summary = RoundSummary {
            mode: self.settings.mode(),
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

    /// Notes what the averaging engine reported, in the metrics, `/status`, the progress
    /// lines and the log.
    pub(crate) fn record_event(&mut self, event: EngineEvent<PeerId>) {
        match event {
            EngineEvent::Round(report) => self.record_round(&report),
            EngineEvent::Alone { round } => {
                // Nothing was averaged with anyone: the round reads as failed, next to a
                // group of one, never as complete.
                let summary = RoundSummary {
                    mode: self.settings.mode(),
                    outcome: RoundOutcome::Failed,
                    duration: Duration::ZERO,
                    coverage: 0.0,
                    group_size: 1,
                    out_peer: None,
                    stragglers_dropped: 0,
                    parts_timed_out: 0,
                };
                self.metrics.averaging.record_round(&summary);
                self.board.record_round(&summary);
                self.counters.rounds += 1;
                self.progress.alone(round);
                tracing::info!(
                    round,
                    "no group formed in time: applying this peer's own update"
                );
            }
            EngineEvent::Share {
                to,
                delivered,
                took,
            } => {
                if !delivered {
                    // Its mass came back from the payload the transport gave back.
                    tracing::info!(peer = %to, "a share the transport could not write, taken back");
                }
                self.record_share(to, delivered, took);
            }
            EngineEvent::Refusal { peer, fate } => {
                let refusal = match fate {
                    RefusalFate::Refused => Refusal::Refused,
                    RefusalFate::TakenBack => {
                        tracing::info!(%peer, "a refused share taken back");
                        Refusal::TakenBack
                    }
                    RefusalFate::Cancelled => {
                        tracing::info!(%peer, "a share its receiver never applied, taken back");
                        Refusal::Cancelled
                    }
                    RefusalFate::Lost => {
                        tracing::warn!(%peer, "a refused or returned share's mass is lost");
                        Refusal::Lost
                    }
                };
                self.metrics.averaging.count_refusal(refusal);
            }
            EngineEvent::BadParcel { from, reason } => {
                // A bad message costs its sender its contribution, never the round.
                tracing::warn!(peer = %from, %reason, "message refused");
            }
            EngineEvent::PeerGone { peer, remaining } => {
                self.board.forget_peer(&peer);
                self.counters.peers = remaining;
                self.metrics.network.set_connected_peers(remaining);
                if self.settings.mode() == AveragingMode::Sgp {
                    // What was in flight to it is lost, as a share to a crashed peer is.
                    self.record_share(peer, false, Duration::ZERO);
                }
            }
            EngineEvent::Drift(drift) => {
                self.metrics.averaging.set_consensus_drift(drift);
                self.counters.drift = Some(drift);
            }
            EngineEvent::NonFiniteContribution { round } => {
                tracing::warn!(
                    round,
                    "this peer's update held NaN or infinity; it takes the group's average instead"
                );
            }
            EngineEvent::CaughtUp { from, to } => {
                tracing::info!(from, to, "behind the swarm's round number: catching up");
            }
        }
    }

    fn record_round(&mut self, report: &RoundReport<PeerId>) {
        let outcome = match report.outcome() {
            "complete" => RoundOutcome::Complete,
            "partial" => RoundOutcome::Partial,
            _ => RoundOutcome::Failed,
        };
        let summary = RoundSummary {
            mode: self.settings.mode(),
            outcome,
            duration: report.finished_after,
            coverage: report.coverage,
            group_size: u32::try_from(report.group_size).unwrap_or(u32::MAX),
            out_peer: None,
            stragglers_dropped: report.stragglers_dropped,
            parts_timed_out: report.parts_timed_out,
        };
        self.metrics.averaging.record_round(&summary);
        self.metrics
            .averaging
            .count_defences(report.weights_capped, report.contributions_rejected);
        self.metrics
            .averaging
            .set_feedback_carried(summary.mode, report.feedback_carried);
        self.board.record_round(&summary);
        self.counters.rounds += 1;
        self.progress.round(report);
    }

    /// The eval losses a summary reports.
    pub(crate) fn eval_losses(&self) -> EvalLosses {
        EvalLosses {
            initial: self.initial_eval_loss,
            last: self.last_eval_loss,
            floor: self.loss_floor,
        }
    }

    /// Refreshes the state served to joiners every [`STATE_EVERY`] local steps, or less
    /// often when encoding it takes long (see `StateCell::refresh_due`), and at the next
    /// step when a refresh found the optimizer's state held (a checkpoint being written);
    /// starts a checkpoint after every `checkpoint.every_steps`, written beside training
    /// (see [`checkpointing`]). A failure is logged, not fatal (training goes on; the next
    /// one may succeed).
    pub(crate) fn maybe_checkpoint(&mut self, params: &[f32]) {
        let refresh_turn = self.counters.step.is_multiple_of(STATE_EVERY) || self.state_skipped;
        let by_rounds = self.settings.mode() == AveragingMode::Butterfly;
        if refresh_turn && !by_rounds && self.state.refresh_due() {
            let published = self.publish_state(params);
            self.state_skipped = published.is_none();
            match published {
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(
                        error = crate::error_text::describe(&e),
                        "state snapshot not refreshed"
                    );
                }
                None => tracing::debug!(
                    "state snapshot not refreshed: the optimizer's state is held; next step"
                ),
            }
        }
        let every = self.settings.checkpoint_every;
        if every > 0 && self.counters.step.is_multiple_of(every) {
            let (target, meta) = (self.checkpoint_target(), self.state_meta());
            self.checkpoints.start(&target, meta, params);
        }
    }

    /// Butterfly: serves the state the update of a round left (`params`, after
    /// `optimizer_steps` optimizer steps, at the schedule's `step`) when the members'
    /// [`RoundCadence`] has it due, so that every member of the round serves the same
    /// bytes. Its counters are the round's, not this member's own: `step` and as many
    /// batches of samples.
    pub(crate) fn publish_round(&mut self, params: &[f32], step: u64, optimizer_steps: u64) {
        if !self.round_cadence.due(optimizer_steps) {
            return;
        }
        let fresh = self
            .optimizer
            .try_lock()
            .is_ok_and(|shared| shared.steps_taken == optimizer_steps);
        if !fresh {
            // A checkpoint being written holds the optimizer's state.
            tracing::debug!(
                optimizer_steps,
                "state snapshot not refreshed: the optimizer's state is held"
            );
            return;
        }
        let meta = StateMeta {
            step,
            samples: step.saturating_mul(self.settings.task.data.batch_size as u64),
            ..self.state_meta()
        };
        match try_with_state_view(&meta, params, &self.optimizer, |view| {
            self.state.publish(view)
        }) {
            Some(Ok(took)) => {
                let now = std::time::Instant::now();
                self.round_cadence.published(optimizer_steps, now, took);
            }
            Some(Err(e)) => tracing::warn!(
                error = crate::error_text::describe(&e),
                "state snapshot not refreshed"
            ),
            None => tracing::debug!("state snapshot not refreshed: the optimizer's state is held"),
        }
    }

    /// Serves the state at `params` to joiners from now on, encoded from the trainer's
    /// vectors without a copy of them; `None`, and nothing done, while a checkpoint holds the
    /// optimizer's state (the refresh stays due, and is tried again at the next step): the
    /// run loop does not wait seconds for a large write to end.
    fn publish_state(&self, params: &[f32]) -> Option<anyhow::Result<Duration>> {
        try_with_state_view(&self.state_meta(), params, &self.optimizer, |view| {
            self.state.publish(view)
        })
    }

    /// Loads optimizer state found at start (checkpoint or download) into the trainer.
    pub(crate) async fn load_pending_optimizer(&mut self) {
        let Some(state) = self.pending_optimizer.take() else {
            return;
        };
        let steps = state.steps_taken;
        if let Err(e) = self.worker.submit(Job::LoadOptimizer(state)) {
            tracing::warn!(
                error = crate::error_text::describe(&e),
                "optimizer state not loaded"
            );
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
                    error = crate::error_text::describe(&e),
                    "optimizer state not loaded; starting it fresh"
                );
            }
            _ => tracing::warn!("the trainer did not load the optimizer state; starting it fresh"),
        }
    }

    /// Writes the current state into the checkpoint folder (atomically; beyond the newest
    /// `checkpoint.keep` valid ones, older files are removed and corrupt ones moved aside).
    pub(crate) fn write_checkpoint(&mut self, params: &[f32]) -> anyhow::Result<()> {
        self.checkpoints.wait();
        checkpointing::write(&self.checkpoint_target(), &self.state_meta(), params)
    }

    /// Where checkpoints go, and what counts them.
    fn checkpoint_target(&self) -> CheckpointTarget {
        CheckpointTarget {
            dir: self.settings.checkpoint_dir.clone(),
            keep: self.settings.checkpoint_keep,
            optimizer: Arc::clone(&self.optimizer),
            metrics: self.metrics.clone(),
        }
    }

    /// What a snapshot of the state now says besides its tensors.
    fn state_meta(&self) -> StateMeta {
        StateMeta {
            step: self.counters.step,
            samples: self.counters.samples,
            swarm_id: self.settings.swarm_id.clone(),
            model_fingerprint: self.model_fingerprint,
        }
    }

    /// Logs and counts corrupt checkpoint files that were moved aside.
    pub(crate) fn report_set_aside(&self, files: &[SetAside]) {
        checkpointing::report_set_aside(&self.metrics, files);
    }
}

/// Local steps between refreshes of the state served to joiners.
const STATE_EVERY: u64 = 10;

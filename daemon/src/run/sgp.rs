//! `averaging.mode = "sgp"`: Stochastic Gradient Push over the network.
//!
//! The loop owns the [`SgpPeer`] state machine. A step runs on the trainer thread at the
//! de-biased parameters `z = x / w`; its update `Δz` comes back and is added to the
//! numerator as `w·Δz`, so that `z` moves by exactly the optimizer's step even when shares
//! arrived (and changed `w`) while the step was computing. Shares go out through the
//! outbox, whose reports confirm them or hand their mass back; shares that arrive are
//! folded in at once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use murmur_gossip::net::NetEvent;
use murmur_gossip::net::exchange::{Delivery, Parcel, SendReport};
use murmur_gossip::sgp::{SgpError, SgpInput, SgpOutput, SgpPeer, ShareHeader};
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::{PushSumShare, ShareRefused};
use tokio::sync::broadcast::error::RecvError;

use super::Finish;
use super::peer::{Peer, Request};
use super::worker::{Done, Job};
use crate::observe::Refusal;

/// How long a leaving peer may take to hand off its mass.
const LEAVE_BOUND: Duration = Duration::from_secs(4);
/// The outbox tag of refusal notices; shares are tagged with their sequence numbers, which
/// never reach it.
const REFUSAL_TAG: u64 = u64::MAX;

/// Runs SGP from `params` (a founder's parameters) or as a joiner (`None`) until the step
/// budget is spent or a stop is requested; returns the final de-biased parameters.
pub(crate) async fn run(
    peer: &mut Peer,
    params: Option<Vec<f32>>,
    len: usize,
    step_offset: u64,
) -> anyhow::Result<(Vec<f32>, Finish)> {
    let members: Vec<PeerId> = peer.peers.keys().copied().collect();
    let config = peer.settings.sgp.clone();
    let mut machine = match params {
        Some(params) => SgpPeer::new(peer.me, members, params, config),
        None => SgpPeer::joining(peer.me, members, len, config),
    }
    .context("cannot start SGP")?;
    let mut sgp = SgpLoop {
        len,
        z: vec![0.0; len],
        z_before: vec![0.0; len],
        step_offset,
        finish: None,
        leave_deadline: None,
        pending_step: None,
        final_eval_asked: false,
        sent_at: HashMap::new(),
    };
    loop {
        sgp.drain(peer, &mut machine)?;
        if machine.has_departed() {
            break;
        }
        if sgp
            .leave_deadline
            .is_some_and(|d| tokio::time::Instant::now() >= d)
        {
            tracing::warn!("hand-off not confirmed in time; leaving anyway");
            break;
        }
        let timer = machine
            .poll_timeout()
            .map(|t| peer.instant_of(t))
            .or(sgp.leave_deadline)
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        let maintenance = peer.next_maintenance();
        tokio::select! {
            Some(delivery) = peer.mailbox.recv() => sgp.on_delivery(peer, &mut machine, delivery),
            Some(report) = peer.outbox.next_report() => sgp.on_report(peer, &mut machine, report)?,
            Some(done) = peer.worker.done.recv() => {
                peer.worker.finished();
                sgp.on_done(peer, &mut machine, done?)?;
            }
            event = peer.events.recv() => match event {
                Ok(event) => sgp.on_event(peer, &mut machine, &event)?,
                Err(RecvError::Lagged(n)) => tracing::warn!(missed = n, "membership events lost"),
                Err(RecvError::Closed) => anyhow::bail!("the network layer stopped"),
            },
            () = tokio::time::sleep_until(timer) => {
                let now = peer.now();
                machine.handle(now, SgpInput::Tick)?;
            }
            () = tokio::time::sleep_until(maintenance) => {
                peer.heartbeat_step = step_offset + machine.steps_done();
                for silent in peer.maintain() {
                    // Its mass in flight is lost, as with a crash seen by the network.
                    peer.record_share(silent, false, Duration::ZERO);
                    let now = peer.now();
                    machine.handle(now, SgpInput::PeerCrashed(silent))?;
                }
                peer.counters.rounds = machine.stats().shares_sent;
                peer.counters.shares_received = machine.stats().shares_received;
                peer.metrics.averaging.set_push_sum_weight(machine.state().weight());
                peer.report_progress();
                // A resume through the status API starts the step the pause held back.
                if !peer.is_paused() && sgp.finish.is_none() && !peer.worker.is_busy()
                    && let Some(step) = sgp.pending_step.take()
                {
                    sgp.start_step(peer, &mut machine, step)?;
                }
            }
            request = peer.signals.next() => sgp.on_request(peer, &mut machine, request)?,
        }
    }
    // A peer that left early (a signal) reports the parameters it had.
    machine.debiased_into(&mut sgp.z).ok();
    let finish = sgp.finish.unwrap_or(Finish::Signal);
    Ok((sgp.z, finish))
}

struct SgpLoop {
    /// Parameters in the model.
    len: usize,
    /// `z = x / w`; handed to the trainer during a step (empty meanwhile).
    z: Vec<f32>,
    z_before: Vec<f32>,
    step_offset: u64,
    finish: Option<Finish>,
    leave_deadline: Option<tokio::time::Instant>,
    /// A step the machine allowed while the peer was paused.
    pending_step: Option<u64>,
    final_eval_asked: bool,
    /// When each share in the outbox was handed to it, by sequence number.
    sent_at: HashMap<u64, Instant>,
}

impl SgpLoop {
    /// Acts on every output the machine has queued.
    fn drain(&mut self, peer: &mut Peer, machine: &mut SgpPeer<PeerId>) -> anyhow::Result<()> {
        while let Some(output) = machine.poll_output() {
            match output {
                SgpOutput::SendShare {
                    to,
                    header,
                    payload,
                } => self.send_share(peer, machine, to, header, payload)?,
                SgpOutput::StartStep { step } => {
                    if peer.is_paused() || self.finish.is_some() {
                        self.pending_step = Some(step);
                    } else {
                        self.start_step(peer, machine, step)?;
                    }
                }
                SgpOutput::Departed => {}
            }
        }
        Ok(())
    }

    fn send_share(
        &mut self,
        peer: &mut Peer,
        machine: &mut SgpPeer<PeerId>,
        to: PeerId,
        header: ShareHeader,
        payload: Vec<u8>,
    ) -> anyhow::Result<()> {
        let elements = u32::try_from(self.len).context("model too large for one share")?;
        peer.counters.raw_bytes += self.len as u64 * 4;
        let parcel = Parcel::Share(header.to_wire(elements), payload);
        self.sent_at.insert(header.seq, Instant::now());
        if let Err(parcel) = peer.outbox.send(to, header.seq, parcel) {
            self.sent_at.remove(&header.seq);
            // The destination's queue is full: the share never left, so take it back.
            let now = peer.now();
            let payload = parcel.into_payload();
            machine.handle(
                now,
                SgpInput::ShareReturned {
                    to,
                    header,
                    payload: &payload,
                    receiver_gone: false,
                },
            )?;
            machine.recycle(payload);
        }
        Ok(())
    }

    fn start_step(
        &mut self,
        peer: &mut Peer,
        machine: &mut SgpPeer<PeerId>,
        step: u64,
    ) -> anyhow::Result<()> {
        machine.debiased_into(&mut self.z)?;
        self.z_before.copy_from_slice(&self.z);
        let local = step + 1;
        let batch = peer.settings.task.data.batch_size as u64;
        let job = Job::Step {
            params: std::mem::take(&mut self.z),
            step: self.step_offset + step,
            swarm_batch: batch * (peer.peers.len() as u64 + 1),
            eval: peer.settings.eval_due(local),
        };
        peer.worker.submit(job)
    }

    fn on_done(
        &mut self,
        peer: &mut Peer,
        machine: &mut SgpPeer<PeerId>,
        done: Done,
    ) -> anyhow::Result<()> {
        match done {
            Done::Step {
                params,
                loss,
                samples,
                eval_loss,
                compute,
                learning_rate,
            } => {
                peer.learning_rate = learning_rate;
                self.z = params;
                let weight = machine.state().weight() as f32;
                if let Some(x) = machine.numerator_mut() {
                    for ((x, &after), &before) in x.iter_mut().zip(&self.z).zip(&self.z_before) {
                        *x += weight * (after - before);
                    }
                }
                peer.count_step(samples, loss, compute);
                peer.maybe_checkpoint(&self.z);
                let now = peer.now();
                machine.handle(now, SgpInput::LocalStepDone)?;
                if let Some(eval_loss) = eval_loss {
                    let step = peer.counters.step;
                    peer.record_eval(step, eval_loss);
                }
                peer.report_progress();
                let budget = peer.settings.steps;
                if budget > 0 && peer.counters.step >= budget {
                    self.finish.get_or_insert(Finish::Finished);
                }
                if self.finish.is_some() {
                    self.final_eval(peer, machine)?;
                }
            }
            Done::Eval { params, loss } => {
                self.z = params;
                peer.last_eval_loss = loss;
                self.leave(peer, machine)?;
            }
            other => anyhow::bail!("the trainer answered {other:?} to an SGP job"),
        }
        Ok(())
    }

    /// Stops training: a final eval of `z`, then the hand-off.
    fn begin_finish(
        &mut self,
        peer: &mut Peer,
        machine: &mut SgpPeer<PeerId>,
        why: Finish,
    ) -> anyhow::Result<()> {
        if self.finish.is_some() {
            return Ok(());
        }
        self.finish = Some(why);
        if peer.worker.is_busy() {
            // The step in flight finishes first; the final eval follows it.
            return Ok(());
        }
        self.final_eval(peer, machine)
    }

    /// Evaluates `z` one last time; the hand-off follows the answer.
    fn final_eval(&mut self, peer: &mut Peer, machine: &mut SgpPeer<PeerId>) -> anyhow::Result<()> {
        if self.final_eval_asked {
            return Ok(());
        }
        self.final_eval_asked = true;
        machine.debiased_into(&mut self.z)?;
        let params = std::mem::take(&mut self.z);
        peer.worker.submit(Job::Eval { params })
    }

    /// Hands all mass to a neighbour; the loop ends at `Departed` (or the bound).
    fn leave(&mut self, peer: &mut Peer, machine: &mut SgpPeer<PeerId>) -> anyhow::Result<()> {
        let now = peer.now();
        machine.handle(now, SgpInput::Leave)?;
        self.leave_deadline = Some(tokio::time::Instant::now() + LEAVE_BOUND);
        Ok(())
    }

    fn on_delivery(&mut self, peer: &mut Peer, machine: &mut SgpPeer<PeerId>, d: Delivery) {
        peer.record_parcel(false, &d.parcel);
        let Delivery { from, parcel } = d;
        match parcel {
            Parcel::Share(share, payload) => {
                if share.chunk_count != 1 || share.elements as usize != self.len {
                    tracing::warn!(peer = %from, "share of the wrong shape dropped");
                } else {
                    let header = ShareHeader::from_wire(&share, 0);
                    if header.reference.is_none() && share.weight > 0.0 {
                        drift_against(peer, machine, &payload, share.weight);
                    }
                    let now = peer.now();
                    let input = SgpInput::ShareReceived {
                        from,
                        header,
                        payload: &payload,
                    };
                    if let Err(e) = machine.handle(now, input) {
                        refuse_share(peer, from, &share, &e);
                    }
                }
                peer.mailbox.recycle(payload);
            }
            Parcel::ShareRefused(refused) => {
                let now = peer.now();
                let input = SgpInput::ShareRefused {
                    by: from,
                    step: refused.step,
                };
                let fate = match machine.handle(now, input) {
                    Ok(()) => {
                        tracing::info!(peer = %from, step = refused.step, "a refused share taken back");
                        Refusal::TakenBack
                    }
                    Err(e) => {
                        tracing::warn!(peer = %from, error = %e, "a refused share's mass is lost");
                        Refusal::Lost
                    }
                };
                peer.metrics.averaging.count_refusal(fate);
            }
            other => {
                tracing::debug!(peer = %from, "ignoring a non-SGP message in SGP mode");
                peer.mailbox.recycle(other.into_payload());
            }
        }
    }

    fn on_report(
        &mut self,
        peer: &mut Peer,
        machine: &mut SgpPeer<PeerId>,
        report: SendReport,
    ) -> anyhow::Result<()> {
        let now = peer.now();
        if report.result.is_ok() {
            peer.record_parcel(true, &report.parcel);
        }
        let SendReport {
            to,
            tag,
            parcel,
            result,
        } = report;
        let Parcel::Share(share, payload) = parcel else {
            return Ok(());
        };
        let took = self
            .sent_at
            .remove(&tag)
            .map_or(Duration::ZERO, |at| at.elapsed());
        peer.record_share(to, result.is_ok(), took);
        match result {
            Ok(()) => machine.handle(now, SgpInput::ShareDelivered { to, seq: tag })?,
            Err(e) => {
                tracing::debug!(peer = %to, error = %e, "share not delivered; taking it back");
                let header = ShareHeader::from_wire(&share, tag);
                let taken_back = machine.handle(
                    now,
                    SgpInput::ShareReturned {
                        to,
                        header,
                        payload: &payload,
                        // A failed stream is not a departed peer: the network says when
                        // its last connection closes (PeerDisconnected).
                        receiver_gone: !peer.peers.contains_key(&to),
                    },
                );
                // A quantized share whose edge was forgotten meanwhile (its receiver was
                // given up as crashed) cannot be taken back: its mass is lost, as the mass
                // in flight to any crashed peer is, and training goes on.
                if let Err(e) = taken_back {
                    tracing::warn!(peer = %to, error = %e, "a returned share's mass is lost");
                }
            }
        }
        machine.recycle(payload);
        Ok(())
    }

    fn on_event(
        &mut self,
        peer: &mut Peer,
        machine: &mut SgpPeer<PeerId>,
        event: &NetEvent,
    ) -> anyhow::Result<()> {
        let returned = peer.note_event(event);
        let now = peer.now();
        if let Some(back) = returned {
            machine.handle(now, SgpInput::PeerJoined(back))?;
        }
        match event {
            NetEvent::PeerAuthorized { peer: other, .. } => {
                machine.handle(now, SgpInput::PeerJoined(*other))?;
            }
            NetEvent::PeerDisconnected { peer: other }
            | NetEvent::PeerRejected { peer: other, .. } => {
                machine.handle(now, SgpInput::PeerCrashed(*other))?;
            }
            NetEvent::Heartbeat { .. } => {}
        }
        Ok(())
    }

    fn on_request(
        &mut self,
        peer: &mut Peer,
        machine: &mut SgpPeer<PeerId>,
        request: Request,
    ) -> anyhow::Result<()> {
        match request {
            Request::Stop => {
                tracing::info!("stop requested: handing off and leaving");
                self.begin_finish(peer, machine, Finish::Signal)
            }
            Request::Pause => {
                tracing::info!("paused: sharing goes on, training stops");
                peer.set_paused(true);
                Ok(())
            }
            Request::Resume => {
                tracing::info!("resumed");
                peer.set_paused(false);
                match self.pending_step.take() {
                    Some(step) if self.finish.is_none() => self.start_step(peer, machine, step),
                    _ => Ok(()),
                }
            }
        }
    }
}

/// Logs a share the machine would not take, and tells its sender when the sender can take it
/// back: a quantized share built on a reference this peer does not hold (it restarted since
/// the sender's last share, or dropped that edge). Its sender then takes the mass back and
/// sends exactly next time, instead of losing half its mass on every share until the
/// membership layer notices the restart.
fn refuse_share(peer: &mut Peer, from: PeerId, share: &PushSumShare<'_>, error: &SgpError) {
    tracing::warn!(peer = %from, error = %error, "share refused");
    let &SgpError::StaleReference {
        version: reference_step,
    } = error
    else {
        return;
    };
    peer.metrics.averaging.count_refusal(Refusal::Refused);
    let notice = Parcel::ShareRefused(ShareRefused {
        step: share.step,
        reference_step,
    });
    if peer.outbox.send(from, REFUSAL_TAG, notice).is_err() {
        tracing::warn!(peer = %from, "the outbox is full: a refused share's sender was not told");
    }
}

/// Sets the consensus-drift gauge and progress counter from an exact (`f32`) share: the
/// relative distance between this peer's `z = x / w` and its sender's, `share / weight`.
/// Quantized shares carry a deviation from a reference instead, and are not used.
fn drift_against(peer: &mut Peer, machine: &SgpPeer<PeerId>, payload: &[u8], weight: f64) {
    let state = machine.state();
    if state.weight() <= 0.0 || payload.len() != state.numerator().len() * 4 {
        return;
    }
    let (mine, theirs) = (1.0 / state.weight(), 1.0 / weight);
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&x, bytes) in state.numerator().iter().zip(payload.chunks_exact(4)) {
        let other =
            f64::from(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])) * theirs;
        diff += (f64::from(x) * mine - other).powi(2);
        norm += other * other;
    }
    if norm > 0.0 {
        let drift = (diff / norm).sqrt();
        peer.metrics.averaging.set_consensus_drift(drift);
        peer.counters.drift = Some(drift);
    }
}

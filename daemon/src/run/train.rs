//! The training loop: the trainer thread does the averaging engine's work, and the daemon
//! counts, evaluates, checkpoints and reports. The engine, behind its driver, does every
//! averaging decision; a gradient passes through here once on its way to the engine (the
//! trainer's answer) and once on its way back (the engine's `Apply`).

use std::time::Duration;

use anyhow::Context as _;
use murmur_gossip::engine::{Work, WorkDone};
use murmur_gossip::net::NetEvent;
use murmur_gossip::net::driver::{DriverExit, EngineHandle, FromEngine};
use murmur_protocol::message::AveragingMode;
use tokio::sync::broadcast;

use super::Finish;
use super::meet::note_for_status;
use super::peer::{Peer, Request};
use super::worker::{Done, Job};

/// How often progress lines and gauges are refreshed.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// What the loop holds between its wake-ups.
#[derive(Debug, Default)]
struct Loop {
    /// Work the engine gave while training was paused.
    held: Option<Work>,
    /// An eval is due at the next update of the parameters.
    eval_pending: bool,
    /// The schedule's step of the update the trainer is applying.
    applying_step: u64,
    final_params: Option<Vec<f32>>,
    finish: Option<Finish>,
}

/// Runs until the engine departs (the step budget was spent, or a stop was asked);
/// returns the final parameters and why training ended.
pub(crate) async fn train(
    peer: &mut Peer,
    handle: &mut EngineHandle,
    events: &mut broadcast::Receiver<NetEvent>,
) -> anyhow::Result<(Option<Vec<f32>>, Finish)> {
    let mut state = Loop::default();
    let mut paused = peer.board.paused_watch();
    let mut report = tokio::time::interval(REPORT_EVERY);
    report.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let busy = peer.worker.is_busy();
        tokio::select! {
            message = handle.next() => match message {
                Some(FromEngine::Work(work)) => {
                    if peer.is_paused() && state.finish.is_none() {
                        state.held = Some(work);
                    } else {
                        submit(peer, &mut state, work)?;
                    }
                }
                Some(FromEngine::Event(event)) => peer.record_event(event),
                Some(FromEngine::Finished(params)) => state.final_params = Some(params),
                None => break,
            },
            done = peer.worker.done.recv(), if busy => {
                peer.worker.finished();
                let done = done.context("the trainer thread stopped")??;
                let Done::Engine { done, loss, eval_loss, learning_rate, optimizer_steps } = done
                else {
                    anyhow::bail!("the trainer answered engine work with something else");
                };
                let answer = Answer { loss, eval_loss, learning_rate, optimizer_steps };
                account(peer, &mut state, &done, answer);
                // The budget is checked before the answer goes back, so that the engine
                // knows to stop before it asks for another step.
                let budget = peer.settings.steps;
                if budget > 0 && peer.counters.step >= budget && state.finish.is_none() {
                    state.finish = Some(Finish::Finished);
                    handle.finish().await;
                }
                handle.work_done(done).await?;
            }
            request = peer.signals.next() => match request {
                Request::Stop => {
                    if state.finish.is_none() {
                        if peer.settings.mode() == AveragingMode::Sgp {
                            tracing::info!("stop requested: handing off and leaving");
                        } else {
                            tracing::info!("stop requested: finishing the round and leaving");
                        }
                        state.finish = Some(Finish::Signal);
                        handle.finish().await;
                    }
                    // Held work must be answered for the engine to finish.
                    if let Some(work) = state.held.take() {
                        submit(peer, &mut state, work)?;
                    }
                }
                Request::Pause => peer.set_paused(true),
                Request::Resume => peer.set_paused(false),
            },
            Ok(()) = paused.changed() => {}
            event = events.recv() => {
                if let Ok(event) = event {
                    note_for_status(peer, &event);
                }
            }
            _ = report.tick() => {
                let status = handle.status();
                if let Some(weight) = status.push_sum_weight {
                    peer.metrics.averaging.set_push_sum_weight(weight);
                    peer.counters.rounds = status.shares_sent;
                    peer.counters.shares_received = status.shares_received;
                    peer.counters.edges_started = status.edges_started;
                    peer.counters.push_sum_weight = Some(weight);
                }
                peer.report_progress(status.peers);
            }
        }
        // A resume (SIGUSR2 or the status API) starts the work the pause held back.
        if !peer.is_paused()
            && !peer.worker.is_busy()
            && let Some(work) = state.held.take()
        {
            submit(peer, &mut state, work)?;
        }
    }
    match handle.stopped().await {
        Ok(DriverExit::Departed) => {}
        Ok(DriverExit::LeaveTimedOut) => {
            tracing::warn!("the averaging engine did not finish its hand-off in time");
        }
        Err(e) => return Err(e).context("the averaging engine stopped"),
    }
    Ok((state.final_params, state.finish.unwrap_or(Finish::Signal)))
}

/// Hands the engine's work to the trainer, asking for an eval where one is due.
fn submit(peer: &mut Peer, state: &mut Loop, work: Work) -> anyhow::Result<()> {
    let eval = match &work {
        Work::Step { .. } => peer.settings.eval_due(peer.counters.step + 1),
        Work::Apply { step, .. } => {
            state.applying_step = *step;
            std::mem::take(&mut state.eval_pending)
        }
        Work::Gradient { .. } => false,
    };
    peer.worker.submit(Job::Engine { work, eval })
}

/// What the trainer reported with its answer to engine work.
struct Answer {
    loss: Option<f32>,
    eval_loss: Option<f32>,
    learning_rate: Option<f32>,
    optimizer_steps: Option<u64>,
}

/// Counts a finished step, records its losses, checkpoints on schedule, and (butterfly)
/// publishes the state a round's update left.
fn account(peer: &mut Peer, state: &mut Loop, done: &WorkDone, answer: Answer) {
    let Answer {
        loss,
        eval_loss,
        learning_rate,
        optimizer_steps,
    } = answer;
    if let Some(lr) = learning_rate {
        peer.learning_rate = lr;
    }
    match done {
        WorkDone::Stepped {
            params,
            samples,
            took,
            ..
        }
        | WorkDone::Gradient {
            params,
            samples,
            took,
            ..
        } => {
            peer.count_step(*samples, loss.unwrap_or(f32::NAN), *took);
            if matches!(done, WorkDone::Gradient { .. })
                && peer.settings.eval_due(peer.counters.step)
            {
                // Gradients leave the parameters as they were: evaluate after the update.
                state.eval_pending = true;
            }
            peer.maybe_checkpoint(params);
        }
        WorkDone::Applied { params, .. } => {
            if let Some(steps) = optimizer_steps
                && peer.settings.mode() == AveragingMode::Butterfly
            {
                peer.publish_round(params, state.applying_step, steps);
            }
        }
    }
    if let Some(loss) = eval_loss {
        let step = peer.counters.step;
        peer.record_eval(step, loss);
    }
}

/// Evaluates `params` on the trainer thread.
pub(crate) async fn evaluate(peer: &mut Peer, params: Vec<f32>) -> anyhow::Result<(Vec<f32>, f32)> {
    peer.worker.submit(Job::Eval { params })?;
    let done = peer
        .worker
        .done
        .recv()
        .await
        .context("the trainer thread stopped")??;
    peer.worker.finished();
    match done {
        Done::Eval { params, loss } => Ok((params, loss)),
        other => anyhow::bail!("the trainer answered an eval with {other:?}"),
    }
}

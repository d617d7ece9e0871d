//! The modes that average in rounds: `butterfly` (gradients, once the swarm has gathered
//! `target_batch` samples), `sync-ring` (gradients, every step; the baseline) and
//! `local-sgd` (parameters, every H local steps, with an outer Nesterov step).
//!
//! Every member of a round is the peer table at the round's start; members agree on the
//! round by its number, which is the optimizer step (butterfly, sync-ring) or the outer
//! step (local-sgd), learned from heartbeats by a peer that joins.

use std::time::Duration;

use anyhow::Context as _;
use murmur_protocol::message::AveragingMode;
use tokio::sync::broadcast::error::RecvError;

use super::Finish;
use super::collective::{self, Collective, Early, RoundOutcome};
use super::peer::{Peer, Request};
use super::worker::{Done, Job};

/// The state of a round-based run.
struct Rounds {
    params: Vec<f32>,
    grad: Vec<f32>,
    /// `Σ samples · gradient` since the last round (butterfly).
    accumulated: Vec<f32>,
    samples: u64,
    /// Rounds completed: the optimizer step (outer step for local-sgd).
    round: u64,
    /// Local SGD: parameters at the start of the outer step, and the outer momentum.
    anchor: Vec<f32>,
    velocity: Vec<f32>,
    early: Early,
    stop: bool,
}

/// Runs a round-based mode from `params` until the step budget is spent or a stop.
pub(crate) async fn run(
    peer: &mut Peer,
    params: Vec<f32>,
    start_round: u64,
) -> anyhow::Result<(Vec<f32>, Finish)> {
    let len = params.len();
    let local_sgd = peer.mode == AveragingMode::LocalSgd;
    let mut state = Rounds {
        anchor: if local_sgd {
            params.clone()
        } else {
            Vec::new()
        },
        velocity: if local_sgd {
            vec![0.0; len]
        } else {
            Vec::new()
        },
        params,
        grad: vec![0.0; len],
        accumulated: vec![0.0; len],
        samples: 0,
        round: start_round,
        early: Early::default(),
        stop: false,
    };
    let budget = peer.settings.steps;
    loop {
        if state.stop {
            return Ok((state.params, Finish::Signal));
        }
        if budget > 0 && peer.counters.step >= budget {
            let loss = evaluate(peer, &mut state).await?;
            peer.last_eval_loss = loss;
            return Ok((state.params, Finish::Finished));
        }
        if peer.is_paused() {
            idle(peer, &mut state, Duration::from_millis(200)).await?;
            continue;
        }
        match peer.mode {
            AveragingMode::LocalSgd => local_sgd_step(peer, &mut state).await?,
            _ => gradient_step(peer, &mut state).await?,
        }
    }
}

/// Butterfly and sync-ring: one local gradient, then (when due) a round and an update.
async fn gradient_step(peer: &mut Peer, state: &mut Rounds) -> anyhow::Result<()> {
    let params = std::mem::take(&mut state.params);
    let grad = std::mem::take(&mut state.grad);
    let Done::Gradient {
        params,
        grad,
        loss,
        samples,
        compute,
    } = work(peer, state, Job::Gradient { params, grad }).await?
    else {
        anyhow::bail!("the trainer answered a gradient job with something else");
    };
    state.params = params;
    state.grad = grad;
    peer.count_step(samples, loss, compute);
    peer.maybe_checkpoint(&state.params);
    let weight = samples as f32;
    for (a, &g) in state.accumulated.iter_mut().zip(&state.grad) {
        *a += weight * g;
    }
    state.samples += samples;
    peer.announce(state.round, state.samples);
    peer.report_progress();

    let due = match peer.mode {
        AveragingMode::SyncRing => true,
        _ => swarm_samples(peer, state) >= peer.settings.target_batch,
    };
    if !due {
        return maybe_eval(peer, state).await;
    }
    let scale = 1.0 / state.samples.max(1) as f32;
    let mut mean = std::mem::take(&mut state.accumulated);
    mean.iter_mut().for_each(|g| *g *= scale);
    let kind = if peer.mode == AveragingMode::SyncRing {
        Collective::Ring
    } else {
        Collective::Butterfly
    };
    let weight = state.samples as f32;
    let outcome = round(peer, state, kind, mean, weight).await?;
    let swarm_batch = peer.settings.task.data.batch_size as u64 * outcome.group as u64;
    let eval = peer.settings.eval_due(peer.counters.step);
    let job = Job::Apply {
        params: std::mem::take(&mut state.params),
        grad: outcome.values,
        step: state.round,
        swarm_batch,
        eval,
    };
    let Done::Applied {
        params,
        mut grad,
        eval_loss,
        learning_rate,
    } = work(peer, state, job).await?
    else {
        anyhow::bail!("the trainer answered an update with something else");
    };
    state.params = params;
    peer.learning_rate = learning_rate;
    grad.fill(0.0);
    state.accumulated = grad;
    state.samples = 0;
    state.round += 1;
    if let Some(loss) = eval_loss {
        let step = peer.counters.step;
        peer.record_eval(step, loss);
    }
    Ok(())
}

/// Local SGD: a local step; every H steps, average the parameters and take the outer step.
async fn local_sgd_step(peer: &mut Peer, state: &mut Rounds) -> anyhow::Result<()> {
    let eval = peer.settings.eval_due(peer.counters.step + 1);
    let job = Job::Step {
        params: std::mem::take(&mut state.params),
        step: peer.counters.step,
        swarm_batch: peer.settings.task.data.batch_size as u64 * (peer.peers.len() as u64 + 1),
        eval,
    };
    let Done::Step {
        params,
        loss,
        samples,
        eval_loss,
        compute,
        learning_rate,
    } = work(peer, state, job).await?
    else {
        anyhow::bail!("the trainer answered a step with something else");
    };
    state.params = params;
    peer.learning_rate = learning_rate;
    peer.count_step(samples, loss, compute);
    peer.maybe_checkpoint(&state.params);
    state.samples += samples;
    if let Some(loss) = eval_loss {
        let step = peer.counters.step;
        peer.record_eval(step, loss);
    }
    peer.announce(state.round, state.samples);
    peer.report_progress();
    let h = peer.settings.local_sgd.local_steps.max(1);
    if !peer.counters.step.is_multiple_of(h) {
        return Ok(());
    }
    let local = state.params.clone();
    let weight = state.samples as f32;
    let outcome = round(peer, state, Collective::Butterfly, local, weight).await?;
    // Outer Nesterov step on the pseudo-gradient Δ = anchor − average (DiLoCo).
    let lr = peer.settings.local_sgd.outer_lr;
    let mu = peer.settings.local_sgd.outer_momentum;
    for (((anchor, v), p), &avg) in state
        .anchor
        .iter_mut()
        .zip(&mut state.velocity)
        .zip(&mut state.params)
        .zip(&outcome.values)
    {
        let delta = *anchor - avg;
        *v = mu * *v + delta;
        *anchor -= lr * (delta + mu * *v);
        *p = *anchor;
    }
    state.samples = 0;
    state.round += 1;
    Ok(())
}

/// Runs one round among the current peers and reports it.
async fn round(
    peer: &mut Peer,
    state: &mut Rounds,
    kind: Collective,
    local: Vec<f32>,
    weight: f32,
) -> anyhow::Result<RoundOutcome> {
    // Peers cut off from the rest (a network partition) go on counting rounds on their own
    // and may come back behind the others' number. Chunks of a round nobody else runs only
    // time out, round after round, so a peer behind catches up with the highest round its
    // peers' heartbeats announce (which, a round being a barrier, they reached without it).
    let swarm_round = peer.swarm_step();
    if swarm_round > state.round {
        tracing::info!(
            from = state.round,
            to = swarm_round,
            "behind the swarm's round number: catching up"
        );
        state.round = swarm_round;
    }
    let mut members: Vec<_> = peer.peers.keys().copied().collect();
    members.push(peer.me);
    let outcome = collective::average(
        peer,
        &mut state.early,
        kind,
        state.round,
        members,
        local,
        weight,
    )
    .await?;
    state.stop |= outcome.stop_requested;
    peer.counters.rounds += 1;
    peer.record_round(&outcome);
    peer.progress.round(&outcome);
    Ok(outcome)
}

/// Samples gathered toward the next round, by this peer and (from their heartbeats) by
/// the peers at the same round.
fn swarm_samples(peer: &Peer, state: &Rounds) -> u64 {
    let others: u64 = peer
        .peers
        .values()
        .filter_map(|news| *news)
        .filter(|news| news.last.step == state.round)
        .map(|news| news.last.samples_accumulated)
        .sum();
    state.samples + others
}

async fn maybe_eval(peer: &mut Peer, state: &mut Rounds) -> anyhow::Result<()> {
    if peer.settings.eval_due(peer.counters.step) {
        let loss = evaluate(peer, state).await?;
        let step = peer.counters.step;
        peer.record_eval(step, loss);
    }
    Ok(())
}

async fn evaluate(peer: &mut Peer, state: &mut Rounds) -> anyhow::Result<f32> {
    let params = std::mem::take(&mut state.params);
    let Done::Eval { params, loss } = work(peer, state, Job::Eval { params }).await? else {
        anyhow::bail!("the trainer answered an eval with something else");
    };
    state.params = params;
    Ok(loss)
}

/// Hands `job` to the trainer and waits for it, keeping up with the network meanwhile:
/// chunks of coming rounds are kept, membership and signals are noted.
async fn work(peer: &mut Peer, state: &mut Rounds, job: Job) -> anyhow::Result<Done> {
    peer.worker.submit(job)?;
    loop {
        if let Some(done) = serve(peer, state, true).await {
            peer.worker.finished();
            return done;
        }
    }
}

/// Waits up to `span` while serving the network.
async fn idle(peer: &mut Peer, state: &mut Rounds, span: Duration) -> anyhow::Result<()> {
    let until = tokio::time::Instant::now() + span;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(until) => return Ok(()),
            served = serve(peer, state, false) => {
                if let Some(Err(e)) = served {
                    return Err(e);
                }
            }
        }
    }
}

/// One piece of background work (a delivery, a send report, a membership event, a
/// signal) or, when `trainer` is set, the trainer's answer.
async fn serve(peer: &mut Peer, state: &mut Rounds, trainer: bool) -> Option<anyhow::Result<Done>> {
    let maintenance = peer.next_maintenance();
    tokio::select! {
        done = peer.worker.done.recv(), if trainer => {
            return Some(done.context("the trainer thread stopped").and_then(|d| d));
        }
        Some(d) = peer.mailbox.recv() => state.early.keep(&peer.mailbox, d),
        Some(report) = peer.outbox.next_report() => {
            peer.mailbox.recycle(report.parcel.into_payload());
        }
        event = peer.events.recv() => match event {
            Ok(event) => {
                peer.note_event(&event);
            }
            Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => {
                return Some(Err(anyhow::anyhow!("the network layer stopped")));
            }
        },
        () = tokio::time::sleep_until(maintenance) => {
            peer.maintain();
        }
        request = peer.signals.next() => match request {
            Request::Stop => state.stop = true,
            Request::Pause => peer.set_paused(true),
            Request::Resume => peer.set_paused(false),
        },
    }
    None
}

//! One process of `murmur bench allreduce`: joins the benchmark swarm and averages a known
//! vector round after round, printing one JSON line per round (time, bytes sent, relative
//! error against the exact weighted mean, coverage).
//!
//! Peer `i` contributes `x_i[k] = (i + 1) · sin(0.001·k + i)` with weight `i + 1`, so every
//! peer can compute the exact weighted mean of all `N` peers by itself. It writes its vector
//! into the engine's gradient buffer for every round rather than keeping a copy: what a
//! peer holds is then the engine's memory, which the benchmark reports (`peak_rss_bytes`).
//!
//! The error is measured on a fixed sample of the vector ([`sample`]): the first 64
//! elements of every 4096, a sixty-fourth of it, in runs that span whole codec blocks. Every
//! chunk of every part has elements in it (a chunk is 16 384 elements by default), so a
//! chunk or part left at local values or averaged wrong shows. A full pass after every
//! round would compete for the CPU with peers still in that round and slow the very round
//! it measures; the sample costs a sixty-fourth of that, and its exact mean (in f64) a
//! thirty-second of the vector's f32 bytes in memory. The sample's exact mean is built
//! once, before the network starts (it takes seconds of CPU at the largest sizes, which
//! would keep a one-thread runtime from answering the swarm), and the round's buffers in
//! the first round.
//!
//! Each peer runs the daemon's own averaging engine (`murmur_gossip::engine`) behind the
//! same network driver as `murmur run`; only the trainer is replaced by one that hands the
//! engine this peer's vector as its gradient (weighted by `index + 1` samples) and
//! measures each averaged result it is asked to apply. Rounds form by matchmaking, as in
//! training, with the whole swarm as the target group; a round's time counts from its
//! group's start to this member's complete result.
//!
//! `--threads 1` runs the network and the rounds on one thread: many peers sharing few
//! cores then spend no CPU handing work between threads.

use std::io::{BufRead as _, Write as _};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use murmur_gossip::butterfly::ButterflyConfig;
use murmur_gossip::engine::{
    EngineEvent, EngineSetup, EngineStatus, Membership, ModeEngine, ModeSettings, RoundReport,
    Start, Work, WorkDone,
};
use murmur_gossip::net::driver::{self, DriverConfig, EngineClock, EngineIo, FromEngine};
use murmur_gossip::net::exchange::{Mailbox, MailboxConfig, Outbox, OutboxConfig};
use murmur_gossip::net::{self, NetHandle, NetIdentity};
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::AveragingMode;
use serde_json::json;
use tokio::sync::{broadcast, oneshot};

use crate::cli::AllreducePeerArgs;
use crate::config::{self, LoadedConfig};
use crate::input_error::BadInput;

/// How long a peer waits for the whole swarm before it gives up.
const GATHER_BOUND: Duration = Duration::from_secs(60);

/// How long a finished peer waits for the benchmark to say that every peer has finished.
const LINGER_BOUND: Duration = Duration::from_secs(60);

/// Elements at the start of every [`SAMPLE_STRIDE`] that the error is measured on.
const SAMPLE_RUN: usize = 64;
/// The period of the error's sample.
const SAMPLE_STRIDE: usize = 4096;

/// The angle step between neighbouring elements.
const STEP: f64 = 0.001;

/// Writes elements `start..start + out.len()` of peer `index`'s benchmark vector,
/// `x[k] = (index + 1) · sin(0.001·k + index)`, with `start` a multiple of
/// [`SAMPLE_STRIDE`]. Each block of [`SAMPLE_STRIDE`] elements starts from an exact sine
/// and cosine and rotates by the step in f64 from there (a nanosecond or two an element,
/// where `sin` itself takes ten): the vector is written anew for every round instead of
/// being kept as a copy, and the exact mean ([`exact_mean`]) reads the same values.
fn fill_elements(index: usize, start: usize, out: &mut [f32]) {
    debug_assert!(start.is_multiple_of(SAMPLE_STRIDE));
    let amplitude = (index + 1) as f64;
    let (step_sin, step_cos) = STEP.sin_cos();
    for (b, block) in out.chunks_mut(SAMPLE_STRIDE).enumerate() {
        let first = start + b * SAMPLE_STRIDE;
        let (mut sin, mut cos) = (STEP * first as f64 + index as f64).sin_cos();
        for x in block {
            *x = (amplitude * sin) as f32;
            (sin, cos) = (
                sin * step_cos + cos * step_sin,
                cos * step_cos - sin * step_sin,
            );
        }
    }
}

/// Peer `index`'s weight.
fn weight_of(index: usize) -> f32 {
    (index + 1) as f32
}

/// The indices the error is measured on, in increasing order.
fn sample(elements: usize) -> impl Iterator<Item = usize> {
    (0..elements)
        .step_by(SAMPLE_STRIDE)
        .flat_map(move |start| start..(start + SAMPLE_RUN).min(elements))
}

/// The exact weighted mean over peers `0..peers` (in f64) at the [`sample`]'s indices, or
/// the plain mean for SGP.
fn exact_mean(peers: usize, elements: usize, weighted: bool) -> Vec<f64> {
    let weight = |i: usize| if weighted { (i + 1) as f64 } else { 1.0 };
    let total: f64 = (0..peers).map(weight).sum();
    let mut exact = Vec::with_capacity(elements.div_ceil(SAMPLE_STRIDE) * SAMPLE_RUN);
    let mut run = [0f32; SAMPLE_RUN];
    for start in (0..elements).step_by(SAMPLE_STRIDE) {
        let len = SAMPLE_RUN.min(elements - start);
        let from = exact.len();
        exact.resize(from + len, 0.0);
        for i in 0..peers {
            fill_elements(i, start, &mut run[..len]);
            for (e, &x) in exact[from..].iter_mut().zip(&run[..len]) {
                *e += weight(i) * f64::from(x);
            }
        }
        for e in &mut exact[from..] {
            *e /= total;
        }
    }
    exact
}

/// `‖values − exact‖ / ‖exact‖` over the [`sample`], `exact` holding the mean there.
fn relative_error(values: &[f32], exact: &[f64]) -> f64 {
    let (mut diff, mut norm) = (0f64, 0f64);
    for (k, &e) in sample(values.len()).zip(exact) {
        diff += (f64::from(values[k]) - e).powi(2);
        norm += e * e;
    }
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// Seconds since the Unix epoch, to the millisecond: comparable between the peers of one
/// host, which is where the benchmark's round periods are measured.
fn unix_s() -> f64 {
    crate::clock::unix_ms() as f64 / 1e3
}

fn emit(line: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// `murmur bench allreduce-peer`.
pub(crate) fn run(args: &AllreducePeerArgs) -> anyhow::Result<()> {
    let loaded = config::load(&args.config).map_err(|e| BadInput(e.to_string()))?;
    crate::observe::init_logging("warn", crate::observe::LogFormat::Human)?;
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(args.threads))
            .enable_all()
            .build()
    }
    .context("cannot start the async runtime")?;
    // Built before the network starts: the exact mean takes seconds of CPU at the largest
    // sizes, which must not hold up the runtime that answers the swarm.
    let exact = exact_mean(args.peers, args.elements, args.algo != AveragingMode::Sgp);
    let workload = Workload {
        weight: weight_of(args.index),
        exact,
    };
    runtime.block_on(async move {
        let identity = NetIdentity::from_keypair(&loaded.keypair);
        let me = identity.peer_id();
        let (net, inbound) = net::spawn(&loaded.net, identity).await?;
        let events = net.subscribe();
        let mailbox = Mailbox::spawn(inbound.tensor_streams, MailboxConfig::default());
        let outbox = Outbox::new(net.clone(), OutboxConfig::default());
        let listen: Vec<String> = net
            .listen_addrs()
            .await?
            .iter()
            .map(|a| format!("{a}/p2p/{me}"))
            .collect();
        emit(json!({"event": "ready", "listen": listen}));
        let io = EngineIo {
            net: net.clone(),
            mailbox,
            outbox,
            events,
        };
        let result = bench(io, me, &loaded, args, workload).await;
        if let Err(e) = &result {
            emit(json!({"event": "done", "error": crate::error_text::describe(e)}));
        }
        if result.is_ok() {
            // This peer has its last round, but its averaged chunks may still be on their
            // way to slower peers: closing now would cut them off. The benchmark closes
            // every peer's standard input once all of them have reported their last round.
            let _ = tokio::time::timeout(LINGER_BOUND, stdin_closed()).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), net.shutdown()).await;
        result
    })
}

/// Resolves when standard input gives a line or closes (at once when it is `/dev/null`).
/// The read blocks, so it runs on a thread of its own that the process's exit ends.
fn stdin_closed() -> oneshot::Receiver<()> {
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        let _ = tx.send(());
    });
    rx
}

/// Waits until `want` other peers are admitted and each has been heard in gossip (groups
/// form through the heartbeats that say who is looking for one), noting them in
/// `membership`. This peer heartbeats meanwhile, so that the others hear it too.
async fn gather(
    io: &mut EngineIo,
    membership: &mut Membership<PeerId>,
    clock: &EngineClock,
    mode: AveragingMode,
    want: usize,
) -> anyhow::Result<()> {
    let until = tokio::time::Instant::now() + GATHER_BOUND;
    let heard = |m: &Membership<PeerId>| m.len() >= want && m.all_heard();
    while !heard(membership) {
        if membership.beat_due(clock.now()) {
            driver::publish_heartbeat(&io.net, clock, mode, membership.own());
        }
        let wake = clock.instant(membership.poll_timeout()).min(until);
        match tokio::time::timeout_at(wake, io.events.recv()).await {
            Err(_) if tokio::time::Instant::now() >= until => anyhow::bail!(
                "only {} of {want} other peers connected and heard within {GATHER_BOUND:?}",
                membership.heard().count()
            ),
            Err(_) => {}
            Ok(Ok(event)) => {
                membership.note(clock.now(), driver::member_event(clock, event));
            }
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(broadcast::error::RecvError::Closed)) => anyhow::bail!("the network stopped"),
        }
    }
    Ok(())
}

/// What a peer averages: its weight, and the exact mean at the [`sample`] (the vector is
/// written by [`fill_elements`] when it is needed).
struct Workload {
    weight: f32,
    exact: Vec<f64>,
}

/// The mode a benchmark runs, as its config names it (the benchmark writes the algorithm
/// there): every round takes the whole swarm (`target_group = peers`, unless the benchmark
/// asks for smaller groups) and exactly one contribution of each member, since a round is
/// due as soon as a member has one gradient (`target_batch = 1`) and members do not compute
/// while they average.
fn mode_of(args: &AllreducePeerArgs, loaded: &LoadedConfig) -> ModeSettings {
    // The benchmark writes `target_group` (every peer, unless `--target-group`).
    let whole = |butterfly: &ButterflyConfig| ButterflyConfig {
        target_group: butterfly
            .target_group
            .min(args.peers)
            .max(butterfly.min_group),
        ..butterfly.clone()
    };
    match &loaded.averaging.mode {
        ModeSettings::Butterfly { butterfly, .. } => ModeSettings::Butterfly {
            target_batch: 1,
            butterfly: whole(butterfly),
        },
        ModeSettings::SyncRing { butterfly, .. } => ModeSettings::SyncRing {
            timeout: RING_BOUND,
            butterfly: whole(butterfly),
        },
        other => other.clone(),
    }
}

/// The longest an SGP step waits for the share it folds in and for the receipt of its own
/// last share. Past it the step goes on, without that share (counted in its round's
/// `missed_shares`, and said at `warn`): a share taken back by its sender, held back, or
/// refused on arrival never comes, and waiting for it would hold up both peers for good.
const SGP_SHARE_PATIENCE: Duration = Duration::from_secs(120);

/// The longest a benchmark's ring round may take.
const RING_BOUND: Duration = Duration::from_secs(60);

/// What a benchmark peer measures between two rounds it reports.
struct Meter {
    net: NetHandle,
    round: u64,
    sent_before: u64,
    since: Instant,
    /// The last round report (or a round alone) the engine made.
    last: Option<RoundReport<PeerId>>,
    /// SGP: shares this round's steps went on without.
    missed: u64,
}

impl Meter {
    /// Emits round `self.round` with the values it ended on, and starts the next. A peer
    /// that caught up with the swarm by leaving rounds out (it found itself looking alone
    /// at a round the others had passed) reports each of them as skipped first, so that
    /// its lines keep the swarm's round numbers.
    fn emit_round(&mut self, values: &[f32], exact: &[f64]) {
        let sent_now = self.net.metrics().snapshot().tensor_bytes_sent;
        let last = self.last.take();
        if let Some(report) = &last {
            while self.round < report.round {
                emit(json!({"event": "round", "round": self.round, "skipped": true}));
                self.round += 1;
            }
        }
        let (time_s, coverage, coverage_all, group, given_up) = match &last {
            Some(r) => (
                r.finished_after.as_secs_f64(),
                r.coverage,
                r.coverage_all,
                r.group_size,
                r.silent_reducers.len(),
            ),
            // SGP, or a round alone: the time since the last report.
            None => (self.since.elapsed().as_secs_f64(), 1.0, 1.0, 1, 0),
        };
        let finished = unix_s();
        emit(json!({
            "event": "round",
            "round": self.round,
            // The swarm's round number this average was for (none for a round alone).
            "swarm_round": last.as_ref().map(|r| r.round),
            "time_s": time_s,
            "until_idle_s": self.since.elapsed().as_secs_f64(),
            "began_unix_s": finished - time_s,
            "finished_unix_s": finished,
            "bytes_sent": sent_now - self.sent_before,
            "rel_error": relative_error(values, exact),
            "coverage": coverage,
            "coverage_all": coverage_all,
            "group": group,
            "given_up": given_up,
            "missed_shares": self.missed,
        }));
        self.round += 1;
        self.missed = 0;
        self.sent_before = sent_now;
        self.since = Instant::now();
    }
}

async fn bench(
    io: EngineIo,
    me: PeerId,
    loaded: &LoadedConfig,
    args: &AllreducePeerArgs,
    workload: Workload,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let clock = EngineClock::start();
    let mut membership = Membership::new(me, loaded.averaging.heartbeat_interval, clock.now());
    let mut io = io;
    let mode = mode_of(args, loaded);
    let Workload { weight, exact } = workload;
    let sgp = args.algo == AveragingMode::Sgp;
    let setup = EngineSetup {
        codec: loaded.averaging.codec,
        error_feedback: false,
        size_parts_by_bandwidth: !args.equal_parts,
        batch_size: weight as u64,
        upload_cap: loaded.net.max_upload_bytes_per_s,
        accepts_connections: true,
        wall_ms_at_zero: clock.wall_ms_at_zero,
        seed: args.index as u64 ^ clock.wall_ms_at_zero,
        max_share_piece: crate::config::frames::share_piece_bytes(loaded.net.max_frame_payload),
    };
    // Made before the peers meet, as `murmur run` does: the rounds then find their memory
    // resident.
    let round_memory = mode.round_memory(args.elements, &setup, args.peers)?;
    gather(
        &mut io,
        &mut membership,
        &clock,
        mode.mode(),
        args.peers - 1,
    )
    .await?;
    // Only peer 0's address was given: the rest were found through the DHT.
    emit(json!({"event": "gathered", "after_s": started.elapsed().as_secs_f64()}));
    let start = Start {
        // SGP averages the vectors themselves; the round modes average "gradients".
        params: Some(if sgp {
            let mut x = vec![0.0; args.elements];
            fill_elements(args.index, 0, &mut x);
            x
        } else {
            // Never written, so never resident.
            vec![0.0; args.elements]
        }),
        len: args.elements,
        round: 0,
        local_steps: 0,
        round_memory,
    };
    let engine = ModeEngine::new(&mode, &setup, membership, start)?;
    let net = io.net.clone();
    let config = DriverConfig {
        mode: mode.mode(),
        bootstrap: Vec::new(),
        expected_peers: args.peers - 1,
        leave_bound: Duration::from_secs(4),
    };
    let mut handle = driver::spawn(engine, io, clock, config, None);
    // A round of SGP is log2(N) push steps: with N a power of two and every peer stepping
    // together, that averages exactly.
    let steps_per_round = u64::from(usize::BITS - (args.peers - 1).leading_zeros()).max(1);
    let mut meter = Meter {
        sent_before: net.metrics().snapshot().tensor_bytes_sent,
        net,
        round: 0,
        since: Instant::now(),
        last: None,
        missed: 0,
    };
    let mut steps = 0u64;
    // Shares the steps so far went on without.
    let mut missed = 0u64;
    let mut finishing = false;
    while let Some(message) = handle.next().await {
        let done = match message {
            FromEngine::Work(Work::Gradient { params, mut grad }) => {
                grad.resize(args.elements, 0.0);
                fill_elements(args.index, 0, &mut grad);
                WorkDone::Gradient {
                    params,
                    grad,
                    samples: weight as u64,
                    took: Duration::ZERO,
                }
            }
            FromEngine::Work(Work::Apply { params, grad, .. }) => {
                meter.emit_round(&grad, &exact);
                WorkDone::Applied { params, grad }
            }
            FromEngine::Work(Work::Step {
                params, mut update, ..
            }) => {
                // Pure averaging, step by step: the step goes on once as many shares have
                // been received as this peer pushed (with every view equal, each step has
                // exactly one in-neighbour). One that arrives while `params` is lent for
                // this step is acknowledged at once and folded in when it comes back, so
                // `params` is `z` after the shares of the steps before.
                // It also waits for the receipt of this peer's last share: an edge whose
                // share is unsettled keeps the next one back, and its receiver would wait
                // for it in vain. A step asked for once this peer finishes is not
                // measured, and waits for nothing: the others are leaving too, and their
                // last shares may never come (at 100M elements the hand-offs outlast the
                // step's patience).
                let until = tokio::time::Instant::now() + SGP_SHARE_PATIENCE;
                let waiting = |status: EngineStatus| {
                    status.shares_received + missed < steps || status.shares_unsettled > 0
                };
                while !finishing && waiting(handle.status()) {
                    if tokio::time::timeout_at(until, handle.status_changed())
                        .await
                        .is_err()
                    {
                        let status = handle.status();
                        tracing::warn!(
                            step = steps,
                            received = status.shares_received,
                            sent = status.shares_sent,
                            returned = status.shares_returned,
                            held = status.shares_held,
                            unsettled = status.shares_unsettled,
                            weight = ?status.push_sum_weight,
                            peers = status.peers,
                            "gossip step goes on after waiting {:?} for a share or for its \
                             last share's receipt (a share taken back by its sender, held \
                             back or refused never comes: see the lines before)",
                            SGP_SHARE_PATIENCE,
                        );
                        if status.shares_received + missed < steps {
                            missed += 1;
                            meter.missed += 1;
                        }
                        break;
                    }
                }
                if steps > 0 && steps.is_multiple_of(steps_per_round) {
                    meter.emit_round(&params, &exact);
                }
                steps += 1;
                // The gossip step leaves the parameters as they are: its update is zero.
                // The engine's buffer starts zeroed and only this loop writes it, so it
                // needs no clearing (a memset of the whole vector every step).
                update.resize(params.len(), 0.0);
                WorkDone::Stepped {
                    params,
                    update,
                    samples: 1,
                    took: Duration::ZERO,
                }
            }
            FromEngine::Event(EngineEvent::Round(report)) => {
                meter.last = Some(report);
                continue;
            }
            FromEngine::Event(EngineEvent::BadParcel { from, reason }) => {
                tracing::warn!(peer = %from, %reason, "message refused");
                continue;
            }
            // A share that did not arrive holds up its receiver's next step: say so.
            FromEngine::Event(EngineEvent::Refusal { peer, fate }) => {
                tracing::warn!(%peer, ?fate, "a share was refused");
                continue;
            }
            FromEngine::Event(EngineEvent::Share {
                to,
                delivered: false,
                ..
            }) => {
                tracing::warn!(peer = %to, "a share the transport could not write, taken back");
                continue;
            }
            FromEngine::Event(_) | FromEngine::Finished(_) => continue,
        };
        handle.work_done(done).await?;
        if meter.round >= args.rounds && !finishing {
            finishing = true;
            handle.finish().await;
        }
    }
    handle
        .stopped()
        .await
        .context("the averaging engine stopped")?;
    emit(json!({
        "event": "done",
        "peak_rss_bytes": crate::observe::process::own_status_bytes("VmHWM:"),
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rotated blocks give the sine to within f32 rounding, far into a large vector.
    #[test]
    fn every_element_is_the_sine_it_names() {
        for (index, start) in [(0, 0), (3, 250_000_000 / SAMPLE_STRIDE * SAMPLE_STRIDE)] {
            let mut x = vec![0f32; 3 * SAMPLE_STRIDE + 17];
            fill_elements(index, start, &mut x);
            for (offset, &got) in x.iter().enumerate() {
                let angle = STEP * (start + offset) as f64 + index as f64;
                let want = (index + 1) as f64 * angle.sin();
                assert!(
                    (f64::from(got) - want).abs() < 1e-5,
                    "peer {index}, element {}: {got} against {want}",
                    start + offset
                );
            }
        }
    }

    #[test]
    fn the_exact_mean_weighs_each_peer_by_its_index_plus_one() {
        let elements = 2 * SAMPLE_STRIDE + 100;
        let exact = exact_mean(3, elements, true);
        let vectors: Vec<Vec<f32>> = (0..3)
            .map(|i| {
                let mut x = vec![0f32; elements];
                fill_elements(i, 0, &mut x);
                x
            })
            .collect();
        let indices: Vec<usize> = sample(elements).collect();
        assert_eq!(indices.len(), exact.len());
        for (&k, &e) in indices.iter().zip(&exact) {
            let sum: f64 = (0..3)
                .map(|i| (i + 1) as f64 * f64::from(vectors[i][k]))
                .sum();
            assert!((sum / 6.0 - e).abs() < 1e-12, "element {k}");
        }
        let plain = exact_mean(3, elements, false);
        let k = indices[1];
        let mean: f64 = (0..3).map(|i| f64::from(vectors[i][k])).sum::<f64>() / 3.0;
        assert!((plain[1] - mean).abs() < 1e-12);
    }
}

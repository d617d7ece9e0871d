//! One process of `murmur bench allreduce`: joins the benchmark swarm and averages a known
//! vector round after round, printing one JSON line per round (time, bytes sent, relative
//! error against the exact weighted mean, coverage).
//!
//! Peer `i` holds `x_i[k] = (i + 1) · sin(0.001·k + i)` with weight `i + 1`, so every peer
//! can compute the exact weighted mean of all `N` peers by itself.
//!
//! The error is measured on a fixed sample of the vector ([`sample`]): the first 256
//! elements of every 4096, a sixteenth of it, in runs that span whole codec blocks. Every
//! chunk of every part has elements in it (a chunk is 16 384 elements by default), so a
//! chunk or part left at local values or averaged wrong shows. A full pass after every
//! round would compete for the CPU with peers still in that round and slow the very round
//! it measures; the sample costs a sixteenth of that. The vector and the sample's exact
//! mean are built once, before the network starts (they take seconds of CPU, which would
//! keep a one-thread runtime from answering the swarm), and the round's buffers in the
//! first round.
//!
//! `--threads 1` runs the network and the rounds on one thread: many peers sharing few
//! cores then spend no CPU handing work between threads.

use std::collections::BTreeSet;
use std::io::{BufRead as _, Write as _};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use murmur_gossip::Time;
use murmur_gossip::butterfly::{ButterflyConfig, RoundBuffers};
use murmur_gossip::net::exchange::{
    Delivery, Mailbox, MailboxConfig, Outbox, OutboxConfig, Parcel,
};
use murmur_gossip::net::{self, NetEvent, NetHandle, NetIdentity};
use murmur_gossip::sgp::{SgpConfig, SgpInput, SgpOutput, SgpPeer, ShareHeader};
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::identity::PeerId;
use serde_json::json;
use tokio::sync::{broadcast, oneshot};

use crate::cli::{AllreduceAlgo, AllreducePeerArgs};
use crate::config;
use crate::input_error::BadInput;
use crate::run::collective::{self, Collective, Early, RoundHost, RoundIo};

mod round_start;

use self::round_start::Readiness;

/// How long a peer waits for the whole swarm before it gives up.
const GATHER_BOUND: Duration = Duration::from_secs(60);

/// How long a finished peer waits for the benchmark to say that every peer has finished.
const LINGER_BOUND: Duration = Duration::from_secs(60);

/// Elements at the start of every [`SAMPLE_STRIDE`] that the error is measured on.
const SAMPLE_RUN: usize = 256;
/// The period of the error's sample.
const SAMPLE_STRIDE: usize = 4096;

/// Element `k` of peer `index`'s benchmark vector.
fn element(index: usize, k: usize) -> f32 {
    (index + 1) as f32 * (0.001 * k as f32 + index as f32).sin()
}

/// The benchmark vector of peer `index`, and its weight.
fn vector_of(index: usize, elements: usize) -> (Vec<f32>, f32) {
    let x = (0..elements).map(|k| element(index, k)).collect();
    (x, (index + 1) as f32)
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
    sample(elements)
        .map(|k| {
            let sum: f64 = (0..peers)
                .map(|i| weight(i) * f64::from(element(i, k)))
                .sum();
            sum / total
        })
        .collect()
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

struct BenchPeer {
    me: PeerId,
    net: NetHandle,
    mailbox: Mailbox,
    outbox: Outbox,
    events: broadcast::Receiver<NetEvent>,
    /// The members of the next round besides this peer: every peer that connected, until
    /// a round finds it silent. A lost connection alone does not remove a peer, because
    /// each peer learns of it at its own moment, and a round that begins between two
    /// peers' moments would be split by them into different layouts.
    peers: BTreeSet<PeerId>,
    /// Peers whose connections closed: rounds give up on them at once.
    disconnected: BTreeSet<PeerId>,
    /// The rounds members said they are ready for.
    ready: Readiness,
    /// Members that did not say they were ready for this round in time: the round gives up
    /// on them at once.
    unready: BTreeSet<PeerId>,
    clock: Instant,
    codec: CodecSpec,
    butterfly: ButterflyConfig,
    raw_bytes: u64,
}

impl RoundHost for BenchPeer {
    fn me(&self) -> PeerId {
        self.me
    }
    fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.clock.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
    fn instant_of(&self, at: Time) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.clock + Duration::from_nanos(at.as_nanos()))
    }
    fn codec(&self) -> CodecSpec {
        self.codec
    }
    fn butterfly(&self) -> &ButterflyConfig {
        &self.butterfly
    }
    fn ring_timeout(&self) -> Duration {
        Duration::from_secs(60)
    }
    fn io(&mut self) -> RoundIo<'_> {
        RoundIo {
            mailbox: &mut self.mailbox,
            outbox: &mut self.outbox,
            events: &mut self.events,
            signals: None,
        }
    }
    fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }
    fn note_event(&mut self, event: &NetEvent) {
        match event {
            NetEvent::PeerAuthorized { peer, .. } => {
                self.peers.insert(*peer);
                self.disconnected.remove(peer);
            }
            NetEvent::PeerDisconnected { peer } | NetEvent::PeerRejected { peer, .. } => {
                self.disconnected.insert(*peer);
            }
            NetEvent::Heartbeat { .. } => {}
        }
    }
    fn is_gone(&self, peer: &PeerId) -> bool {
        self.disconnected.contains(peer) || self.unready.contains(peer)
    }
    fn note_parcel(&mut self, delivery: Delivery) {
        self.ready.note_parcel(delivery.from, &delivery.parcel);
        self.mailbox.recycle(delivery.parcel.into_payload());
    }
    fn set_paused(&mut self, _: bool) {}
    fn count_raw(&mut self, bytes: u64) {
        self.raw_bytes += bytes;
    }
    fn measures_drift(&self) -> bool {
        false
    }
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
    // Built before the network starts: the vector and its exact mean take seconds of CPU,
    // which must not hold up the runtime that answers the swarm.
    let (local, weight) = vector_of(args.index, args.elements);
    let exact = exact_mean(args.peers, args.elements, args.algo != AllreduceAlgo::Sgp);
    let workload = Workload {
        local,
        weight,
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
        let mut peer = BenchPeer {
            me,
            net: net.clone(),
            mailbox,
            outbox,
            events,
            peers: BTreeSet::new(),
            disconnected: BTreeSet::new(),
            ready: Readiness::default(),
            unready: BTreeSet::new(),
            clock: Instant::now(),
            codec: loaded.averaging.codec,
            butterfly: loaded.averaging.butterfly.clone(),
            raw_bytes: 0,
        };
        let result = bench(&mut peer, args, loaded.averaging.sgp.clone(), workload).await;
        if let Err(e) = &result {
            emit(json!({"event": "done", "error": format!("{e:#}")}));
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

async fn gather(peer: &mut BenchPeer, want: usize) -> anyhow::Result<()> {
    let until = tokio::time::Instant::now() + GATHER_BOUND;
    let connected = |peer: &BenchPeer| peer.peers.difference(&peer.disconnected).count();
    while connected(peer) < want {
        match tokio::time::timeout_at(until, peer.events.recv()).await {
            Err(_) => anyhow::bail!(
                "only {} of {want} other peers connected within {GATHER_BOUND:?}",
                connected(peer)
            ),
            Ok(Ok(event)) => peer.note_event(&event),
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(broadcast::error::RecvError::Closed)) => anyhow::bail!("the network stopped"),
        }
    }
    Ok(())
}

/// What a peer averages: its vector, its weight, and the exact mean at the [`sample`].
struct Workload {
    local: Vec<f32>,
    weight: f32,
    exact: Vec<f64>,
}

async fn bench(
    peer: &mut BenchPeer,
    args: &AllreducePeerArgs,
    sgp: SgpConfig,
    workload: Workload,
) -> anyhow::Result<()> {
    let started = Instant::now();
    gather(peer, args.peers - 1).await?;
    // Only peer 0's address was given: the rest were found through the DHT.
    emit(json!({"event": "gathered", "after_s": started.elapsed().as_secs_f64()}));
    // Everyone is connected; give their own gathering a moment to finish too.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let Workload {
        local,
        weight,
        exact,
    } = workload;
    match args.algo {
        AllreduceAlgo::Butterfly | AllreduceAlgo::Ring => {
            let kind = if args.algo == AllreduceAlgo::Ring {
                Collective::Ring
            } else {
                Collective::Butterfly
            };
            let mut early = Early::default();
            // The readiness message carries the weight as samples, as a join would.
            let samples = weight as u64;
            // The butterfly hands its contribution back unchanged, so after the first round
            // nothing of the vector's size is built, copied or allocated between rounds.
            let mut buffers = RoundBuffers::from(local.clone());
            for round in 0..args.rounds {
                if buffers.local.is_empty() {
                    // The ring scales its input in place and keeps it.
                    buffers.local.extend_from_slice(&local);
                }
                let waited = if args.free_start {
                    Duration::ZERO
                } else {
                    // Before the first round a peer may still be finding the others.
                    let bound = if round == 0 {
                        GATHER_BOUND
                    } else {
                        peer.butterfly.chunk_timeout()
                    };
                    peer.agree_to_start(&mut early, round, samples, bound)
                        .await?
                };
                let sent_before = peer.net.metrics().snapshot().tensor_bytes_sent;
                let mut members: Vec<PeerId> = peer.peers.iter().copied().collect();
                members.push(peer.me);
                let began = unix_s();
                let started = Instant::now();
                let outcome =
                    collective::average(peer, &mut early, kind, round, members, buffers, weight)
                        .await?;
                let time_s = outcome.finished_after.as_secs_f64();
                let idle_s = started.elapsed().as_secs_f64();
                let sent = peer.net.metrics().snapshot().tensor_bytes_sent - sent_before;
                emit(json!({
                    "event": "round",
                    "round": round,
                    "time_s": time_s,
                    "until_idle_s": idle_s,
                    "waited_s": waited.as_secs_f64(),
                    "began_unix_s": began,
                    "finished_unix_s": began + time_s,
                    "bytes_sent": sent,
                    "rel_error": relative_error(&outcome.values, &exact),
                    "coverage": outcome.coverage,
                    "coverage_all": outcome.coverage_all,
                    "group": outcome.group,
                    "given_up": outcome.silent_reducers.len(),
                }));
                // A reducer whose averages never came (timed out, or its connection closed)
                // is gone: every member saw the same, so all of them leave it out of the
                // next rounds, at the same round.
                for gone in &outcome.silent_reducers {
                    peer.peers.remove(gone);
                }
                buffers = outcome.spare;
                buffers.result = outcome.values;
            }
        }
        AllreduceAlgo::Sgp => gossip(peer, args, sgp, local, exact).await?,
    }
    emit(json!({"event": "done"}));
    Ok(())
}

/// SGP as pure averaging: no training, each "round" is log2(N) push steps; the error is of
/// `z = x / w` against the plain mean (push-sum starts every peer at weight 1).
async fn gossip(
    peer: &mut BenchPeer,
    args: &AllreducePeerArgs,
    config: SgpConfig,
    local: Vec<f32>,
    exact: Vec<f64>,
) -> anyhow::Result<()> {
    let members: Vec<PeerId> = peer.peers.iter().copied().collect();
    let mut machine = SgpPeer::new(peer.me, members, local, config)?;
    let steps_per_round = u64::from(usize::BITS - (args.peers - 1).leading_zeros()).max(1);
    let mut z = vec![0f32; args.elements];
    let bound = Duration::from_secs(120);
    let mut pending: Option<u64> = None;
    for round in 0..args.rounds {
        let began = unix_s();
        let started = Instant::now();
        let sent_before = peer.net.metrics().snapshot().tensor_bytes_sent;
        let target = steps_per_round * (round + 1);
        if pending.take().is_some() {
            let now = peer.now();
            machine.handle(now, SgpInput::LocalStepDone)?;
        }
        let deadline = tokio::time::Instant::now() + bound;
        // A round ends when this peer has pushed `target` shares in all and folded in as
        // many: with every view equal, each step has exactly one in-neighbour.
        let round_done =
            |m: &SgpPeer<PeerId>| m.steps_done() >= target && m.stats().shares_received >= target;
        while !round_done(&machine) {
            while let Some(output) = machine.poll_output() {
                match output {
                    SgpOutput::StartStep { step } => {
                        // A step past the round waits for the next round.
                        if step < target {
                            let now = peer.now();
                            machine.handle(now, SgpInput::LocalStepDone)?;
                        } else {
                            pending = Some(step);
                        }
                    }
                    SgpOutput::SendShare {
                        to,
                        header,
                        payload,
                    } => {
                        let elements = u32::try_from(args.elements)?;
                        let parcel = Parcel::Share(header.to_wire(elements), payload);
                        if let Err(parcel) = peer.outbox.send(to, header.seq, parcel) {
                            let payload = parcel.into_payload();
                            let now = peer.now();
                            let input = SgpInput::ShareReturned {
                                to,
                                header,
                                payload: &payload,
                                receiver_gone: false,
                            };
                            machine.handle(now, input)?;
                        }
                    }
                    SgpOutput::Departed => {}
                }
            }
            if round_done(&machine) {
                break;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "gossip round {round} took longer than {bound:?}"
            );
            let timer = machine
                .poll_timeout()
                .map(|t| peer.instant_of(t))
                .unwrap_or(deadline)
                .min(deadline);
            tokio::select! {
                Some(d) = peer.mailbox.recv() => {
                    if let Parcel::Share(share, payload) = &d.parcel {
                        let header = ShareHeader::from_wire(share, 0);
                        let now = peer.now();
                        let input = SgpInput::ShareReceived { from: d.from, header, payload };
                        if let Err(e) = machine.handle(now, input) {
                            tracing::warn!(error = %e, "share refused");
                        }
                    }
                    peer.mailbox.recycle(d.parcel.into_payload());
                }
                Some(report) = peer.outbox.next_report() => {
                    let now = peer.now();
                    let to = report.to;
                    if let Parcel::Share(share, payload) = report.parcel {
                        if report.result.is_ok() {
                            machine.handle(now, SgpInput::ShareDelivered { to, seq: report.tag })?;
                        } else {
                            let header = ShareHeader::from_wire(&share, report.tag);
                            let input = SgpInput::ShareReturned {
                                to,
                                header,
                                payload: &payload,
                                // A failed stream is not a departed peer: the network
                                // says when its last connection closes.
                                receiver_gone: peer.disconnected.contains(&to),
                            };
                            machine.handle(now, input)?;
                        }
                        machine.recycle(payload);
                    }
                }
                () = tokio::time::sleep_until(timer) => {
                    let now = peer.now();
                    machine.handle(now, SgpInput::Tick)?;
                }
            }
        }
        machine.debiased_into(&mut z)?;
        let sent = peer.net.metrics().snapshot().tensor_bytes_sent - sent_before;
        let time_s = started.elapsed().as_secs_f64();
        emit(json!({
            "event": "round",
            "round": round,
            "time_s": time_s,
            "until_idle_s": time_s,
            "began_unix_s": began,
            "finished_unix_s": began + time_s,
            "bytes_sent": sent,
            "rel_error": relative_error(&z, &exact),
            "coverage": 1.0,
            "group": args.peers,
        }));
    }
    Ok(())
}

//! `murmur run`: join the swarm, train, average, and leave cleanly.
//!
//! One process is one peer. The network task, the mailbox readers and the averaging loop
//! run on a small tokio runtime; the model trains on its own thread ([`worker`]). The
//! averaging loop of the configured mode owns its state machine and reacts to whatever
//! comes first: a message, a send report, a finished step, a membership change, a timer,
//! or a signal.

pub(crate) mod collective;
mod peer;
mod progress;
mod rounds;
mod settings;
mod sgp;
mod state_sync;
mod worker;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use murmur_gossip::net::exchange::{Mailbox, MailboxConfig, Outbox, OutboxConfig};
use murmur_gossip::net::{self, NetIdentity};
use murmur_protocol::message::AveragingMode;
use murmur_trainer::{ParamLayout, PeerSampling, export_safetensors};
use sha2::{Digest as _, Sha256};

use crate::checkpoint::CheckpointStore;
use crate::observe::{self, HttpLimits, Metrics, MetricsOptions, StatusBoard, StatusIdentity};
use murmur_protocol::frame::FrameLimits;
use murmur_protocol::snapshot::SnapshotLimits;
use peer::{Peer, Signals};
use progress::{Counters, Progress};
pub(crate) use settings::{LocalSgdSettings, RunSettings};
use state_sync::StateCell;
use worker::{SharedOptimizer, Worker};

/// Why a peer stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// It ran its step budget.
    Finished,
    /// SIGINT or SIGTERM.
    Signal,
}

/// How long a peer with bootstrap addresses waits for its first peer before training alone.
const FIRST_PEER_WAIT: Duration = Duration::from_secs(10);
/// How often a peer meeting the swarm checks whether to dial its bootstrap addresses again.
const MEET_TICK: Duration = Duration::from_secs(1);
/// Heartbeat intervals a meeting peer waits, past its first interval and a half, for the
/// news that tells it the swarm's step.
const NEWS_WAIT_INTERVALS: u32 = 4;

/// Runs one peer to the end. Call from `main` before any other thread starts.
pub(crate) fn run(settings: RunSettings) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("murmur-io")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run_peer(settings))
}

async fn run_peer(settings: RunSettings) -> anyhow::Result<()> {
    let identity = NetIdentity::from_keypair(&settings.keypair);
    let me = identity.peer_id();
    let (net, inbound) = net::spawn(&settings.net, identity)
        .await
        .context("cannot start the network")?;
    let events = net.subscribe();
    let mailbox = Mailbox::spawn(inbound.tensor_streams, MailboxConfig::default());
    let outbox = Outbox::new(net.clone(), OutboxConfig::default());
    let state = StateCell::default();
    let control_limits =
        FrameLimits::new(settings.net.max_control_payload).context("net.max_control_payload")?;
    tokio::spawn(state_sync::serve(
        net.clone(),
        inbound.control_requests,
        state.clone(),
        control_limits,
    ));

    let sampling = PeerSampling {
        swarm_seed: PeerSampling::seed_from_id(settings.swarm_id.as_bytes()),
        peer_seed: PeerSampling::seed_from_id(&me.to_bytes()),
        shard: 0,
        shards: 1,
    };
    let mut task = settings
        .task
        .build(sampling)
        .context("cannot build the training task")?;
    let mut params = task.model.init(sampling.swarm_seed);
    let initial_eval_loss = task.evaluate(&params).context("initial eval")?;
    let loss_floor = task.dataset.loss_floor();
    let layout = task.model.layout().clone();
    let len = params.len();
    let optimizer = SharedOptimizer::default();
    let worker = Worker::spawn(task, len, settings.pace(), Arc::clone(&optimizer))?;

    let listen: Vec<String> = net
        .listen_addrs()
        .await?
        .iter()
        .map(|a| format!("{a}/p2p/{me}"))
        .collect();
    let metrics = Metrics::new(MetricsOptions { gpu: false })?;
    metrics.network.attach(Arc::new(net.clone()))?;
    metrics.network.set_bandwidth_caps(
        settings.net.max_upload_bytes_per_s,
        settings.net.max_download_bytes_per_s,
    );
    let board = StatusBoard::new(StatusIdentity {
        peer_id: me.to_string(),
        swarm: settings.swarm_id.clone(),
        mode: settings.mode_name().to_owned(),
        codec: settings.codec.to_string(),
    });
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = match settings.metrics_listen {
        Some(addr) => {
            let shutdown = async move {
                let _ = http_stopped.await;
            };
            let server = observe::serve(
                addr,
                HttpLimits::default(),
                metrics.clone(),
                board.clone(),
                shutdown,
            )
            .await
            .context("cannot serve the metrics and status endpoints")?;
            tracing::info!(addr = %server.local_addr(), "serving /metrics, /status and /healthz");
            Some(server)
        }
        None => None,
    };
    let metrics_addr = server.as_ref().map(|s| s.local_addr().to_string());
    let progress = Progress::new(settings.progress, me.to_string(), settings.mode_name());
    progress.ready(&listen, len, initial_eval_loss, loss_floor, metrics_addr);
    tracing::info!(peer = %me, params = len, mode = settings.mode_name(), "ready");

    let mode = settings.mode;
    let mut peer = Peer {
        me,
        net: net.clone(),
        mailbox,
        outbox,
        events,
        worker,
        signals: Signals::install()?,
        progress,
        counters: Counters::default(),
        peers: BTreeMap::new(),
        model_fingerprint: fingerprint(&layout),
        optimizer,
        state,
        pending_optimizer: None,
        last_heard: HashMap::new(),
        next_heartbeat: tokio::time::Instant::now(),
        next_liveness: tokio::time::Instant::now(),
        redial: peer::Redial::default(),
        heartbeat_step: 0,
        heartbeat_samples: 0,
        metrics,
        board,
        learning_rate: 0.0,
        clock: Instant::now(),
        initial_eval_loss,
        last_eval_loss: initial_eval_loss,
        loss_floor,
        mode,
        rate: 0.0,
        settings,
    };
    let resumed_step = resume(&mut peer, &mut params);
    meet_the_swarm(&mut peer, resumed_step.unwrap_or(0)).await;
    let swarm_step = peer.swarm_step();
    // The swarm's state wins when it is newer than our checkpoint.
    let joining = swarm_step > resumed_step.unwrap_or(0);
    if joining {
        tracing::info!(swarm_step, "the swarm is training already: joining it");
    }

    peer.load_pending_optimizer().await;
    let outcome = match mode {
        AveragingMode::Sgp => {
            let founder = (!joining).then_some(params);
            let offset = swarm_step.max(resumed_step.unwrap_or(0));
            sgp::run(&mut peer, founder, len, offset).await
        }
        AveragingMode::Butterfly | AveragingMode::SyncRing | AveragingMode::LocalSgd => {
            if joining {
                join_from_swarm(&mut peer, &mut params, control_limits).await;
            }
            rounds::run(&mut peer, params, swarm_step).await
        }
    };
    let (final_params, finish) = match outcome {
        Ok(done) => done,
        Err(e) => {
            let losses = peer.eval_losses();
            peer.report_progress();
            peer.progress
                .done(&peer.counters, losses, "error", Some(format!("{e:#}")));
            let _ = net.shutdown().await;
            return Err(e);
        }
    };

    if let Some(path) = &peer.settings.export {
        export_safetensors(&layout, &final_params, path)
            .with_context(|| format!("cannot export the model to {}", path.display()))?;
        tracing::info!(path = %path.display(), "model exported");
    }
    peer.write_checkpoint(&final_params)?;
    peer.report_progress();
    let losses = peer.eval_losses();
    let exit = match finish {
        Finish::Finished => "finished",
        Finish::Signal => "signal",
    };
    peer.progress.done(&peer.counters, losses, exit, None);
    let _ = stop_http.send(());
    if let Some(server) = server {
        let _ = tokio::time::timeout(Duration::from_secs(2), server.stopped()).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), net.shutdown()).await;
    Ok(())
}

/// Waits (bounded) until the swarm is known well enough to start: `training.min_peers`
/// peers authorized (at most `training.start_timeout_ms`), and, when any peer is known,
/// until the swarm's step is known: a heartbeat interval and a half, then on until a peer
/// announces a step past `resumed_step` (the swarm is ahead: join it) or every known peer
/// has been heard, for at most [`NEWS_WAIT_INTERVALS`] intervals more.
///
/// A peer that decided on too little news would start as a founder with its checkpoint
/// (or the initial parameters) while the swarm is far ahead, and pull every peer back
/// towards them. So the meeting peer heartbeats too (step 0: it trains nothing yet), so
/// that peers meeting at the same time hear each other at once, and so that the swarm
/// notices when it dies before training (it is then given up as silent, and its stale
/// connection closed).
async fn meet_the_swarm(peer: &mut Peer, resumed_step: u64) {
    let min_peers = peer.settings.min_peers;
    let discovers = !peer.settings.net.bootstrap.is_empty() || peer.settings.net.mdns;
    if min_peers == 0 && !discovers {
        return;
    }
    let first_wait = if min_peers > 0 {
        peer.settings.start_timeout
    } else {
        FIRST_PEER_WAIT
    };
    let interval = peer.settings.heartbeat_interval;
    let until = tokio::time::Instant::now() + first_wait;
    let mut heard_until: Option<tokio::time::Instant> = None;
    loop {
        let now = tokio::time::Instant::now();
        if let Some(heard) = heard_until {
            let enough_news =
                peer.swarm_step() > resumed_step || peer.peers.values().all(Option::is_some);
            if (now >= heard && enough_news) || now >= heard + interval * NEWS_WAIT_INTERVALS {
                break;
            }
        } else if now >= until {
            break;
        }
        if now >= peer.next_maintenance() {
            peer.maintain();
        }
        let mut wake = (now + MEET_TICK).min(peer.next_maintenance());
        let checks = match heard_until {
            Some(heard) => [heard, heard + interval * NEWS_WAIT_INTERVALS],
            None => [until, until],
        };
        for check in checks.into_iter().filter(|&t| t > now) {
            wake = wake.min(check);
        }
        match tokio::time::timeout_at(wake, peer.events.recv()).await {
            // A bootstrap dial that failed (the peer was busy or unreachable) is retried.
            Err(_) => peer.redial_when_short(Instant::now()),
            Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => break,
            Ok(Err(_)) => {}
            Ok(Ok(event)) => {
                let _ = peer.note_event(&event);
                if heard_until.is_none() && peer.peers.len() >= min_peers.max(1) {
                    heard_until = Some(tokio::time::Instant::now() + interval * 3 / 2);
                }
            }
        }
    }
    if peer.peers.len() < min_peers {
        tracing::warn!(
            known = peer.peers.len(),
            wanted = min_peers,
            "training.start_timeout_ms passed before training.min_peers peers connected; starting anyway"
        );
    } else if peer.peers.values().all(Option::is_none) && !peer.peers.is_empty() {
        tracing::warn!(
            known = peer.peers.len(),
            "no heartbeat heard from any peer: the swarm's step is unknown, starting as if it had none"
        );
    }
}

/// A hash of the model's parameter layout: every tensor's name and shape, in order.
fn fingerprint(layout: &ParamLayout) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for tensor in layout.tensors() {
        hasher.update(tensor.name().as_bytes());
        hasher.update([0]);
        for &dim in tensor.shape() {
            hasher.update((dim as u64).to_le_bytes());
        }
        hasher.update([0xff]);
    }
    hasher.finalize().into()
}

/// Loads the newest valid checkpoint of this swarm and model into `params`, if there is
/// one; returns its step. Unusable files are skipped with a message naming each.
fn resume(peer: &mut Peer, params: &mut [f32]) -> Option<u64> {
    let store =
        match CheckpointStore::open(&peer.settings.checkpoint_dir, peer.settings.checkpoint_keep) {
            Ok(store) => store,
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the checkpoint folder; starting fresh");
                return None;
            }
        };
    let latest = match store.latest_valid() {
        Ok(latest) => latest,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the checkpoint folder; starting fresh");
            return None;
        }
    };
    for skipped in &latest.skipped {
        tracing::warn!(
            path = %skipped.path.display(),
            reason = %skipped.reason,
            "skipping a checkpoint that cannot be used"
        );
    }
    let (path, snapshot) = latest.found?;
    let tensor = snapshot.tensors.iter().find(|t| t.name == "params");
    let usable = snapshot.swarm_id == peer.settings.swarm_id
        && snapshot.model_fingerprint == peer.model_fingerprint
        && tensor.is_some_and(|t| t.data.len() == params.len());
    let Some(tensor) = tensor.filter(|_| usable) else {
        tracing::warn!(
            path = %path.display(),
            "the newest checkpoint is for another swarm or model; starting fresh"
        );
        return None;
    };
    params.copy_from_slice(&tensor.data);
    peer.counters.step = snapshot.step;
    peer.counters.samples = snapshot.samples;
    peer.pending_optimizer = peer::optimizer_of(&snapshot);
    tracing::info!(path = %path.display(), step = snapshot.step, "resumed from a checkpoint");
    Some(snapshot.step)
}

/// Downloads the state of the most advanced peers and starts from it; on failure the peer
/// starts from what it has (its checkpoint or the initial parameters) and says so.
async fn join_from_swarm(peer: &mut Peer, params: &mut [f32], limits: FrameLimits) {
    let mut servers: Vec<(u64, murmur_protocol::identity::PeerId)> = peer
        .peers
        .iter()
        .map(|(p, news)| (news.map_or(0, |n| n.last.step), *p))
        .collect();
    servers.sort_unstable_by(|a, b| b.cmp(a));
    let servers: Vec<_> = servers.into_iter().map(|(_, p)| p).collect();
    let snapshot_limits = SnapshotLimits {
        max_raw_len: (params.len() as u64 * 4 + (1 << 20)) * 4,
        max_tensors: 64,
    };
    let snapshot = match state_sync::download(&peer.net, &servers, &limits, &snapshot_limits).await
    {
        Ok(snapshot) => snapshot,
        Err(e) => {
            tracing::warn!(
                error = format!("{e:#}"),
                "cannot download the swarm's state; starting from local state"
            );
            return;
        }
    };
    let tensor = snapshot.tensors.iter().find(|t| t.name == "params");
    let fits = snapshot.swarm_id == peer.settings.swarm_id
        && snapshot.model_fingerprint == peer.model_fingerprint
        && tensor.is_some_and(|t| t.data.len() == params.len());
    match tensor.filter(|_| fits) {
        Some(tensor) => {
            params.copy_from_slice(&tensor.data);
            peer.pending_optimizer = peer::optimizer_of(&snapshot);
            tracing::info!(step = snapshot.step, "started from the swarm's state");
        }
        None => tracing::warn!("the downloaded state is for another swarm or model; ignoring it"),
    }
}

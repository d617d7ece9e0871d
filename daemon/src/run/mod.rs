//! `murmur run`: join the swarm, train, average, and leave cleanly.
//!
//! One process is one peer. The network task, the averaging engine's driver and the
//! daemon's loop run on a small tokio runtime; the model trains on its own thread
//! ([`worker`]). The daemon meets the swarm ([`meet`]), picks up a checkpoint or the
//! swarm's state, builds the engine of its mode (`murmur_gossip::engine::ModeEngine`, the
//! same type the simulator drives), hands it to the driver (`murmur_gossip::net::driver`),
//! and then only does the engine's work on the trainer and reports ([`train`]).

mod checkpointing;
mod device;
mod fault;
mod meet;
mod peer;
mod progress;
mod settings;
pub(crate) mod state_sync;
mod train;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use murmur_gossip::engine::{EngineSetup, Membership, ModeEngine, ModeSettings, Start};
use murmur_gossip::net::driver::{self, DriverConfig, EngineClock, EngineIo};
use murmur_gossip::net::exchange::{Mailbox, MailboxConfig, Outbox, OutboxConfig};
use murmur_gossip::net::{self, NetEvent, NetIdentity};
use murmur_trainer::{ParamLayout, PeerSampling, export_safetensors};
use sha2::{Digest as _, Sha256};

use crate::checkpoint::CheckpointStore;
use crate::observe::{self, HttpLimits, Metrics, MetricsOptions, StatusBoard, StatusIdentity};
use device::DeviceWatch;
pub(crate) use device::{TrainingDevice, open as open_device};
pub(crate) use fault::FAULT_VAR;
use murmur_protocol::frame::FrameLimits;
use murmur_protocol::message::AveragingMode;
use murmur_protocol::snapshot::SnapshotLimits;
use peer::{Peer, Signals, Traffic};
use progress::{Counters, Progress};
pub(crate) use settings::RunSettings;
use state_sync::{RoundCadence, StateCell};
use worker::{SharedOptimizer, Worker};

/// Why a peer stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// It ran its step budget.
    Finished,
    /// SIGINT or SIGTERM.
    Signal,
}

/// How long a finishing engine may take to hand off its mass (SGP) or finish its round.
const LEAVE_BOUND: Duration = Duration::from_secs(4);

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
    let mut events = net.subscribe();
    let mailbox = Mailbox::spawn(inbound.tensor_streams, MailboxConfig::default());
    let outbox = Outbox::new(net.clone(), OutboxConfig::default());
    let state = StateCell::in_dir(settings.checkpoint_dir.clone());
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
        shard: settings.task.data.shard,
        shards: settings.task.data.shards,
    };
    let mut task = settings
        .task
        .build(sampling)
        .context("cannot build the training task")?;
    task.micro_batches = settings.passes.micro_batches;
    if settings.passes.recompute_activations {
        task.model.set_recompute_activations(true);
        tracing::info!(
            "a pass keeps each block's input only and computes the block again in its \
             backward pass (training.recompute_activations)"
        );
    }
    let device = settings.device.device.clone();
    task.model
        .set_device(device)
        .context("cannot move the model to the training device")?;
    let mut params = task.model.init(sampling.swarm_seed);
    let initial_eval_loss = task.evaluate(&mut params).context("initial eval")?;
    let loss_floor = task.dataset.loss_floor();
    let layout = task.model.layout().clone();
    let len = params.len();
    // `config check` did this where the config alone gives the model's size; with IDX
    // files the size is known only now.
    let frame = crate::config::frames::largest_frame_of(&settings.mode, settings.codec, len);
    if let Err((key, message)) = crate::config::frames::check(frame, settings.net.max_frame_payload)
    {
        anyhow::bail!("{key}: {message}");
    }
    if let ModeSettings::Sgp(sgp) = &settings.mode
        && let Some(each_way) = sgp.references_each_way(len)
    {
        tracing::info!(
            each_way,
            vector_bytes = len * 4,
            max_reference_bytes = sgp.max_reference_bytes,
            "SGP edge references kept each way: at most {each_way}"
        );
    }
    let optimizer = SharedOptimizer::default();
    let fault = fault::Fault::from_env()?;
    if let Some(fault) = fault {
        tracing::warn!(
            ?fault,
            "{} is set: this peer sends corrupted contributions (a test of the defences)",
            fault::FAULT_VAR
        );
    }

    let listen: Vec<String> = net
        .listen_addrs()
        .await?
        .iter()
        .map(|a| format!("{a}/p2p/{me}"))
        .collect();
    let metrics = Metrics::new(MetricsOptions {
        gpu: settings.device.is_gpu(),
        device: settings.device.kind,
    })?;
    let watch = DeviceWatch::new(&settings.device, metrics.gpu.clone());
    let worker = Worker::spawn(
        task,
        len,
        settings.pace(),
        Arc::clone(&optimizer),
        fault,
        watch,
    )?;
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
        device: settings.device.label(),
    });
    metrics.set_build_info(&board.identity());
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = match settings.metrics_listen {
        Some(addr) => {
            let shutdown = async move {
                let _ = http_stopped.await;
            };
            let server = observe::serve(
                addr,
                HttpLimits::default(),
                settings.metrics_control_token.clone(),
                metrics.clone(),
                board.clone(),
                shutdown,
            )
            .await
            .with_context(|| {
                format!(
                    "cannot serve the metrics and status endpoints on {addr} (metrics.listen; \
                     another peer on this host may hold the port: give each its own)"
                )
            })?;
            tracing::info!(addr = %server.local_addr(), "serving /metrics, /status and /healthz");
            Some(server)
        }
        None => None,
    };
    let metrics_addr = server.as_ref().map(|s| s.local_addr().to_string());
    let progress = Progress::new(
        settings.progress,
        settings.status_lines,
        me.to_string(),
        settings.mode_name(),
    );
    progress.ready(
        &listen,
        len,
        initial_eval_loss,
        loss_floor,
        metrics_addr,
        &settings.device.label(),
    );
    tracing::info!(
        peer = %me,
        params = len,
        mode = settings.mode_name(),
        device = %settings.device.kind,
        "ready; other peers can bootstrap from {}",
        if listen.is_empty() { "nowhere (no listen address)".to_owned() } else { listen.join(" ") }
    );

    let traffic = Traffic::new(metrics.clone());
    let interval = settings.heartbeat_interval;
    let clock = EngineClock::start();
    let mut membership = Membership::new(me, interval, clock.now());
    let mut status_events = net.subscribe();
    let mut peer = Peer {
        net: net.clone(),
        worker,
        signals: Signals::install()?,
        progress,
        counters: Counters::default(),
        model_fingerprint: fingerprint(&layout),
        optimizer,
        state,
        state_skipped: false,
        round_cadence: RoundCadence::default(),
        pending_optimizer: None,
        metrics,
        board,
        traffic,
        learning_rate: 0.0,
        initial_eval_loss,
        last_eval_loss: initial_eval_loss,
        loss_floor,
        rate: 0.0,
        checkpoints: checkpointing::CheckpointWriter::default(),
        settings,
    };
    let resumed_step = resume(&mut peer, &mut params);
    let setup = EngineSetup {
        codec: peer.settings.codec,
        error_feedback: peer.settings.error_feedback,
        size_parts_by_bandwidth: true,
        batch_size: peer.settings.task.data.batch_size as u64,
        upload_cap: peer.settings.net.max_upload_bytes_per_s,
        accepts_connections: !peer.settings.net.listen_addrs.is_empty(),
        wall_ms_at_zero: clock.wall_ms_at_zero,
        seed: PeerSampling::seed_from_id(&me.to_bytes()) ^ clock.wall_ms_at_zero,
        max_share_piece: crate::config::frames::share_piece_bytes(
            peer.settings.net.max_frame_payload,
        ),
    };
    // The round modes' memory is made before this peer meets the swarm: a first round
    // that faulted in fresh pages would hold the others waiting on it (`RoundBuffers::
    // resident`). Parts are sized for full groups; a smaller group's grow in its round.
    let round_memory = peer
        .settings
        .mode
        .round_memory(len, &setup, usize::MAX)
        .context("cannot allocate the averaging rounds' memory")?;
    let met = meet::meet_the_swarm(
        &mut peer,
        &mut events,
        &mut membership,
        &clock,
        resumed_step.unwrap_or(0),
    )
    .await;
    if met == meet::Met::Stopped {
        tracing::info!("stop requested before training started: leaving");
        stopped_untrained(&mut peer, membership.len(), stop_http, &net).await;
        return Ok(());
    }
    let swarm_step = membership.swarm_step();
    let mode = peer.settings.mode();
    // The swarm's state wins when it is newer than our checkpoint. SGP's heartbeats count
    // local steps, as checkpoints do; the round modes' count rounds, which a checkpoint
    // does not know: a swarm past its first round is taken to be ahead.
    // A solo peer (`none`) never takes the swarm's state: it is the control.
    let joining = match mode {
        AveragingMode::Sgp => swarm_step > resumed_step.unwrap_or(0),
        AveragingMode::Solo => false,
        _ => swarm_step > 0,
    };
    if joining {
        tracing::info!(swarm_step, "the swarm is training already: joining it");
    }
    // An SGP joiner starts with no mass and takes the swarm's through shares; the other
    // modes download the swarm's state.
    let downloaded = joining
        && mode != AveragingMode::Sgp
        && join_from_swarm(
            &mut peer,
            &mut events,
            &mut membership,
            &clock,
            &mut params,
            control_limits,
        )
        .await;
    peer.load_pending_optimizer().await;
    if downloaded {
        // What the joiner starts from, as every peer's eval set scores it: the servers'
        // own evals of the same round's state give the same loss.
        let (evaluated, loss) = train::evaluate(&mut peer, params).await?;
        params = evaluated;
        tracing::info!(eval_loss = loss, "the swarm's state evaluated");
        peer.record_eval(peer.counters.step, loss);
    }

    // SGP's step is the local step a checkpoint counts too; the round modes' round is the
    // optimizer (or outer) step, which only the swarm's heartbeats tell.
    let round = match mode {
        AveragingMode::Sgp => swarm_step.max(resumed_step.unwrap_or(0)),
        AveragingMode::Solo => resumed_step.unwrap_or(0),
        _ => swarm_step,
    };
    let start = Start {
        params: (!(joining && mode == AveragingMode::Sgp)).then_some(params),
        len,
        round,
        local_steps: peer.counters.step,
        round_memory,
    };
    let engine = ModeEngine::new(&peer.settings.mode, &setup, membership, start)
        .context("cannot start the averaging engine")?;
    let io = EngineIo {
        net: net.clone(),
        mailbox,
        outbox,
        events,
    };
    let config = DriverConfig {
        mode,
        bootstrap: peer.settings.net.bootstrap.clone(),
        expected_peers: peer.settings.min_peers,
        leave_bound: LEAVE_BOUND,
    };
    let observer: Arc<dyn driver::ParcelObserver> = peer.traffic.clone();
    let mut handle = driver::spawn(engine, io, clock, config, Some(observer));

    let outcome = train::train(&mut peer, &mut handle, &mut status_events).await;
    let (final_params, finish) = match outcome {
        Ok(done) => done,
        Err(e) => {
            let losses = peer.eval_losses();
            peer.report_progress(handle.status().peers);
            peer.progress.done(
                &peer.counters,
                losses,
                "error",
                Some(crate::error_text::describe(&e)),
            );
            let _ = net.shutdown().await;
            return Err(e);
        }
    };
    let Some(final_params) = final_params else {
        // An SGP joiner stopped before the swarm's first share reached it: it holds no
        // parameters of the swarm, so it has nothing to evaluate or save.
        if finish == Finish::Signal && mode == AveragingMode::Sgp {
            tracing::info!("stopped before the swarm's first share arrived: nothing to save");
            stopped_untrained(&mut peer, handle.status().peers, stop_http, &net).await;
            return Ok(());
        }
        anyhow::bail!("the averaging engine stopped without its final parameters");
    };
    let (final_params, loss) = train::evaluate(&mut peer, final_params).await?;
    peer.last_eval_loss = loss;

    if let Some(path) = &peer.settings.export {
        export_safetensors(&layout, &final_params, path)
            .with_context(|| format!("cannot export the model to {}", path.display()))?;
        tracing::info!(path = %path.display(), "model exported");
    }
    peer.write_checkpoint(&final_params)?;
    peer.report_progress(handle.status().peers);
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

/// Ends a peer stopped before it held parameters worth saving: its `done` line says
/// `signal`, and nothing is evaluated or checkpointed.
async fn stopped_untrained(
    peer: &mut Peer,
    peers: usize,
    stop_http: tokio::sync::oneshot::Sender<()>,
    net: &net::NetHandle,
) {
    peer.report_progress(peers);
    let losses = peer.eval_losses();
    peer.progress.done(&peer.counters, losses, "signal", None);
    let _ = stop_http.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), net.shutdown()).await;
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
/// one; returns its step. Unusable files are skipped with a message naming each, and moved
/// aside.
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
    let mut set_aside = Vec::with_capacity(latest.skipped.len());
    for skipped in &latest.skipped {
        tracing::warn!(
            path = %skipped.path.display(),
            reason = %skipped.reason,
            "skipping a checkpoint that cannot be used"
        );
        // Out of the way, so that it never stands in for a valid checkpoint in `keep`.
        match store.set_aside(&skipped.path, &skipped.reason) {
            Ok(moved) => set_aside.push(moved),
            Err(e) => tracing::warn!(error = %e, "corrupt checkpoint not moved aside"),
        }
    }
    peer.report_set_aside(&set_aside);
    let (path, mut snapshot) = latest.found?;
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
    peer.pending_optimizer = checkpointing::optimizer_of(&mut snapshot);
    tracing::info!(path = %path.display(), step = snapshot.step, "resumed from a checkpoint");
    Some(snapshot.step)
}

/// Downloads the state of the most advanced peers and starts from it; on failure the peer
/// starts from what it has (its checkpoint or the initial parameters) and says so. Whether
/// it took the swarm's state.
async fn join_from_swarm(
    peer: &mut Peer,
    events: &mut tokio::sync::broadcast::Receiver<NetEvent>,
    membership: &mut Membership<murmur_protocol::identity::PeerId>,
    clock: &EngineClock,
    params: &mut [f32],
    limits: FrameLimits,
) -> bool {
    let mut servers: Vec<(u64, murmur_protocol::identity::PeerId)> = membership
        .peers()
        .map(|p| (membership.news(&p).map_or(0, |n| n.step), p))
        .collect();
    servers.sort_unstable_by(|a, b| b.cmp(a));
    let servers: Vec<_> = servers.into_iter().map(|(_, p)| p).collect();
    let snapshot_limits = SnapshotLimits {
        max_raw_len: (params.len() as u64 * 4 + (1 << 20)) * 4,
        max_tensors: 64,
    };
    let net = peer.net.clone();
    let dir = peer.settings.checkpoint_dir.clone();
    // A task of its own: the download writes each range to its file as it comes (up to
    // 8 MiB at a time), and a write the kernel holds up must not hold up the heartbeats
    // `keep_in_touch` sends meanwhile, or the servers give this peer up as silent.
    let download = tokio::spawn(async move {
        state_sync::download(&net, &servers, &dir, &limits, &snapshot_limits).await
    });
    let download = async move {
        download
            .await
            .map_err(|e| anyhow::anyhow!("the state download stopped: {e}"))?
    };
    let mut snapshot = match meet::keep_in_touch(peer, events, membership, clock, download).await {
        Ok(downloaded) => downloaded.snapshot,
        Err(e) => {
            tracing::warn!(
                error = crate::error_text::describe(&e),
                "cannot download the swarm's state; starting from local state"
            );
            return false;
        }
    };
    let tensor = snapshot.tensors.iter().find(|t| t.name == "params");
    let fits = snapshot.swarm_id == peer.settings.swarm_id
        && snapshot.model_fingerprint == peer.model_fingerprint
        && tensor.is_some_and(|t| t.data.len() == params.len());
    match tensor.filter(|_| fits) {
        Some(tensor) => {
            params.copy_from_slice(&tensor.data);
            peer.pending_optimizer = checkpointing::optimizer_of(&mut snapshot);
            tracing::info!(step = snapshot.step, "started from the swarm's state");
            true
        }
        None => {
            tracing::warn!("the downloaded state is for another swarm or model; ignoring it");
            false
        }
    }
}

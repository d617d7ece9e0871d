//! `murmur bench metrics`: what the run loop's metric and status updates cost per training
//! step, against the same calls on [`Metrics::disabled`] and against a real step of the
//! default task, all measured in one run.
//!
//! One "step's worth" of updates is what the run loop does around one local step, taken
//! generously: the step itself (`Peer::count_step`), one finished averaging round or push-sum
//! share (`Peer::record_round`, `Peer::record_share`), one evaluation (`Peer::record_eval`),
//! one heartbeat heard (`Peer::note_event`) and the push-sum weight. A real peer finishes
//! fewer rounds, evaluations and heartbeats than steps, so the ratio printed is an upper
//! bound. Each variant runs the same calls in the same order as `daemon/src/run/peer.rs`.
//!
//! The "with collection" variant updates registered metrics and the `/status` board; the
//! "without" variant updates [`Metrics::disabled`] and no board (the board has no switch, so
//! its cost is counted as part of collection). Serving `/metrics` is timed on its own: it
//! runs on a scrape, not on a step.

use std::hint::black_box;
use std::time::Duration;

use anyhow::{Context, bail};
use murmur_protocol::identity::{Keypair, PeerId};
use murmur_protocol::message::{AveragingMode, HeartbeatBody};
use murmur_trainer::{Batch, DataShape, PeerSampling, TaskPreset};
use serde::Serialize;

use super::timing::median_time;
use crate::cli::MetricsBenchArgs;
use crate::observe::{
    Metrics, MetricsOptions, RoundOutcome, RoundSummary, StatusBoard, StatusIdentity,
};

/// The result, as printed with `--json`.
#[derive(Debug, Serialize)]
struct MetricsReport {
    /// The task whose step is timed.
    task: &'static str,
    /// Parameters of its model.
    params: usize,
    /// Samples per step.
    batch_size: usize,
    /// Median wall time of one training step.
    step_ms: f64,
    /// Median cost of one step's worth of updates with metrics and status collected.
    collected_ns_per_step: f64,
    /// The same calls on disabled metrics and no status board.
    disabled_ns_per_step: f64,
    /// `collected − disabled`: what collection adds to a step.
    overhead_ns_per_step: f64,
    /// `overhead / step`, a fraction (0.01 is 1 %).
    overhead_ratio: f64,
    /// Median time to encode one `/metrics` page (paid per scrape, not per step).
    scrape_us: f64,
    /// Bytes of that page.
    scrape_bytes: usize,
    /// Timed repetitions behind each median.
    repeats: usize,
    /// Step's worth of updates per timed repetition.
    updates: usize,
    /// Training steps per timed repetition.
    steps: usize,
}

/// The objects one peer's run loop updates, as `daemon/src/run/mod.rs` builds them.
struct Collection {
    metrics: Metrics,
    board: Option<StatusBoard>,
    mode: AveragingMode,
    neighbour: PeerId,
    heartbeat: HeartbeatBody,
    learning_rate: f32,
    rate: f64,
    step: u64,
    samples: u64,
}

impl Collection {
    fn new(metrics: Metrics, with_board: bool) -> Collection {
        let me = Keypair::from_seed([1; 32]).peer_id();
        let board = with_board.then(|| {
            StatusBoard::new(StatusIdentity {
                peer_id: me.to_string(),
                swarm: "bench".into(),
                mode: AveragingMode::Sgp.name().into(),
                codec: "f32".into(),
                device: "cpu".into(),
            })
        });
        Collection {
            metrics,
            board,
            mode: AveragingMode::Sgp,
            neighbour: Keypair::from_seed([2; 32]).peer_id(),
            heartbeat: HeartbeatBody {
                step: 0,
                timestamp_ms: 0,
                samples_per_s: 100.0,
                upload_bytes_per_s: 1 << 20,
                download_bytes_per_s: 1 << 20,
                mode: AveragingMode::Sgp,
                samples_accumulated: 0,
                looking_round: 0,
                looking_until_ms: 0,
                incarnation: 1,
            },
            learning_rate: 1e-3,
            rate: 0.0,
            step: 0,
            samples: 0,
        }
    }

    /// One step's worth of the run loop's updates (see the module docs).
    fn one_step(&mut self, samples: u64, loss: f32, took: Duration) {
        // Peer::count_step
        self.step += 1;
        self.samples += samples;
        let rate = samples as f64 / took.as_secs_f64().max(1e-6);
        self.rate = if self.rate == 0.0 {
            rate
        } else {
            0.8 * self.rate + 0.2 * rate
        };
        self.metrics.training.record_step(
            self.step,
            samples,
            f64::from(loss),
            f64::from(self.learning_rate),
        );
        self.metrics.training.set_samples_per_second(self.rate);
        if let Some(board) = &self.board {
            board.record_step(self.step, self.samples, f64::from(loss), self.rate);
        }
        // Peer::record_share (SGP) and Peer::record_round (the collectives) report alike.
        let round = RoundSummary {
            mode: self.mode,
            outcome: RoundOutcome::Complete,
            duration: took,
            coverage: 1.0,
            group_size: 2,
            out_peer: Some(self.neighbour),
            stragglers_dropped: 0,
            parts_timed_out: 0,
        };
        self.metrics.averaging.record_round(&round);
        if let Some(board) = &self.board {
            board.record_round(&round);
        }
        self.metrics.averaging.set_push_sum_weight(0.5);
        // Peer::record_eval
        self.metrics.training.set_eval_loss(f64::from(loss));
        if let Some(board) = &self.board {
            board.set_eval_loss(f64::from(loss));
        }
        // Peer::note_event for a heartbeat
        self.heartbeat.step = self.step;
        if let Some(board) = &self.board {
            board.record_heartbeat(self.neighbour, &self.heartbeat);
        }
        self.metrics.network.set_connected_peers(2);
    }
}

/// Median nanoseconds of one step's worth of updates on `collection`.
fn updates_ns(collection: &mut Collection, args: &MetricsBenchArgs) -> f64 {
    let took = Duration::from_millis(5);
    let total = median_time(args.repeats, || {
        for i in 0..args.updates {
            collection.one_step(black_box(16), black_box(i as f32 * 1e-6), took);
        }
    });
    total.as_secs_f64() * 1e9 / args.updates as f64
}

pub(crate) fn run(args: &MetricsBenchArgs) -> anyhow::Result<()> {
    if args.repeats == 0 || args.updates == 0 || args.steps == 0 {
        bail!("--repeats, --updates and --steps must each be at least 1");
    }
    let (step, params, batch_size) = step_time(args)?;

    let metrics = Metrics::new(MetricsOptions::default()).context("registering the metrics")?;
    let mut collected = Collection::new(metrics.clone(), true);
    let mut disabled = Collection::new(Metrics::disabled(), false);
    let collected_ns = updates_ns(&mut collected, args);
    let disabled_ns = updates_ns(&mut disabled, args);

    let mut page = Vec::with_capacity(64 * 1024);
    let mut encode_failed = None;
    let scrape = median_time(args.repeats, || {
        page.clear();
        if let Err(e) = metrics.encode_text(&mut page) {
            encode_failed = Some(e);
        }
    });
    if let Some(e) = encode_failed {
        return Err(e).context("encoding /metrics");
    }

    let overhead_ns = (collected_ns - disabled_ns).max(0.0);
    let report = MetricsReport {
        task: "default local task (TaskPreset::default_local)",
        params,
        batch_size,
        step_ms: step.as_secs_f64() * 1e3,
        collected_ns_per_step: collected_ns,
        disabled_ns_per_step: disabled_ns,
        overhead_ns_per_step: overhead_ns,
        overhead_ratio: overhead_ns / (step.as_secs_f64() * 1e9),
        scrape_us: scrape.as_secs_f64() * 1e6,
        scrape_bytes: page.len(),
        repeats: args.repeats,
        updates: args.updates,
        steps: args.steps,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_text(&report);
    }
    Ok(())
}

/// Median wall time of one local step of the default task, built and stepped as the run
/// loop's trainer thread does; also its parameter count and batch size.
fn step_time(args: &MetricsBenchArgs) -> anyhow::Result<(Duration, usize, usize)> {
    let config = TaskPreset::default_local();
    let sampling = PeerSampling {
        swarm_seed: 1,
        peer_seed: 2,
        shard: 0,
        shards: 1,
    };
    let mut task = config
        .build(sampling)
        .context("building the default task")?;
    let mut params = task.model.init(sampling.swarm_seed);
    let mut grad = vec![0.0; params.len()];
    let rows = task.batch_size;
    let mut batch = match task.dataset.shape() {
        DataShape::Tokens { context, .. } => Batch::tokens_with_capacity(rows, context),
        DataShape::Features { width, .. } => Batch::features_with_capacity(rows, width),
    };
    let mut step = 0u64;
    let mut failed = None;
    let swarm_batch = rows as u64;
    let median_of_repeat = median_time(args.repeats, || {
        for _ in 0..args.steps {
            step += 1;
            if let Err(e) = task.local_step(&mut params, &mut batch, &mut grad, step, swarm_batch) {
                failed = Some(e);
            }
        }
    });
    if let Some(e) = failed {
        return Err(e).context("a training step");
    }
    let per_step = median_of_repeat / u32::try_from(args.steps).unwrap_or(u32::MAX);
    Ok((per_step, params.len(), rows))
}

fn print_text(r: &MetricsReport) {
    println!(
        "metrics cost per training step (medians of {} repeats)",
        r.repeats
    );
    println!(
        "  one step of the {}: {:.3} ms ({} params, batch {})",
        r.task, r.step_ms, r.params, r.batch_size
    );
    println!(
        "  a step's updates, metrics and status collected: {:.0} ns",
        r.collected_ns_per_step
    );
    println!(
        "  the same calls, metrics disabled:               {:.0} ns",
        r.disabled_ns_per_step
    );
    println!(
        "  overhead: {:.0} ns per step = {:.4} % of a step (budget 1 %)",
        r.overhead_ns_per_step,
        r.overhead_ratio * 100.0
    );
    println!(
        "  one /metrics scrape (encode {} bytes): {:.0} µs, paid per scrape, not per step",
        r.scrape_bytes, r.scrape_us
    );
}

//! `murmur bench train`: one peer's training throughput on one device, full local steps
//! (next batch, forward, backward, optimizer update) of the built-in GPT at a chosen size.
//!
//! Run it twice with the same model, `--device cuda` and `--device cpu --threads 1`, to put
//! a GPU peer's tokens per second next to one CPU core's. A GPU step copies the parameters
//! to the device and the gradient back (the daemon averages host buffers), so those copies
//! are part of what is measured.

use std::time::Duration;

use anyhow::Context as _;
use murmur_trainer::{
    GptConfig, ModelConfig, PeerSampling, TaskConfig, TaskPreset, TrainerDevice, cpu_threads,
};
use serde::Serialize;

use super::timing::median_time;
use crate::cli::{BenchDevice, TrainBenchArgs};
use crate::input_error::BadInput;

/// What one run measured.
#[derive(Debug, Serialize)]
struct TrainReport {
    /// `cpu` or `cuda:0`.
    device: String,
    /// candle's CPU threads (the optimizer and the data run on the host either way).
    cpu_threads: usize,
    params: usize,
    layers: usize,
    width: usize,
    heads: usize,
    context: usize,
    batch: usize,
    /// Timed steps; one more ran first, untimed.
    steps: usize,
    /// Median wall time of one step.
    step_ms: f64,
    /// Tokens per second: `batch × context` per step.
    tokens_per_s: f64,
    /// Sequences per second.
    samples_per_s: f64,
    /// Training loss of the first and the last step (the model does learn).
    first_loss: f32,
    last_loss: f32,
}

pub(crate) fn run(args: &TrainBenchArgs) -> anyhow::Result<()> {
    // SAFETY: `murmur bench train` runs on the main thread straight from `main`, before
    // anything in this process has started a thread.
    unsafe { murmur_trainer::set_cpu_threads(args.threads) };
    let config = task_config(args);
    config
        .validate()
        .map_err(|e| BadInput(format!("bench train: {e}")))?;
    let sampling = PeerSampling {
        swarm_seed: 42,
        peer_seed: 1,
        shard: 0,
        shards: 1,
    };
    let mut task = config
        .build(sampling)
        .context("cannot build the training task")?;
    let device = match args.device {
        BenchDevice::Cpu => TrainerDevice::Cpu,
        BenchDevice::Cuda => TrainerDevice::Cuda(0),
    };
    let opened = device
        .open()
        .map_err(|e| BadInput(format!("--device {device}: {e}")))?;
    task.model
        .set_device(opened)
        .context("cannot move the model to the device")?;

    let mut params = task.model.init(sampling.swarm_seed);
    let mut grad = vec![0.0; params.len()];
    let mut batch = task.dataset.empty_batch(task.batch_size);
    let mut losses = Vec::with_capacity(args.steps + 1);
    let mut failure = None;
    let mut step = 0u64;
    let step_time = median_time(args.steps, || {
        if failure.is_some() {
            return;
        }
        match task.local_step(&mut params, &mut batch, &mut grad, step, 1) {
            Ok(loss) => losses.push(loss),
            Err(e) => failure = Some(e),
        }
        step += 1;
    });
    if let Some(e) = failure {
        return Err(e).context("a training step failed");
    }
    let report = report(args, device, params.len(), step_time, &losses);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_text(&report);
    }
    Ok(())
}

/// The built-in task (a GPT on synthetic Markov text) at the size the flags ask for.
fn task_config(args: &TrainBenchArgs) -> TaskConfig {
    let mut config = TaskPreset::MarkovGpt.config();
    config.model = ModelConfig::Gpt(GptConfig {
        layers: args.layers,
        heads: args.heads,
        width: args.width,
        context: args.context,
        vocab: None,
        mlp_ratio: 4,
    });
    config.data.batch_size = args.batch;
    // The eval set is built with the task but never used here.
    config.data.eval_samples = 1;
    config
}

fn report(
    args: &TrainBenchArgs,
    device: TrainerDevice,
    params: usize,
    step_time: Duration,
    losses: &[f32],
) -> TrainReport {
    let seconds = step_time.as_secs_f64();
    let tokens_per_step = (args.batch * args.context) as f64;
    TrainReport {
        device: device.to_string(),
        cpu_threads: cpu_threads(),
        params,
        layers: args.layers,
        width: args.width,
        heads: args.heads,
        context: args.context,
        batch: args.batch,
        steps: args.steps,
        step_ms: seconds * 1e3,
        tokens_per_s: tokens_per_step / seconds,
        samples_per_s: args.batch as f64 / seconds,
        first_loss: losses.first().copied().unwrap_or(f32::NAN),
        last_loss: losses.last().copied().unwrap_or(f32::NAN),
    }
}

fn print_text(r: &TrainReport) {
    println!(
        "model   gpt: {} layers, width {}, {} heads, context {}, batch {}: {:.1} M parameters",
        r.layers,
        r.width,
        r.heads,
        r.context,
        r.batch,
        r.params as f64 / 1e6
    );
    println!("device  {} ({} CPU threads)", r.device, r.cpu_threads);
    println!(
        "step    {:.2} ms (median of {} steps after one untimed)",
        r.step_ms, r.steps
    );
    println!(
        "speed   {:.0} tokens/s, {:.1} samples/s",
        r.tokens_per_s, r.samples_per_s
    );
    println!("loss    {:.4} -> {:.4}", r.first_loss, r.last_loss);
}

//! Trains one peer of the default `murmur local` task and prints speed and eval loss.
//!
//! `cargo run --release -p murmur-trainer --example default_task -- [steps] [eval_every]
//! [width] [batch] [peak_lr]` (set `RAYON_NUM_THREADS=1` to match a peer sharing its cores).
//! The schedule is stretched over `steps`; the optional width, batch and peak learning rate
//! override the preset's, to compare sizes.

use std::time::Instant;

use murmur_trainer::{PeerSampling, TaskPreset, cpu_threads};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut config = TaskPreset::default_local();
    let steps: u64 = match args.next() {
        Some(s) => s.parse()?,
        None => config.schedule.total_steps,
    };
    config.schedule.total_steps = steps;
    config.schedule.warmup_steps = config.schedule.warmup_steps.min(steps);
    let eval_every: u64 = match args.next() {
        Some(s) => s.parse()?,
        None => 100,
    };
    if let Some(width) = args.next()
        && let murmur_trainer::ModelConfig::Gpt(gpt) = &mut config.model
    {
        gpt.width = width.parse()?;
    }
    if let Some(batch) = args.next() {
        config.data.batch_size = batch.parse()?;
    }
    if let Some(lr) = args.next() {
        config.schedule.peak_lr = lr.parse()?;
    }
    let sampling = PeerSampling {
        swarm_seed: 42,
        peer_seed: 1,
        shard: 0,
        shards: 1,
    };
    let mut task = config.build(sampling)?;
    let mut params = task.model.init(sampling.swarm_seed);
    let mut grad = vec![0.0; params.len()];
    let mut batch = task.dataset.empty_batch(task.batch_size);
    let floor = task.dataset.loss_floor().unwrap_or(0.0);
    let initial = task.evaluate(&params)?;
    println!(
        "params {}  cpu threads {}  floor {floor:.4}  initial eval {initial:.4}",
        params.len(),
        cpu_threads()
    );
    let started = Instant::now();
    let mut train_time = 0.0;
    let mut last = Instant::now();
    for step in 0..steps {
        let loss = task.local_step(&mut params, &mut batch, &mut grad, step, 16)?;
        if (step + 1) % eval_every == 0 || step + 1 == steps {
            train_time += last.elapsed().as_secs_f64();
            let eval_started = Instant::now();
            let eval = task.evaluate(&params)?;
            let progress = (initial - eval) / (initial - floor);
            println!(
                "step {:5}  train {loss:.4}  eval {eval:.4}  progress {:5.1}%  {:.1} steps/s  eval {:.0} ms  wall {:.1}s",
                step + 1,
                100.0 * progress,
                (step + 1) as f64 / train_time,
                eval_started.elapsed().as_secs_f64() * 1e3,
                started.elapsed().as_secs_f64()
            );
            last = Instant::now();
        }
    }
    Ok(())
}

//! `murmur run --config FILE`: load the config, then run the peer.

use std::path::Path;
use std::time::Duration;

use crate::config::{self, LoadedConfig};
use crate::input_error::BadInput;
use crate::observe;
use crate::run::{self, LocalSgdSettings, RunSettings};

/// Loads `path` (a bad config exits 2) and runs the peer it describes.
pub(crate) fn run(path: &Path, progress: bool) -> anyhow::Result<()> {
    let loaded = config::load(path).map_err(|e| BadInput(e.to_string()))?;
    let format = match loaded.log.format {
        config::schema::LogFormat::Human => observe::LogFormat::Human,
        config::schema::LogFormat::Json => observe::LogFormat::Json,
    };
    observe::init_logging(&loaded.log.level, format).map_err(|e| BadInput(e.to_string()))?;
    let threads = loaded.volunteer.cpu_threads;
    if threads > 0 {
        // SAFETY: `main` calls this before anything has started a thread.
        unsafe { murmur_trainer::set_cpu_threads(threads) };
    }
    run::run(settings(loaded, progress))
}

fn settings(c: LoadedConfig, progress: bool) -> RunSettings {
    RunSettings {
        keypair: c.keypair,
        swarm_id: c.swarm.to_string(),
        net: c.net,
        task: c.task,
        mode: wire_mode(c.averaging.mode),
        codec: c.averaging.codec,
        sgp: c.averaging.sgp,
        butterfly: c.averaging.butterfly,
        local_sgd: LocalSgdSettings {
            local_steps: u64::from(c.averaging.local_sgd.local_steps),
            outer_lr: c.averaging.local_sgd.outer_lr,
            outer_momentum: c.averaging.local_sgd.outer_momentum,
        },
        ring_timeout: Duration::from_millis(c.averaging.ring.timeout_ms),
        target_batch: c.averaging.target_batch,
        heartbeat_interval: c.averaging.heartbeat_interval,
        steps: c.training.steps,
        eval_every: c.training.eval_every_steps,
        export: c.training.export,
        slowdown: c.training.slowdown,
        synthetic_step: c.training.synthetic_step,
        min_peers: c.training.min_peers,
        start_timeout: c.training.start_timeout,
        checkpoint_dir: c.checkpoint.dir,
        checkpoint_every: c.checkpoint.every_steps,
        checkpoint_keep: c.checkpoint.keep,
        progress,
        metrics_listen: c.metrics_listen,
    }
}

/// The config's mode as the heartbeat names it.
fn wire_mode(mode: config::AveragingMode) -> murmur_protocol::message::AveragingMode {
    use murmur_protocol::message::AveragingMode as Wire;
    match mode {
        config::AveragingMode::Sgp => Wire::Sgp,
        config::AveragingMode::Butterfly => Wire::Butterfly,
        config::AveragingMode::LocalSgd => Wire::LocalSgd,
        config::AveragingMode::SyncRing => Wire::SyncRing,
    }
}

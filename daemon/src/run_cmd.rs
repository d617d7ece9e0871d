//! `murmur run --config FILE`: load the config, open the training device, then run the peer.

use std::path::Path;

use crate::config::{self, LoadedConfig};
use crate::input_error::BadInput;
use crate::instance_lock::InstanceLock;
use crate::observe;
use crate::run::{self, RunSettings, TrainingDevice};

/// Loads `path` (a bad config exits 2) and runs the peer it describes.
pub(crate) fn run(path: &Path, progress: bool, status_lines: bool) -> anyhow::Result<()> {
    let loaded = config::load(path).map_err(|e| BadInput(e.to_string()))?;
    // Held until the run ends: a second run on this key or checkpoint folder exits 2.
    let _lock = InstanceLock::acquire(&loaded.key_file, &loaded.checkpoint.dir)
        .map_err(|e| BadInput(e.to_string()))?;
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
    // Before the network starts: a GPU the config demands but cannot have exits 2 here.
    let device = run::open_device(loaded.training.device).map_err(BadInput::from)?;
    run::run(settings(loaded, device, progress, status_lines))
}

fn settings(
    c: LoadedConfig,
    device: TrainingDevice,
    progress: bool,
    status_lines: bool,
) -> RunSettings {
    RunSettings {
        keypair: c.keypair,
        swarm_id: c.swarm.to_string(),
        net: c.net,
        task: c.task,
        device,
        mode: c.averaging.mode,
        codec: c.averaging.codec,
        error_feedback: c.averaging.error_feedback,
        heartbeat_interval: c.averaging.heartbeat_interval,
        steps: c.training.steps,
        eval_every: c.training.eval_every_steps,
        export: c.training.export,
        slowdown: c.training.slowdown,
        synthetic_step: c.training.synthetic_step,
        min_peers: c.training.min_peers,
        start_timeout: c.training.start_timeout,
        passes: c.training.passes,
        checkpoint_dir: c.checkpoint.dir,
        checkpoint_every: c.checkpoint.every_steps,
        checkpoint_keep: c.checkpoint.keep,
        progress,
        status_lines,
        metrics_listen: c.metrics_listen,
        metrics_control_token: c.metrics_control_token,
    }
}

//! `murmur bench checkpoint`: a checkpoint of a model's parameters and AdamW state, as
//! `murmur run` writes it (encoded from the vectors themselves, synced, renamed, the folder
//! synced), against a plain write and fsync of as many bytes to the same folder, in the
//! same run; and the peak resident memory the write adds to the state's, read from
//! `VmHWM` after resetting it (`/proc/self/clear_refs`).

use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use murmur_protocol::snapshot_file::{SnapshotView, TensorView};
use rand::{RngExt as _, SeedableRng as _};
use serde_json::json;

use crate::checkpoint::CheckpointStore;
use crate::cli::CheckpointBenchArgs;
use crate::observe::process::own_status_bytes;

/// The plain write's buffer.
const PLAIN_BUFFER: usize = 8 << 20;

pub(crate) fn run(args: &CheckpointBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.params > 0, "--params must be at least 1");
    let folder = args
        .dir
        .join(format!("murmur-bench-checkpoint-{}", std::process::id()));
    std::fs::create_dir(&folder).with_context(|| format!("cannot create {}", folder.display()))?;
    let result = measure(args, &folder);
    let _ = std::fs::remove_dir_all(&folder);
    result
}

fn measure(args: &CheckpointBenchArgs, folder: &Path) -> anyhow::Result<()> {
    let state = State::new(args.params);
    let store = CheckpointStore::open(folder.join("checkpoints"), 1)?;
    let mut checkpoint = Vec::new();
    let mut plain = Vec::new();
    let mut added = Vec::new();
    let mut len = 0;
    for repeat in 0..args.repeats.max(1) {
        let before = own_status_bytes("VmRSS:").unwrap_or(0);
        let peak_reset = reset_peak();
        let start = Instant::now();
        let view = state.view(repeat as u64 + 1);
        let written = if args.in_memory {
            in_memory_write(&view, &folder.join("in-memory.snap"))?
        } else {
            store.write(&view)?.path
        };
        checkpoint.push(start.elapsed());
        if peak_reset {
            let peak = own_status_bytes("VmHWM:").unwrap_or(0);
            added.push(peak.saturating_sub(before));
        }
        len = std::fs::metadata(&written)?.len();
        plain.push(plain_write(&folder.join("plain"), len)?);
    }
    let checkpoint = median(checkpoint);
    let plain = median(plain);
    let state_bytes = state.bytes();
    let rss = own_status_bytes("VmRSS:").unwrap_or(0);
    let added = (!added.is_empty()).then(|| median(added));
    if args.json {
        println!(
            "{}",
            json!({
                "params": args.params,
                "in_memory": args.in_memory,
                "state_bytes": state_bytes,
                "file_bytes": len,
                "checkpoint_s": checkpoint.as_secs_f64(),
                "plain_write_s": plain.as_secs_f64(),
                "ratio": checkpoint.as_secs_f64() / plain.as_secs_f64(),
                "rss_bytes": rss,
                "peak_added_bytes": added,
                "peak_added_fraction": added.map(|a| a as f64 / rss.max(1) as f64),
            })
        );
        return Ok(());
    }
    println!(
        "checkpoint of {} parameters and AdamW state: {:.1} MB of state, {:.1} MB on disk",
        args.params,
        state_bytes as f64 / 1e6,
        len as f64 / 1e6
    );
    println!(
        "{}: {:.3} s (median of {}); plain write and fsync of as many bytes: {:.3} s; ratio \
         {:.2}",
        if args.in_memory {
            "encoded in memory, written and synced"
        } else {
            "streamed, synced and renamed"
        },
        checkpoint.as_secs_f64(),
        args.repeats.max(1),
        plain.as_secs_f64(),
        checkpoint.as_secs_f64() / plain.as_secs_f64()
    );
    match added {
        Some(added) => println!(
            "peak resident memory added by the write: {:.1} MB, {:.2}% of the process's {:.1} MB",
            added as f64 / 1e6,
            100.0 * added as f64 / rss.max(1) as f64,
            rss as f64 / 1e6
        ),
        None => println!("peak resident memory: not measured (/proc/self/clear_refs refused)"),
    }
    Ok(())
}

/// Parameters and AdamW's moments, at the scales training leaves them: weights about
/// N(0, 0.02), first moments about 1e-3, second moments about 1e-6 and positive.
struct State {
    params: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
}

impl State {
    fn new(params: usize) -> State {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut fill = |scale: f32, positive: bool| -> Vec<f32> {
            (0..params)
                .map(|_| {
                    let x: f32 = rng.random_range(-1.0..1.0);
                    if positive { scale * x.abs() } else { scale * x }
                })
                .collect()
        };
        State {
            params: fill(0.04, false),
            m: fill(1e-3, false),
            v: fill(1e-6, true),
        }
    }

    fn bytes(&self) -> u64 {
        4 * (self.params.len() + self.m.len() + self.v.len()) as u64
    }

    fn view(&self, step: u64) -> SnapshotView<'_> {
        SnapshotView {
            step,
            samples: step * 256,
            push_sum_weight: 1.0,
            swarm_id: "bench",
            model_fingerprint: [0; 32],
            tensors: vec![
                TensorView::floats("params", &self.params),
                TensorView::floats("optimizer.slot.m", &self.m),
                TensorView::floats("optimizer.slot.v", &self.v),
            ],
        }
    }
}

/// The checkpoint as it was written before it was streamed: a copy of the state, encoded
/// whole in memory (at the level used then), written and synced.
fn in_memory_write(view: &SnapshotView<'_>, path: &Path) -> anyhow::Result<std::path::PathBuf> {
    let bytes = view.to_snapshot().encode(3)?;
    let mut file = File::create(path)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    Ok(path.to_owned())
}

/// Writes `len` bytes to a new file at `path` and syncs it; returns how long that took.
fn plain_write(path: &Path, len: u64) -> anyhow::Result<Duration> {
    let buffer: Vec<u8> = (0..PLAIN_BUFFER).map(|i| (i * 131 % 251) as u8).collect();
    let _ = std::fs::remove_file(path);
    let start = Instant::now();
    let mut file =
        File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut left = len;
    while left > 0 {
        let n = usize::try_from(left).map_or(PLAIN_BUFFER, |l| l.min(PLAIN_BUFFER));
        file.write_all(&buffer[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    let took = start.elapsed();
    std::fs::remove_file(path)?;
    Ok(took)
}

/// Resets this process's peak resident memory (`VmHWM`) to its current one; false where
/// the kernel refuses.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn median<T: Ord + Copy>(mut values: Vec<T>) -> T {
    values.sort_unstable();
    values[values.len() / 2]
}

//! Checkpoints written beside training. At a checkpoint step the parameters are copied and
//! a thread encodes and writes them with the optimizer's state, while the trainer computes
//! its next gradient: at GPT-2 small's size with AdamW a checkpoint is 1.3 GB of zstd and
//! took training 14 s to wait for on a GPU host when it was written inline.
//!
//! The optimizer's state (twice the model with AdamW) is not copied for it: the thread
//! writes the slots the trainer held at the checkpoint step, shared ([`OptimizerState`]),
//! and the trainer copies them only if it steps again before the write ends.
//!
//! One checkpoint is written at a time: the next one, and the last one at exit, wait for the
//! one before. The cost is the copy: the model's f32 bytes, held while the write lasts.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context as _;
use murmur_protocol::snapshot::Snapshot;
use murmur_protocol::snapshot_file::{SnapshotView, TensorView};

use super::worker::{OptimizerState, SharedOptimizer};
use crate::checkpoint::{CheckpointStore, SetAside};
use crate::observe::Metrics;
use murmur_trainer::Slot;

/// Snapshot tensor holding the optimizer's step count.
const STEPS_TENSOR: &str = "optimizer.steps_taken";
/// Prefix of the snapshot tensors holding optimizer slots.
const OPTIMIZER_PREFIX: &str = "optimizer.slot.";

/// What a snapshot says besides its tensors.
#[derive(Debug, Clone)]
pub(crate) struct StateMeta {
    pub(crate) step: u64,
    pub(crate) samples: u64,
    pub(crate) swarm_id: String,
    pub(crate) model_fingerprint: [u8; 32],
}

/// Where checkpoints go, and what to count them in.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointTarget {
    pub(crate) dir: PathBuf,
    pub(crate) keep: usize,
    pub(crate) optimizer: SharedOptimizer,
    pub(crate) metrics: Metrics,
}

/// The checkpoint being written, if any.
#[derive(Debug, Default)]
pub(crate) struct CheckpointWriter {
    running: Option<JoinHandle<()>>,
}

impl CheckpointWriter {
    /// Writes a checkpoint of `params` on a thread of its own, once the one before it is
    /// written, with the optimizer's state as it is now (call it while the trainer is
    /// idle, so that both are of the same step).
    pub(crate) fn start(&mut self, target: &CheckpointTarget, meta: StateMeta, params: &[f32]) {
        self.wait();
        let target = target.clone();
        let params = params.to_vec();
        let optimizer = shared_state(&target.optimizer);
        let spawned = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || {
                // Counted in `write_state`; training goes on, and the next one may succeed.
                if let Err(e) = write_state(&target, &meta, &params, optimizer.as_ref()) {
                    tracing::warn!(
                        error = crate::error_text::describe(&e),
                        "checkpoint not written"
                    );
                }
            });
        match spawned {
            Ok(handle) => self.running = Some(handle),
            Err(e) => tracing::warn!(error = %e, "checkpoint not written: no thread for it"),
        }
    }

    /// Waits until the checkpoint being written, if any, is.
    pub(crate) fn wait(&mut self) {
        if let Some(handle) = self.running.take()
            && handle.join().is_err()
        {
            tracing::warn!("the checkpoint thread panicked; that checkpoint was not written");
        }
    }
}

/// Writes a checkpoint of `params` now, logs it and counts it; the caller says what a
/// failure means.
pub(crate) fn write(
    target: &CheckpointTarget,
    meta: &StateMeta,
    params: &[f32],
) -> anyhow::Result<()> {
    write_state(
        target,
        meta,
        params,
        shared_state(&target.optimizer).as_ref(),
    )
}

/// The optimizer's state, its slots shared, not copied; `None` if a panic poisoned it.
fn shared_state(optimizer: &SharedOptimizer) -> Option<OptimizerState> {
    optimizer.lock().ok().map(|state| state.clone())
}

/// [`write()`] with the optimizer's state `optimizer`.
fn write_state(
    target: &CheckpointTarget,
    meta: &StateMeta,
    params: &[f32],
    optimizer: Option<&OptimizerState>,
) -> anyhow::Result<()> {
    let written = CheckpointStore::open(&target.dir, target.keep)
        .context("cannot open the checkpoint folder")
        .and_then(|store| {
            view_with(meta, params, optimizer, |view| {
                store.write(view).context("cannot write the checkpoint")
            })
        });
    target.metrics.daemon.record_checkpoint(written.is_ok());
    let written = written?;
    tracing::info!(path = %written.path.display(), step = meta.step, "checkpoint written");
    report_set_aside(&target.metrics, &written.set_aside);
    Ok(())
}

/// Logs and counts corrupt checkpoint files that were moved aside.
pub(crate) fn report_set_aside(metrics: &Metrics, files: &[SetAside]) {
    for file in files {
        tracing::warn!(
            path = %file.from.display(),
            moved_to = %file.to.display(),
            reason = %file.reason,
            "corrupt checkpoint moved aside; it does not count toward checkpoint.keep"
        );
    }
    metrics.daemon.record_corrupt_checkpoints(files.len());
}

/// Calls `use_view` with the state at `params`, borrowed, as checkpoints and joiners
/// receive it: the parameters and the optimizer's state, locked for the call. `None` at
/// once, and nothing called, while the optimizer's state is held elsewhere (a checkpoint
/// being written beside training, the trainer stepping), rather than waiting for it on the
/// caller's task.
pub(crate) fn try_with_state_view<R>(
    meta: &StateMeta,
    params: &[f32],
    optimizer: &SharedOptimizer,
    use_view: impl FnOnce(&SnapshotView<'_>) -> R,
) -> Option<R> {
    let optimizer = match optimizer.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(_)) => None,
        Err(std::sync::TryLockError::WouldBlock) => return None,
    };
    Some(view_with(meta, params, optimizer.as_deref(), use_view))
}

/// Calls `use_view` with the state at `params` and `optimizer`'s slots.
fn view_with<R>(
    meta: &StateMeta,
    params: &[f32],
    optimizer: Option<&OptimizerState>,
    use_view: impl FnOnce(&SnapshotView<'_>) -> R,
) -> R {
    let names = slot_names(optimizer);
    let steps = steps_tensor(optimizer);
    use_view(&state_view(meta, params, optimizer, &steps, &names))
}

/// The state at `params`, borrowed: the optimizer's slots named `names`, its step count
/// `steps`.
fn state_view<'a>(
    meta: &'a StateMeta,
    params: &'a [f32],
    optimizer: Option<&'a OptimizerState>,
    steps: &'a [f32; 2],
    names: &'a [String],
) -> SnapshotView<'a> {
    let mut tensors = vec![TensorView::floats("params", params)];
    if let Some(optimizer) = optimizer.filter(|o| !o.slots.is_empty()) {
        tensors.push(TensorView::floats(STEPS_TENSOR, steps));
        // 8-bit moments are written decoded, as `f32`s, a run at a time: a snapshot's
        // format does not depend on how a peer keeps its optimizer's state.
        for (name, (_, slot)) in names.iter().zip(&optimizer.slots) {
            tensors.push(TensorView {
                name,
                data: slot.data(),
            });
        }
    }
    SnapshotView {
        step: meta.step,
        samples: meta.samples,
        push_sum_weight: 1.0,
        swarm_id: &meta.swarm_id,
        model_fingerprint: meta.model_fingerprint,
        tensors,
    }
}

/// The optimizer's step count as a snapshot tensor: two exact f32 integers of 24 bits
/// each, so steps up to 2^48.
fn steps_tensor(optimizer: Option<&OptimizerState>) -> [f32; 2] {
    let steps = optimizer.map_or(0, |o| o.steps_taken);
    [
        (steps & 0xff_ffff) as f32,
        ((steps >> 24) & 0xff_ffff) as f32,
    ]
}

/// The snapshot tensor names of the optimizer's slots.
fn slot_names(optimizer: Option<&OptimizerState>) -> Vec<String> {
    optimizer.map_or_else(Vec::new, |o| {
        o.slots
            .iter()
            .map(|(name, _)| format!("{OPTIMIZER_PREFIX}{name}"))
            .collect()
    })
}

/// The optimizer state a snapshot holds, if any, moved out of it (its slots are left
/// empty): a model's optimizer state is several times its parameters, and a copy would
/// hold it twice while the peer starts.
pub(crate) fn optimizer_of(snapshot: &mut Snapshot) -> Option<OptimizerState> {
    let steps = snapshot.tensors.iter().find(|t| t.name == STEPS_TENSOR)?;
    let [lo, hi] = steps.data.as_slice() else {
        return None;
    };
    let steps_taken = (*lo as u64) | ((*hi as u64) << 24);
    let slots = snapshot
        .tensors
        .iter_mut()
        .filter_map(|t| {
            t.name.strip_prefix(OPTIMIZER_PREFIX).map(|name| {
                let values = std::mem::take(&mut t.data);
                (name.to_owned(), Arc::new(Slot::Floats(values)))
            })
        })
        .collect();
    Some(OptimizerState { steps_taken, slots })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn meta(step: u64) -> StateMeta {
        StateMeta {
            step,
            samples: step * 16,
            swarm_id: "s".into(),
            model_fingerprint: [3; 32],
        }
    }

    /// A view asked for while the optimizer's state is held elsewhere is not waited for.
    #[test]
    fn a_state_view_tried_while_the_optimizer_is_held_is_skipped() {
        let optimizer: SharedOptimizer = Arc::new(Mutex::new(OptimizerState {
            steps_taken: 4,
            slots: vec![("m".into(), Arc::new(Slot::Floats(vec![0.25; 8])))],
        }));
        let params = [1.0_f32; 8];
        let tensors = |view: &SnapshotView<'_>| view.tensors.len();
        let held = optimizer.lock().unwrap();
        assert_eq!(
            try_with_state_view(&meta(4), &params, &optimizer, tensors),
            None
        );
        drop(held);
        // The parameters, the step count and the one slot.
        assert_eq!(
            try_with_state_view(&meta(4), &params, &optimizer, tensors),
            Some(3)
        );
    }

    /// A checkpoint writes the optimizer's state of the step it was started at without
    /// holding the trainer up: the trainer's next step, right after the start, takes the
    /// state at once and changes its own copy of the slots, not what the checkpoint writes.
    #[test]
    fn a_checkpoint_writes_the_optimizer_state_of_its_step_while_the_trainer_steps_on() {
        let dir = tempfile::tempdir().unwrap();
        let optimizer: SharedOptimizer = Arc::new(Mutex::new(OptimizerState {
            steps_taken: 10,
            slots: vec![("m".into(), Arc::new(Slot::Floats(vec![0.5; 64])))],
        }));
        let target = CheckpointTarget {
            dir: dir.path().to_owned(),
            keep: 3,
            optimizer: Arc::clone(&optimizer),
            metrics: Metrics::disabled(),
        };
        let mut writer = CheckpointWriter::default();
        writer.start(&target, meta(10), &[1.0; 64]);
        // The trainer's next optimizer step, as `worker::optimizer_step` takes it.
        {
            let mut state = optimizer.try_lock().expect("the checkpoint holds the lock");
            state.steps_taken = 11;
            *Arc::make_mut(&mut state.slots[0].1) = Slot::Floats(vec![9.0; 64]);
        }
        writer.wait();
        let store = CheckpointStore::open(dir.path(), 3).unwrap();
        let (_, snapshot) = store.latest_valid().unwrap().found.expect("written");
        assert_eq!(snapshot.step, 10);
        let names: Vec<&str> = snapshot.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["params", STEPS_TENSOR, "optimizer.slot.m"]);
        assert_eq!(
            snapshot.tensors[1].data,
            [10.0, 0.0],
            "the step count at the start"
        );
        assert_eq!(
            snapshot.tensors[2].data,
            vec![0.5; 64],
            "the moments at the start"
        );
        let state = optimizer.lock().unwrap();
        assert_eq!(
            *state.slots[0].1,
            Slot::Floats(vec![9.0; 64]),
            "the trainer's step was lost"
        );
        assert_eq!(
            Arc::strong_count(&state.slots[0].1),
            1,
            "the checkpoint kept its copy"
        );
        drop(state);

        // The next one starts once the one before is written; both are kept.
        writer.start(&target, meta(20), &[2.0; 64]);
        writer.wait();
        let (path, snapshot) = store.latest_valid().unwrap().found.expect("written");
        assert_eq!(snapshot.step, 20, "{}", path.display());
        assert_eq!(snapshot.tensors[0].data, vec![2.0; 64]);
    }

    /// Moments kept in 8 bits are written as the `f32`s they decode to, and read back into
    /// the same codes: a checkpoint's format does not depend on how its writer kept them.
    #[test]
    fn a_checkpoint_writes_8_bit_moments_as_the_floats_they_decode_to() {
        use murmur_trainer::{MomentCodes, MomentKind};
        let values: Vec<f32> = (0..700).map(|i| (i as f32 * 0.3).sin() * 1e-3).collect();
        let codes = MomentCodes::from_values(MomentKind::Signed, &values);
        let slot = Slot::Codes(codes.clone());
        let decoded = slot.to_vec();
        assert_ne!(decoded, values, "the codes round");
        let optimizer: SharedOptimizer = Arc::new(Mutex::new(OptimizerState {
            steps_taken: 3,
            slots: vec![("exp_avg".into(), Arc::new(slot))],
        }));
        let dir = tempfile::tempdir().unwrap();
        let target = CheckpointTarget {
            dir: dir.path().to_owned(),
            keep: 1,
            optimizer,
            metrics: Metrics::disabled(),
        };
        write(&target, &meta(3), &[1.0; 700]).unwrap();
        let store = CheckpointStore::open(dir.path(), 1).unwrap();
        let (_, mut snapshot) = store.latest_valid().unwrap().found.expect("written");
        let loaded = optimizer_of(&mut snapshot).expect("the optimizer's state");
        assert_eq!(loaded.steps_taken, 3);
        let Slot::Floats(read) = &*loaded.slots[0].1 else {
            panic!("a snapshot holds f32s")
        };
        assert_eq!(read, &decoded);
        assert_eq!(MomentCodes::from_values(MomentKind::Signed, read), codes);
    }
}

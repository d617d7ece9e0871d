//! The trainer's thread: the model, data and optimizer live here, away from the async
//! loop, which hands it the averaging engine's work and takes the answers back.
//!
//! Buffers move, they are not copied: a job carries the vector the loop gave up, and its
//! answer carries the same vector back.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use murmur_gossip::engine::{Work, WorkDone};
use murmur_trainer::{Batch, DataShape, Optimizer, Slot, Task};

use super::device::DeviceWatch;
use super::fault::Fault;
use tokio::sync::mpsc;

/// Work for the trainer thread.
#[derive(Debug)]
pub(crate) enum Job {
    /// The averaging engine's work, then (when `eval`) an eval of the parameters it leaves.
    Engine { work: Work, eval: bool },
    /// Eval loss of `params`.
    Eval { params: Vec<f32> },
    /// Replaces the optimizer's state (from a checkpoint or the swarm).
    LoadOptimizer(OptimizerState),
}

/// The optimizer's state: its step count and its slots (e.g. AdamW's two moments). A clone
/// shares the slots' values ([`Arc`]); whoever changes a slot held by a clone copies it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct OptimizerState {
    pub(crate) steps_taken: u64,
    /// Slot name and values, in the optimizer's order.
    pub(crate) slots: Vec<(String, Arc<Slot>)>,
}

/// The optimizer's state, one copy of it (at GPT-2 small's size AdamW's two moments are
/// 1 GB), shared with the run loop for checkpoints and the state served to joiners. The
/// trainer locks it only while it takes an optimizer step, and lends its slots to the
/// optimizer for that step ([`Optimizer::exchange_slots`]); between steps the run loop
/// reads it. A checkpoint written beside training takes a clone; the trainer's next step
/// copies a slot only if that checkpoint is still being written ([`Arc::make_mut`]).
pub(crate) type SharedOptimizer = Arc<Mutex<OptimizerState>>;

/// A finished job, with its buffers.
#[derive(Debug)]
pub(crate) enum Done {
    /// The engine's work, answered, and what the daemon reports of it.
    Engine {
        done: WorkDone,
        /// The batch's training loss (steps and gradients).
        loss: Option<f32>,
        /// The eval loss of the parameters the work left, when asked for.
        eval_loss: Option<f32>,
        /// The learning rate of the update (steps and applies).
        learning_rate: Option<f32>,
        /// The optimizer's steps after an apply, which names the round's state.
        optimizer_steps: Option<u64>,
    },
    Eval {
        params: Vec<f32>,
        loss: f32,
    },
    OptimizerLoaded,
}

/// How long a step takes besides its compute: a simulated straggler, and a synthetic step
/// time that takes the place of compute in network experiments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StepPace {
    /// A step takes this many times its (padded) compute time, at least 1.
    pub(crate) slowdown: f64,
    /// Every step is padded to at least this by sleeping; zero = off.
    pub(crate) synthetic_step: Duration,
}

impl StepPace {
    /// Steps as fast as the trainer computes them.
    #[cfg(test)]
    pub(crate) const FULL_SPEED: StepPace = StepPace {
        slowdown: 1.0,
        synthetic_step: Duration::ZERO,
    };

    /// How long a step that computed for `compute` takes in all:
    /// `slowdown × max(compute, synthetic_step)`.
    pub(crate) fn step_time(&self, compute: Duration) -> Duration {
        compute
            .max(self.synthetic_step)
            .mul_f64(self.slowdown.max(1.0))
    }
}

/// The trainer thread and its two queues.
#[derive(Debug)]
pub(crate) struct Worker {
    jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    pub(crate) done: mpsc::Receiver<anyhow::Result<Done>>,
    thread: Option<JoinHandle<()>>,
    busy: bool,
}

impl Worker {
    /// Starts the thread. `pace` pads and stretches every step (a synthetic step time, a
    /// simulated straggler).
    pub(crate) fn spawn(
        task: Task,
        params_len: usize,
        pace: StepPace,
        shared: SharedOptimizer,
        fault: Option<Fault>,
        watch: DeviceWatch,
    ) -> anyhow::Result<Worker> {
        let mut task = task;
        hand_over_state(&mut task.optimizer, &shared)?;
        let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel::<Job>(1);
        let (done_tx, done_rx) = mpsc::channel(1);
        let thread = std::thread::Builder::new()
            .name("murmur-trainer".into())
            .spawn(move || {
                let mut state = WorkerState::new(task, params_len, pace, shared, fault, watch);
                while let Ok(job) = jobs_rx.recv() {
                    let done = state.run(job);
                    if done_tx.blocking_send(done).is_err() {
                        return;
                    }
                }
            })
            .context("cannot start the trainer thread")?;
        Ok(Worker {
            jobs: Some(jobs_tx),
            done: done_rx,
            thread: Some(thread),
            busy: false,
        })
    }

    /// Hands a job over; the thread takes one at a time, so call only when idle.
    pub(crate) fn submit(&mut self, job: Job) -> anyhow::Result<()> {
        anyhow::ensure!(!self.busy, "the trainer is still busy with its last job");
        let jobs = self
            .jobs
            .as_ref()
            .context("the trainer thread has stopped")?;
        jobs.try_send(job)
            .map_err(|_| anyhow::anyhow!("the trainer thread has stopped"))?;
        self.busy = true;
        Ok(())
    }

    /// Whether a job is in progress.
    pub(crate) fn is_busy(&self) -> bool {
        self.busy
    }

    /// Takes a finished job's answer (call when [`Worker::done`] yielded it).
    pub(crate) fn finished(&mut self) {
        self.busy = false;
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take()
            && !self.busy
        {
            let _ = thread.join();
        }
    }
}

/// Moves the optimizer's state slots (fresh, all zero) into `shared`, where they live from
/// then on.
fn hand_over_state(optimizer: &mut Optimizer, shared: &SharedOptimizer) -> anyhow::Result<()> {
    let mut shared = lock(shared);
    let names = optimizer.slot_names();
    shared.steps_taken = optimizer.steps_taken();
    shared.slots = names
        .iter()
        .map(|n| ((*n).to_owned(), Arc::default()))
        .collect();
    optimizer
        .exchange_slots(shared.slots.iter_mut().map(|s| Arc::make_mut(&mut s.1)))
        .context("handing the optimizer's state over")
}

/// Locks the optimizer's state. A panic while it was held (a reader) left it as it was, so
/// a poisoned lock is taken as it is.
fn lock(shared: &SharedOptimizer) -> std::sync::MutexGuard<'_, OptimizerState> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What an optimizer step moves the parameters along.
enum StepAlong<'a> {
    /// A gradient, left as it is.
    Gradient(&'a [f32]),
    /// A gradient whose buffer then takes the update (`Optimizer::step_keeping_update`).
    KeepingUpdate(&'a mut [f32]),
}

/// One optimizer step on `params` along `grad`, with the state in `shared` lent to the
/// optimizer for it. A slot a checkpoint still holds is copied first (and the copy logged).
fn optimizer_step(
    optimizer: &mut Optimizer,
    shared: &SharedOptimizer,
    params: &mut [f32],
    grad: StepAlong<'_>,
    lr: f32,
) -> anyhow::Result<()> {
    let mut state = lock(shared);
    let held = state
        .slots
        .iter()
        .filter(|s| Arc::strong_count(&s.1) > 1)
        .count();
    if held > 0 {
        tracing::info!(
            slots = held,
            "the optimizer's state copied: a checkpoint is still being written from it"
        );
    }
    optimizer.exchange_slots(state.slots.iter_mut().map(|s| Arc::make_mut(&mut s.1)))?;
    let stepped = match grad {
        StepAlong::Gradient(grad) => optimizer.step(params, grad, lr),
        StepAlong::KeepingUpdate(grad) => optimizer.step_keeping_update(params, grad, lr),
    };
    optimizer.exchange_slots(state.slots.iter_mut().map(|s| Arc::make_mut(&mut s.1)))?;
    state.steps_taken = optimizer.steps_taken();
    Ok(stepped?)
}

struct WorkerState {
    task: Task,
    batch: Batch,
    /// The model's parameter count.
    params_len: usize,
    pace: StepPace,
    shared: SharedOptimizer,
    /// The test-only fault switch, when set.
    fault: Option<Fault>,
    /// Where the passes' device time and memory go.
    watch: DeviceWatch,
}

impl WorkerState {
    fn new(
        task: Task,
        params_len: usize,
        pace: StepPace,
        shared: SharedOptimizer,
        fault: Option<Fault>,
        watch: DeviceWatch,
    ) -> WorkerState {
        let rows = task.batch_size;
        let batch = match task.dataset.shape() {
            DataShape::Tokens { context, .. } => Batch::tokens_with_capacity(rows, context),
            DataShape::Features { width, .. } => Batch::features_with_capacity(rows, width),
        };
        WorkerState {
            task,
            batch,
            params_len,
            pace,
            shared,
            fault,
            watch,
        }
    }

    /// Samples in the step just taken: the batch just drawn, times the micro-batches it was
    /// one of.
    fn samples(&self) -> u64 {
        self.batch.rows as u64 * self.task.micro_batches.max(1) as u64
    }

    /// Sleeps so that a step that computed for `spent` takes [`StepPace::step_time`] in all.
    fn stretch(&self, spent: Duration) {
        let rest = self.pace.step_time(spent).saturating_sub(spent);
        if !rest.is_zero() {
            std::thread::sleep(rest);
        }
    }

    fn run(&mut self, job: Job) -> anyhow::Result<Done> {
        match job {
            Job::Engine { work, eval } => self.run_work(work, eval),
            Job::Eval { mut params } => {
                let loss = self.task.evaluate(&mut params).context("eval")?;
                Ok(Done::Eval { params, loss })
            }
            Job::LoadOptimizer(state) => {
                let optimizer = &mut self.task.optimizer;
                let names = optimizer.slot_names();
                let same_slots = state.slots.len() == names.len()
                    && state.slots.iter().zip(names).all(|(s, n)| s.0 == *n);
                anyhow::ensure!(
                    same_slots,
                    "the saved optimizer state is for another optimizer"
                );
                let len = self.params_len;
                if let Some((name, slot)) = state.slots.iter().find(|s| s.1.len() != len) {
                    anyhow::bail!(
                        "the saved optimizer state's {name} holds {} values, the model {len}",
                        slot.len()
                    );
                }
                // The loaded vectors become the state: no copy of a state several times
                // the model's size. Moments kept in 8 bits are coded from them, one slot at
                // a time.
                let slots = state
                    .slots
                    .into_iter()
                    .enumerate()
                    .map(|(index, (name, slot))| {
                        let slot = match Arc::unwrap_or_clone(slot) {
                            Slot::Floats(values) => optimizer.slot_from_values(index, values),
                            coded => coded,
                        };
                        (name, Arc::new(slot))
                    })
                    .collect();
                let mut shared = lock(&self.shared);
                shared.slots = slots;
                shared.steps_taken = state.steps_taken;
                optimizer.set_steps_taken(state.steps_taken);
                Ok(Done::OptimizerLoaded)
            }
        }
    }

    /// The eval loss of `params` when `eval`.
    fn eval_if(&mut self, eval: bool, params: &mut [f32]) -> anyhow::Result<Option<f32>> {
        eval.then(|| self.task.evaluate(params))
            .transpose()
            .context("eval")
    }

    fn run_work(&mut self, work: Work, eval: bool) -> anyhow::Result<Done> {
        match work {
            Work::Step {
                mut params,
                mut update,
                step,
                swarm_batch,
            } => {
                let started = Instant::now();
                // `Task::local_step`, with the passes timed for the device's metrics; the
                // engine's buffer takes the gradient, then the update.
                update.resize(params.len(), 0.0);
                let task = &mut self.task;
                let passes = Instant::now();
                let loss = task
                    .next_loss_and_grad(&mut params, &mut self.batch, &mut update)
                    .context("local step")?;
                self.watch.passes_took(passes.elapsed());
                let lr = task.schedule.lr(step, swarm_batch);
                let along = StepAlong::KeepingUpdate(&mut update);
                optimizer_step(&mut task.optimizer, &self.shared, &mut params, along, lr)
                    .context("local step")?;
                self.stretch(started.elapsed());
                let took = started.elapsed();
                let eval_loss = self.eval_if(eval, &mut params)?;
                Ok(Done::Engine {
                    done: WorkDone::Stepped {
                        params,
                        update,
                        samples: self.samples(),
                        took,
                    },
                    loss: Some(loss),
                    eval_loss,
                    learning_rate: Some(self.task.schedule.lr(step, swarm_batch)),
                    optimizer_steps: None,
                })
            }
            Work::Gradient {
                mut params,
                mut grad,
            } => {
                let started = Instant::now();
                grad.resize(params.len(), 0.0);
                let passes = Instant::now();
                let loss = self
                    .task
                    .next_loss_and_grad(&mut params, &mut self.batch, &mut grad)
                    .context("gradient")?;
                self.watch.passes_took(passes.elapsed());
                self.stretch(started.elapsed());
                let mut samples = self.samples();
                if let Some(fault) = &self.fault {
                    fault.corrupt(&mut grad, &mut samples);
                }
                Ok(Done::Engine {
                    done: WorkDone::Gradient {
                        params,
                        grad,
                        samples,
                        took: started.elapsed(),
                    },
                    loss: Some(loss),
                    eval_loss: None,
                    learning_rate: None,
                    optimizer_steps: None,
                })
            }
            Work::Apply {
                mut params,
                grad,
                step,
                swarm_batch,
            } => {
                let lr = self.task.schedule.lr(step, swarm_batch);
                let along = StepAlong::Gradient(&grad);
                optimizer_step(
                    &mut self.task.optimizer,
                    &self.shared,
                    &mut params,
                    along,
                    lr,
                )
                .context("optimizer step")?;
                let eval_loss = self.eval_if(eval, &mut params)?;
                Ok(Done::Engine {
                    done: WorkDone::Applied { params, grad },
                    loss: None,
                    eval_loss,
                    learning_rate: Some(lr),
                    optimizer_steps: Some(self.task.optimizer.steps_taken()),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn full_speed_adds_nothing() {
        assert_eq!(StepPace::FULL_SPEED.step_time(7 * MS), 7 * MS);
    }

    #[test]
    fn a_slowdown_stretches_the_compute_time() {
        let pace = StepPace {
            slowdown: 4.0,
            synthetic_step: Duration::ZERO,
        };
        assert_eq!(pace.step_time(10 * MS), 40 * MS);
    }

    #[test]
    fn a_synthetic_step_sets_the_step_time_unless_compute_takes_longer() {
        let pace = StepPace {
            slowdown: 1.0,
            synthetic_step: 100 * MS,
        };
        assert_eq!(pace.step_time(3 * MS), 100 * MS);
        assert_eq!(pace.step_time(130 * MS), 130 * MS);
        let straggler = StepPace {
            slowdown: 4.0,
            ..pace
        };
        assert_eq!(straggler.step_time(3 * MS), 400 * MS);
        assert_eq!(straggler.step_time(130 * MS), 520 * MS);
    }
}

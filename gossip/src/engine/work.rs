//! What an engine asks of the trainer, and what comes back.
//!
//! Buffers move, they are not copied: a request carries the vectors the engine gave up,
//! and its answer carries the same vectors back.

use std::time::Duration;

/// Work for the trainer. The engine has at most one request out at a time.
#[derive(Debug)]
pub enum Work {
    /// One local optimizer step at `params`, updated in place.
    Step {
        /// The parameters to step from (SGP: the de-biased `z = x / w`).
        params: Vec<f32>,
        /// A buffer for the step's gradient (any contents, any length: the trainer sizes
        /// it), which comes back holding the step's update.
        update: Vec<f32>,
        /// The step number for the learning-rate schedule.
        step: u64,
        /// Samples the swarm processes per step, for schedules that scale with it.
        swarm_batch: u64,
    },
    /// The mean gradient of the next batch at `params`, written into `grad`; no update.
    Gradient {
        /// The parameters.
        params: Vec<f32>,
        /// Where the gradient goes (its contents are overwritten).
        grad: Vec<f32>,
    },
    /// An optimizer step on `params` along `grad`.
    Apply {
        /// The parameters, updated in place.
        params: Vec<f32>,
        /// The averaged gradient.
        grad: Vec<f32>,
        /// The step number for the learning-rate schedule.
        step: u64,
        /// Samples behind the averaged gradient.
        swarm_batch: u64,
    },
}

/// The trainer's answer to a [`Work`] request, with its buffers.
#[derive(Debug)]
pub enum WorkDone {
    /// A [`Work::Step`] finished.
    Stepped {
        /// The updated parameters.
        params: Vec<f32>,
        /// How far the step moved each parameter: `after − before`, in `f32`, in the
        /// buffer the work lent.
        update: Vec<f32>,
        /// Samples in the step's batch.
        samples: u64,
        /// How long the step took.
        took: Duration,
    },
    /// A [`Work::Gradient`] finished.
    Gradient {
        /// The parameters, unchanged.
        params: Vec<f32>,
        /// The mean gradient of the batch.
        grad: Vec<f32>,
        /// Samples in the batch.
        samples: u64,
        /// How long it took.
        took: Duration,
    },
    /// A [`Work::Apply`] finished.
    Applied {
        /// The updated parameters.
        params: Vec<f32>,
        /// The gradient buffer, handed back for reuse.
        grad: Vec<f32>,
    },
}

impl Work {
    /// What kind of request this is, for errors and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Work::Step { .. } => "step",
            Work::Gradient { .. } => "gradient",
            Work::Apply { .. } => "apply",
        }
    }
}

impl WorkDone {
    /// What kind of answer this is, for errors and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkDone::Stepped { .. } => "step",
            WorkDone::Gradient { .. } => "gradient",
            WorkDone::Applied { .. } => "apply",
        }
    }

    /// The parameters and the update of a finished [`Work::Step`] of a model of `len`
    /// parameters; any other answer, or vectors of another length, is an error.
    pub(crate) fn into_stepped(
        self,
        len: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), super::EngineError> {
        let WorkDone::Stepped { params, update, .. } = self else {
            return Err(super::EngineError::UnexpectedWork {
                expected: "step",
                got: self.kind(),
            });
        };
        for got in [params.len(), update.len()] {
            if got != len {
                return Err(super::EngineError::LengthMismatch { expected: len, got });
            }
        }
        Ok((params, update))
    }
}

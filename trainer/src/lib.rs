//! murmur's built-in models, datasets and optimizers, on candle's CPU backend (or its CUDA
//! backend, with the `cuda` feature).
//!
//! The crate is built around one contract with the daemon: **parameters live in one flat
//! `Vec<f32>` the daemon owns.** Averaging (push-sum numerators, butterfly parts,
//! checkpoints, state sync) works on flat buffers, so everything here reads and writes flat
//! slices:
//!
//! - [`Model`] (an MLP or a GPT) names its tensors in a [`ParamLayout`], draws identical
//!   initial parameters on every peer from the swarm seed, and computes a batch's mean loss
//!   and flat gradient with candle's autograd.
//! - [`Optimizer`] (SGD with Nesterov momentum, AdamW, LAMB) steps the flat vector; its state
//!   is flat vectors too. [`LrSchedule`] gives the rate: warm-up, cosine decay, optional linear
//!   scaling with the swarm's batch.
//! - [`data`] gives each peer its own training stream and every peer the same eval set.
//! - [`export_safetensors`] writes the final model for any safetensors reader.
//! - [`TrainerDevice`] picks where the model runs: the CPU, or a CUDA GPU in a build with the
//!   `cuda` feature ([`Model::set_device`]). The parameters stay in the flat host vector
//!   either way; a GPU step copies them in and the gradient out.
//!
//! [`TaskConfig`] gathers the config sections the daemon embeds in its TOML file;
//! [`TaskPreset::default_local`] is the task `murmur local` trains by default.
//!
//! ```
//! use murmur_trainer::{PeerSampling, TaskPreset};
//!
//! let mut config = TaskPreset::default_local();
//! config.data.eval_samples = 16;
//! let sampling = PeerSampling { swarm_seed: 7, peer_seed: 1, shard: 0, shards: 1 };
//! let mut task = config.build(sampling).unwrap();
//! let mut params = task.model.init(7);
//! let mut grad = vec![0.0; params.len()];
//! let mut batch = task.dataset.empty_batch(task.batch_size);
//! let loss = task.local_step(&mut params, &mut batch, &mut grad, 0, 16).unwrap();
//! assert!(loss.is_finite());
//! ```

mod batch;
pub mod data;
mod device;
mod error;
mod export;
mod layout;
mod model;
mod optim;
mod pages;
mod rng;
mod schedule;
mod task;
mod threads;
mod transfer;

pub use batch::{Batch, BatchInputs};
pub use data::{DataConfig, DataSource, Dataset, PeerSampling, open_dataset};
pub use device::{DeviceMemory, TrainerDevice, device_memory};
pub use error::{ConfigError, DataError, DeviceError, ExportError, TrainerError};
pub use export::export_safetensors;
pub use layout::{Init, ParamLayout, TensorSpec};
pub use model::{
    Activation, BLOCK_LOGITS, DataShape, Gpt, GptConfig, GptPreset, GradWrite, Mlp, MlpConfig,
    Model, ModelConfig,
};
pub use optim::{MomentCodes, MomentKind, Optimizer, OptimizerConfig, Slot};
pub use schedule::{LrSchedule, ScheduleConfig};
pub use task::{Task, TaskConfig, TaskPreset};
pub use threads::{CANDLE_THREADS_ENV, CPU_THREADS_ENV, cpu_threads, set_cpu_threads};
pub use transfer::{TransferTotals, transfer_totals};

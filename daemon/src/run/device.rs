//! Where `murmur run` trains: `training.device` turned into the device the model's forward
//! and backward passes run on.
//!
//! - `auto` takes CUDA GPU 0 when this build has the `cuda` feature and the GPU opens;
//!   otherwise it trains on the CPU and logs one line saying why.
//! - `cpu` is the CPU.
//! - `cuda` and `cuda:N` are demands: a build without CUDA, or a GPU that does not open, is
//!   a [`DeviceUnavailable`] naming the key, and `murmur run` exits 2 before it starts the
//!   network.
//!
//! Only the passes move: the parameters, the gradient and the optimizer state stay in host
//! memory, where averaging reads them (see `murmur_trainer::Model::set_device`).
//!
//! On a GPU, [`DeviceWatch`] feeds the `murmur_gpu_*` metrics from the trainer's thread:
//! the time of each step's passes and the device memory in use after them.

use std::time::Duration;

use candle_core::Device;
use murmur_trainer::{DeviceError, TrainerDevice, TransferTotals};
use thiserror::Error;

use crate::config::DeviceChoice;
use crate::input_error::BadInput;
use crate::observe::GpuMetrics;

/// The device a peer trains on, opened.
#[derive(Debug, Clone)]
pub(crate) struct TrainingDevice {
    /// Which device it is (`cpu`, `cuda:N`): the label in the log, `/status` and metrics.
    pub(crate) kind: TrainerDevice,
    /// The opened device, for `Model::set_device`.
    pub(crate) device: Device,
}

impl TrainingDevice {
    /// The CPU.
    pub(crate) fn cpu() -> TrainingDevice {
        TrainingDevice {
            kind: TrainerDevice::Cpu,
            device: Device::Cpu,
        }
    }

    /// `cpu` or `cuda:N`, as the config spells a fixed device.
    pub(crate) fn label(&self) -> String {
        self.kind.to_string()
    }

    /// Whether the passes run on a GPU, so the `murmur_gpu_*` metrics mean something.
    pub(crate) fn is_gpu(&self) -> bool {
        matches!(self.kind, TrainerDevice::Cuda(_))
    }
}

/// The trainer thread's reports of its device into the `murmur_gpu_*` metrics. The metrics
/// are registered only for a GPU (see [`TrainingDevice::is_gpu`]); on the CPU every report
/// is a no-op.
#[derive(Debug, Clone)]
pub(crate) struct DeviceWatch {
    device: Device,
    gpu: GpuMetrics,
    /// The trainer's transfer totals at the last report.
    transferred: TransferTotals,
}

impl DeviceWatch {
    /// The label of the training passes in `murmur_gpu_kernel_seconds_total`.
    pub(crate) const PASSES: &'static str = "forward_backward";

    pub(crate) fn new(device: &TrainingDevice, gpu: GpuMetrics) -> DeviceWatch {
        DeviceWatch {
            device: device.device.clone(),
            gpu,
            transferred: murmur_trainer::transfer_totals(),
        }
    }

    /// One step's passes took `took` (parameter upload, forward, backward and the gradient's
    /// download, which waits for the device): counts it and the bytes copied since the last
    /// report (evals' included), and reads the memory in use after.
    pub(crate) fn passes_took(&mut self, took: Duration) {
        if self.device.is_cpu() {
            return;
        }
        self.gpu
            .record_kernel_time(Self::PASSES, took.as_secs_f64());
        let now = murmur_trainer::transfer_totals();
        self.gpu.record_transfer(
            now.to_device.saturating_sub(self.transferred.to_device),
            now.to_host.saturating_sub(self.transferred.to_host),
        );
        self.transferred = now;
        if let Some(memory) = murmur_trainer::device_memory(&self.device) {
            self.gpu.set_memory(memory.used, memory.total);
        }
    }
}

/// `training.device` names a GPU that cannot be used.
#[derive(Debug, Error)]
#[error(
    "training.device = \"{requested}\": {reason}; set training.device = \"auto\" to train on \
     the CPU when no GPU can be used"
)]
pub(crate) struct DeviceUnavailable {
    /// The device the config asked for.
    requested: TrainerDevice,
    /// Why it cannot be used: this build has no CUDA, or the driver or the GPU refused.
    reason: DeviceError,
}

/// A device the config demands but the host or build cannot give is the user's input at
/// fault: `murmur run` exits 2.
impl From<DeviceUnavailable> for BadInput {
    fn from(error: DeviceUnavailable) -> Self {
        BadInput(error.to_string())
    }
}

/// Opens the device `choice` asks for (see the module docs for the rules).
pub(crate) fn open(choice: DeviceChoice) -> Result<TrainingDevice, DeviceUnavailable> {
    match choice {
        DeviceChoice::Auto => Ok(open_auto()),
        DeviceChoice::Fixed(TrainerDevice::Cpu) => Ok(TrainingDevice::cpu()),
        DeviceChoice::Fixed(requested) => match requested.open() {
            Ok(device) => Ok(TrainingDevice {
                kind: requested,
                device,
            }),
            Err(reason) => Err(DeviceUnavailable { requested, reason }),
        },
    }
}

/// `auto`: GPU 0 when the build has CUDA and the GPU opens, else the CPU with one log line.
fn open_auto() -> TrainingDevice {
    if !TrainerDevice::CUDA_BUILT {
        tracing::info!(
            "training on the CPU: training.device = \"auto\" and this murmur was built without \
             CUDA (the `cuda` feature; see docs/gpu.md)"
        );
        return TrainingDevice::cpu();
    }
    let gpu = TrainerDevice::Cuda(0);
    match gpu.open() {
        Ok(device) => TrainingDevice { kind: gpu, device },
        Err(reason) => {
            tracing::warn!(
                "training on the CPU: training.device = \"auto\" and the GPU cannot be used: \
                 {reason}"
            );
            TrainingDevice::cpu()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_the_cpu() {
        let opened = open(DeviceChoice::Fixed(TrainerDevice::Cpu)).unwrap();
        assert_eq!(opened.label(), "cpu");
        assert!(opened.device.is_cpu());
    }

    /// Without the `cuda` feature `auto` is the CPU, and a demanded GPU is an error that
    /// names the key and the way to a GPU build.
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_build_without_cuda_trains_on_the_cpu_or_refuses() {
        let auto = open(DeviceChoice::Auto).unwrap();
        assert_eq!(auto.label(), "cpu");
        assert!(auto.device.is_cpu());
        for (requested, label) in [
            (TrainerDevice::Cuda(0), "cuda:0"),
            (TrainerDevice::Cuda(3), "cuda:3"),
        ] {
            let error = open(DeviceChoice::Fixed(requested)).unwrap_err();
            let text = BadInput::from(error).to_string();
            assert!(
                text.starts_with(&format!("training.device = \"{label}\": ")),
                "{text}"
            );
            assert!(text.contains("--features cuda"), "{text}");
        }
    }
}

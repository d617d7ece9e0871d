//! Where the models run: the CPU, or a CUDA GPU when murmur is built with the `cuda` feature.
//!
//! The CPU build carries no CUDA code at all, so it needs no toolkit to build and runs on any
//! host. With the `cuda` feature the trainer uses candle's CUDA backend, which links the CUDA
//! libraries at build time (see `docs/gpu.md`). Either way a GPU that cannot be opened is an
//! error value, never a panic: [`TrainerDevice::open_or_cpu`] falls back to the CPU and hands
//! the reason to the caller to log.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;

use crate::error::DeviceError;

/// Which processor runs the model's forward and backward passes.
///
/// Parsed from and displayed as `cpu`, `cuda` (GPU 0) or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TrainerDevice {
    /// The CPU, with candle's multi-threaded kernels (see [`crate::cpu_threads`]).
    #[default]
    Cpu,
    /// The CUDA GPU with this ordinal, as `CUDA_VISIBLE_DEVICES` leaves them numbered.
    Cuda(usize),
}

impl TrainerDevice {
    /// Whether this build can run models on a CUDA GPU (it was built with the `cuda` feature).
    pub const CUDA_BUILT: bool = cfg!(feature = "cuda");

    /// Opens the device for candle.
    ///
    /// Fails with [`DeviceError::NotBuilt`] when a GPU is asked of a build without the `cuda`
    /// feature, and with [`DeviceError::Open`] when the driver or the GPU refuses (no GPU,
    /// no such ordinal, a driver too old for the kernels, out of memory).
    pub fn open(self) -> Result<Device, DeviceError> {
        match self {
            TrainerDevice::Cpu => Ok(Device::Cpu),
            TrainerDevice::Cuda(ordinal) => open_cuda(ordinal),
        }
    }

    /// Opens the device, or the CPU when it cannot be opened; the error says why, for the
    /// caller's log.
    pub fn open_or_cpu(self) -> (Device, Option<DeviceError>) {
        match self.open() {
            Ok(device) => (device, None),
            Err(reason) => (Device::Cpu, Some(reason)),
        }
    }
}

/// Device memory of an opened device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Bytes in use, by this process and every other on the device.
    pub used: u64,
    /// Bytes in all.
    pub total: u64,
}

/// The memory of `device` now: `None` for the CPU, and when the driver does not answer.
/// One driver call (`cuMemGetInfo`), cheap enough to make after every training step.
pub fn device_memory(device: &Device) -> Option<DeviceMemory> {
    cuda_memory(device)
}

#[cfg(feature = "cuda")]
fn cuda_memory(device: &Device) -> Option<DeviceMemory> {
    let cuda = device.as_cuda_device().ok()?;
    let (free, total) = cuda.cuda_stream().context().mem_get_info().ok()?;
    Some(DeviceMemory {
        used: total.saturating_sub(free) as u64,
        total: total as u64,
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda_memory(_device: &Device) -> Option<DeviceMemory> {
    None
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> Result<Device, DeviceError> {
    // candle links the CUDA libraries (cudarc's `dynamic-linking`), so a process that started
    // has them; what remains (no GPU, a bad ordinal, a driver older than the kernels' PTX)
    // comes back as an error. The unwind guard covers a panic inside candle or cudarc while
    // the context, streams and library handles are set up: the trainer then runs on the CPU.
    let opened = std::panic::catch_unwind(|| Device::new_cuda(ordinal));
    match opened {
        Ok(Ok(device)) => Ok(device),
        Ok(Err(error)) => Err(DeviceError::Open {
            ordinal,
            message: without_backtrace(error).to_string(),
        }),
        Err(payload) => Err(DeviceError::Open {
            ordinal,
            message: panic_message(payload.as_ref()),
        }),
    }
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(ordinal: usize) -> Result<Device, DeviceError> {
    Err(DeviceError::NotBuilt { ordinal })
}

/// candle's error without the backtrace candle attaches when `RUST_BACKTRACE` is set: the
/// reason goes into one log line or exit message.
#[cfg(feature = "cuda")]
fn without_backtrace(mut error: candle_core::Error) -> candle_core::Error {
    while let candle_core::Error::WithBacktrace { inner, .. } = error {
        error = *inner;
    }
    error
}

/// The text of a caught panic, for the fallback reason.
#[cfg(feature = "cuda")]
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        format!("CUDA setup panicked: {text}")
    } else if let Some(text) = payload.downcast_ref::<String>() {
        format!("CUDA setup panicked: {text}")
    } else {
        "CUDA setup panicked".into()
    }
}

impl fmt::Display for TrainerDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrainerDevice::Cpu => f.write_str("cpu"),
            TrainerDevice::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}

impl FromStr for TrainerDevice {
    type Err = DeviceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let unknown = || DeviceError::Unknown { text: text.into() };
        match text {
            "cpu" => Ok(TrainerDevice::Cpu),
            "cuda" => Ok(TrainerDevice::Cuda(0)),
            _ => {
                let ordinal = text.strip_prefix("cuda:").ok_or_else(unknown)?;
                ordinal
                    .parse()
                    .map(TrainerDevice::Cuda)
                    .map_err(|_| unknown())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_it_displays_and_nothing_else() {
        for device in [
            TrainerDevice::Cpu,
            TrainerDevice::Cuda(0),
            TrainerDevice::Cuda(7),
        ] {
            assert_eq!(
                device.to_string().parse::<TrainerDevice>().ok(),
                Some(device)
            );
        }
        assert_eq!(
            "cuda".parse::<TrainerDevice>().ok(),
            Some(TrainerDevice::Cuda(0))
        );
        for text in [
            "", "gpu", "CPU", "cuda:", "cuda:-1", "cuda:x", "cuda0", " cpu",
        ] {
            assert!(
                matches!(
                    text.parse::<TrainerDevice>(),
                    Err(DeviceError::Unknown { .. })
                ),
                "{text:?}"
            );
        }
    }

    #[test]
    fn the_cpu_always_opens() {
        assert!(TrainerDevice::Cpu.open().is_ok_and(|d| d.is_cpu()));
        assert_eq!(device_memory(&Device::Cpu), None);
        let (device, reason) = TrainerDevice::Cpu.open_or_cpu();
        assert!(device.is_cpu() && reason.is_none());
    }

    #[test]
    fn a_gpu_that_cannot_be_opened_falls_back_to_the_cpu_with_a_reason() {
        // An ordinal no host has: with or without the `cuda` feature, with or without a GPU,
        // opening fails with a reason instead of panicking.
        let (device, reason) = TrainerDevice::Cuda(1 << 20).open_or_cpu();
        assert!(device.is_cpu());
        let reason = reason.map(|r| r.to_string()).unwrap_or_default();
        if TrainerDevice::CUDA_BUILT {
            assert!(reason.contains("cannot open CUDA GPU 1048576"), "{reason}");
        } else {
            assert!(reason.contains("--features cuda"), "{reason}");
        }
    }
}

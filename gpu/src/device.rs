//! Finding out whether this host can run the CUDA kernels, without ever failing to start.
//!
//! cudarc panics when a library it needs cannot be loaded, and when a loaded library lacks
//! a symbol (an old driver). The library check comes first, before any other cudarc call,
//! so a host without a driver never reaches cudarc's loader. The remaining calls run under
//! [`std::panic::catch_unwind`] as a last guard, so a broken or very old driver also yields
//! a CPU report. (The default panic hook still prints cudarc's message to stderr, which
//! helps whoever debugs that host; murmur does not build with `panic = "abort"`, which would
//! defeat the guard.)

use std::ffi::c_int;
use std::fmt;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::{self, CUdevice_attribute};
use thiserror::Error;

/// Which backend the communication kernels can use on this host, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceReport {
    /// A usable CUDA GPU.
    Cuda(CudaDevice),
    /// No usable CUDA GPU; the CPU backend runs the kernels.
    Cpu {
        /// The step of the probe that failed.
        reason: CudaUnavailable,
    },
}

impl DeviceReport {
    /// Whether the report found a usable CUDA GPU.
    pub fn is_cuda(&self) -> bool {
        matches!(self, DeviceReport::Cuda(_))
    }
}

impl fmt::Display for DeviceReport {
    /// One line for the daemon's log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceReport::Cuda(device) => write!(f, "CUDA available: {device}"),
            DeviceReport::Cpu { reason } => write!(f, "CUDA unavailable, using the CPU: {reason}"),
        }
    }
}

/// A CUDA GPU that the probe reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDevice {
    /// The device's ordinal, as `CUDA_VISIBLE_DEVICES` leaves them numbered.
    pub ordinal: usize,
    /// GPUs the driver sees on this host.
    pub device_count: usize,
    /// The device's name, e.g. `"NVIDIA H100 80GB HBM3"`.
    pub name: String,
    /// Total device memory in bytes.
    pub memory_bytes: u64,
    /// Compute capability as (major, minor), e.g. `(9, 0)`.
    pub compute_capability: (u32, u32),
    /// The newest CUDA version the driver supports, as (major, minor), e.g. `(12, 8)`.
    pub driver_cuda_version: (u32, u32),
}

impl fmt::Display for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = self.memory_bytes as f64 / f64::from(1u32 << 30);
        write!(
            f,
            "GPU {} of {} ({}, {gib:.1} GiB, compute capability {}.{}, driver CUDA {}.{})",
            self.ordinal,
            self.device_count,
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.driver_cuda_version.0,
            self.driver_cuda_version.1,
        )
    }
}

/// Why the CUDA kernels cannot run on this host.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CudaUnavailable {
    /// No CUDA driver library could be loaded: no NVIDIA driver is installed, or the
    /// library is not on the loader's path.
    #[error(
        "no CUDA driver library (libcuda.so) found; install the NVIDIA driver \
         or add its directory to LD_LIBRARY_PATH to use a GPU"
    )]
    NoDriverLibrary,
    /// The driver library loaded but `cuInit` failed (driver/kernel-module mismatch, no
    /// device nodes in a container, ...).
    #[error("the CUDA driver failed to initialize ({error}); check that `nvidia-smi` works")]
    DriverInit {
        /// The driver's error name and description.
        error: String,
    },
    /// The driver initialized but sees no GPU.
    #[error("the CUDA driver sees no GPU; check CUDA_VISIBLE_DEVICES")]
    NoDevice,
    /// The requested GPU ordinal is not among the driver's devices.
    #[error("GPU {ordinal} was requested but the CUDA driver sees only {count}")]
    NoSuchOrdinal {
        /// The ordinal requested.
        ordinal: usize,
        /// GPUs the driver sees.
        count: usize,
    },
    /// A query about the GPU failed.
    #[error("querying GPU {ordinal} failed ({error}); check that `nvidia-smi` works")]
    DeviceQuery {
        /// The ordinal queried.
        ordinal: usize,
        /// The driver's error name and description.
        error: String,
    },
    /// The GPU is usable but NVRTC, which compiles murmur's kernels, could not be loaded.
    #[error(
        "found {device} but no NVRTC library (libnvrtc.so); install the CUDA runtime \
         compiler (cuda-nvrtc) to run murmur's kernels on it"
    )]
    NoNvrtc {
        /// The GPU found, as its one-line description.
        device: String,
    },
    /// The driver library is incomplete: loading one of its functions failed.
    #[error("the CUDA driver library is unusable ({message}); it may be older than CUDA 12")]
    BrokenDriver {
        /// What the loader reported.
        message: String,
    },
}

/// Probes whether GPU 0 can run murmur's CUDA kernels. Never panics.
///
/// murmur ships one binary for hosts with and without NVIDIA GPUs, so it loads the CUDA
/// driver at run time. The probe checks, in order: the driver library (`libcuda.so`), the
/// driver's initialization, the GPU, and NVRTC (`libnvrtc.so`), which compiles murmur's
/// kernels at run time. The first step that fails becomes the [`CudaUnavailable`] reason
/// of [`DeviceReport::Cpu`]. The probe creates no CUDA context, so it takes no device
/// memory. The daemon logs the report once (its `Display` is that line).
pub fn detect() -> DeviceReport {
    detect_ordinal(0)
}

/// As [`detect`], for the GPU with the given ordinal.
pub fn detect_ordinal(ordinal: usize) -> DeviceReport {
    if !driver_library_present() {
        return DeviceReport::Cpu {
            reason: CudaUnavailable::NoDriverLibrary,
        };
    }
    let probed = std::panic::catch_unwind(|| probe(ordinal)).unwrap_or_else(|payload| {
        Err(CudaUnavailable::BrokenDriver {
            message: panic_message(payload.as_ref()),
        })
    });
    let device = match probed {
        Ok(device) => device,
        Err(reason) => return DeviceReport::Cpu { reason },
    };
    if !nvrtc_library_present() {
        return DeviceReport::Cpu {
            reason: CudaUnavailable::NoNvrtc {
                device: device.to_string(),
            },
        };
    }
    DeviceReport::Cuda(device)
}

/// Whether the CUDA driver library (`libcuda.so`) can be opened.
#[cfg(not(feature = "link-cuda"))]
fn driver_library_present() -> bool {
    // SAFETY: `is_culib_present` only tries to open the candidate library names and closes
    // what it opened; it touches no other cudarc state, and is the one call that is safe to
    // make without a driver.
    unsafe { sys::is_culib_present() }
}

/// Whether NVRTC (`libnvrtc.so`) can be opened.
#[cfg(not(feature = "link-cuda"))]
fn nvrtc_library_present() -> bool {
    // SAFETY: as for the driver library: this only opens and closes candidate names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// With `link-cuda` the dynamic loader resolved `libcuda.so` before `main` ran: a process
/// without it never starts.
#[cfg(feature = "link-cuda")]
fn driver_library_present() -> bool {
    true
}

/// With `link-cuda` NVRTC is linked like the driver library.
#[cfg(feature = "link-cuda")]
fn nvrtc_library_present() -> bool {
    true
}

/// Initializes the driver and reads the device's properties. Creates no context, so it
/// takes no device memory.
fn probe(ordinal: usize) -> Result<CudaDevice, CudaUnavailable> {
    result::init().map_err(|e| CudaUnavailable::DriverInit { error: describe(e) })?;
    let query = |e: DriverError| CudaUnavailable::DeviceQuery {
        ordinal,
        error: describe(e),
    };
    let count = result::device::get_count().map_err(query)?;
    let count = usize::try_from(count).unwrap_or(0);
    if count == 0 {
        return Err(CudaUnavailable::NoDevice);
    }
    let Some(cu_ordinal) = c_int::try_from(ordinal).ok().filter(|_| ordinal < count) else {
        return Err(CudaUnavailable::NoSuchOrdinal { ordinal, count });
    };
    let dev = result::device::get(cu_ordinal).map_err(query)?;
    let name = result::device::get_name(dev).map_err(query)?;
    // SAFETY: `dev` was returned by `device::get` after a successful `init`.
    let memory_bytes = unsafe { result::device::total_mem(dev) }.map_err(query)?;
    let attribute = |attribute| {
        // SAFETY: `dev` was returned by `device::get` after a successful `init`.
        unsafe { result::device::get_attribute(dev, attribute) }
            .map(|v| u32::try_from(v).unwrap_or(0))
            .map_err(query)
    };
    let major = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let mut version: c_int = 0;
    // SAFETY: `version` is a valid place for the driver to write one int; the driver is
    // initialized.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(query)?;
    // The driver encodes CUDA x.y as 1000·x + 10·y.
    let version = u32::try_from(version).unwrap_or(0);
    Ok(CudaDevice {
        ordinal,
        device_count: count,
        name,
        memory_bytes: u64::try_from(memory_bytes).unwrap_or(u64::MAX),
        compute_capability: (major, minor),
        driver_cuda_version: (version / 1000, version % 1000 / 10),
    })
}

/// The driver's name and description of an error, e.g.
/// `CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected`.
pub(crate) fn describe(error: DriverError) -> String {
    match (error.error_name(), error.error_string()) {
        (Ok(name), Ok(text)) => format!("{}: {}", name.to_string_lossy(), text.to_string_lossy()),
        _ => format!("CUresult {:?}", error.0),
    }
}

/// The text of a caught panic, when it is a string.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic while loading a driver function".to_owned()
    }
}

//! Kernels of murmur's communication path: what one averaging step does to tensor data.
//!
//! The trainer leaves gradients or parameters in one flat buffer per tensor group. An
//! averaging step encodes parts of that buffer for the wire (folding in the error-feedback
//! residual), decode-accumulates the parts that arrive into a weighted sum, and mixes
//! buffers with scales and weighted adds (push-sum in SGP, the reducer's mean in butterfly
//! all-reduce). This crate provides those operations behind one trait, [`Backend`], so that
//! averaging can be written once and run wherever the data lives. Today `murmur bench
//! codecs` and the tests run them; the averaging engines of `murmur_gossip::engine` still
//! encode and decode on the host with `murmur_protocol::codec` and do not take a backend
//! yet.
//!
//!
//! - [`CpuBackend`] works on host vectors and calls the reference codecs in
//!   `murmur_protocol::codec` directly; it is the reference for every other backend.
//! - [`CudaBackend`] keeps buffers in GPU memory ([`CudaBuffer`]) and runs NVRTC-compiled
//!   CUDA kernels ([`cuda`]); only encoded bytes cross PCIe. Its results are byte-identical
//!   to the CPU backend's, so that CPU and GPU peers mix freely in one swarm.
//!
//! [`clip`] holds CenteredClip's arithmetic in the order the GPU computes it, and [`bench`](mod@bench)
//! measures the device codecs against a device-to-device copy.
//!
//! [`detect`] tells the daemon whether this host could run CUDA kernels, and why not when
//! it cannot; it never panics, whatever the host has installed.
//!
//! ```
//! use murmur_gpu::{Backend, CpuBackend};
//! use murmur_protocol::codec::{Codec, CodecSpec};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut backend = CpuBackend::new();
//! let mut codec = Codec::new(CodecSpec::Int8 { block: 64 })?;
//! let local = vec![0.5_f32; 256];
//!
//! // Send the second half of the tensor.
//! let mut wire = vec![0u8; codec.max_encoded_len(128)];
//! let written = backend.encode(&mut codec, &local, 128..256, &mut wire)?;
//!
//! // The reducer of that half adds it, weighted by the samples behind it, then divides.
//! let mut sum = backend.alloc(128)?;
//! backend.decode_accumulate(&mut codec, &wire[..written], 32.0, &mut sum, 0..128)?;
//! backend.scale(&mut sum, 0..128, 1.0 / 32.0)?;
//! assert!((sum[0] - 0.5).abs() <= codec.error_bound(&local));
//! # Ok(())
//! # }
//! ```

mod backend;
pub mod bench;
pub mod clip;
mod cpu;
pub mod cuda;
mod device;
mod error;

pub use backend::{Backend, DeviceBuffer};
pub use cpu::CpuBackend;
pub use cuda::{CudaBackend, CudaBuffer};
pub use device::{CudaDevice, CudaUnavailable, DeviceReport, detect, detect_ordinal};
pub use error::GpuError;

//! What can go wrong on the communication path's kernels.

use murmur_protocol::codec::CodecError;
use thiserror::Error;

use crate::CudaUnavailable;

/// An error from a [`Backend`](crate::Backend) operation. A failed operation leaves every
/// buffer it was given exactly as it was.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GpuError {
    /// Encoding or decoding failed: non-finite input, a malformed or wrongly sized part from
    /// a peer, or an output buffer smaller than [`Codec::max_encoded_len`].
    ///
    /// [`Codec::max_encoded_len`]: murmur_protocol::codec::Codec::max_encoded_len
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A range does not fit inside the buffer it addresses; the part plan was made for a
    /// different tensor layout than the buffer holds.
    #[error(
        "{op}: range {start}..{end} does not fit a buffer of {len} elements; \
         check that the part plan was made for this buffer"
    )]
    RangeOutOfBounds {
        /// The operation that was asked for.
        op: &'static str,
        /// First element of the range.
        start: usize,
        /// One past the last element of the range.
        end: usize,
        /// Elements in the buffer.
        len: usize,
    },
    /// The two sides of an operation address different numbers of elements.
    #[error(
        "{op}: source has {source_len} elements but destination has {dest_len}; both sides must be the same size"
    )]
    LengthMismatch {
        /// The operation that was asked for.
        op: &'static str,
        /// Elements on the source side.
        source_len: usize,
        /// Elements on the destination side.
        dest_len: usize,
    },
    /// A mixing factor is NaN or infinite; a push-sum weight or a sample count upstream has
    /// diverged, and applying it would poison the whole buffer.
    #[error(
        "{op}: factor {value} is not finite; the push-sum weight or sample count that produced it has diverged"
    )]
    NonFiniteFactor {
        /// The operation that was asked for.
        op: &'static str,
        /// The factor given.
        value: f32,
    },
    /// A buffer could not be allocated; use a smaller model or part size, or free memory.
    #[error(
        "cannot allocate a buffer of {elements} elements ({bytes} bytes); use a smaller model or part size"
    )]
    OutOfMemory {
        /// Elements requested.
        elements: usize,
        /// Bytes requested (saturating at `usize::MAX`).
        bytes: usize,
    },
    /// The CUDA backend was asked for on a host that cannot run it; the daemon falls back
    /// to the CPU backend.
    #[error("cannot use CUDA: {0}")]
    Unavailable(#[from] CudaUnavailable),
    /// NVRTC rejected one of murmur's kernel sources. Only a broken or unexpected NVRTC
    /// version can cause this; the log says what it objected to.
    #[error(
        "NVRTC failed to compile the {source_name} kernels ({error}); install a CUDA 12 NVRTC \
         matching the driver. Compiler log:\n{log}"
    )]
    KernelCompile {
        /// Which kernel source failed, e.g. `"blockwise"`.
        source_name: &'static str,
        /// NVRTC's error.
        error: String,
        /// NVRTC's compile log.
        log: String,
    },
    /// A CUDA driver call failed: out of device memory, a PTX the driver is too old to
    /// load, or a GPU fault. Device buffers touched by the failed operation may hold
    /// partial results.
    #[error(
        "{op}: the CUDA driver reported {error}; check `nvidia-smi`, free device memory, \
         or update the driver to at least the CUDA version of NVRTC"
    )]
    Driver {
        /// The operation that was asked for.
        op: &'static str,
        /// The driver's error name and description.
        error: String,
    },
    /// The GPU's validation of a received part disagreed with the reference codec's: a
    /// defect in murmur's kernels, never a peer's fault.
    #[error(
        "{op}: the GPU rejected a {codec} part that the reference codec accepts; \
         please report this with the part that caused it"
    )]
    KernelMismatch {
        /// The operation that was asked for.
        op: &'static str,
        /// The codec's name.
        codec: &'static str,
    },
}

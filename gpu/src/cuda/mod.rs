//! The CUDA backend: the communication kernels on an NVIDIA GPU, through cudarc.
//!
//! CUDA is loaded at run time, so the same binary runs on hosts without it: a
//! [`CudaBackend`] is only ever built after [`crate::detect_ordinal`] found
//! the driver and NVRTC libraries, because cudarc panics when a library it needs is
//! missing. The kernels are CUDA C (`src/cuda/kernels/*.cu`) compiled by NVRTC when the
//! backend is built, for the GPU's own architecture.
//!
//! # Byte identity with the CPU
//!
//! Every kernel reproduces the reference codecs of `murmur_protocol::codec` bit for bit:
//! the same integer bit tricks, the same rounding (explicit `_rn` intrinsics, no fused
//! multiply-adds, subnormals kept), and float sums in the reference's documented order.
//! Maxima are integer maxima over bit patterns, which no order can change. So a GPU peer's
//! bytes are a CPU peer's bytes, and the reverse. One caveat: a NaN already inside a
//! buffer comes out of the mixing kernels as the GPU's canonical NaN rather than with the
//! CPU's payload; no codec ever lets a NaN in.
//!
//! # What crosses PCIe
//!
//! Tensors stay in device memory ([`CudaBuffer`]). Encoding runs on the device and only the
//! encoded bytes travel to the host; a received part travels to the device encoded and is
//! validated and decode-accumulated there. A round therefore moves little more than the
//! encoded size, plus 16 bytes of status per operation. Copies go through pinned staging
//! buffers on a stream of their own (see `transfer.rs`).
//!
//! `topk` is the exception: selecting the `k` largest magnitudes and compressing with zstd
//! are host work in the reference, and a device selection must reproduce its exact tie
//! order before zstd sees the bytes. The backend runs `topk` through the reference codec
//! on the host and moves the whole part across PCIe (4 bytes per element each way). Its
//! bytes are the reference's by construction.
//!
//! # Validation of received parts
//!
//! The device checks a received part (block scales, or every element of a float codec)
//! before any kernel writes the accumulator, and the write kernels do nothing once a check
//! failed, so a rejected part changes nothing. When the device flags a part, the host
//! replays it through the reference decoder to name the exact error the CPU backend
//! would have returned.

mod bench;
mod clip;
mod codec;
mod kernels;
mod transfer;

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DriverError, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use murmur_protocol::codec::Codec;

use crate::backend::{Backend, DeviceBuffer, check_factor, check_range, check_same_len};
use crate::device::{CudaDevice, DeviceReport, describe, detect_ordinal};
use crate::{CudaUnavailable, GpuError};

pub use kernels::{KERNEL_SOURCES, KernelSource, compile, compile_options};

use kernels::Kernels;
use transfer::{Staging, download_into, upload_from};

/// Threads per block of every kernel: eight warps.
const THREADS: u32 = 256;
/// Resident blocks per multiprocessor that the grid-stride kernels aim for.
const BLOCKS_PER_SM: u32 = 16;

/// A flat buffer of `f32` in device memory.
///
/// An empty buffer still holds one device element, because CUDA cannot allocate zero
/// bytes; [`DeviceBuffer::len`] says 0 and no operation addresses it.
#[derive(Debug)]
pub struct CudaBuffer {
    slice: CudaSlice<f32>,
    len: usize,
}

impl CudaBuffer {
    /// The device memory, e.g. to hand to a training framework. Its first
    /// [`DeviceBuffer::len`] elements are the buffer.
    pub fn as_cuda_slice(&self) -> &CudaSlice<f32> {
        &self.slice
    }

    /// The device memory, mutably.
    pub fn as_cuda_slice_mut(&mut self) -> &mut CudaSlice<f32> {
        &mut self.slice
    }
}

impl DeviceBuffer for CudaBuffer {
    fn len(&self) -> usize {
        self.len
    }
}

/// The communication kernels on one CUDA GPU.
///
/// It owns a context on the GPU, a compute stream for kernels, a copy stream for
/// host ↔ device transfers, the compiled kernels, and reusable scratch: the device copy of
/// an encoded part, the error-feedback scratch, pinned staging buffers and the status
/// words. The steady state allocates nothing.
pub struct CudaBackend {
    device: CudaDevice,
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    kernels: Kernels,
    multiprocessors: u32,
    staging: Staging,
    /// Encoded bytes on the device: what an encode kernel wrote, or a part that arrived.
    wire: CudaSlice<u8>,
    /// `src + residual` of the part being encoded with error feedback.
    corrected: CudaSlice<f32>,
    /// `[encode, validate]` status words of the current operation (see `prelude.cuh`).
    status: CudaSlice<u64>,
    status_host: PinnedHostSlice<u64>,
    /// Host copies for the `topk` path and for naming a rejected part's error.
    host_values: Vec<f32>,
    host_residual: Vec<f32>,
    clip: clip::ClipScratch,
}

impl fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Copies may still read the pinned staging buffers; they must end before the
        // buffers are freed. Nothing can be reported from a drop.
        let _ = self.copy.synchronize();
        let _ = self.compute.synchronize();
    }
}

impl CudaBackend {
    /// Builds the backend on the GPU with the given ordinal: probes it with
    /// [`detect_ordinal`], creates a context and two streams, and compiles the kernels.
    /// A host without a usable GPU gets [`GpuError::Unavailable`] with the reason, and
    /// nothing panics.
    pub fn new(ordinal: usize) -> Result<CudaBackend, GpuError> {
        match detect_ordinal(ordinal) {
            DeviceReport::Cuda(device) => Self::on_device(device),
            DeviceReport::Cpu { reason } => Err(GpuError::Unavailable(reason)),
        }
    }

    /// Builds the backend on a GPU that [`detect_ordinal`] reported usable.
    pub fn on_device(device: CudaDevice) -> Result<CudaBackend, GpuError> {
        // cudarc panics when a driver function it needs is missing (a driver older than the
        // bindings); detection has already loaded the libraries, so catching the panic is
        // the last guard, as in `detect`.
        std::panic::catch_unwind(|| Self::build(device)).unwrap_or_else(|payload| {
            Err(GpuError::Unavailable(CudaUnavailable::BrokenDriver {
                message: crate::device::panic_message(payload.as_ref()),
            }))
        })
    }

    fn build(device: CudaDevice) -> Result<CudaBackend, GpuError> {
        let setup = |e| driver_error("starting the CUDA backend", e);
        let ctx = CudaContext::new(device.ordinal).map_err(setup)?;
        let compute = ctx.new_stream().map_err(setup)?;
        let copy = ctx.new_stream().map_err(setup)?;
        let kernels = Kernels::load(&ctx, kernels::arch_for(device.compute_capability))?;
        let multiprocessors = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(setup)?;
        let staging = Staging::new(&ctx).map_err(setup)?;
        // SAFETY: the status words are only read after a copy wrote them.
        let status_host = unsafe { ctx.alloc_pinned_with_flags::<u64>(2, 0) }.map_err(setup)?;
        let clip = clip::ClipScratch::new(&compute).map_err(setup)?;
        Ok(CudaBackend {
            wire: compute.alloc_zeros(1).map_err(setup)?,
            corrected: compute.alloc_zeros(1).map_err(setup)?,
            status: compute.alloc_zeros(2).map_err(setup)?,
            device,
            kernels,
            multiprocessors: u32::try_from(multiprocessors).unwrap_or(1).max(1),
            staging,
            status_host,
            host_values: Vec::new(),
            host_residual: Vec::new(),
            clip,
            ctx,
            compute,
            copy,
        })
    }

    /// The GPU this backend runs on.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// The CUDA context, for sharing the GPU with a training framework.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream kernels run on. Work that other code queues on it is ordered with the
    /// backend's own.
    pub fn compute_stream(&self) -> &Arc<CudaStream> {
        &self.compute
    }

    /// Waits for all queued work and reports any error the driver recorded meanwhile.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        let op = "synchronize";
        self.compute
            .synchronize()
            .map_err(|e| driver_error(op, e))?;
        self.copy.synchronize().map_err(|e| driver_error(op, e))?;
        self.ctx.check_err().map_err(|e| driver_error(op, e))
    }

    /// A grid-stride launch over `n` elements.
    fn elementwise(&self, n: usize) -> LaunchConfig {
        self.grid(n.div_ceil(THREADS as usize))
    }

    /// A launch with one warp per codec block.
    fn per_block(&self, blocks: usize) -> LaunchConfig {
        self.grid(blocks.div_ceil((THREADS / 32) as usize))
    }

    fn grid(&self, wanted: usize) -> LaunchConfig {
        let cap = self.multiprocessors * BLOCKS_PER_SM;
        let blocks = u32::try_from(wanted).unwrap_or(cap).clamp(1, cap);
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Clears the status words for a new operation.
    fn reset_status(&mut self, op: &'static str) -> Result<(), GpuError> {
        self.compute
            .memset_zeros(&mut self.status)
            .map_err(|e| driver_error(op, e))
    }

    /// Waits for the operation and returns its `[encode, validate]` status words: `None`
    /// where that step passed, else the lowest index it flagged.
    fn finish(&mut self, op: &'static str) -> Result<[Option<usize>; 2], GpuError> {
        let err = |e| driver_error(op, e);
        let host = self.status_host.as_mut_slice().map_err(err)?;
        self.copy
            .memcpy_dtoh(&self.status, &mut host[..2])
            .map_err(err)?;
        self.copy.synchronize().map_err(err)?;
        self.ctx.check_err().map_err(err)?;
        let host = self.status_host.as_slice().map_err(err)?;
        let flagged = |word: u64| (word != 0).then(|| usize::try_from(!word).unwrap_or(usize::MAX));
        Ok([flagged(host[0]), flagged(host[1])])
    }

    /// Grows a host scratch vector to `len` elements without aborting on failure.
    fn host_scratch(vec: &mut Vec<f32>, len: usize) -> Result<&mut [f32], GpuError> {
        if vec.len() < len {
            vec.try_reserve_exact(len - vec.len())
                .map_err(|_| out_of_memory(len))?;
            vec.resize(len, 0.0);
        }
        Ok(&mut vec[..len])
    }

    /// Copies `dst[range]` to the host scratch `host_values`.
    fn download_to_scratch(
        &mut self,
        src: &CudaBuffer,
        range: Range<usize>,
        op: &'static str,
    ) -> Result<(), GpuError> {
        let n = range.len();
        Self::host_scratch(&mut self.host_values, n)?;
        download_into(
            &mut self.staging,
            &self.copy,
            src,
            range,
            &mut self.host_values[..n],
            op,
        )
    }

    fn launch_mixing(
        &self,
        op: &'static str,
        launch: impl FnOnce(&Self) -> Result<(), DriverError>,
    ) -> Result<(), GpuError> {
        launch(self).map_err(|e| driver_error(op, e))
    }
}

/// Grows a device scratch buffer to at least `len` elements (it never shrinks).
fn ensure_len<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    slice: &mut CudaSlice<T>,
    len: usize,
    op: &'static str,
) -> Result<(), GpuError> {
    if slice.len() < len {
        *slice = stream
            .alloc_zeros(len)
            .map_err(|e| alloc_error(op, len, e))?;
    }
    Ok(())
}

/// A driver error as a [`GpuError`], naming the operation.
pub(crate) fn driver_error(op: &'static str, error: DriverError) -> GpuError {
    GpuError::Driver {
        op,
        error: describe(error),
    }
}

/// A failed allocation of `len` elements: out of memory, or another driver error.
fn alloc_error(op: &'static str, len: usize, error: DriverError) -> GpuError {
    if error.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        out_of_memory(len)
    } else {
        driver_error(op, error)
    }
}

pub(crate) fn out_of_memory(elements: usize) -> GpuError {
    GpuError::OutOfMemory {
        elements,
        bytes: elements.saturating_mul(size_of::<f32>()),
    }
}

/// `n` as the kernels' element count type.
fn count(n: usize) -> u64 {
    n as u64
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn alloc(&mut self, len: usize) -> Result<CudaBuffer, GpuError> {
        if len.checked_mul(size_of::<f32>()).is_none() {
            return Err(out_of_memory(len));
        }
        let slice = self
            .compute
            .alloc_zeros::<f32>(len.max(1))
            .map_err(|e| alloc_error("alloc", len, e))?;
        Ok(CudaBuffer { slice, len })
    }

    fn upload(
        &mut self,
        src: &[f32],
        dst: &mut CudaBuffer,
        range: Range<usize>,
    ) -> Result<(), GpuError> {
        check_range("upload", &range, dst.len)?;
        check_same_len("upload", src.len(), range.len())?;
        upload_from(&mut self.staging, &self.copy, src, dst, range, "upload")
    }

    fn download(
        &mut self,
        src: &CudaBuffer,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<(), GpuError> {
        check_range("download", &range, src.len)?;
        check_same_len("download", range.len(), dst.len())?;
        download_into(&mut self.staging, &self.copy, src, range, dst, "download")
    }

    fn copy(
        &mut self,
        src: &CudaBuffer,
        src_range: Range<usize>,
        dst: &mut CudaBuffer,
        dst_range: Range<usize>,
    ) -> Result<(), GpuError> {
        check_range("copy", &src_range, src.len)?;
        check_range("copy", &dst_range, dst.len)?;
        check_same_len("copy", src_range.len(), dst_range.len())?;
        if src_range.is_empty() {
            return Ok(());
        }
        let from = src.slice.slice(src_range);
        let mut to = dst.slice.slice_mut(dst_range);
        self.compute
            .memcpy_dtod(&from, &mut to)
            .map_err(|e| driver_error("copy", e))
    }

    fn fill(
        &mut self,
        buf: &mut CudaBuffer,
        range: Range<usize>,
        value: f32,
    ) -> Result<(), GpuError> {
        check_range("fill", &range, buf.len)?;
        if range.is_empty() {
            return Ok(());
        }
        let n = count(range.len());
        let cfg = self.elementwise(range.len());
        let mut y = buf.slice.slice_mut(range);
        self.launch_mixing("fill", |b| {
            let mut launch = b.compute.launch_builder(&b.kernels.fill);
            launch.arg(&mut y).arg(&n).arg(&value);
            // SAFETY: fill(float* y, u64 n, float value) writes y[0..n), which `y` covers.
            unsafe { launch.launch(cfg) }.map(drop)
        })
    }

    fn scale(
        &mut self,
        buf: &mut CudaBuffer,
        range: Range<usize>,
        alpha: f32,
    ) -> Result<(), GpuError> {
        check_range("scale", &range, buf.len)?;
        check_factor("scale", alpha)?;
        if range.is_empty() {
            return Ok(());
        }
        let n = count(range.len());
        let cfg = self.elementwise(range.len());
        let mut y = buf.slice.slice_mut(range);
        self.launch_mixing("scale", |b| {
            let mut launch = b.compute.launch_builder(&b.kernels.scale);
            launch.arg(&mut y).arg(&n).arg(&alpha);
            // SAFETY: scale(float* y, u64 n, float alpha) touches y[0..n), which `y` covers.
            unsafe { launch.launch(cfg) }.map(drop)
        })
    }

    fn axpy(
        &mut self,
        alpha: f32,
        x: &CudaBuffer,
        x_range: Range<usize>,
        y: &mut CudaBuffer,
        y_range: Range<usize>,
    ) -> Result<(), GpuError> {
        check_range("axpy", &x_range, x.len)?;
        check_range("axpy", &y_range, y.len)?;
        check_same_len("axpy", x_range.len(), y_range.len())?;
        check_factor("axpy", alpha)?;
        if x_range.is_empty() {
            return Ok(());
        }
        let n = count(x_range.len());
        let cfg = self.elementwise(x_range.len());
        let xs = x.slice.slice(x_range);
        let mut ys = y.slice.slice_mut(y_range);
        self.launch_mixing("axpy", |b| {
            let mut launch = b.compute.launch_builder(&b.kernels.axpy);
            launch.arg(&alpha).arg(&xs).arg(&mut ys).arg(&n);
            // SAFETY: axpy(float alpha, const float* x, float* y, u64 n) reads x[0..n) and
            // writes y[0..n); both views hold n elements.
            unsafe { launch.launch(cfg) }.map(drop)
        })
    }

    fn axpby(
        &mut self,
        alpha: f32,
        x: &CudaBuffer,
        x_range: Range<usize>,
        beta: f32,
        y: &mut CudaBuffer,
        y_range: Range<usize>,
    ) -> Result<(), GpuError> {
        check_range("axpby", &x_range, x.len)?;
        check_range("axpby", &y_range, y.len)?;
        check_same_len("axpby", x_range.len(), y_range.len())?;
        check_factor("axpby", alpha)?;
        check_factor("axpby", beta)?;
        if x_range.is_empty() {
            return Ok(());
        }
        let n = count(x_range.len());
        let cfg = self.elementwise(x_range.len());
        let xs = x.slice.slice(x_range);
        let mut ys = y.slice.slice_mut(y_range);
        self.launch_mixing("axpby", |b| {
            let mut launch = b.compute.launch_builder(&b.kernels.axpby);
            launch.arg(&alpha).arg(&xs).arg(&beta).arg(&mut ys).arg(&n);
            // SAFETY: axpby(float alpha, const float* x, float beta, float* y, u64 n) reads
            // x[0..n) and y[0..n) and writes y[0..n); both views hold n elements.
            unsafe { launch.launch(cfg) }.map(drop)
        })
    }

    fn encode(
        &mut self,
        codec: &mut Codec,
        src: &CudaBuffer,
        range: Range<usize>,
        dst: &mut [u8],
    ) -> Result<usize, GpuError> {
        check_range("encode", &range, src.len)?;
        self.encode_part(codec, src, range, dst)
    }

    fn encode_with_feedback(
        &mut self,
        codec: &mut Codec,
        src: &CudaBuffer,
        residual: &mut CudaBuffer,
        range: Range<usize>,
        dst: &mut [u8],
    ) -> Result<usize, GpuError> {
        check_range("encode_with_feedback", &range, src.len)?;
        check_range("encode_with_feedback", &range, residual.len)?;
        self.encode_part_with_feedback(codec, src, residual, range, dst)
    }

    fn decode(
        &mut self,
        codec: &mut Codec,
        src: &[u8],
        dst: &mut CudaBuffer,
        range: Range<usize>,
    ) -> Result<(), GpuError> {
        check_range("decode", &range, dst.len)?;
        self.decode_part(codec, src, None, dst, range)
    }

    fn decode_accumulate(
        &mut self,
        codec: &mut Codec,
        src: &[u8],
        weight: f32,
        acc: &mut CudaBuffer,
        range: Range<usize>,
    ) -> Result<(), GpuError> {
        check_range("decode_accumulate", &range, acc.len)?;
        self.decode_part(codec, src, Some(weight), acc, range)
    }
}

#[cfg(test)]
mod tests {
    use super::CudaBackend;

    /// The daemon hands the backend to its averaging task, so it must move between threads.
    #[test]
    fn backend_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<CudaBackend>();
    }
}

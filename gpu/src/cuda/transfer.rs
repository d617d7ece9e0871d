//! Host ↔ device copies through pinned staging buffers on the copy stream.
//!
//! Encoded parts and tensors arrive in and leave from ordinary (pageable) host memory.
//! The DMA engine can only read and write page-locked memory asynchronously, so copies go
//! through two pinned staging buffers of [`STAGING_BYTES`] each, in pieces: while the copy
//! engine moves one piece, the host fills or drains the other. The copies run on their own
//! stream, so they overlap kernels on the compute stream; cudarc's event tracking orders
//! each copy after the kernels that write what it reads and before the kernels that read
//! what it writes.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaStream, CudaView, CudaViewMut, DriverError, PinnedHostSlice,
};

use super::{CudaBuffer, driver_error, out_of_memory};
use crate::GpuError;

/// Size of each staging buffer: large enough that a piece's copy time dwarfs the driver's
/// per-call overhead, small enough to keep two per backend.
pub(crate) const STAGING_BYTES: usize = 4 << 20;

/// Two pinned buffers and, for each, an event marking the end of the last copy that used
/// it.
#[derive(Debug)]
pub(crate) struct Staging {
    buffers: [PinnedHostSlice<u8>; 2],
    done: [CudaEvent; 2],
}

impl Staging {
    /// Allocates both buffers in page-locked host memory.
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Staging, DriverError> {
        // Plain page-locked memory (flags 0): the host reads what the device wrote, and
        // write-combined memory would make those reads very slow.
        // SAFETY: the buffers' contents are only read after a copy or the host wrote them.
        let alloc = || unsafe { ctx.alloc_pinned_with_flags::<u8>(STAGING_BYTES, 0) };
        let event = || ctx.new_event(None);
        Ok(Staging {
            buffers: [alloc()?, alloc()?],
            done: [event()?, event()?],
        })
    }

    /// Copies `src` into `dst`, which has the same length, and returns once the last piece
    /// is queued: the host may reuse `src` at once, and later work on `stream` (or on any
    /// stream, through `dst`'s events) sees the data.
    pub(crate) fn upload(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &[u8],
        dst: &mut CudaViewMut<'_, u8>,
    ) -> Result<(), DriverError> {
        debug_assert_eq!(src.len(), dst.len());
        for (k, piece) in src.chunks(STAGING_BYTES).enumerate() {
            let slot = k % 2;
            let offset = k * STAGING_BYTES;
            // The copy that last read this buffer must be over before the host refills it.
            self.done[slot].synchronize()?;
            let host = self.buffers[slot].as_mut_slice()?;
            host[..piece.len()].copy_from_slice(piece);
            let mut target = dst.slice_mut(offset..offset + piece.len());
            stream.memcpy_htod(&host[..piece.len()], &mut target)?;
            self.done[slot].record(stream)?;
        }
        Ok(())
    }

    /// Copies `src` into `dst`, which has the same length, and returns once all of it is
    /// in `dst`. Pieces are queued two ahead, so the host drains one buffer while the copy
    /// engine fills the other.
    pub(crate) fn download(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &CudaView<'_, u8>,
        dst: &mut [u8],
    ) -> Result<(), DriverError> {
        debug_assert_eq!(src.len(), dst.len());
        let total = dst.len();
        let pieces = total.div_ceil(STAGING_BYTES);
        let piece_range = |k: usize| k * STAGING_BYTES..((k + 1) * STAGING_BYTES).min(total);
        for k in 0..pieces.min(2) {
            self.enqueue_download(stream, src, piece_range(k), k % 2)?;
        }
        for k in 0..pieces {
            let slot = k % 2;
            let range = piece_range(k);
            self.done[slot].synchronize()?;
            let host = self.buffers[slot].as_mut_slice()?;
            dst[range.clone()].copy_from_slice(&host[..range.len()]);
            if k + 2 < pieces {
                self.enqueue_download(stream, src, piece_range(k + 2), slot)?;
            }
        }
        Ok(())
    }

    fn enqueue_download(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &CudaView<'_, u8>,
        range: Range<usize>,
        slot: usize,
    ) -> Result<(), DriverError> {
        let len = range.len();
        let host = self.buffers[slot].as_mut_slice()?;
        stream.memcpy_dtoh(&src.slice(range), &mut host[..len])?;
        self.done[slot].record(stream)
    }
}

/// `dst = src[range]` through the staging buffers.
pub(crate) fn download_into(
    staging: &mut Staging,
    copy: &Arc<CudaStream>,
    src: &CudaBuffer,
    range: Range<usize>,
    dst: &mut [f32],
    op: &'static str,
) -> Result<(), GpuError> {
    if range.is_empty() {
        return Ok(());
    }
    let n = range.len();
    let view = src.slice.slice(range);
    // SAFETY: reinterpreting n f32 as 4n bytes of the same memory; u8 has alignment 1.
    let bytes = unsafe { view.transmute::<u8>(n * 4) }.ok_or_else(|| out_of_memory(n))?;
    staging
        .download(copy, &bytes, f32_bytes_mut(dst))
        .map_err(|e| driver_error(op, e))
}

/// `dst[range] = src` through the staging buffers.
pub(crate) fn upload_from(
    staging: &mut Staging,
    copy: &Arc<CudaStream>,
    src: &[f32],
    dst: &mut CudaBuffer,
    range: Range<usize>,
    op: &'static str,
) -> Result<(), GpuError> {
    if range.is_empty() {
        return Ok(());
    }
    let n = range.len();
    let mut view = dst.slice.slice_mut(range);
    // SAFETY: reinterpreting n f32 as 4n bytes of the same memory; every byte pattern is
    // a valid f32.
    let mut bytes = unsafe { view.transmute_mut::<u8>(n * 4) }.ok_or_else(|| out_of_memory(n))?;
    staging
        .upload(copy, f32_bytes(src), &mut bytes)
        .map_err(|e| driver_error(op, e))
}

/// The bytes of a slice of `f32`.
fn f32_bytes(xs: &[f32]) -> &[u8] {
    // SAFETY: `f32` has no padding and every byte of it is initialized; `u8` has alignment
    // 1, and the new slice covers exactly the same memory for the same lifetime.
    unsafe { std::slice::from_raw_parts(xs.as_ptr().cast(), size_of_val(xs)) }
}

/// The bytes of a mutable slice of `f32`.
fn f32_bytes_mut(xs: &mut [f32]) -> &mut [u8] {
    // SAFETY: as in `f32_bytes`; in addition every byte pattern is a valid `f32`, so any
    // write through the byte slice leaves valid values.
    unsafe { std::slice::from_raw_parts_mut(xs.as_mut_ptr().cast(), size_of_val(xs)) }
}

//! CenteredClip on the device: the squared distances of contributions from the center,
//! and the clipped step. The host computes each row's factor from its distance with
//! [`crate::clip::clip_factor`]; see [`crate::clip`] for the summation order.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg};

use super::{CudaBackend, CudaBuffer, THREADS, count, driver_error, ensure_len};
use crate::GpuError;
use crate::backend::{check_range, check_same_len};
use crate::clip::CLIP_TILE;

/// Rows per launch of the distance kernel: CUDA's limit on a grid's second dimension.
const MAX_ROWS_PER_LAUNCH: usize = 65_535;

/// Reusable device and host space for CenteredClip.
#[derive(Debug)]
pub(super) struct ClipScratch {
    row_offsets: CudaSlice<u64>,
    factors: CudaSlice<f32>,
    partials: CudaSlice<f64>,
    offsets_host: Vec<u64>,
    partials_host: Vec<f64>,
}

impl ClipScratch {
    pub(super) fn new(stream: &Arc<CudaStream>) -> Result<ClipScratch, DriverError> {
        Ok(ClipScratch {
            row_offsets: stream.alloc_zeros(1)?,
            factors: stream.alloc_zeros(1)?,
            partials: stream.alloc_zeros(1)?,
            offsets_host: Vec::new(),
            partials_host: Vec::new(),
        })
    }
}

impl CudaBackend {
    /// Checks that every row `rows[start..start + len]` fits and uploads the row starts.
    fn upload_row_offsets(
        &mut self,
        op: &'static str,
        rows: &CudaBuffer,
        row_starts: &[usize],
        len: usize,
    ) -> Result<(), GpuError> {
        self.clip.offsets_host.clear();
        for &start in row_starts {
            check_range(op, &(start..start.saturating_add(len)), rows.len)?;
            self.clip.offsets_host.push(count(start));
        }
        let n = row_starts.len();
        ensure_len(&self.compute, &mut self.clip.row_offsets, n, op)?;
        let mut target = self.clip.row_offsets.slice_mut(..n);
        self.compute
            .memcpy_htod(&self.clip.offsets_host[..], &mut target)
            .map_err(|e| driver_error(op, e))
    }

    /// Writes `‖x_r − v‖²` into `out[r]` for every row `x_r = rows[row_starts[r]..][..len]`,
    /// where `v = center[center_range]` and `len` is the range's length, summed in the
    /// order of [`crate::clip::squared_distance`].
    pub fn clip_squared_distances(
        &mut self,
        rows: &CudaBuffer,
        row_starts: &[usize],
        center: &CudaBuffer,
        center_range: Range<usize>,
        out: &mut [f64],
    ) -> Result<(), GpuError> {
        const OP: &str = "clip_squared_distances";
        check_range(OP, &center_range, center.len)?;
        check_same_len(OP, row_starts.len(), out.len())?;
        let len = center_range.len();
        if len == 0 || row_starts.is_empty() {
            out.fill(0.0);
            return Ok(());
        }
        self.upload_row_offsets(OP, rows, row_starts, len)?;
        let tiles = len.div_ceil(CLIP_TILE);
        let partial_count = row_starts.len() * tiles;
        ensure_len(&self.compute, &mut self.clip.partials, partial_count, OP)?;
        let tile_blocks = self.grid(tiles).grid_dim.0;
        let (elements, tile_count) = (count(len), count(tiles));
        let v = center.slice.slice(center_range);
        for first in (0..row_starts.len()).step_by(MAX_ROWS_PER_LAUNCH) {
            let batch = (row_starts.len() - first).min(MAX_ROWS_PER_LAUNCH);
            let offsets = self.clip.row_offsets.slice(first..first + batch);
            let mut partials = self
                .clip
                .partials
                .slice_mut(first * tiles..(first + batch) * tiles);
            let cfg = LaunchConfig {
                grid_dim: (tile_blocks, batch as u32, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut launch = self
                .compute
                .launch_builder(&self.kernels.clip_tile_distances);
            launch
                .arg(&rows.slice)
                .arg(&offsets)
                .arg(&v)
                .arg(&elements)
                .arg(&tile_count)
                .arg(&mut partials);
            // SAFETY: clip_tile_distances(const float* rows, const u64* row_offsets, const
            // float* center, u64 len, u64 tiles, double* partials) reads rows[offset..][..len]
            // (checked to fit above), center[..len], and writes batch × tiles partials, which
            // the view holds. It uses 256 threads, as THREADS is.
            unsafe { launch.launch(cfg) }.map_err(|e| driver_error(OP, e))?;
        }
        self.clip.partials_host.clear();
        self.clip.partials_host.resize(partial_count, 0.0);
        self.compute
            .memcpy_dtoh(
                &self.clip.partials.slice(..partial_count),
                &mut self.clip.partials_host[..],
            )
            .map_err(|e| driver_error(OP, e))?;
        self.compute
            .synchronize()
            .map_err(|e| driver_error(OP, e))?;
        for (sum, partials) in out.iter_mut().zip(self.clip.partials_host.chunks(tiles)) {
            *sum = partials.iter().fold(0.0, |total, p| total + p);
        }
        Ok(())
    }

    /// One CenteredClip step on `center[center_range]`: element `j` gains
    /// `Σ_r factors[r] · (x_r[j] − center[j])`, the terms added in row order, with rows laid
    /// out as in [`clip_squared_distances`](Self::clip_squared_distances).
    pub fn clip_step(
        &mut self,
        rows: &CudaBuffer,
        row_starts: &[usize],
        factors: &[f32],
        center: &mut CudaBuffer,
        center_range: Range<usize>,
    ) -> Result<(), GpuError> {
        const OP: &str = "clip_step";
        check_range(OP, &center_range, center.len)?;
        check_same_len(OP, row_starts.len(), factors.len())?;
        let len = center_range.len();
        if len == 0 {
            return Ok(());
        }
        self.upload_row_offsets(OP, rows, row_starts, len)?;
        let n = row_starts.len();
        ensure_len(&self.compute, &mut self.clip.factors, n.max(1), OP)?;
        if n > 0 {
            let mut target = self.clip.factors.slice_mut(..n);
            self.compute
                .memcpy_htod(factors, &mut target)
                .map_err(|e| driver_error(OP, e))?;
        }
        let row_count = u32::try_from(n).map_err(|_| GpuError::LengthMismatch {
            op: OP,
            source_len: n,
            dest_len: u32::MAX as usize,
        })?;
        let elements = count(len);
        let cfg = self.elementwise(len);
        let mut v = center.slice.slice_mut(center_range);
        let mut launch = self.compute.launch_builder(&self.kernels.clip_step);
        launch
            .arg(&rows.slice)
            .arg(&self.clip.row_offsets)
            .arg(&self.clip.factors)
            .arg(&row_count)
            .arg(&elements)
            .arg(&mut v);
        // SAFETY: clip_step(const float* rows, const u64* row_offsets, const float* factors,
        // u32 row_count, u64 len, float* center) reads row_count offsets and factors (both
        // uploaded above) and rows[offset..][..len] (checked), and updates center[..len].
        unsafe { launch.launch(cfg) }.map_err(|e| driver_error(OP, e))?;
        Ok(())
    }
}

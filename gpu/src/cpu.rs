//! The CPU backend: host vectors, the reference codecs, and elementwise loops the compiler
//! vectorizes.
//!
//! Encoding and decoding call `murmur_protocol::codec` directly, so the CPU backend is the
//! reference every other backend is checked against. The mixing loops are plain zips over
//! slices whose lengths were checked up front, so LLVM drops the bounds checks and emits
//! SIMD; each is compiled for the baseline target and for AVX2 and chosen at run time. Both
//! builds do the same IEEE operations in the same order (Rust never fuses `a * b + c`), so
//! they give the same bits.

use std::ops::Range;

use murmur_protocol::codec::Codec;

use crate::GpuError;
use crate::backend::{Backend, check_factor, check_range, check_same_len};

/// The communication kernels on the host. Its buffers are `Vec<f32>`: a tensor that is
/// already in host memory is used as it is, and [`Backend::upload`] and
/// [`Backend::download`] are plain copies.
///
/// The backend keeps one scratch vector for error feedback, sized to the largest part it
/// has encoded, so the steady state allocates nothing.
#[derive(Debug, Default)]
pub struct CpuBackend {
    /// `src + residual` for the part being encoded with error feedback.
    corrected: Vec<f32>,
}

impl CpuBackend {
    /// A CPU backend with no scratch space allocated yet.
    pub fn new() -> CpuBackend {
        CpuBackend::default()
    }
}

impl Backend for CpuBackend {
    type Buffer = Vec<f32>;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn alloc(&mut self, len: usize) -> Result<Vec<f32>, GpuError> {
        let mut buf = Vec::new();
        buf.try_reserve_exact(len)
            .map_err(|_| GpuError::OutOfMemory {
                elements: len,
                bytes: len.saturating_mul(size_of::<f32>()),
            })?;
        buf.resize(len, 0.0);
        Ok(buf)
    }

    fn upload(
        &mut self,
        src: &[f32],
        dst: &mut Vec<f32>,
        range: Range<usize>,
    ) -> Result<(), GpuError> {
        check_range("upload", &range, dst.len())?;
        check_same_len("upload", src.len(), range.len())?;
        dst[range].copy_from_slice(src);
        Ok(())
    }

    fn download(
        &mut self,
        src: &Vec<f32>,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<(), GpuError> {
        check_range("download", &range, src.len())?;
        check_same_len("download", range.len(), dst.len())?;
        dst.copy_from_slice(&src[range]);
        Ok(())
    }

    fn copy(
        &mut self,
        src: &Vec<f32>,
        src_range: Range<usize>,
        dst: &mut Vec<f32>,
        dst_range: Range<usize>,
    ) -> Result<(), GpuError> {
        check_range("copy", &src_range, src.len())?;
        check_range("copy", &dst_range, dst.len())?;
        check_same_len("copy", src_range.len(), dst_range.len())?;
        dst[dst_range].copy_from_slice(&src[src_range]);
        Ok(())
    }

    fn fill(
        &mut self,
        buf: &mut Vec<f32>,
        range: Range<usize>,
        value: f32,
    ) -> Result<(), GpuError> {
        check_range("fill", &range, buf.len())?;
        buf[range].fill(value);
        Ok(())
    }

    fn scale(
        &mut self,
        buf: &mut Vec<f32>,
        range: Range<usize>,
        alpha: f32,
    ) -> Result<(), GpuError> {
        check_range("scale", &range, buf.len())?;
        check_factor("scale", alpha)?;
        scale_in_place(&mut buf[range], alpha);
        Ok(())
    }

    fn axpy(
        &mut self,
        alpha: f32,
        x: &Vec<f32>,
        x_range: Range<usize>,
        y: &mut Vec<f32>,
        y_range: Range<usize>,
    ) -> Result<(), GpuError> {
        check_range("axpy", &x_range, x.len())?;
        check_range("axpy", &y_range, y.len())?;
        check_same_len("axpy", x_range.len(), y_range.len())?;
        check_factor("axpy", alpha)?;
        add_scaled(alpha, &x[x_range], &mut y[y_range]);
        Ok(())
    }

    fn axpby(
        &mut self,
        alpha: f32,
        x: &Vec<f32>,
        x_range: Range<usize>,
        beta: f32,
        y: &mut Vec<f32>,
        y_range: Range<usize>,
    ) -> Result<(), GpuError> {
        check_range("axpby", &x_range, x.len())?;
        check_range("axpby", &y_range, y.len())?;
        check_same_len("axpby", x_range.len(), y_range.len())?;
        check_factor("axpby", alpha)?;
        check_factor("axpby", beta)?;
        mix(alpha, &x[x_range], beta, &mut y[y_range]);
        Ok(())
    }

    fn encode(
        &mut self,
        codec: &mut Codec,
        src: &Vec<f32>,
        range: Range<usize>,
        dst: &mut [u8],
    ) -> Result<usize, GpuError> {
        check_range("encode", &range, src.len())?;
        Ok(codec.encode(&src[range], dst)?)
    }

    fn encode_with_feedback(
        &mut self,
        codec: &mut Codec,
        src: &Vec<f32>,
        residual: &mut Vec<f32>,
        range: Range<usize>,
        dst: &mut [u8],
    ) -> Result<usize, GpuError> {
        check_range("encode_with_feedback", &range, src.len())?;
        check_range("encode_with_feedback", &range, residual.len())?;
        let len = range.len();
        if self.corrected.len() < len {
            let grow = len - self.corrected.len();
            self.corrected
                .try_reserve_exact(grow)
                .map_err(|_| GpuError::OutOfMemory {
                    elements: len,
                    bytes: len.saturating_mul(size_of::<f32>()),
                })?;
            self.corrected.resize(len, 0.0);
        }
        // The same steps as `ErrorFeedback::encode`, in the same order, on a scratch copy so
        // that a failure leaves the residual alone: t = x + e; send t; e' = t − decode(sent).
        let corrected = &mut self.corrected[..len];
        add(&src[range.clone()], &residual[range.clone()], corrected);
        let written = codec.encode(corrected, dst)?;
        codec.decode_accumulate(&dst[..written], -1.0, corrected)?;
        residual[range].copy_from_slice(corrected);
        Ok(written)
    }

    fn decode(
        &mut self,
        codec: &mut Codec,
        src: &[u8],
        dst: &mut Vec<f32>,
        range: Range<usize>,
    ) -> Result<(), GpuError> {
        check_range("decode", &range, dst.len())?;
        Ok(codec.decode_into(src, &mut dst[range])?)
    }

    fn decode_accumulate(
        &mut self,
        codec: &mut Codec,
        src: &[u8],
        weight: f32,
        acc: &mut Vec<f32>,
        range: Range<usize>,
    ) -> Result<(), GpuError> {
        check_range("decode_accumulate", &range, acc.len())?;
        Ok(codec.decode_accumulate(src, weight, &mut acc[range])?)
    }
}

murmur_protocol::multiversion! {
    /// `ys[i] = alpha * ys[i]`.
    fn scale_in_place(ys: &mut [f32], alpha: f32) = scale_in_place_loop;
}

murmur_protocol::multiversion! {
    /// `ys[i] = ys[i] + alpha * xs[i]`; the slices have equal length.
    fn add_scaled(alpha: f32, xs: &[f32], ys: &mut [f32]) = add_scaled_loop;
}

murmur_protocol::multiversion! {
    /// `ys[i] = alpha * xs[i] + beta * ys[i]`; the slices have equal length.
    fn mix(alpha: f32, xs: &[f32], beta: f32, ys: &mut [f32]) = mix_loop;
}

murmur_protocol::multiversion! {
    /// `out[i] = xs[i] + es[i]`; the slices have equal length.
    fn add(xs: &[f32], es: &[f32], out: &mut [f32]) = add_loop;
}

#[inline(always)]
fn scale_in_place_loop(ys: &mut [f32], alpha: f32) {
    for y in ys {
        *y *= alpha;
    }
}

#[inline(always)]
fn add_scaled_loop(alpha: f32, xs: &[f32], ys: &mut [f32]) {
    for (y, &x) in ys.iter_mut().zip(xs) {
        *y += alpha * x;
    }
}

#[inline(always)]
fn mix_loop(alpha: f32, xs: &[f32], beta: f32, ys: &mut [f32]) {
    for (y, &x) in ys.iter_mut().zip(xs) {
        *y = alpha * x + beta * *y;
    }
}

#[inline(always)]
fn add_loop(xs: &[f32], es: &[f32], out: &mut [f32]) {
    for ((t, &x), &e) in out.iter_mut().zip(xs).zip(es) {
        *t = x + e;
    }
}

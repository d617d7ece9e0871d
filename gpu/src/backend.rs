//! The [`Backend`] trait: the operations one averaging step performs on tensor data.
//!
//! A backend owns its buffers ([`Backend::Buffer`]): host vectors for the CPU, device memory
//! for CUDA. The averaging layers address parts of a flat buffer with plain
//! `Range<usize>`s, the same ranges their part plans already hold, so no view types are
//! needed. Encoded bytes always live in host memory, because they go on the wire.
//!
//! Every operation checks its ranges before it touches anything, and a failed operation
//! leaves all of its buffers as they were.

use std::fmt;
use std::ops::Range;

use murmur_protocol::codec::Codec;

use crate::GpuError;

/// A flat buffer of `f32` owned by a [`Backend`].
pub trait DeviceBuffer: fmt::Debug + Send {
    /// Number of elements.
    fn len(&self) -> usize;

    /// Whether the buffer holds no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The CPU backend's buffer is an ordinary vector, so a tensor already in host memory
/// becomes a buffer without a copy.
impl DeviceBuffer for Vec<f32> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

/// The kernels of the communication path: moving data in and out, encoding a part for the
/// wire (optionally with error feedback), decoding a received part into place or into a
/// weighted sum, and the elementwise mixing that push-sum and all-reduce need.
///
/// # How the averaging step uses it
///
/// - **SGP** (push-sum): [`scale`](Backend::scale) the numerator by the kept share,
///   [`encode_with_feedback`](Backend::encode_with_feedback) the pushed share, and
///   [`decode_accumulate`](Backend::decode_accumulate) with weight 1 what arrives.
///   [`copy`](Backend::copy) and [`scale`](Backend::scale) give the de-biased `x / w`.
/// - **Butterfly all-reduce**: the reducer of part `j` starts its sum with
///   [`fill`](Backend::fill) or [`axpby`](Backend::axpby) of its own copy, adds each
///   member's part with [`decode_accumulate`](Backend::decode_accumulate) weighted by its
///   samples, divides by the total weight with [`scale`](Backend::scale), and
///   [`encode`](Backend::encode)s the average; members write it back with
///   [`decode`](Backend::decode).
///
/// # Exactness
///
/// Results must be bit-identical across backends, so that CPU and GPU peers can mix and a
/// run can be replayed. Encoding and decoding follow the reference codecs in
/// `murmur_protocol::codec`. The elementwise operations compute exactly the formula in
/// their docs, as separately rounded IEEE `f32` multiplies and adds in the order written;
/// a device backend must not contract them into fused multiply-adds.
///
/// # Ordering
///
/// Methods take `&mut self`: a backend is one ordered stream of work, and an operation sees
/// the results of every operation issued before it. Operations that return data to the host
/// ([`download`](Backend::download), [`encode`](Backend::encode),
/// [`encode_with_feedback`](Backend::encode_with_feedback)) return once it is there.
pub trait Backend: fmt::Debug {
    /// A flat buffer of `f32` in this backend's memory.
    type Buffer: DeviceBuffer;

    /// A short name for logs and metrics labels, e.g. `"cpu"`.
    fn name(&self) -> &'static str;

    /// A buffer of `len` zeros.
    fn alloc(&mut self, len: usize) -> Result<Self::Buffer, GpuError>;

    /// Copies host data into `dst[range]`; `src.len()` must equal the range's length.
    fn upload(
        &mut self,
        src: &[f32],
        dst: &mut Self::Buffer,
        range: Range<usize>,
    ) -> Result<(), GpuError>;

    /// Copies `src[range]` into host memory; `dst.len()` must equal the range's length.
    fn download(
        &mut self,
        src: &Self::Buffer,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<(), GpuError>;

    /// `dst[dst_range] = src[src_range]`; the ranges must have the same length.
    fn copy(
        &mut self,
        src: &Self::Buffer,
        src_range: Range<usize>,
        dst: &mut Self::Buffer,
        dst_range: Range<usize>,
    ) -> Result<(), GpuError>;

    /// Sets every element of `buf[range]` to `value`.
    fn fill(
        &mut self,
        buf: &mut Self::Buffer,
        range: Range<usize>,
        value: f32,
    ) -> Result<(), GpuError>;

    /// `buf[i] = alpha * buf[i]` over `range`. `alpha` must be finite.
    fn scale(
        &mut self,
        buf: &mut Self::Buffer,
        range: Range<usize>,
        alpha: f32,
    ) -> Result<(), GpuError>;

    /// `y[i] = y[i] + alpha * x[i]` over equally long ranges. `alpha` must be finite.
    fn axpy(
        &mut self,
        alpha: f32,
        x: &Self::Buffer,
        x_range: Range<usize>,
        y: &mut Self::Buffer,
        y_range: Range<usize>,
    ) -> Result<(), GpuError>;

    /// `y[i] = alpha * x[i] + beta * y[i]` over equally long ranges: a weighted mix in one
    /// pass. `alpha` and `beta` must be finite.
    fn axpby(
        &mut self,
        alpha: f32,
        x: &Self::Buffer,
        x_range: Range<usize>,
        beta: f32,
        y: &mut Self::Buffer,
        y_range: Range<usize>,
    ) -> Result<(), GpuError>;

    /// Encodes `src[range]` with `codec` into the front of `dst` and returns the bytes
    /// written; `dst` needs `codec.max_encoded_len(range.len())` bytes.
    fn encode(
        &mut self,
        codec: &mut Codec,
        src: &Self::Buffer,
        range: Range<usize>,
        dst: &mut [u8],
    ) -> Result<usize, GpuError>;

    /// Encodes `src[range] + residual[range]` into `dst` and sets `residual[range]` to what
    /// this send lost (`sent − decode(encoded)`), exactly as
    /// `murmur_protocol::codec::ErrorFeedback` does. `residual[i]` is the error carried for
    /// `src[i]`: both buffers share the layout, so one residual serves every part of a
    /// tensor. On error `residual` is unchanged.
    fn encode_with_feedback(
        &mut self,
        codec: &mut Codec,
        src: &Self::Buffer,
        residual: &mut Self::Buffer,
        range: Range<usize>,
        dst: &mut [u8],
    ) -> Result<usize, GpuError>;

    /// Decodes the encoded part `src` into `dst[range]`, replacing what was there.
    fn decode(
        &mut self,
        codec: &mut Codec,
        src: &[u8],
        dst: &mut Self::Buffer,
        range: Range<usize>,
    ) -> Result<(), GpuError>;

    /// `acc[range] += weight * decode(src)`, fused in one pass. The whole part is validated
    /// before `acc` is touched, so a malformed part from a peer changes nothing.
    fn decode_accumulate(
        &mut self,
        codec: &mut Codec,
        src: &[u8],
        weight: f32,
        acc: &mut Self::Buffer,
        range: Range<usize>,
    ) -> Result<(), GpuError>;
}

/// Checks that `range` lies inside a buffer of `len` elements.
pub(crate) fn check_range(
    op: &'static str,
    range: &Range<usize>,
    len: usize,
) -> Result<(), GpuError> {
    if range.start <= range.end && range.end <= len {
        Ok(())
    } else {
        Err(GpuError::RangeOutOfBounds {
            op,
            start: range.start,
            end: range.end,
            len,
        })
    }
}

/// Checks that the two sides of an operation have the same number of elements.
pub(crate) fn check_same_len(
    op: &'static str,
    source_len: usize,
    dest_len: usize,
) -> Result<(), GpuError> {
    if source_len == dest_len {
        Ok(())
    } else {
        Err(GpuError::LengthMismatch {
            op,
            source_len,
            dest_len,
        })
    }
}

/// Checks that a mixing factor is finite.
pub(crate) fn check_factor(op: &'static str, value: f32) -> Result<(), GpuError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(GpuError::NonFiniteFactor { op, value })
    }
}

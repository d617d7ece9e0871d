//! Device throughput of the codecs, for `murmur bench codecs --device cuda`.
//!
//! Each operation is timed on the GPU alone with CUDA events, with its data already in
//! device memory, so the numbers are what the kernels can do, not what PCIe allows:
//!
//! - **encode**: the status reset and the encode kernel, `f32` tensor → encoded bytes;
//! - **decode-accumulate**: the status reset, the validation kernel and the
//!   decode-accumulate kernel, encoded bytes → `acc += w · decoded`;
//! - **copy**: a device-to-device copy of the same `f32` tensor, measured in the same run,
//!   as the yardstick of what the memory system delivers.
//!
//! Every rate is `4 × elements` bytes (the `f32` input) over the median time of the
//! repeats, so the ratios compare the three operations on the same data. An encode reads
//! the tensor and writes a fraction of it, and a copy reads and writes it all, so a
//! memory-bound encode can exceed the copy's rate.

use murmur_protocol::codec::CodecSpec;

use crate::{CudaBackend, GpuError};

/// Device throughput of one codec on one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct CodecThroughput {
    /// The codec measured.
    pub spec: CodecSpec,
    /// Elements in the tensor.
    pub elements: usize,
    /// Bytes of its encoding.
    pub encoded_bytes: usize,
    /// Timed repetitions of each operation.
    pub repeats: usize,
    /// Encode rate, in GB/s of `f32` input (10⁹ bytes per second), median of the repeats.
    pub encode_gbps: f64,
    /// Decode-accumulate rate, in GB/s of `f32` output, median of the repeats.
    pub decode_accumulate_gbps: f64,
    /// Device-to-device copy rate of the same tensor in the same run, in GB/s.
    pub copy_gbps: f64,
    /// The GPU, as its one-line description.
    pub device: String,
}

impl CodecThroughput {
    /// Encode rate as a fraction of the copy rate.
    pub fn encode_vs_copy(&self) -> f64 {
        self.encode_gbps / self.copy_gbps
    }

    /// Decode-accumulate rate as a fraction of the copy rate.
    pub fn decode_accumulate_vs_copy(&self) -> f64 {
        self.decode_accumulate_gbps / self.copy_gbps
    }
}

/// Measures `spec`'s encode and decode-accumulate on `backend`'s GPU over a tensor of
/// `elements` pseudo-random values (seeded, the same on every run), `repeats` times each
/// after one warm-up, next to a device-to-device copy of the same tensor.
///
/// `topk` has no device kernels (the CUDA backend runs it through the reference codec on
/// the host) and is refused with [`GpuError::Codec`]; benchmark it on the CPU.
pub fn codec_throughput(
    backend: &mut CudaBackend,
    spec: CodecSpec,
    elements: usize,
    repeats: usize,
) -> Result<CodecThroughput, GpuError> {
    backend.codec_throughput(spec, elements, repeats.max(1))
}

/// `len` pseudo-random values of gradient-like magnitudes (a few decades around 1e-3),
/// with both signs, from a fixed seed.
pub(crate) fn bench_values(len: usize) -> Vec<f32> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..len)
        .map(|_| {
            // xorshift64*: fast, and good enough to avoid patterns a codec could exploit.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let r = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
            let unit = (r >> 40) as f32 / (1u64 << 24) as f32;
            let decade = ((r >> 8) & 3) as i32;
            (unit * 2.0 - 1.0) * 10f32.powi(-2 - decade)
        })
        .collect()
}

/// The median of `times`, which is not empty.
pub(crate) fn median(times: &mut [f32]) -> f32 {
    times.sort_by(f32::total_cmp);
    times[times.len() / 2]
}

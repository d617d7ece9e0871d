//! Getting the CUDA backend in a test that executes kernels on a GPU.
//!
//! Every such test is marked `#[ignore = "needs a CUDA GPU: ..."]`, so a run without a GPU
//! (CI) reports it as skipped rather than passed. On a GPU host run them with
//! `cargo nextest run -p murmur-gpu --release --run-ignored all` (or `cargo test
//! -p murmur-gpu --release -- --include-ignored`); `scripts/gpu-check.sh` does this from a
//! prebuilt archive. Run on a host without a usable GPU, each fails with the reason: none of
//! them can pass without executing on a GPU.
//!
//! `MURMUR_REQUIRE_GPU=1` (which `scripts/gpu-check.sh` sets) covers the tests that are not
//! ignored because they also say something true on a host without a GPU, such as device
//! detection in `device.rs`: with it set, a report of "no GPU" or a fallback to the CPU is
//! a failure in those tests too.

use murmur_gpu::{CudaBackend, GpuError};

/// Where a GPU test runs, for the failure message of one that found no GPU.
const HOW_TO_RUN: &str = "run it on a GPU host: scripts/gpu-check.sh, or cargo nextest run \
                          -p murmur-gpu --release --run-ignored all";

/// The backend on GPU 0. Panics with the reason where there is no usable GPU: a test that
/// asks for it has nothing to check without one.
pub(crate) fn backend() -> CudaBackend {
    match CudaBackend::new(0) {
        Ok(backend) => backend,
        Err(GpuError::Unavailable(reason)) => {
            panic!("this test executes CUDA kernels and found no GPU: {reason}; {HOW_TO_RUN}")
        }
        Err(e) => panic!("a GPU is present but the CUDA backend failed to start: {e}"),
    }
}

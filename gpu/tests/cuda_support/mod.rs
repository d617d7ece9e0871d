//! Getting a CUDA backend in a test, or a clear reason why there is none.
//!
//! The CUDA tests execute kernels, so they need a GPU. On a host without one each prints
//! `no CUDA device: <reason>` and passes; set `MURMUR_REQUIRE_GPU=1` on a GPU host so that
//! a missing or broken GPU fails instead of skipping. A GPU that is found but cannot start
//! the backend (kernels that do not compile or load) always fails.

use murmur_gpu::{CudaBackend, GpuError};

/// The backend on GPU 0, or `None` (after saying why) where there is no usable GPU.
pub(crate) fn backend() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(backend) => Some(backend),
        Err(GpuError::Unavailable(reason)) => {
            let required = std::env::var("MURMUR_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "MURMUR_REQUIRE_GPU=1 but no CUDA device: {reason}"
            );
            eprintln!("no CUDA device: {reason}");
            None
        }
        Err(e) => panic!("a GPU is present but the CUDA backend failed to start: {e}"),
    }
}

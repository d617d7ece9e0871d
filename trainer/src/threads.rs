//! How many CPU threads candle's CPU backend uses, and how to cap them.
//!
//! candle 0.11 runs CPU work on two process-wide pools, both sized from the environment the
//! first time they are used:
//!
//! - matrix multiplies go through `gemm` on rayon's global pool, split into as many tasks as
//!   `RAYON_NUM_THREADS` says (read on every matmul; default: the physical core count);
//! - element-wise ops on tensors of 64 Ki elements or more go to candle's own barrier pool of
//!   `CANDLE_NUM_THREADS − 1` spinning workers (falling back to `RAYON_NUM_THREADS`). The pool
//!   is shared by every thread of the process and serves one caller at a time; with one thread
//!   it runs every op inline on the caller.
//!
//! So the volunteer's CPU-thread cap is applied by setting both variables before the first
//! candle call: [`set_cpu_threads`] at the top of the daemon's `main`, or exported by the
//! volunteer. With several peers sharing a few cores (as in `murmur local`), 1 is the right
//! value: spinning pool workers would steal the cores the other peers need.

/// The environment variable rayon (and candle's matmuls) read for their thread count.
pub const CPU_THREADS_ENV: &str = "RAYON_NUM_THREADS";

/// The environment variable candle's element-wise pool reads first for its thread count.
pub const CANDLE_THREADS_ENV: &str = "CANDLE_NUM_THREADS";

/// The number of threads candle's CPU matmuls split work across in this process now.
pub fn cpu_threads() -> usize {
    candle_core::utils::get_num_threads()
}

/// Caps candle's CPU threads at `threads` (at least 1) by setting [`CPU_THREADS_ENV`] and
/// [`CANDLE_THREADS_ENV`]. Takes effect only if called before the first candle call.
///
/// # Safety
///
/// Setting an environment variable is only sound while no other thread may read or write the
/// environment (see [`std::env::set_var`]): call this at the start of `main`, before any
/// runtime, logger or pool has started a thread.
pub unsafe fn set_cpu_threads(threads: usize) {
    let threads = threads.max(1).to_string();
    // SAFETY: the caller guarantees no other thread is running (this function's contract).
    unsafe {
        std::env::set_var(CPU_THREADS_ENV, &threads);
        std::env::set_var(CANDLE_THREADS_ENV, &threads);
    }
}

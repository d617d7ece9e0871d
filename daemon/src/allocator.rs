//! How this process's allocator gives freed buffers back to the kernel.
//!
//! glibc's malloc serves a request of at least `M_MMAP_THRESHOLD` bytes (128 KiB at start)
//! with a mapping of its own, unmapped when freed. The threshold is dynamic, though: each
//! time such a mapping is freed it rises to that size (up to 32 MiB), so from then on the
//! buffers murmur allocates every round (shares, frames, decoded vectors: hundreds of KiB to
//! MiB each) come from the per-thread arenas instead. Small long-lived allocations made
//! between them keep the freed space from ever going back, and resident memory climbs in
//! steps that stay. A survivor of the churn soak showed it: its live heap, profiled, stayed
//! flat at about 19 MiB while its anonymous resident memory grew from 49 to 61 MiB in 90 s.
//! With the threshold fixed at 128 KiB (which also stops the dynamic adjustment) the same
//! soak held it at about 24 MiB.
//!
//! The price: SGP, which allocates its share payloads afresh each round, faults them in
//! each time; its rounds on loopback took 1.27 to 1.40 times as long in `bench allreduce`
//! (butterfly, which reuses its buffers, none). BENCHMARKS.md, *Churn soak*.
//!
//! glibc also gives each thread that allocates while another holds the lock an arena of its
//! own, up to eight per core. Memory freed in one stays there for that arena's thread, so
//! with the network's runtime threads and readers each allocating and freeing the same
//! 64 KiB message buffers, resident memory is the sum of every arena's high-water mark, not
//! the high-water mark of the whole. One arena for the process keeps it at the latter
//! ([`share_one_arena`]; `MALLOC_ARENA_MAX` in the environment still overrides it). On
//! four `bench allreduce` peers of 10M elements, peak resident memory fell from 4.46× to
//! 3.24× the vector's `f32` bytes with `f32` and from 2.92× to 2.48× with `int8:64`, with
//! the rounds as fast; `bench train` on two threads stepped as fast (BENCHMARKS.md).
//!
//! Only glibc has `mallopt`; elsewhere this does nothing.

/// Large buffers: mapped on their own at and above this size, and unmapped when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD_BYTES: libc::c_int = 128 * 1024;

/// Fixes the allocator's threshold for mapping buffers on their own, so that every
/// tensor-sized buffer goes back to the kernel when it is freed. Called from `main` before
/// any other thread starts; `false` if the allocator refused the setting.
pub(crate) fn return_large_buffers_to_the_kernel() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only changes malloc's tunables; the value is in its valid range.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        true
    }
}

/// Has every thread allocate from one arena (see the module docs), unless
/// `MALLOC_ARENA_MAX` is set. Called from `main` before any other thread starts; `false` if
/// the allocator refused the setting.
pub(crate) fn share_one_arena() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
            return true;
        }
        // SAFETY: as above; one arena is a valid limit.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        true
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;
    use crate::observe::process::own_status_bytes;

    fn resident() -> u64 {
        own_status_bytes("VmRSS:").expect("/proc/self/status has VmRSS")
    }

    /// Without the fixed threshold, the first large buffer freed raises it, the buffers after
    /// it come from the arena, and the small allocations between them pin that memory: this
    /// test then sees nothing go back. (Each test is its own process under nextest.)
    #[test]
    fn freed_tensor_sized_buffers_go_back_to_the_kernel() {
        assert!(return_large_buffers_to_the_kernel());
        drop(std::hint::black_box(vec![1u8; 4 << 20]));
        const BUFFERS: usize = 32;
        const BUFFER_BYTES: usize = 512 << 10;
        let before = resident();
        let mut buffers = Vec::with_capacity(BUFFERS);
        let mut pins = Vec::with_capacity(BUFFERS);
        for i in 0..BUFFERS {
            buffers.push(std::hint::black_box(vec![1u8; BUFFER_BYTES]));
            pins.push(std::hint::black_box(Box::new([i as u8; 64])));
        }
        let full = resident();
        drop(buffers);
        let after = resident();
        let total = (BUFFERS * BUFFER_BYTES) as u64;
        assert!(
            full.saturating_sub(before) >= total * 3 / 4,
            "the buffers were resident: {before} -> {full} bytes"
        );
        assert!(
            full.saturating_sub(after) >= total * 3 / 4,
            "freeing {total} bytes of buffers gave back only {} ({full} -> {after} bytes)",
            full.saturating_sub(after)
        );
        drop(pins);
    }
}

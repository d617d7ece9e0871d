//! Run-time selection between baseline and AVX2 builds of the codecs' hot loops.
//!
//! The loops themselves are plain Rust written so that LLVM vectorizes them (fixed-width
//! lanes, no early exits, branch-free selects). [`multiversion!`] compiles such a loop twice,
//! once for the baseline x86-64 target (SSE2) and once with AVX2 enabled, and picks one at
//! run time. Both builds perform the same IEEE operations in the same order (Rust never
//! contracts `a * b + c` into a fused multiply-add), so they produce identical bits.

/// Defines `$vis fn $name(args) -> ret` that calls `$imp(args)` compiled for AVX2 when the
/// CPU has it and for the baseline target otherwise. `$imp` must be `#[inline(always)]`.
///
/// Exported (hidden) so that the other crates of the communication path compile their
/// loops the same way.
#[doc(hidden)]
#[macro_export]
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? = $imp:path;) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $imp($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2, checked just above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $imp($($arg),*)
        }
    };
}
pub(crate) use crate::multiversion;

/// `1.5 × 2²³`: adding it to a float of magnitude below 2²² rounds that float to the nearest
/// integer (ties to even), which then sits in the low mantissa bits.
pub(crate) const ROUND_MAGIC: f32 = 12_582_912.0;

/// Rounds `v` (|v| < 2²²) to the nearest integer, ties to even, without a branch or a
/// float-to-int conversion, so that the loop around it vectorizes.
#[inline(always)]
pub(crate) fn round_to_i32(v: f32) -> i32 {
    ((v + ROUND_MAGIC).to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32)
}

/// The largest `|x|` bit pattern in `xs` (the sign bit cleared). Comparing IEEE magnitudes as
/// integers orders them correctly, and NaN and ±Inf come out at `0x7f80_0000` or above, so
/// one pass finds the block maximum and detects non-finite input.
#[inline(always)]
pub(crate) fn abs_max_bits(xs: &[f32]) -> u32 {
    let mut lanes = [0u32; 8];
    let mut chunks = xs.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *lane = (*lane).max(x.to_bits() & 0x7fff_ffff);
        }
    }
    let mut max = lanes.into_iter().max().unwrap_or(0);
    for x in chunks.remainder() {
        max = max.max(x.to_bits() & 0x7fff_ffff);
    }
    max
}

/// Bit pattern of `+Inf`; magnitudes at or above it are not finite.
pub(crate) const INF_BITS: u32 = 0x7f80_0000;

/// Index of the first non-finite element of `xs`, found on the slow path after a vectorized
/// check said there is one.
pub(crate) fn first_non_finite(xs: &[f32]) -> usize {
    xs.iter().position(|x| !x.is_finite()).unwrap_or(0)
}

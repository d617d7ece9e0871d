// Shared by every murmur kernel: fixed-width types, the status word, and helpers that make
// the float arithmetic match the CPU reference in murmur_protocol::codec bit for bit.
//
// Exactness rules, kept by every kernel:
// - every float add, multiply and divide is an explicit round-to-nearest intrinsic
//   (__fadd_rn, __fmul_rn, __fdiv_rn), so nothing is contracted into a fused multiply-add
//   (the module is also compiled with --fmad=false);
// - subnormals are kept (--ftz=false), divisions are IEEE (--prec-div=true);
// - maxima are taken over integer bit patterns, which is order-independent, and every float
//   sum runs in the order the CPU reference documents.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL_WARP 0xffffffffu
#define INF_BITS 0x7f800000u
#define ROUND_MAGIC 12582912.0f
#define ROUND_MAGIC_BITS 0x4b400000u

// |x| as a bit pattern; NaN and +-Inf compare >= INF_BITS.
__device__ __forceinline__ u32 abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

// Rounds |v| < 2^22 to the nearest integer, ties to even (the CPU's round_to_i32).
__device__ __forceinline__ int round_to_int(float v) {
    return (int)(__float_as_uint(__fadd_rn(v, ROUND_MAGIC)) - ROUND_MAGIC_BITS);
}

// The status words of one operation: status[0] for encoding, status[1] for validating a
// received part. 0 means no error; otherwise ~index of the first offending element or
// block, so that atomicMax keeps the lowest index.
__device__ __forceinline__ void report(u64* status, u64 index) { atomicMax(status, ~index); }

// Whether an earlier step of this operation failed; kernels that write results then do
// nothing, so a rejected part leaves every buffer as it was.
__device__ __forceinline__ bool failed(const u64* status) { return (status[0] | status[1]) != 0; }

__device__ __forceinline__ u64 global_thread() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ u64 thread_count() { return (u64)blockDim.x * gridDim.x; }

// Codec blocks are processed one per warp; blockDim.x is a multiple of 32.
__device__ __forceinline__ u64 global_warp() { return global_thread() >> 5; }
__device__ __forceinline__ u64 warp_count() { return thread_count() >> 5; }
__device__ __forceinline__ u32 lane_id() { return threadIdx.x & 31u; }

__device__ __forceinline__ u32 warp_max(u32 v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = max(v, __shfl_xor_sync(FULL_WARP, v, offset));
    }
    return v;
}

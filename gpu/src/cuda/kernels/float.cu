// The float codecs: f32 (exact), IEEE f16 and bf16, little-endian, as in
// murmur_protocol::codec::float16. Conversions are the same branch-free bit arithmetic.

#define F16_MAX 65504.0f
#define BF16_MAX_BITS 0x7f7f0000u

// ---- f32 ---------------------------------------------------------------------------------

extern "C" __global__ void encode_f32(const float* src, u64 n, u8* dst, u64* status) {
    u32* out = (u32*)dst;
    for (u64 i = global_thread(); i < n; i += thread_count()) {
        float x = src[i];
        if (abs_bits(x) >= INF_BITS) report(status, i);
        out[i] = __float_as_uint(x);
    }
}

extern "C" __global__ void validate_f32(const u8* src, u64 n, u64* status) {
    const u32* words = (const u32*)src;
    for (u64 i = global_thread(); i < n; i += thread_count()) {
        if ((words[i] & 0x7fffffffu) >= INF_BITS) report(status + 1, i);
    }
}

extern "C" __global__ void decode_f32(
    const u8* src, u64 n, float w, int accumulate, float* out, const u64* status) {
    if (failed(status)) return;
    const u32* words = (const u32*)src;
    for (u64 i = global_thread(); i < n; i += thread_count()) {
        float v = __uint_as_float(words[i]);
        out[i] = accumulate ? __fadd_rn(out[i], __fmul_rn(w, v)) : v;
    }
}

// ---- f16 ---------------------------------------------------------------------------------

// f32 -> f16 bits, round to nearest even, for finite x with |x| <= 65504.
__device__ __forceinline__ u32 f32_to_f16_bits(float x) {
    u32 bits = __float_as_uint(x);
    u32 sign = (bits >> 16) & 0x8000u;
    u32 a = bits & 0x7fffffffu;
    u32 mantissa_odd = (a >> 13) & 1u;
    u32 normal = (a + 0xc8000fffu + mantissa_odd) >> 13;
    const u32 subnormal_magic = 126u << 23;
    u32 subnormal = __float_as_uint(__fadd_rn(__uint_as_float(a), __uint_as_float(subnormal_magic)))
        - subnormal_magic;
    u32 half = a < (113u << 23) ? subnormal : normal;
    return (half | sign) & 0xffffu;
}

// f16 bits -> f32, exact, for finite halves.
__device__ __forceinline__ float f16_bits_to_f32(u32 h) {
    u32 shifted = (h & 0x7fffu) << 13;
    u32 normal = shifted + ((127u - 15u) << 23);
    const float magic = __uint_as_float(113u << 23);
    u32 subnormal = __float_as_uint(__fsub_rn(__uint_as_float(normal + (1u << 23)), magic));
    u32 magnitude = (shifted & (0x7c00u << 13)) == 0 ? subnormal : normal;
    return __uint_as_float(magnitude | ((h & 0x8000u) << 16));
}

extern "C" __global__ void encode_f16(const float* src, u64 n, u8* dst, u64* status) {
    u16* out = (u16*)dst;
    for (u64 i = global_thread(); i < n; i += thread_count()) {
        float x = src[i];
        if (abs_bits(x) >= INF_BITS) report(status, i);
        // Rust's f32::clamp: below min becomes min, then above max becomes max.
        float c = x < -F16_MAX ? -F16_MAX : x;
        c = c > F16_MAX ? F16_MAX : c;
        out[i] = (u16)f32_to_f16_bits(c);
    }
}

// A half is Inf or NaN when all its exponent bits (exp_mask) are set: 0x7c00 for f16,
// 0x7f80 for bf16.
extern "C" __global__ void validate_halves(const u8* src, u64 n, u32 exp_mask, u64* status) {
    const u16* halves = (const u16*)src;
    for (u64 i = global_thread(); i < n; i += thread_count()) {
        if ((halves[i] & exp_mask) == exp_mask) report(status + 1, i);
    }
}

extern "C" __global__ void decode_f16(
    const u8* src, u64 n, float w, int accumulate, float* out, const u64* status) {
    if (failed(status)) return;
    const u16* halves = (const u16*)src;
    for (u64 i = global_thread(); i < n; i += thread_count()) {
        float v = f16_bits_to_f32(halves[i]);
        out[i] = accumulate ? __fadd_rn(out[i], __fmul_rn(w, v)) : v;
    }
}

// ---- bf16 --------------------------------------------------------------------------------

extern "C" __global__ void encode_bf16(const float* src, u64 n, u8* dst, u64* status) {
    u16* out = (u16*)dst;
    const float bf16_max = __uint_as_float(BF16_MAX_BITS);
    for (u64 i = global_thread(); i < n; i += thread_count()) {
        float x = src[i];
        if (abs_bits(x) >= INF_BITS) report(status, i);
        float c = x < -bf16_max ? -bf16_max : x;
        c = c > bf16_max ? bf16_max : c;
        u32 bits = __float_as_uint(c);
        out[i] = (u16)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
}

extern "C" __global__ void decode_bf16(
    const u8* src, u64 n, float w, int accumulate, float* out, const u64* status) {
    if (failed(status)) return;
    const u16* halves = (const u16*)src;
    for (u64 i = global_thread(); i < n; i += thread_count()) {
        float v = __uint_as_float((u32)halves[i] << 16);
        out[i] = accumulate ? __fadd_rn(out[i], __fmul_rn(w, v)) : v;
    }
}

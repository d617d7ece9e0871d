// Blockwise absmax int8 and int4, as in murmur_protocol::codec::blockwise.
//
// Layout of a part of n elements in blocks of B: ceil(n/B) scales (f32 LE), then the
// elements, one i8 each for int8, two per byte for int4 (element 2j in the low nibble of
// byte j). One warp handles one codec block: the block maximum is an integer max over
// |x| bit patterns (exact in any order), and every element is then quantized on its own.

// Magnitudes below 2^-100 flush a block to zero.
#define FLUSH_BITS (27u << 23)
// Block maxima are capped at 2^127 so that every storable level decodes to a finite value.
#define CAP_BITS (254u << 23)

// The decode scale m/L and the encode multiplier L/m of a block with maximum bits m.
__device__ __forceinline__ void block_scale(u32 max_bits, float levels, float* scale, float* inv) {
    if (max_bits < FLUSH_BITS) {
        *scale = 0.0f;
        *inv = 0.0f;
    } else {
        float m = __uint_as_float(min(max_bits, CAP_BITS));
        *scale = __fdiv_rn(m, levels);
        *inv = __fdiv_rn(levels, m);
    }
}

// The largest |x| bit pattern of xs[0..len), the same value in every lane.
__device__ __forceinline__ u32 block_max_bits(const float* xs, u32 len) {
    u32 m = 0;
    for (u32 j = lane_id(); j < len; j += 32) m = max(m, abs_bits(xs[j]));
    return warp_max(m);
}

// Reports the first non-finite element of a block already known to hold one.
__device__ __forceinline__ void report_block(const float* xs, u32 len, u64 start, u64* status) {
    for (u32 j = lane_id(); j < len; j += 32) {
        if (abs_bits(xs[j]) >= INF_BITS) report(status, start + j);
    }
}

__device__ __forceinline__ int quantize(float x, float inv, int levels) {
    int q = round_to_int(__fmul_rn(x, inv));
    return min(max(q, -levels), levels);
}

extern "C" __global__ void encode_int8(
    const float* src, u64 n, u32 block, u8* scales, u8* q, u64* status) {
    float* scale_out = (float*)scales;
    u64 blocks = (n + block - 1) / block;
    for (u64 b = global_warp(); b < blocks; b += warp_count()) {
        u64 start = b * block;
        u32 len = (u32)min((u64)block, n - start);
        const float* xs = src + start;
        u32 max_bits = block_max_bits(xs, len);
        if (max_bits >= INF_BITS) {
            report_block(xs, len, start, status);
            continue;
        }
        float scale, inv;
        block_scale(max_bits, 127.0f, &scale, &inv);
        if (lane_id() == 0) scale_out[b] = scale;
        for (u32 j = lane_id(); j < len; j += 32) {
            q[start + j] = (u8)quantize(xs[j], inv, 127);
        }
    }
}

extern "C" __global__ void encode_int4(
    const float* src, u64 n, u32 block, u8* scales, u8* q, u64* status) {
    float* scale_out = (float*)scales;
    u64 blocks = (n + block - 1) / block;
    for (u64 b = global_warp(); b < blocks; b += warp_count()) {
        u64 start = b * block;
        u32 len = (u32)min((u64)block, n - start);
        const float* xs = src + start;
        u32 max_bits = block_max_bits(xs, len);
        if (max_bits >= INF_BITS) {
            report_block(xs, len, start, status);
            continue;
        }
        float scale, inv;
        block_scale(max_bits, 7.0f, &scale, &inv);
        if (lane_id() == 0) scale_out[b] = scale;
        // Blocks hold an even number of elements, so each starts on a byte.
        u8* bytes = q + start / 2;
        u32 pairs = (len + 1) / 2;
        for (u32 p = lane_id(); p < pairs; p += 32) {
            u32 j = 2 * p;
            u32 low = (u32)quantize(xs[j], inv, 7) & 0xfu;
            u32 high = j + 1 < len ? (u32)quantize(xs[j + 1], inv, 7) & 0xfu : 0u;
            bytes[p] = (u8)(low | (high << 4));
        }
    }
}

// Received scales must be non-negative and stay finite times the largest level
// (127 for int8, 8 for int4: a nibble can hold -8); reports the first bad block.
extern "C" __global__ void validate_scales(const u8* scales, u64 blocks, float max_level, u64* status) {
    const float* s = (const float*)scales;
    for (u64 b = global_thread(); b < blocks; b += thread_count()) {
        float scale = s[b];
        bool bad = abs_bits(scale) > INF_BITS  // NaN
            || abs_bits(__fmul_rn(scale, max_level)) >= INF_BITS
            || scale < 0.0f;
        if (bad) report(status + 1, b);
    }
}

extern "C" __global__ void decode_int8(
    const u8* scales, const u8* q, u64 n, u32 block, float w, int accumulate, float* out,
    const u64* status) {
    if (failed(status)) return;
    const float* s = (const float*)scales;
    u64 blocks = (n + block - 1) / block;
    for (u64 b = global_warp(); b < blocks; b += warp_count()) {
        u64 start = b * block;
        u32 len = (u32)min((u64)block, n - start);
        float scale = s[b];
        for (u32 j = lane_id(); j < len; j += 32) {
            float v = __fmul_rn((float)(signed char)q[start + j], scale);
            out[start + j] = accumulate ? __fadd_rn(out[start + j], __fmul_rn(w, v)) : v;
        }
    }
}

__device__ __forceinline__ float low_nibble(u32 byte) {
    return (float)((int)(signed char)(u8)(byte << 4) >> 4);
}

__device__ __forceinline__ float high_nibble(u32 byte) {
    return (float)((int)(signed char)(u8)byte >> 4);
}

extern "C" __global__ void decode_int4(
    const u8* scales, const u8* q, u64 n, u32 block, float w, int accumulate, float* out,
    const u64* status) {
    if (failed(status)) return;
    const float* s = (const float*)scales;
    u64 blocks = (n + block - 1) / block;
    for (u64 b = global_warp(); b < blocks; b += warp_count()) {
        u64 start = b * block;
        u32 len = (u32)min((u64)block, n - start);
        float scale = s[b];
        const u8* bytes = q + start / 2;
        float* os = out + start;
        u32 pairs = (len + 1) / 2;
        for (u32 p = lane_id(); p < pairs; p += 32) {
            u32 byte = bytes[p];
            u32 j = 2 * p;
            float lo = __fmul_rn(low_nibble(byte), scale);
            os[j] = accumulate ? __fadd_rn(os[j], __fmul_rn(w, lo)) : lo;
            if (j + 1 < len) {
                float hi = __fmul_rn(high_nibble(byte), scale);
                os[j + 1] = accumulate ? __fadd_rn(os[j + 1], __fmul_rn(w, hi)) : hi;
            }
        }
    }
}

// sign1: one sign bit per element and one scale per block, as in
// murmur_protocol::codec::sign1. The scale is the block's mean |x|, summed in the order the
// reference documents: lane l (0..8) sums |x| of elements l, l+8, l+16, ... in index order,
// then the lanes combine as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) and the sum is divided by
// the block length; if the sum overflows, the scale is the block's largest magnitude.
// One warp handles one block; its first eight threads hold the eight lane sums.

extern "C" __global__ void encode_sign1(
    const float* src, u64 n, u32 block, u8* scales, u8* bits, u64* status) {
    float* scale_out = (float*)scales;
    const u32 lane = lane_id();
    u64 blocks = (n + block - 1) / block;
    for (u64 b = global_warp(); b < blocks; b += warp_count()) {
        u64 start = b * block;
        u32 len = (u32)min((u64)block, n - start);
        const float* xs = src + start;
        u32 max_bits = 0;
        for (u32 j = lane; j < len; j += 32) max_bits = max(max_bits, abs_bits(xs[j]));
        max_bits = warp_max(max_bits);
        if (max_bits >= INF_BITS) {
            for (u32 j = lane; j < len; j += 32) {
                if (abs_bits(xs[j]) >= INF_BITS) report(status, start + j);
            }
            continue;
        }
        float lane_sum = 0.0f;
        if (lane < 8) {
            for (u32 j = lane; j < len; j += 8) lane_sum = __fadd_rn(lane_sum, fabsf(xs[j]));
        }
        float l0 = __shfl_sync(FULL_WARP, lane_sum, 0);
        float l1 = __shfl_sync(FULL_WARP, lane_sum, 1);
        float l2 = __shfl_sync(FULL_WARP, lane_sum, 2);
        float l3 = __shfl_sync(FULL_WARP, lane_sum, 3);
        float l4 = __shfl_sync(FULL_WARP, lane_sum, 4);
        float l5 = __shfl_sync(FULL_WARP, lane_sum, 5);
        float l6 = __shfl_sync(FULL_WARP, lane_sum, 6);
        float l7 = __shfl_sync(FULL_WARP, lane_sum, 7);
        float sum = __fadd_rn(__fadd_rn(__fadd_rn(l0, l1), __fadd_rn(l2, l3)),
                              __fadd_rn(__fadd_rn(l4, l5), __fadd_rn(l6, l7)));
        float scale = abs_bits(sum) < INF_BITS ? __fdiv_rn(sum, (float)len)
                                               : __uint_as_float(max_bits);
        if (lane == 0) scale_out[b] = scale;
        // Blocks are multiples of 8 elements, so each starts on a byte.
        u8* bs = bits + start / 8;
        u32 bytes = (len + 7) / 8;
        for (u32 k = lane; k < bytes; k += 32) {
            u32 byte = 0;
            for (u32 t = 0; t < 8; t++) {
                u32 j = 8 * k + t;
                if (j < len) byte |= (__float_as_uint(xs[j]) >> 31) << t;
            }
            bs[k] = (u8)byte;
        }
    }
}

extern "C" __global__ void decode_sign1(
    const u8* scales, const u8* bits, u64 n, u32 block, float w, int accumulate, float* out,
    const u64* status) {
    if (failed(status)) return;
    const float* s = (const float*)scales;
    u64 blocks = (n + block - 1) / block;
    for (u64 b = global_warp(); b < blocks; b += warp_count()) {
        u64 start = b * block;
        u32 len = (u32)min((u64)block, n - start);
        u32 ws = __float_as_uint(__fmul_rn(w, s[b]));
        const u8* bs = bits + start / 8;
        float* os = out + start;
        u32 bytes = (len + 7) / 8;
        for (u32 k = lane_id(); k < bytes; k += 32) {
            u32 byte = bs[k];
            for (u32 t = 0; t < 8; t++) {
                u32 j = 8 * k + t;
                if (j < len) {
                    float v = __uint_as_float(ws ^ (((byte >> t) & 1u) << 31));
                    os[j] = accumulate ? __fadd_rn(os[j], v) : v;
                }
            }
        }
    }
}

// CenteredClip at a butterfly reducer (Karimireddy, He and Jaggi, ICML 2021): the pieces
// of one iteration v <- v + sum_i f_i (x_i - v), with f_i = share_i * min(1, tau/|x_i - v|).
//
// Squared distances are summed in f64 in a fixed order, so that every run and the host
// mirror in murmur_gpu::clip give the same bits: tiles of 2048 elements; in a tile, thread t
// of 256 sums the squares of elements t, t+256, ..., t+1792 in index order, the 256 thread
// sums combine in a halving tree (t += t+128, then t += t+64, ..., then t += t+1); the host
// adds the tile sums of a row in tile order. Each square of an f32 difference is exact in
// f64, so only the additions round.

#define CLIP_THREADS 256
#define CLIP_TILE 2048

// grid = (tiles, rows); partials[row * tiles + tile].
extern "C" __global__ void clip_tile_distances(
    const float* rows, const u64* row_offsets, const float* center, u64 len, u64 tiles,
    double* partials) {
    __shared__ double sums[CLIP_THREADS];
    const u32 t = threadIdx.x;
    const float* x = rows + row_offsets[blockIdx.y];
    for (u64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        u64 base = tile * CLIP_TILE;
        double acc = 0.0;
        for (u32 k = 0; k < CLIP_TILE / CLIP_THREADS; k++) {
            u64 j = base + t + (u64)k * CLIP_THREADS;
            if (j < len) {
                double d = (double)__fsub_rn(x[j], center[j]);
                acc = __dadd_rn(acc, __dmul_rn(d, d));
            }
        }
        sums[t] = acc;
        __syncthreads();
        for (u32 half = CLIP_THREADS / 2; half > 0; half >>= 1) {
            if (t < half) sums[t] = __dadd_rn(sums[t], sums[t + half]);
            __syncthreads();
        }
        if (t == 0) partials[(u64)blockIdx.y * tiles + tile] = sums[0];
        __syncthreads();
    }
}

// center[j] += sum over rows r, in order, of factors[r] * (x_r[j] - center[j]).
extern "C" __global__ void clip_step(
    const float* rows, const u64* row_offsets, const float* factors, u32 row_count, u64 len,
    float* center) {
    for (u64 j = global_thread(); j < len; j += thread_count()) {
        float v = center[j];
        float step = 0.0f;
        for (u32 r = 0; r < row_count; r++) {
            float x = rows[row_offsets[r] + j];
            step = __fadd_rn(step, __fmul_rn(factors[r], __fsub_rn(x, v)));
        }
        center[j] = __fadd_rn(v, step);
    }
}

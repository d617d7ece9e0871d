// The elementwise operations of push-sum mixing and error feedback. Each computes exactly
// the formula the Backend trait documents, as separately rounded IEEE f32 operations in
// the order written.

extern "C" __global__ void fill(float* y, u64 n, float value) {
    for (u64 i = global_thread(); i < n; i += thread_count()) y[i] = value;
}

// y = alpha * y
extern "C" __global__ void scale(float* y, u64 n, float alpha) {
    for (u64 i = global_thread(); i < n; i += thread_count()) y[i] = __fmul_rn(y[i], alpha);
}

// y = y + alpha * x
extern "C" __global__ void axpy(float alpha, const float* x, float* y, u64 n) {
    for (u64 i = global_thread(); i < n; i += thread_count()) {
        y[i] = __fadd_rn(y[i], __fmul_rn(alpha, x[i]));
    }
}

// y = alpha * x + beta * y
extern "C" __global__ void axpby(float alpha, const float* x, float beta, float* y, u64 n) {
    for (u64 i = global_thread(); i < n; i += thread_count()) {
        y[i] = __fadd_rn(__fmul_rn(alpha, x[i]), __fmul_rn(beta, y[i]));
    }
}

// Error feedback, first step: corrected = x + residual.
extern "C" __global__ void feedback_correct(
    const float* x, const float* residual, float* corrected, u64 n) {
    for (u64 i = global_thread(); i < n; i += thread_count()) {
        corrected[i] = __fadd_rn(x[i], residual[i]);
    }
}

// Error feedback, last step: residual = corrected - decoded, already computed in place in
// `corrected`, becomes the new residual unless encoding or the self-check failed.
extern "C" __global__ void feedback_commit(
    const float* corrected, float* residual, u64 n, const u64* status) {
    if (failed(status)) return;
    for (u64 i = global_thread(); i < n; i += thread_count()) residual[i] = corrected[i];
}

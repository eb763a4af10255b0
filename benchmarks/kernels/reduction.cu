// A row reduction shaped like a generated reduction kernel: each block reduces one row; threads
// accumulate a strided share of the row in registers, then the block combines the partial sums
// in shared memory, halving until one warp is left, and finishes with warp shuffles.
// Self-contained (no #include), NVRTC-compatible.  The block size is BENCH_BLOCK (a power of two,
// at least 64).

#ifndef BENCH_BLOCK
#define BENCH_BLOCK 256
#endif
#ifndef BENCH_VARIANT
#define BENCH_VARIANT 0
#endif

typedef float bench_acc_t;

__device__ __forceinline__ bench_acc_t bench_pre_map(float v) { return (bench_acc_t)v * (bench_acc_t)v; }
__device__ __forceinline__ bench_acc_t bench_combine(bench_acc_t a, bench_acc_t b) { return a + b; }
__device__ __forceinline__ float bench_post_map(bench_acc_t v) { return sqrtf((float)v) + (float)BENCH_VARIANT; }

__device__ __forceinline__ bench_acc_t bench_warp_combine(bench_acc_t v)
{
    for (int offset = 16; offset > 0; offset >>= 1)
        v = bench_combine(v, __shfl_down_sync(0xffffffffu, v, offset));
    return v;
}

extern "C" __global__ void bench_row_norm(const float* __restrict__ in, float* __restrict__ out,
                                          int rows, int cols)
{
    __shared__ bench_acc_t partial[BENCH_BLOCK];
    int row = blockIdx.x;
    if (row >= rows) return;
    const float* base = in + (long long)row * cols;
    bench_acc_t acc = (bench_acc_t)0;
    for (int j = threadIdx.x; j < cols; j += BENCH_BLOCK)
        acc = bench_combine(acc, bench_pre_map(base[j]));
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int width = BENCH_BLOCK / 2; width >= 32; width >>= 1) {
        if (threadIdx.x < width)
            partial[threadIdx.x] = bench_combine(partial[threadIdx.x], partial[threadIdx.x + width]);
        __syncthreads();
    }
    if (threadIdx.x < 32) {
        bench_acc_t v = bench_warp_combine(partial[threadIdx.x]);
        if (threadIdx.x == 0) out[row] = bench_post_map(v);
    }
}

// Elementwise kernels for the ptxbackend benchmarks (self-contained: no #include, NVRTC-compatible).
//
// bench_init fills a buffer with bounded values; saxpy is the memory-bound kernel of section 3;
// bench_axpby_strided is shaped like a generated elementwise kernel: a grid-stride loop over a
// flat index turned into an offset by a small strided indexer.  BENCH_VARIANT makes distinct
// sources (distinct cache keys) for the warm-start and concurrency sections.

#ifndef BENCH_VARIANT
#define BENCH_VARIANT 0
#endif

struct BenchIndexer2 {
    long long shape[2];
    long long strides[2];   // in elements
};

__device__ __forceinline__ long long bench_offset(const BenchIndexer2& ix, long long flat)
{
    long long inner = flat % ix.shape[1];
    long long outer = flat / ix.shape[1];
    return outer * ix.strides[0] + inner * ix.strides[1];
}

extern "C" __global__ void bench_init(float* x, unsigned int n, float scale)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = (float)(i % 1024u) * scale;
}

extern "C" __global__ void saxpy(float a, const float* __restrict__ x, float* __restrict__ y, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i] + (float)BENCH_VARIANT * 1e-9f;
}

extern "C" __global__ void bench_axpby_strided(const float* x, const float* y, float* out,
                                               float alpha, float beta, BenchIndexer2 ix)
{
    long long size = ix.shape[0] * ix.shape[1];
    for (long long flat = (long long)blockIdx.x * blockDim.x + threadIdx.x; flat < size;
         flat += (long long)blockDim.x * gridDim.x) {
        long long at = bench_offset(ix, flat);
        float xv = x[at];
        float yv = y[at];
        out[flat] = alpha * xv + beta * yv + (float)BENCH_VARIANT;
    }
}

// The compute-bound kernel: a chain of 64 dependent sinf calls per element, unrolled.
// Values stay in [-0.75, 1.25], so sinf never takes its slow large-argument path.
// Self-contained (no #include), NVRTC-compatible.

#ifndef BENCH_CHAIN
#define BENCH_CHAIN 64
#endif
#ifndef BENCH_VARIANT
#define BENCH_VARIANT 0
#endif

extern "C" __global__ void bench_init(float* x, unsigned int n, float scale)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = (float)(i % 1024u) * scale;
}

extern "C" __global__ void sinf_chain(const float* __restrict__ x, float* __restrict__ y, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
#pragma unroll
    for (int k = 0; k < BENCH_CHAIN; ++k)
        v = sinf(v) * 0.999f + 0.25f;
    y[i] = v + (float)BENCH_VARIANT;
}

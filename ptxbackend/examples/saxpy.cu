// The example kernel of `ptxbackend demo`: y = a * x + y.
// extern "C" keeps the name unmangled so it can be looked up as "saxpy".
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}

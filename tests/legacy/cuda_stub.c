/* Link-only stand-in for the CUDA driver library (libcuda.so.1) on a build machine without a driver.
 *
 * It must export every driver function CuPy v1's extension modules call: the linker runs with
 * --as-needed, and a libcuda.so that satisfies none of their symbols is dropped from DT_NEEDED,
 * so the modules would fail to import on the GPU machine ("undefined symbol: cuModuleLoad").
 * build.sh checks the list against the built modules.  Every stub returns CUDA_ERROR_NO_DEVICE;
 * at run time the real driver is loaded instead (soname libcuda.so.1).
 */
#define STUB(name) int name(void) { return 100; }

STUB(cuInit)
STUB(cuGetErrorName)
STUB(cuGetErrorString)
STUB(cuLaunchKernel)
STUB(cuModuleGetFunction)
STUB(cuModuleGetGlobal_v2)
STUB(cuModuleLoad)
STUB(cuModuleLoadData)
STUB(cuModuleUnload)

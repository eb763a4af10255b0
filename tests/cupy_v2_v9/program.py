"""A small CuPy v2-v9 program whose every result is checked against numpy (issue 15).

    python program.py OUT.json

Runs under the old interpreter (Python 3.7/3.8) with the CuPy under test, and
never imports ptxbackend: with ptxbackend installed, only its start-up hook is
at work.  Each kernel family CuPy compiles through ``compile_with_cache``:
ElementwiseKernel, ReductionKernel, RawKernel, cupy.fuse, and CuPy's own
elementwise/reduction routines.  Writes OUT.json and exits 1 if a result
differs from numpy's or a kernel fails.
"""

import json
import sys
import time
import traceback

import numpy

T0 = time.time()
import cupy  # noqa: E402
import cupy.cuda.compiler  # noqa: E402

SAXPY = r'''
extern "C" __global__ void ptxb_saxpy(float a, const float* x, const float* y, float* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
'''


def checks():
    rng = numpy.random.RandomState(7)
    n = 100003  # not a multiple of any block size
    x32 = rng.uniform(-2, 2, n).astype(numpy.float32)
    y32 = rng.uniform(-2, 2, n).astype(numpy.float32)
    x64 = x32.astype(numpy.float64)
    y64 = y32.astype(numpy.float64)

    def elementwise():
        kernel = cupy.ElementwiseKernel("T x, T y", "T z", "z = x * y + sin(x)", "ptxb_fma_sin")
        for x, y in ((x32, y32), (x64, y64)):
            yield "float%d" % (8 * x.itemsize), cupy.asnumpy(kernel(cupy.asarray(x), cupy.asarray(y))), \
                x * y + numpy.sin(x)

    def reduction():
        kernel = cupy.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "ptxb_l2norm")
        for x in (x32, x64):
            yield "float%d" % (8 * x.itemsize), cupy.asnumpy(kernel(cupy.asarray(x))), \
                numpy.sqrt(numpy.sum(x.astype(numpy.float64) ** 2)).astype(x.dtype)
        matrix = x64[:100000].reshape(400, 250)
        yield "axis=1", cupy.asnumpy(kernel(cupy.asarray(matrix), axis=1)), numpy.sqrt((matrix ** 2).sum(axis=1))

    def raw():
        kernel = cupy.RawKernel(SAXPY, "ptxb_saxpy")
        x, y = cupy.asarray(x32), cupy.asarray(y32)
        out = cupy.empty_like(x)
        kernel(((n + 255) // 256,), (256,), (numpy.float32(3.0), x, y, out, numpy.int32(n)))
        yield "saxpy", cupy.asnumpy(out), numpy.float32(3.0) * x32 + y32

    def fused():
        @cupy.fuse()
        def squash(a, b):
            return cupy.tanh(a * b) + a - b
        yield "tanh(a*b)+a-b", cupy.asnumpy(squash(cupy.asarray(x64), cupy.asarray(y64))), \
            numpy.tanh(x64 * y64) + x64 - y64

    def routines():
        x, y = cupy.asarray(x64), cupy.asarray(y64)
        yield "x+y*2", cupy.asnumpy(x + y * 2), x64 + y64 * 2
        yield "exp(x)", cupy.asnumpy(cupy.exp(x)), numpy.exp(x64)
        matrix = x64[:100000].reshape(250, 400)
        yield "sum(axis=0)", cupy.asnumpy(cupy.asarray(matrix).sum(axis=0)), matrix.sum(axis=0)
        yield "max", cupy.asnumpy(x.max()), x64.max()
        yield "cumsum", cupy.asnumpy(cupy.cumsum(x[:5000])), numpy.cumsum(x64[:5000])

    return (("ElementwiseKernel", elementwise), ("ReductionKernel", reduction), ("RawKernel", raw),
            ("cupy.fuse", fused), ("routines", routines))


def main(out_path):
    # the function the hook replaces: compile_with_cache (v2-v9), _compile_module_with_cache (v10+)
    compile_with_cache = getattr(cupy.cuda.compiler, "_compile_module_with_cache", None) \
        or cupy.cuda.compiler.compile_with_cache
    result = {
        "cupy": cupy.__version__, "numpy": numpy.__version__, "python": sys.version.split()[0],
        "import_seconds": round(time.time() - T0, 3),
        # set by ptxbackend's replacement, read here without importing ptxbackend
        "hook_active": getattr(compile_with_cache, "_ptxbackend_original", None) is not None,
        "checks": [], "ok": True,
    }
    try:
        result["device_cc"] = cupy.cuda.Device().compute_capability
        result["nvrtc"] = list(cupy.cuda.nvrtc.getVersion())
    except Exception as exc:
        result["device_error"] = "%s: %s" % (type(exc).__name__, exc)
    t0 = time.time()
    for family, produce in checks():
        try:
            for label, got, want in produce():
                got, want = numpy.asarray(got), numpy.asarray(want)
                tol = 1e-4 if want.dtype == numpy.float32 else 1e-10
                err = float(numpy.max(numpy.abs(got - want) / (numpy.abs(want) + 1.0))) if want.size else 0.0
                ok = got.shape == want.shape and got.dtype == want.dtype and err <= tol
                result["checks"].append({"family": family, "case": label, "ok": ok, "max_rel_err": err,
                                         "tolerance": tol, "dtype": str(got.dtype)})
                result["ok"] = result["ok"] and ok
        except Exception as exc:
            result["checks"].append({"family": family, "ok": False, "error": "%s: %s" % (type(exc).__name__, exc),
                                     "traceback": traceback.format_exc()})
            result["ok"] = False
    result["gpu_seconds"] = round(time.time() - t0, 3)
    with open(out_path, "w") as handle:
        json.dump(result, handle, indent=1, sort_keys=True)
    for check in result["checks"]:
        print("%s %-18s %-14s %s" % ("ok  " if check["ok"] else "FAIL", check["family"], check.get("case", ""),
                                     check.get("error") or "max rel err %.3g" % check["max_rel_err"]))
    print("program: %s (hook %s, %.2f s on the GPU)" % ("ok" if result["ok"] else "FAILED",
                                                       "active" if result["hook_active"] else "absent",
                                                       result["gpu_seconds"]))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

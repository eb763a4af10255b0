"""Where a CuPy v2-v9 kernel's first use spends its time on this machine (the GPU machine's harness helper).

    python compile_probe.py OUT.json          # the stock interpreter, with the harness's environment

Runs a few kernels through stock CuPy (no ptxbackend) and splits each first use into NVRTC's compile
(``compile_using_nvrtc``), the rest of ``_compile_with_cache_cuda`` (key, cache file, module load) and
what lies outside it (CuPy's code generation).  Then compiles CuPy's preamble straight through NVRTC
(ctypes) with each include folder CuPy passes, to see which one costs what.  Writes OUT.json.
"""

import ctypes
import json
import os
import sys
import time

import numpy

import cupy
import cupy.cuda.compiler as compiler

timings = {"nvrtc": [], "compile_with_cache": []}


def _timed(name, function):
    def wrapper(*args, **kwargs):
        t0 = time.time()
        try:
            return function(*args, **kwargs)
        finally:
            timings[name].append(round(time.time() - t0, 3))
    return wrapper


compiler.compile_using_nvrtc = _timed("nvrtc", compiler.compile_using_nvrtc)
compiler._compile_with_cache_cuda = _timed("compile_with_cache", compiler._compile_with_cache_cuda)


def first_uses():
    x = cupy.arange(1000, dtype=numpy.float32)
    cases = [("add f32", lambda: x + x), ("sin f32", lambda: cupy.sin(x)), ("sum f32", lambda: x.sum()),
             ("mul f64", lambda: x.astype(numpy.float64) * 2.5), ("complex abs", lambda: abs(x * 1j))]
    rows = []
    for name, case in cases:
        before = {k: len(v) for k, v in timings.items()}
        t0 = time.time()
        case()
        cupy.cuda.Device().synchronize()
        total = time.time() - t0
        row = {"case": name, "total_s": round(total, 3)}
        for k, v in timings.items():
            row[k + "_s"] = round(sum(v[before[k]:]), 3)
            row[k + "_calls"] = len(v) - before[k]
        rows.append(row)
        print(json.dumps(row))
        sys.stdout.flush()
    return rows


def raw_nvrtc(includes):
    """NVRTC alone on CuPy's preamble and a one-line kernel: seconds per include set."""
    lib = ctypes.CDLL(os.environ["V2V9_NVRTC"])
    source = ("#include <cupy/complex.cuh>\n#include <cupy/carray.cuh>\n#include <cupy/atomics.cuh>\n"
              'extern "C" __global__ void k(float* p) { p[threadIdx.x] += 1.0f; }\n').encode()
    rows = []
    for label, dirs in includes:
        options = [b"-I" + d.encode() for d in dirs] + [b"-ftz=true", b"--gpu-architecture=compute_86"]
        seconds = []
        for _ in range(2):
            program = ctypes.c_void_p()
            t0 = time.time()
            lib.nvrtcCreateProgram(ctypes.byref(program), source, b"k.cu", 0, None, None)
            rc = lib.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
            seconds.append(round(time.time() - t0, 3))
            lib.nvrtcDestroyProgram(ctypes.byref(program))
        rows.append({"includes": label, "rc": rc, "seconds": seconds})
        print(json.dumps(rows[-1]))
        sys.stdout.flush()
    return rows


def main():
    from cupy._core import core
    inc = core._get_header_dir_path()
    bundled = os.path.join(inc, "cupy", "_cuda", "cuda-11")
    cuda_inc = os.path.join(os.environ["CUDA_PATH"], "include")
    result = {"cpu_count": os.cpu_count(), "first_uses": first_uses()}
    result["raw_nvrtc"] = raw_nvrtc([("cupy", [inc]), ("cupy+bundled", [inc, bundled]),
                                     ("cupy+bundled+CUDA_PATH", [inc, bundled, cuda_inc])])
    with open(sys.argv[1], "w") as handle:
        json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()

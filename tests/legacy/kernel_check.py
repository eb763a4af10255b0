"""CPU-side check of the kernel patches: CuPy v1's own code generators, real compilers, no GPU.

Generates representative kernels with the installed Chainer 1.24 CuPy (an
elementwise kernel as Chainer writes them, its float16 variant, a ufunc-style
kernel, the simple reduction that every ``sum(axis=...)`` uses), each with
carray.cuh prepended exactly as CuPy v1 does, and compiles them:

- ``nvcc`` (CUDA 13) ``--cubin -arch sm_90``  : what stock CuPy v1 runs on the H200;
- nvcc 11.2 ``--ptx -arch compute_86``        : what ptxbackend runs with the old toolkit;
- nvcc 11.2 ``--cubin -arch sm_90``           : the user story's failure (must fail);
- NVRTC 11.7 ``compute_86`` through ptxbackend : the NVRTC path (when a libnvrtc is given).

Needs ``import cupy`` to work, so on a machine without a driver put a libcuda
stub on LD_LIBRARY_PATH (build.sh does).  Nothing is loaded or run.

    python kernel_check.py --out DIR [--nvcc112 PATH] [--nvrtc LIB]
"""

import argparse
import json
import os
import subprocess
import sys
import time


class _Captured(Exception):
    pass


def generate():
    """{name: full source} through CuPy v1's generators; compile_with_cache is intercepted."""
    import numpy
    import cupy
    import cupy.cuda
    from cupy.core import core

    captured = []

    def capture(source, options=(), arch=None, cache_dir=None):
        captured.append(source)
        raise _Captured()

    cupy.cuda.compile_with_cache = capture

    def take(make):
        del captured[:]
        try:
            make()
        except _Captured:
            pass
        return captured[0]

    # memoize(for_each_device=True) asks the driver for the device: call the function it wraps
    get_elementwise_kernel = getattr(core._get_elementwise_kernel, "__wrapped__", core._get_elementwise_kernel)

    def elementwise(kernel, dtype):
        # kernel.params ends with "CIndexer _ind"; every other argument an ndarray of ndim 1
        args_info = tuple((core.ndarray, numpy.dtype(dtype).type, 1) for _ in kernel.params[:-1])
        args_info += ((core.Indexer, None, 1),)
        return get_elementwise_kernel(args_info, (("T", numpy.dtype(dtype).type),), kernel.params,
                                      kernel.operation, kernel.name, kernel.preamble, kernel.kwargs)

    relu_grad = cupy.ElementwiseKernel("T y, T gy", "T gx", "gx = y > 0 ? gy : (T)0", "relu_bwd")
    adam = cupy.ElementwiseKernel(
        "T grad, T lr, T one_minus_beta1, T one_minus_beta2, T eps", "T param, T m, T v",
        """m += one_minus_beta1 * (grad - m);
           v += one_minus_beta2 * (grad * grad - v);
           param -= lr * m / (sqrt(v) + eps);""", "adam")
    sources = {
        "relu_bwd_float32": take(lambda: elementwise(relu_grad, "float32")),
        "relu_bwd_float16": take(lambda: elementwise(relu_grad, "float16")),
        "adam_float32": take(lambda: elementwise(adam, "float32")),
        "sum_axis_float32": take(lambda: core._get_simple_reduction_kernel(
            "cupy_sum", 512, "float",
            "CArray<float, 2> _raw_in0, CArray<float, 1> _raw_out0, CIndexer<2> _in_ind, "
            "CIndexer<1> _out_ind, int _block_stride",
            "0", "in0", "a + b", "out0 = a", "typedef float type_in0_raw; typedef float type_out0_raw;",
            "const type_in0_raw in0 = _raw_in0[_in_ind.get()];",
            "type_out0_raw &out0 = _raw_out0[_out_ind.get()];", "", ())),
        "sum_axis_float16": take(lambda: core._get_simple_reduction_kernel(
            "cupy_sum_half", 512, "float",
            "CArray<float16, 2> _raw_in0, CArray<float16, 1> _raw_out0, CIndexer<2> _in_ind, "
            "CIndexer<1> _out_ind, int _block_stride",
            "0", "in0", "a + b", "out0 = a", "typedef float16 type_in0_raw; typedef float16 type_out0_raw;",
            "const type_in0_raw in0 = _raw_in0[_in_ind.get()];",
            "type_out0_raw &out0 = _raw_out0[_out_ind.get()];", "", ())),
    }
    return sources


def run_nvcc(nvcc, args, source_path):
    t0 = time.time()
    proc = subprocess.run([nvcc] + args + [source_path], cwd=os.path.dirname(source_path),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return {"ok": proc.returncode == 0, "seconds": round(time.time() - t0, 3),
            "output": proc.stdout.decode("utf-8", "replace").strip()[-2000:]}


def run_nvrtc(lib, source, out_dir):
    import ptxbackend
    os.environ["PTXBACKEND_NVRTC"] = lib
    os.environ.setdefault("PTXBACKEND_CACHE_DIR", os.path.join(out_dir, "ptxbackend-cache"))
    t0 = time.time()
    try:
        artifact = ptxbackend.compile(source, target="compute_86", compiler="nvrtc", device_cc="9.0")
        return {"ok": True, "seconds": round(time.time() - t0, 3), "kind": artifact.kind,
                "producer": artifact.producer}
    except Exception as exc:
        return {"ok": False, "seconds": round(time.time() - t0, 3),
                "output": "%s: %s" % (type(exc).__name__, str(exc)[-2000:])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--nvcc", default="nvcc")
    parser.add_argument("--nvcc112")
    parser.add_argument("--nvrtc")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sources = generate()
    results, problems = {}, []
    for name, source in sorted(sources.items()):
        path = os.path.join(args.out, name + ".cu")
        with open(path, "w") as handle:
            handle.write(source)
        checks = {"nvcc13 --cubin sm_90": run_nvcc(args.nvcc, ["--cubin", "-arch", "sm_90"], path)}
        if args.nvcc112:
            checks["nvcc11.2 --ptx compute_86"] = run_nvcc(args.nvcc112, ["--ptx", "-arch", "compute_86"], path)
            story = run_nvcc(args.nvcc112, ["--cubin", "-arch", "sm_90"], path)
            story["ok"] = (not story["ok"]) and "Value 'sm_90' is not defined" in story["output"]
            checks["nvcc11.2 --cubin sm_90 fails as in the story"] = story
        if args.nvrtc:
            checks["nvrtc11.7 compute_86"] = run_nvrtc(args.nvrtc, source, args.out)
        results[name] = checks
        for check, outcome in sorted(checks.items()):
            print("%-18s %-46s %s (%.2f s)" % (name, check, "ok" if outcome["ok"] else "FAILED",
                                               outcome["seconds"]))
            if not outcome["ok"]:
                problems.append("%s: %s: %s" % (name, check, outcome.get("output", "")[-600:]))
    with open(os.path.join(args.out, "kernel_check.json"), "w") as handle:
        json.dump({"results": results, "problems": problems}, handle, indent=1)
    for problem in problems:
        print(problem)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What a dependency set costs a hit (issue 24), CPU only, one process, one run.

With CuPy 14's real include tree (``-I`` its ``_core/include`` and the three ``_cccl`` trees), nvcc 13
(or ``--compiler nvrtc``), it compiles N kernels that include ``cupy/complex.cuh``, ``cupy/carray.cuh``
and ``cupy/atomics.cuh`` and N header-free kernels, then times ``compile()`` hits of both kinds,
interleaved, in repetitions, and reports the median per hit, their ratio (the issue's budget: 1.25x), the
bytes an entry holds besides its payload (budget: 2 KiB), and the dependency set's size.  The header-free
hit is the lookup cuda-python's program cache is compared with.

    python benchmarks/bench_deps.py [--kernels 20] [--reps 7] [--compiler nvcc] [--out DIR]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

HEADERS = '#include <cupy/complex.cuh>\n#include <cupy/carray.cuh>\n#include <cupy/atomics.cuh>\n'


def source(i, headers):
    return (HEADERS if headers else "") + 'extern "C" __global__ void k%d(float* y) { y[0] = %d.0f; }\n' % (i, i)


def cupy_options():
    import cupy
    include = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
    cccl = os.path.join(include, "cupy", "_cccl")
    if not os.path.isdir(cccl):
        raise SystemExit("this CuPy (%s) has no bundled CCCL: CuPy 14 is what the figure is about" % cupy.__version__)
    options = ["-I", include]
    for name in ("libcudacxx", "cub", "thrust"):
        options += ["-I", os.path.join(cccl, name)]
    return options + ["--std=c++17"], cupy.__version__


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=20)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--compiler", default="nvcc", choices=("nvcc", "nvrtc"))
    parser.add_argument("--target", default="compute_75")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import ptxbackend
    options, cupy_version = cupy_options()
    cache = tempfile.mkdtemp(prefix="bench-deps-")
    kw = dict(target=args.target, compiler=args.compiler, cache_dir=cache)
    started = time.perf_counter()
    cold = {}
    for headers in (False, True):
        t0 = time.perf_counter()
        for i in range(args.kernels):
            art = ptxbackend.compile(source(i, headers), options if headers else (), **kw)
        cold[headers] = (time.perf_counter() - t0) / args.kernels * 1e3
        if headers:
            with open(art.path, "rb") as handle:
                overhead = len(handle.read()) - len(art.image)
            depset = json.loads(art.store.load_depset(art.deps.decode("ascii")).decode("ascii"))
            depset_bytes = len(json.dumps(depset, separators=(",", ":")))
    hits = {False: [], True: []}
    for _rep in range(args.reps):
        for headers in (False, True):
            t0 = time.perf_counter()
            for i in range(args.kernels):
                assert ptxbackend.compile(source(i, headers), options if headers else (), **kw).cache_hit
            hits[headers].append((time.perf_counter() - t0) / args.kernels * 1e6)
    bare, with_headers = statistics.median(hits[False]), statistics.median(hits[True])
    result = {
        "cupy": cupy_version, "compiler": args.compiler, "target": args.target, "kernels": args.kernels,
        "reps": args.reps, "ptxbackend": ptxbackend.__version__,
        "hit_us_header_free": bare, "hit_us_cupy_headers": with_headers,
        "hit_us_all": {"header_free": hits[False], "cupy_headers": hits[True]},
        "ratio": with_headers / bare, "ratio_budget": 1.25,
        "entry_bytes_besides_payload": overhead, "entry_budget": 2048,
        "depset_files": len(depset["files"]), "depset_absent_dirs": len(depset["absent"]),
        "depset_bytes": depset_bytes, "cold_ms": {"header_free": cold[False], "cupy_headers": cold[True]},
        "wall_s": time.perf_counter() - started,
    }
    lines = [
        "| figure | value | budget |", "| --- | --- | --- |",
        "| hit, header-free kernel (`compile()`, no load) | %.1f us | |" % bare,
        "| hit, kernel with CuPy 14's headers | %.1f us | |" % with_headers,
        "| ratio | %.2fx | 1.25x: %s |" % (result["ratio"], "met" if result["ratio"] <= 1.25 else "**not met**"),
        "| entry bytes besides the payload | %d | 2048: %s |" % (overhead, "met" if overhead <= 2048 else "**not met**"),
        "| the shared dependency set | %d files, %d directories with absent names, %d bytes (once per cache) | |"
        % (result["depset_files"], result["depset_absent_dirs"], depset_bytes),
        "| cold, per kernel (header-free / CuPy headers) | %.0f / %.0f ms | |" % (cold[False], cold[True]),
    ]
    print("\n".join(lines))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench-deps.json"), "w") as handle:
            json.dump(result, handle, indent=1)
        with open(os.path.join(args.out, "bench-deps.md"), "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

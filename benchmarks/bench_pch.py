#!/usr/bin/env python3
"""Cold compiles with and without NVRTC's precompiled headers (``PTXBACKEND_NVRTC_PCH``), CPU only.

Fresh processes, ABAB: each compiles N kernels that include CuPy 14's ``cupy/complex.cuh``,
``cupy/carray.cuh`` and ``cupy/atomics.cuh`` (its real include tree, as ``bench_deps.py`` uses it)
into an empty cache with NVRTC (12.8 or later: ``PTXBACKEND_NVRTC`` names it), and reports the ms per
kernel of the first kernel and of the rest, per arm, and the ratio on / off of each round.

    PTXBACKEND_NVRTC=/path/to/nvrtc/lib python benchmarks/bench_pch.py [--kernels 20] [--rounds 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def child(kernels, target):
    sys.path.insert(0, HERE)
    from bench_deps import HEADERS, cupy_options
    import ptxbackend
    options, _ = cupy_options()
    seconds = []
    for i in range(kernels):
        source = HEADERS + 'extern "C" __global__ void k%d(CArray<float, 1> y) { y[0] = %d.0f; }\n' % (i, i)
        begun = time.perf_counter()
        ptxbackend.compile(source, tuple(options), target=target, compiler="nvrtc")
        seconds.append(time.perf_counter() - begun)
    print(json.dumps({"first_ms": seconds[0] * 1e3, "rest_ms": statistics.median(seconds[1:]) * 1e3}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--target", default="sm_90")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.kernels, args.target)
    rows = {"off": [], "on": []}
    for number in range(args.rounds):
        for arm in (("off", "on") if number % 2 == 0 else ("on", "off")):
            env = dict(os.environ, PTXBACKEND_CACHE_DIR=tempfile.mkdtemp(prefix="bench-pch-"),
                       PTXBACKEND_NVRTC_PCH="1" if arm == "on" else "0")
            out = subprocess.check_output([sys.executable, os.path.abspath(__file__), "--child", "--kernels",
                                           str(args.kernels), "--target", args.target], env=env)
            rows[arm].append(json.loads(out.decode().strip().splitlines()[-1]))
    print("%d kernels a process, %d rounds (ABAB), NVRTC %s" % (args.kernels, args.rounds,
                                                                   os.environ.get("PTXBACKEND_NVRTC", "found")))
    for arm in ("off", "on"):
        print("  PTXBACKEND_NVRTC_PCH=%s: first kernel %s ms, the rest %s ms a kernel" % (
            "1" if arm == "on" else "0", " ".join("%.0f" % r["first_ms"] for r in rows[arm]),
            " ".join("%.1f" % r["rest_ms"] for r in rows[arm])))
    ratios = [on["rest_ms"] / off["rest_ms"] for on, off in zip(rows["on"], rows["off"])]
    print("  on / off, the rest, per round: %s (median %.2f)" % (" ".join("%.2f" % r for r in ratios),
                                                                 statistics.median(ratios)))


if __name__ == "__main__":
    main()

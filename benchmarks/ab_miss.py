#!/usr/bin/env python3
"""ab.py's miss workload: ptxbackend's own time per miss, CPU only: ``compile()`` minus the compiler's work.

N distinct kernels that include CuPy 14's headers (``-I`` its ``_core/include`` and the three ``_cccl``
trees, as CuPy passes them) are compiled by NVRTC into an empty cache in one process; per miss, the time
inside ``nvrtcCompileProgram``'s wrapper (``NvrtcCompiler._compile_program``) is subtracted from
``compile()``'s, and the recording of what NVRTC opened (``reads.OpenedFiles``, which that wrapper
enters) is added back: what is left is the key, the include roots' walk and watches, the dependency
set, the entry's write.  The first two misses (NVRTC's start-up, the toolkit digest) are not counted.
Each ``--tree`` (a ptxbackend source tree, the package layout or 0.4.0's flat one) runs in its own
fresh process, trees interleaved in ab.py's rotated order, ``--pairs`` rounds, in an empty working
directory unless ``--cwd`` names one; the table gives the median per tree and its ratio to the first.

    PTXBACKEND_NVRTC=.../libnvrtc.so.13 python benchmarks/run.py miss --tree old=/tmp/pb040a --tree now=.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab  # noqa: E402

HEADERS = '#include <cupy/complex.cuh>\n#include <cupy/carray.cuh>\n#include <cupy/atomics.cuh>\n'


def child(tree, kernels):
    ab.import_from_tree(tree)
    import cupy
    import ptxbackend
    from ptxbackend.compilers import nvrtc
    try:
        from ptxbackend.dependencies import reads
    except ImportError:  # 0.4.0's flat layout kept it with the compilers
        from ptxbackend.compilers import reads
    if not os.path.realpath(ptxbackend.__file__).startswith(os.path.realpath(tree) + os.sep):
        raise SystemExit("ptxbackend came from %s, not from %s" % (ptxbackend.__file__, tree))
    compiler_s, recording_s = [], []

    def timed(into, original):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                into.append(time.perf_counter() - started)
        return wrapper
    nvrtc.NvrtcCompiler._compile_program = timed(compiler_s, nvrtc.NvrtcCompiler._compile_program)
    for method in ("__enter__", "__exit__"):
        setattr(reads.OpenedFiles, method, timed(recording_s, getattr(reads.OpenedFiles, method)))
    base = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
    options = ["-I" + base] + ["-I" + os.path.join(base, "cupy", "_cccl", d) for d in ("libcudacxx", "cub", "thrust")]
    os.environ["PTXBACKEND_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-miss-")
    own = []
    for i in range(kernels + 2):
        del compiler_s[:], recording_s[:]
        started = time.perf_counter()
        art = ptxbackend.compile(HEADERS + 'extern "C" __global__ void k%d(float* y) { y[0] = %d.0f; }\n' % (i, i),
                                 options + ["--std=c++17"], target="compute_75", compiler="nvrtc",
                                 name="%032x.cu" % i)
        total = time.perf_counter() - started
        if art.cache_hit:
            raise SystemExit("kernel %d was a hit in an empty cache" % i)
        if i >= 2:
            own.append((total - sum(compiler_s) + sum(recording_s)) * 1e3)
    print(json.dumps({"version": ptxbackend.__version__, "own_ms": own}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--kernels", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--cwd", help="the children's working directory (NVRTC's source directory, walked and "
                        "watched: a busy one costs more); default: an empty one")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.kernels)
    if args.pairs < 1 or args.kernels < 1:
        parser.error("--pairs and --kernels must be at least 1")
    arms = ab.parse_trees(args.tree, None)
    trees = [(a["name"], a["dir"]) for a in arms]
    own = {name: [] for name, _ in trees}
    for r in range(args.pairs):
        for name, tree in ab.round_order(trees, r):
            got = ab.json_child(__file__, ["--child", tree, "--kernels", str(args.kernels), "--tree", "x"],
                                env={"PTXBACKEND_DISABLE": "1"},  # no installed copy's hook
                                cwd=args.cwd or tempfile.mkdtemp(prefix="bench-miss-cwd-"), what=name)
            own[name] += got["own_ms"]
    for arm in arms:
        print("%s: ptxbackend %s from %s" % (arm["name"], arm.get("version", "?"), arm["dir"]))
    first = statistics.median(own[trees[0][0]])
    print("| tree | ptxbackend's own ms per miss (median, min-max) | ratio to %s |" % trees[0][0])
    print("| --- | --- | --- |")
    for name, _ in trees:
        values = own[name]
        print("| %s | %.2f (%.2f-%.2f) | %.2f |" % (name, statistics.median(values), min(values), max(values),
                                                  statistics.median(values) / first))


if __name__ == "__main__":
    sys.exit(main())

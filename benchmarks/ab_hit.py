"""A paired A/B of the warm hit: two ptxbackend trees, fresh processes interleaved (ABBA), one run.

Each child imports ptxbackend from the tree it is given, makes the CUDA context, uses one cached
kernel (the one-time costs: settings, store, compiler memo), then times N = 100 distinct cached kernels
through ``compile()`` + ``load()`` (the cubin level on), and ``compile()`` alone, per kernel.
Rows: kernels without headers, and kernels that include the synthetic Chainer-like header tree
(``benchmarks/kernels/include``, 9 headers through one ``-I``).  Both trees use NVRTC by default
(what a GPU machine without a toolkit would), with the same target.

    python benchmarks/run.py hit --before DIR_WITH_OLD_ptxbackend --pairs 12 --out hit-ab.json
    python benchmarks/ab.py hit ...      (the same; this module is ab.py's hit workload)

Reports the median of each (tree, row) and the median of the paired differences (after - before),
with the differences' 25th-75th percentile: pairs taken side by side in time share the machine's
state, which two separate runs do not.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ab  # noqa: E402

REPO = os.path.dirname(HERE)
INCLUDE = os.path.join(HERE, "kernels", "include")
N = 100


def _source(i, headers):
    head = "#include <bench/carray.cuh>\n" if headers else ""
    return head + ('extern "C" __global__ void ab_%d(const float* x, float* y, int n)\n'
                   '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] * %d.0f + 1.0f; }\n'
                   % (i, i))


def child(args):
    ab.import_from_tree(args.src)
    import gc
    import ptxbackend
    # compile-only runs without a GPU (a CPU box); the driver module moved from the flat layout (0.4.0)
    # into ptxbackend.gpu, so both trees are looked up.
    load = (lambda art: art) if args.compile_only else ptxbackend.load
    if not args.compile_only:
        try:
            from ptxbackend.gpu import driver
        except ImportError:
            from ptxbackend import driver
        driver.ensure_context()
    options = ("-I", INCLUDE) if args.headers else ()
    kw = dict(target=args.target, compiler=args.compiler)
    load(ptxbackend.compile(_source(N + 1, args.headers), options, **kw))
    sources = [_source(i, args.headers) for i in range(N)]
    gc.collect()
    perf = time.perf_counter
    in_compile = 0.0
    keep = []
    hits = 0
    t0 = perf()
    for source in sources:
        c0 = perf()
        art = ptxbackend.compile(source, options, **kw)
        in_compile += perf() - c0
        hits += bool(art.cache_hit)
        keep.append(load(art))
    total = perf() - t0
    print(json.dumps({"total_us": total / N * 1e6, "compile_us": in_compile / N * 1e6, "hits": hits,
                      "version": ptxbackend.__version__, "from": os.path.dirname(ptxbackend.__file__)}))


def _run_child(src, headers, cache, compiler, target, compile_only=False):
    # PTXBACKEND_DISABLE: no installed copy's hook in the child; it imports the tree's package itself
    return ab.json_child(__file__, ["--child", "--src", src, "--compiler", compiler, "--target", target] +
                         (["--headers"] if headers else []) + (["--compile-only"] if compile_only else []),
                         env={"PTXBACKEND_CACHE_DIR": cache, "PTXBACKEND_DISABLE": "1"}, what=src)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=False, help="a directory holding the older ptxbackend/ package")
    p.add_argument("--after", default=REPO, help="the newer tree (default: this checkout)")
    p.add_argument("--pairs", type=int, default=12)
    p.add_argument("--compiler", default="nvrtc")
    p.add_argument("--target", default="compute_86")
    p.add_argument("--out", default="hit-ab.json")
    p.add_argument("--compile-only", action="store_true",
                   help="time compile() hits alone, no driver or load() (a machine without a GPU)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--src", help=argparse.SUPPRESS)
    p.add_argument("--headers", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if not args.before:
        p.error("--before DIR is required")
    work = tempfile.mkdtemp(prefix="hit-ab-")
    trees = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    rows = {"no headers": False, "headers": True}
    results = {(t, r): [] for t in trees for r in rows}
    versions = {}
    for t, src in trees.items():
        for r, headers in rows.items():
            cache = os.path.join(work, "%s-%s" % (t, r.replace(" ", "-")))
            for _ in range(2):  # fill the cache and the JIT cubins, then a discarded warm process
                versions[t] = _run_child(src, headers, cache, args.compiler, args.target, args.compile_only)
    for i in range(args.pairs):
        order = ab.round_order(["before", "after"], i)
        for r, headers in rows.items():
            for t in order:
                cache = os.path.join(work, "%s-%s" % (t, r.replace(" ", "-")))
                out = _run_child(trees[t], headers, cache, args.compiler, args.target, args.compile_only)
                assert out["hits"] == N, out
                results[(t, r)].append(out)
    report = {"pairs": args.pairs, "n": N, "compiler": args.compiler, "target": args.target,
              "versions": versions, "rows": {}}
    lines = ["| row | figure | before us/kernel | after us/kernel | after/before | paired delta us (median, p25-p75) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        for figure in ("total_us", "compile_us"):
            before = [x[figure] for x in results[("before", r)]]
            after = [x[figure] for x in results[("after", r)]]
            deltas = [a - b for a, b in zip(after, before)]
            row = {"before": statistics.median(before), "after": statistics.median(after),
                   "delta": statistics.median(deltas), "delta_p25": ab.percentile(deltas, 0.25),
                   "delta_p75": ab.percentile(deltas, 0.75), "before_all": before, "after_all": after}
            report["rows"]["%s %s" % (r, figure)] = row
            row["ratio"] = row["after"] / row["before"]
            lines.append("| %s | %s | %.1f | %.1f | %.2f | %+.1f (%+.1f..%+.1f) |" % (
                r, "compile()+load()" if figure == "total_us" else "compile() only", row["before"],
                row["after"], row["ratio"], row["delta"], row["delta_p25"], row["delta_p75"]))
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=1)
    print("before: %(version)s from %(from)s" % versions["before"])
    print("after:  %(version)s from %(from)s" % versions["after"])
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())

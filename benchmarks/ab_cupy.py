"""ab.py's cupy workload: stock CuPy 14 and the start-up hook of each tree side by side, fresh processes.

Arms: ``stock`` (CuPy alone: PTXBACKEND_DISABLE=1, no hook registered) and one arm per ptxbackend
source tree (``--tree NAME=DIR``, e.g. an old release unpacked from ``git archive`` and the working
tree).  A tree arm's child puts DIR first on ``sys.path`` and activates the hook exactly as
``ptxbackend.pth`` does (``import _ptxbackend_pth; _ptxbackend_pth.install()``) before it imports
CuPy, then checks that CuPy's compile function is ptxbackend's, from DIR.

Each child is a fresh process that imports CuPy, makes the context with one uncounted warm-up
kernel, then creates and launches N (100) distinct ``cupy.ElementwiseKernel``s (each includes CuPy's
own headers, as every CuPy kernel does) on a small array, synchronises, and reports the time per
kernel.  Cold = a child over empty caches (CuPy's, ptxbackend's, the driver's JIT cache: all three
per arm and round); warm = a second fresh child over what the cold one left.  Rounds interleave
the arms ABAB (order reversed every other round) so that arms compared share the machine's state.

    python benchmarks/run.py cupy-ab --tree 0.2.0=/tmp/pb020 --tree now=. --rounds 3 --out ab
    python benchmarks/run.py cupy-ab --tree now=. --dry-run     # no GPU: checks arms and hooks only
    python benchmarks/run.py cupy-ab --tree now=. --tree pch=. --arm-env pch:PTXBACKEND_NVRTC_PCH=1 --out ab

Writes results.json (every child's figures) and summary.md (medians, ratios to stock per round,
the issue's targets: warm at most 0.5x stock, cold at most 1x stock).  Inherited PTXBACKEND_*
variables are dropped so that every arm runs on defaults.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

# benchmarks/ for ab, as the other scripts find benchutil; not the checkout's root: a stock child
# must not be able to import ptxbackend from it.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab  # noqa: E402

MARK = "CUPY14AB-RESULT "  # the child's one result line; anything else it prints is noise
TARGET_WARM, TARGET_COLD = 0.5, 1.0  # issue 24: ratio to stock CuPy, per kernel


# --------------------------------------------------------------------------- the kernels

# Distinct sources: an operation from this list and constants from the index.  Only the body
# differs; CuPy wraps each in its usual headers (cupy/carray.cuh and friends).
_OPS = ("y = x * {a}f + {b}f",
        "y = sinf(x) * {a}f + {b}f",
        "y = expf(-fabsf(x) * {a}f) + {b}f",
        "y = sqrtf(fabsf(x) + {a}f) * {b}f",
        "y = x > {a}f ? x - {b}f : x * {b}f")


def kernel_spec(i):
    """(in_params, out_params, operation, name) of kernel ``i``; the same in every arm and round."""
    body = _OPS[i % len(_OPS)].format(a="%d.5" % (i + 1), b="%d.25" % (i % 7))
    return "float32 x", "float32 y", body, "ab24_k%d" % i


WARMUP = ("float32 x", "float32 y", "y = x + 0.125f", "ab24_warmup")  # not among the N


# --------------------------------------------------------------------------- the child

def _verify(tree, pth_file):
    """Raise unless the arm is what it claims: stock untouched, or the hook from ``tree`` in charge."""
    import cupy.cuda.compiler as compiler
    replaced = hasattr(compiler._compile_module_with_cache, "_ptxbackend_original")
    if tree is None:
        ab.assert_stock(replaced)
        return {}
    import ptxbackend
    cupy_integration = ab.tree_module("ptxbackend.hook.cupy_integration")
    ab.assert_from_tree(tree, pth_file, ptxbackend.__file__)
    if not (replaced and cupy_integration.installed()):
        raise SystemExit("tree arm: the hook did not take over CuPy's compiler: %s" % (cupy_integration.status(),))
    return {"version": ptxbackend.__version__, "from": os.path.dirname(ptxbackend.__file__),
            "status": cupy_integration.status()}


artifact_seconds = []
cache_function_seconds = []
stage_seconds = {}  # a tree arm's hook, step by step (ab.probe_stages)


def _time_cache_function():
    """Time each call of CuPy's ``_compile_module_with_cache`` (stock's, or the hook's in its place).

    That call is the whole of what ptxbackend can change in a kernel's first use: the key, the lookup
    and ``cuModuleLoadData``; the rest (CuPy's code generation, argument handling, the launch) is the
    same in every arm.  CuPy looks the function up as a module global at each call, so a wrapper
    there sees every kernel.
    """
    import cupy.cuda.compiler as compiler
    compiler._compile_module_with_cache = ab.timed(compiler._compile_module_with_cache, cache_function_seconds)


def _summarise_artifacts(records):
    hits = sum(bool(a.cache_hit) for a in records)
    overheads, payloads = [], []
    for a in records:
        image = getattr(a, "_image", None)  # not .image: a cubin-level hit would read the PTX now
        try:
            if image is not None:
                overheads.append(os.path.getsize(a.path) - len(image))
                payloads.append(len(image))
        except OSError:
            pass
    kinds = {}
    for a in records:
        kinds[a.kind] = kinds.get(a.kind, 0) + 1
    out = {"served": len(records), "hits": hits, "kinds": kinds}
    if artifact_seconds:
        out["in_compile_ms_median"] = statistics.median(artifact_seconds) * 1e3
    if overheads:  # "an entry holds at most 2 KiB besides its payload"
        out.update(entry_overhead_median=statistics.median(overheads), entry_overhead_max=max(overheads),
                   payload_median=statistics.median(payloads))
    return out


def _cupy_info(cupy):
    return ab.probe_each({"cupy": cupy.__version__}, (
        ("driver", lambda: cupy.cuda.runtime.driverGetVersion()),
        ("runtime", lambda: cupy.cuda.runtime.runtimeGetVersion()),
        ("nvrtc", lambda: cupy.cuda.compiler._get_nvrtc_version()),
        ("device", lambda: cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())))


def child(args):
    cupy, report, tree = ab.start_child(args, _verify, "ptxbackend")
    if args.child == "check":  # the dry run, and the real run's uncounted priming pass
        return ab.report_check(MARK, cupy, report, args.kernels, kernel_spec, _cupy_info)

    records = []
    if tree:
        ab.probe_engine(records, artifact_seconds)
        ab.probe_stages(stage_seconds)
    _time_cache_function()
    dirs = ab.cache_dirs()
    x, y, timings = ab.make_context(cupy, 1024, WARMUP)  # warm-up: NVRTC's start-up among others
    report.update(timings)
    if tree:  # 0 would mean the tree's hook reaches the engine some other way: no hit counts then
        report["probe_saw_warmup"] = len(records)
    report["warmup_cache_function_ms"] = sum(cache_function_seconds) * 1e3
    del records[:], cache_function_seconds[:], artifact_seconds[:]
    for seconds in stage_seconds.values():
        del seconds[:]
    report.update(ab.time_kernels(cupy, x, y, [kernel_spec(i) for i in range(args.kernels)], dirs))
    n = args.kernels
    # The program's view: its first kernel (which pays each arm's one-time costs: NVRTC's start-up and
    # CuPy's empty-file preprocess and header checksum for stock, ptxbackend's settings for the hook)
    # counted with the others; the context itself is not.
    report["with_first_ms"] = (report["warmup_s"] + report["total_s"]) / (n + 1) * 1e3
    if cache_function_seconds:
        report["cache_function_ms_median"] = statistics.median(cache_function_seconds) * 1e3
        report["cache_function_ms_per_kernel"] = sum(cache_function_seconds) / n * 1e3
    pb = report["caches"]["ptxbackend"]
    report["cache_bytes_per_kernel"] = (pb["after"]["bytes"] - pb["before"]["bytes"]) / n
    if tree:
        report["artifacts"] = _summarise_artifacts(records)
        report["artifacts"]["in_compile_us_per_kernel"] = sum(artifact_seconds) / n * 1e6
        report["stages"] = ab.stage_report(stage_seconds, n)
    report.update(_cupy_info(cupy))
    ab.emit(MARK, report)


# --------------------------------------------------------------------------- the parent

def run_child(mode, arm, caches, args):
    # PTXBACKEND_*: every arm on defaults; the cache variables: each child gets its own (ab.child_env)
    env = ab.child_env(caches, ("PTXBACKEND_",), ("CUPY_CACHE_DIR", "CUDA_CACHE_PATH"))
    env.update(arm.get("env") or {})  # --arm-env: the one setting this arm is about
    return ab.launch(__file__, MARK, mode, arm, caches, env, args)


def summarise(results):
    """Per arm: cold and warm ms/kernel over rounds, and each round's ratio to stock in that round."""
    per = ab.by_arm_and_phase(results["runs"])
    out = {}
    for arm in results["arms"]:
        row = {}
        for phase in ab.PHASES:
            mine = per.get((arm["name"], phase), {})
            row.update(ab.phase_figures(phase, mine, per.get(("stock", phase), {})))
            row.update(ab.phase_figures(phase, mine, per.get(("stock", phase), {}), "with_first_ms",
                                           phase + "_with_first"))
            row[phase + "_cache_function"] = ab.stats([v.get("cache_function_ms_per_kernel")
                                                          for v in mine.values()])
            row[phase + "_warmup_cache_function"] = ab.stats([v.get("warmup_cache_function_ms")
                                                                 for v in mine.values()])
            row[phase + "_in_compile"] = ab.stats([v.get("artifacts", {}).get("in_compile_ms_median")
                                                      for v in mine.values()])
            row[phase + "_median_kernel"] = ab.stats([v.get("median_kernel_ms") for v in mine.values()])
            row[phase + "_gc"] = ab.stats([v.get("gc", {}).get("ms_per_kernel") for v in mine.values()])
            row[phase + "_gc_full_runs"] = [v["gc"]["runs_by_generation"][2] for v in mine.values() if "gc" in v]
            row[phase + "_compile_per_kernel"] = ab.stats([v.get("artifacts", {}).get("in_compile_us_per_kernel")
                                                              for v in mine.values()])
            row[phase + "_stages"] = ab.stage_summary(mine, phase)
            row[phase + "_hits"] = [v["artifacts"]["hits"] for v in mine.values() if "artifacts" in v]
            row[phase + "_served"] = [v["artifacts"]["served"] for v in mine.values() if "artifacts" in v]
            row[phase + "_cupy_files"] = [v["caches"]["cupy"]["after"]["files"] - v["caches"]["cupy"]["before"]["files"]
                                          for v in mine.values() if "caches" in v]
        cold = [v for v in per.get((arm["name"], "cold"), {}).values() if "caches" in v]
        row["cache_bytes_per_kernel"] = ab.stats([v["cache_bytes_per_kernel"] for v in cold])
        row["entry_overhead_max"] = max([v["artifacts"].get("entry_overhead_max", 0) for v in cold
                                         if "artifacts" in v] or [None], key=lambda v: -1 if v is None else v)
        out[arm["name"]] = row
    return out


def render(results):
    fmt = ab.fmt
    summary = results["summary"]
    m = results["machine"]
    lines = ["# Issue 24: stock CuPy 14 vs the start-up hook (%s)" % ab.started(results),
             "", "GPU: %s; CuPy %s, NVRTC %s; Python %s; %d kernels per child; %d round(s) done%s." % (
                 m.get("gpu"), m.get("cupy"), m.get("nvrtc"), m.get("python"), results["kernels"],
                 results["rounds_done"], " (stopped by the budget)" if results.get("stopped_by_budget") else ""),
             "", "ms per kernel (median over rounds, min-max); ratio = arm / stock in the same round (median, "
             "min-max); targets: warm <= %.1fx, cold <= %.1fx stock." % (TARGET_WARM, TARGET_COLD), "",
             "| arm | cold ms/kernel | warm ms/kernel | cold ratio | warm ratio |", "| --- | --- | --- | --- | --- |"]
    for arm in results["arms"]:
        row = summary[arm["name"]]
        lines.append("| %s | %s | %s | %s | %s |" % (arm["name"], fmt(row["cold"]), fmt(row["warm"]),
                                                     fmt(row["cold_ratio"]), fmt(row["warm_ratio"])))
    lines += ["", "The same runs, the program's view: the first kernel of each process counted with the %d "
              "others (it pays each arm's one-time costs); and where the time goes: ms per kernel inside "
              "CuPy's `_compile_module_with_cache` (key, lookup, `cuModuleLoadData`; the hook's replacement "
              "in a tree arm), the first kernel's ms there, and ptxbackend's own `compile()` (median)." % (
                  results["kernels"]), "",
              "| arm | cold incl. first | warm incl. first | cold ratio | warm ratio | warm: in the cache "
              "function | warm: first kernel's | warm: ptxbackend compile() |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm in results["arms"]:
        row = summary[arm["name"]]
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            arm["name"], fmt(row["cold_with_first"]), fmt(row["warm_with_first"]),
            fmt(row["cold_with_first_ratio"]), fmt(row["warm_with_first_ratio"]), fmt(row["warm_cache_function"]),
            fmt(row["warm_warmup_cache_function"], "%.1f"), fmt(row["warm_in_compile"])))
    lines += ["", "Where a warm kernel's time goes (medians over rounds): the mean against the median kernel (a "
              "gap is a few slow kernels), the cyclic garbage collector's share inside the timed loop and its "
              "full collections per child, and, for a tree arm, us per kernel in ptxbackend's compile() and in "
              "each of the hook's other steps.", "",
              "| arm | warm mean ms | warm median ms | GC ms/kernel | full GCs | cache function ms | compile() us | "
              "other steps us |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm in results["arms"]:
        row = summary[arm["name"]]
        steps = ab.stage_text(row["warm_stages"])
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            arm["name"], fmt(row["warm"]), fmt(row["warm_median_kernel"]), fmt(row["warm_gc"]),
            row["warm_gc_full_runs"] or "-", fmt(row["warm_cache_function"]),
            fmt(row["warm_compile_per_kernel"], "%.1f"), steps))
    lines.append("")
    for arm in results["arms"]:
        row = summary[arm["name"]]
        title = arm["name"] + ("" if arm["dir"] is None else " (%s)" % ab.tree_label(arm))
        lines += ["## " + title, "", "| phase | ms/kernel | ratio to stock | target | child wall s | errors |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for phase, target in (("cold", TARGET_COLD), ("warm", TARGET_WARM)):
            ratio = row[phase + "_ratio"]
            verdict = "-" if arm["dir"] is None or not ratio else ab.verdict(ratio, target)
            lines.append("| %s | %s | %s | <= %.1fx: %s | %s | %d |" % (
                phase, fmt(row[phase]), fmt(ratio), target, verdict, fmt(row[phase + "_wall"], "%.1f"),
                row[phase + "_errors"]))
        lines += ["", "Files CuPy's own cache gained per round (a tree arm: 0 when the hook served every kernel): "
                  "cold %s, warm %s." % (row["cold_cupy_files"], row["warm_cupy_files"])]
        if arm["dir"] is not None:
            lines[-1] += (" ptxbackend cache per kernel: %s bytes; largest entry overhead besides its payload: %s "
                          "bytes (issue: at most 2048); warm hits/served per round: %s; cold served: %s." % (
                              fmt(row["cache_bytes_per_kernel"], "%.0f"), row["entry_overhead_max"],
                              ", ".join("%d/%d" % hs for hs in zip(row["warm_hits"], row["warm_served"])) or "-",
                              row["cold_served"]))
        lines.append("")
    return "\n".join(lines)


def _save(results, out):
    ab.save(results, out, summarise, render)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR", help="a ptxbackend source tree arm")
    p.add_argument("--arm-env", action="append", default=[], metavar="NAME:VAR=VALUE",
                   help="a variable set for tree arm NAME's children only (e.g. pch:PTXBACKEND_NVRTC_PCH=1)")
    ab.add_run_options(p, child_timeout=300,
                          budget_help="start no round that the longest round so far would push past this",
                          dry_run_help="check arms and hooks in a child each; run no kernel")
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if args.rounds < 1 or args.kernels < 1:
        p.error("--rounds and --kernels must be at least 1")
    if not args.dry_run and not args.out:
        p.error("--out is needed (or --dry-run)")
    arms = [{"name": "stock", "dir": None}] + ab.parse_trees(args.tree, "stock")
    for spec in args.arm_env:
        name, colon, assignment = spec.partition(":")
        var, eq, value = assignment.partition("=")
        arm = [a for a in arms if a["name"] == name and a["dir"]]
        if not (colon and eq and var and arm):
            p.error("--arm-env %r: write NAME:VAR=VALUE for a --tree arm NAME" % spec)
        arm[0].setdefault("env", {})[var] = value
    scratch = tempfile.mkdtemp(prefix="cupy14-ab-")
    results = {"started": time.time(), "kernels": args.kernels, "rounds": args.rounds, "arms": arms,
               "machine": ab.machine(), "checks": {}, "runs": [], "rounds_done": 0}

    for arm in arms:
        if arm["dir"]:
            ab.precompile(ab.tree_files(arm["dir"]))
    ab.check_arms(results, arms, lambda arm: run_child("check", arm, ab.arm_caches(scratch, "check", arm), args))
    stock = results["checks"]["stock"]
    results["machine"].update({k: stock.get(k) for k in ("cupy", "nvrtc", "driver", "runtime", "device")})
    if args.dry_run:
        ab.print_plan(ab.plan(args.rounds, lambda r: ab.round_order(arms, r)))
        shutil.rmtree(scratch, ignore_errors=True)
        return 0

    os.makedirs(args.out, exist_ok=True)

    def run_arm(arm, r):
        caches = ab.arm_caches(scratch, "r%d" % r, arm)
        for phase in ab.PHASES:
            got = run_child("run", arm, caches, args)
            yield phase, got, (got["error"].splitlines()[-1] if "error" in got else
                               "%.3f ms/kernel (wall %.1f s)" % (got["per_kernel_ms"], got["wall_s"]))

    ab.run_rounds(results, args.rounds, lambda r: ab.round_order(arms, r), run_arm,
                  lambda res: _save(res, args.out), args.budget_s, time.perf_counter())
    if args.keep_caches:
        print("caches kept in", scratch)
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

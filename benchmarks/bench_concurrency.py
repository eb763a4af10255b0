"""Section 6: P processes starting cold on the same K kernels, one fresh cache directory.

Every process calls ptxbackend.compile() on the same K sources (benchmarks/kernels/elementwise.cu with
a distinct BENCH_VARIANT each), in the same order, through a logging nvcc wrapper (like the
logging_nvcc fixture of tests/conftest.py): the log counts the real compiler processes.  CPU-capable:
explicit target and device compute capability, no driver call.  With a GPU the processes also
ptxbackend.load() every kernel, and each counts its driver JIT links (the cubin level).
Reference: one process compiling the K kernels alone.
"""

import json
import os
import subprocess
import sys
import time

import benchutil


def conc_child(args):
    """Child: compile (and on a GPU load) every kernel; report own compiles and JIT links."""
    import ptxbackend
    links = [0]
    if args.get("load"):
        from ptxbackend.gpu import driver
        from ptxbackend.compiling import engine
        driver.ensure_context()
        original = engine.driver.link_ptx

        def counting(*a, **k):
            links[0] += 1
            return original(*a, **k)
        engine.driver.link_ptx = counting
    sources = [benchutil.kernel_source("elementwise", v) for v in args["variants"]]
    started = time.time()
    compiled = 0
    for source in sources:
        artifact = ptxbackend.compile(source, (), target=args["target"], compiler="nvcc",
                                      device_cc=args.get("device_cc"))
        compiled += not artifact.cache_hit
        if args.get("load"):
            ptxbackend.load(artifact)
    return {"compiled": compiled, "links": links[0], "started": started, "ended": time.time()}


def _round(ctx, procs, variants, target, load, nvcc):
    wrapper, log = benchutil.logging_nvcc(ctx.ws, nvcc, "nvcc-wrapper")
    env = benchutil.clean_env({"PTXBACKEND_NVCC": wrapper, "PTXBACKEND_CACHE_DIR": ctx.ws.fresh("conc-cache"),
                               "CUDA_CACHE_PATH": ctx.ws.fresh("conc-jit"), "PTXBACKEND_DISABLE": "1"})
    args = {"variants": variants, "target": target, "load": load,
            "device_cc": None if load else "%d.%d" % (ctx.device_cc // 10, ctx.device_cc % 10)}
    code = ("import sys, json; sys.path[:0] = %r; import bench_concurrency as m; "
            "print(%r + json.dumps(m.conc_child(json.loads(sys.argv[1]))))"
            % (benchutil.child_path(), benchutil.MARKER))
    started = time.perf_counter()
    children = [subprocess.Popen([sys.executable, "-c", code, json.dumps(args)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
                for _ in range(procs)]
    results, errors = [], []
    for child in children:
        out, err = child.communicate(timeout=1800)
        lines = [l for l in out.splitlines() if l.startswith(benchutil.MARKER)]
        if child.returncode != 0 or not lines:
            errors.append(benchutil.tail(err, 3))
        else:
            results.append(json.loads(lines[-1][len(benchutil.MARKER):]))
    wall = time.perf_counter() - started
    return {"wall_s": wall, "nvcc_compiles": benchutil.nvcc_compiles(log),
            "self_reported": sum(r["compiled"] for r in results),
            "jit_links": sum(r["links"] for r in results), "errors": errors, "ok": len(results)}


def run(ctx):
    title = "Concurrency: processes starting cold on the same kernels"
    entry = ctx.toolkits.get("nvcc13") or {}
    if "path" not in entry:
        return ctx.skipped(title, "needs a CUDA 12/13 nvcc (%s)" % entry.get("missing", "not found"))
    procs, kernels = (8, 10) if ctx.quick else (16, 50)
    reps = ctx.reps(full=3, quick=1)
    arch = max([a for a in entry["virtual_archs"] if a <= ctx.ptx_arch] or [0])
    if not arch:
        return ctx.skipped(title, "nvcc %s knows no compute_XY <= %d" % (entry["version"], ctx.ptx_arch))
    target = "compute_%d" % arch
    variants = [2000 + i for i in range(kernels)]
    load = bool(ctx.gpu.get("available"))
    notes = ["%d processes x %d kernels (%s, nvcc %s), the same order in every process; wall time from the "
             "first spawn to the last exit; compiles counted in the nvcc wrapper's log." % (
                 procs, kernels, target, entry["version"])]
    if load:
        notes.append("GPU: every process also loads every kernel; 'JIT links' counts the cubin-level links "
                     "(driver.link_ptx calls) across processes (no lock there by design: a link may repeat).")
    else:
        notes.append("CPU only: compile part only (no load).")
    if ctx.quick:
        notes.append("--quick: %d processes x %d kernels instead of 16 x 50." % (procs, kernels))
    rounds, serial = [], []
    for rep in range(reps):
        benchutil.log("concurrency: rep %d, %d processes x %d kernels" % (rep + 1, procs, kernels))
        rounds.append(_round(ctx, procs, variants, target, load, entry["path"]))
    benchutil.log("concurrency: reference, 1 process x %d kernels" % kernels)
    serial.append(_round(ctx, 1, variants, target, load, entry["path"]))
    wall = benchutil.summarize([r["wall_s"] for r in rounds], "s")
    alone = benchutil.summarize([r["wall_s"] for r in serial], "s")
    compiles = [r["nvcc_compiles"] for r in rounds]
    for r in rounds + serial:
        for error in r["errors"]:
            notes.append("a process failed: %s" % error)
    rows = [["%d processes" % procs, str(kernels), benchutil.fmt_stat(wall),
             "/".join(str(c) for c in compiles), "/".join(str(r["self_reported"]) for r in rounds),
             "/".join(str(r["jit_links"]) for r in rounds) if load else "-",
             "%d/%d" % (min(r["ok"] for r in rounds), procs)],
            ["1 process (reference)", str(kernels), benchutil.fmt_stat(alone), str(serial[0]["nvcc_compiles"]),
             str(serial[0]["self_reported"]), str(serial[0]["jit_links"]) if load else "-", "%d/1" % serial[0]["ok"]]]
    once = all(c == kernels for c in compiles) and all(r["ok"] == procs for r in rounds)
    summary = {"processes": procs, "kernels": kernels, "compiles": compiles, "each_once": once,
               "wall_s": wall["median"], "reference_wall_s": alone["median"]}
    return {"title": title, "status": "ok", "notes": notes, "rounds": rounds, "reference": serial,
            "stats": {"wall_s": wall, "reference_wall_s": alone}, "summary": summary,
            "table": {"columns": ["run", "kernels", "wall, s", "nvcc compiles (per repetition)",
                                  "compiles reported by processes", "JIT links", "processes ok"], "rows": rows},
            "plots": [{"file": "concurrency.png", "title": "Cold start of the same kernels", "ylabel": "seconds",
                       "labels": ["%d processes" % procs, "1 process"], "series": {"wall time": [wall, alone]}}]}

"""Section 1: cold compile per kernel, the bare compiler call against ptxbackend.compile().

For every kernel and every toolkit found: nvcc --cubin and --ptx, NVRTC PTX.  The bare call is the
compiler class ptxbackend itself uses (NvccCompiler / NvrtcCompiler .compile()); the ptxbackend call
is ptxbackend.compile() missing the cache (a cache directory per toolkit, a distinct source per
repetition, so every call compiles), which adds the key, the entry lock and the atomic write.  The two are interleaved (ABBA) and compile the very same text.  The compiler's identity is
probed once per cache directory; that one-time cost is reported separately.

With CuPy and a GPU, two CuPy-generated sources (an ElementwiseKernel and a ReductionKernel) are
captured through ptxbackend's start-up hook with PTXBACKEND_RECORD, with CuPy's own options.
"""

import json
import os
import time

import benchutil
import machine

KERNELS = ("elementwise", "reduction", "transcendental", "matmul")
QUICK_KERNELS = ("elementwise", "transcendental")
NVRTC_ONLY = ("--device-as-default-execution-space", "-default-device", "--pch")
OLD_SLOTS = ("nvcc112", "nvrtc117")  # the toolkits that do not know the GPU, as CUDA 8 in the user story


# --------------------------------------------------------------------------- CuPy capture (child)

def capture_child(args):
    """Child: run one ElementwiseKernel and one ReductionKernel through the hook, recording them."""
    import _ptxbackend_boot
    _ptxbackend_boot.start()
    import cupy
    import ptxbackend
    ew = cupy.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x * x + 2.5f * y",
                                "bench_cupy_fma2")
    red = cupy.ReductionKernel("float32 x", "float32 y", "x * x", "a + b", "y = sqrt(a)", "0",
                               "bench_cupy_l2norm")
    a = cupy.arange(4096, dtype=cupy.float32)
    b = cupy.ones(4096, dtype=cupy.float32)
    z = ew(a, b)
    n = red(a)
    cupy.cuda.Device().synchronize()
    records = []
    path = os.environ["PTXBACKEND_RECORD"]
    if os.path.exists(path):
        with open(path) as handle:
            records = [json.loads(line) for line in handle if line.strip()]
    wanted = {}
    for record in records:
        for label, name in (("cupy elementwise", "bench_cupy_fma2"), ("cupy reduction", "bench_cupy_l2norm")):
            if name in record["source"] and label not in wanted:
                wanted[label] = {"source": record["source"], "options": record["options"]}
    return {"installed": ptxbackend.installed(), "cupy": cupy.__version__, "kernels": wanted,
            "check": [float(z[3]), float(n)]}


def capture_cupy_kernels(ctx):
    record = os.path.join(ctx.ws.fresh("record"), "manifest.jsonl")
    env = benchutil.clean_env({"PTXBACKEND_RECORD": record, "PTXBACKEND_CACHE_DIR": ctx.ws.fresh("capture-cache"),
                               "PTXBACKEND_DISABLE": None, "CUPY_CACHE_DIR": ctx.ws.fresh("capture-cupy"),
                               "CUDA_CACHE_PATH": ctx.ws.fresh("capture-jit"),
                               # CuPy's CUB reduction builds templates through name_expressions, which
                               # ptxbackend hands back to CuPy: ask for its plain reduction kernel.
                               "CUPY_ACCELERATORS": ""})
    if "path" in ctx.toolkits.get("nvrtc13", {}):
        env["PTXBACKEND_NVRTC"] = ctx.toolkits["nvrtc13"]["path"]
    result = benchutil.spawn("bench_compile", "capture_child", {}, env, timeout=600)
    return result


# --------------------------------------------------------------------------- measurement

def _modes(slot, entry, cc):
    """(mode label, target string, device_cc for ptxbackend) for one toolkit."""
    modes = []
    if entry["kind"] == "nvcc":
        sm = machine.newest(entry["real_archs"], cc)
        if sm:
            modes.append(("cubin", "sm_%d" % sm, sm))
    compute = machine.newest(entry["virtual_archs"], cc)
    if compute:
        modes.append(("ptx", "compute_%d" % compute, cc))
    return modes


def _compiler(entry):
    if entry["kind"] == "nvcc":
        from ptxbackend.compilers.nvcc import nvcc_compiler
        return nvcc_compiler(entry["path"])
    from ptxbackend.compilers.nvrtc import nvrtc_compiler
    return nvrtc_compiler(entry["path"])


def _with_env(changes):
    saved = {k: os.environ.get(k) for k in changes}
    for key, value in changes.items():
        os.environ[key] = value
    return saved


def _restore(saved):
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _measure_cell(ptxbackend, compiler, target_text, device_cc, source, options, cache_dir, reps, tag):
    from ptxbackend.compiling.targets import parse_target
    target = parse_target(target_text)
    bare, ours, paired = [], [], []
    cc_text = "%d.%d" % (device_cc // 10, device_cc % 10)
    for rep in range(reps):
        # A distinct comment per repetition: a new cache key, the same work for the compiler.
        text = source + "\n// ptxbench %s rep %d %.6f\n" % (tag, rep, time.time())
        order = ("bare", "ours") if rep % 2 == 0 else ("ours", "bare")
        times = {}
        for which in order:
            started = time.perf_counter()
            if which == "bare":
                compiler.compile(text, tuple(options), target, "kernel.cu")
            else:
                artifact = ptxbackend.compile(text, options, target=target_text, compiler=compiler.kind,
                                              device_cc=cc_text, cache_dir=cache_dir, name="kernel.cu")
                if artifact.cache_hit:
                    raise RuntimeError("ptxbackend.compile() hit the cache; the benchmark needs a miss")
            times[which] = time.perf_counter() - started
        bare.append(times["bare"])
        ours.append(times["ours"])
        paired.append(times["ours"] / times["bare"])
    return bare, ours, paired


def run(ctx):
    import ptxbackend
    reps = ctx.reps(full=5, quick=3)
    names = QUICK_KERNELS if ctx.quick else KERNELS
    kernels = [(name, benchutil.kernel_source(name), ()) for name in names]
    notes = ["Each cell: median seconds (min-max, repetitions); ratio = ptxbackend median / bare median, "
             "with the range of the per-repetition paired ratios.",
             "Bare call: the compiler class (NvccCompiler/NvrtcCompiler).compile(); ptxbackend: "
             "ptxbackend.compile() on a cache miss (key, lock, compile, atomic write)."]
    if ctx.quick:
        notes.append("--quick: kernels %s only (the heavier ones run without --quick)." % ", ".join(names))
    captured = {}
    if ctx.gpu.get("available") and ctx.cupy.get("cupy_version"):
        try:
            got = capture_cupy_kernels(ctx)
            captured = got["kernels"]
            if not got["installed"]:
                notes.append("CuPy capture: the hook did not install itself; CuPy kernels not measured.")
                captured = {}
            for label in ("cupy elementwise", "cupy reduction"):
                if label not in captured:
                    notes.append("CuPy capture: no record of the %s (ptxbackend did not serve it)." % label)
        except benchutil.ChildError as exc:
            notes.append("CuPy kernels not captured: %s" % exc)
    else:
        notes.append("CuPy-generated kernels not measured: capturing them needs CuPy and a GPU here.")
    for label in sorted(captured):
        kernels.append((label, captured[label]["source"], tuple(captured[label]["options"])))
        notes.append("%s: CuPy's options %s (for nvcc without the NVRTC-only %s)"
                     % (label, " ".join(captured[label]["options"]), ", ".join(NVRTC_ONLY)))
    # CuPy's -I directories are fingerprinted once per process: do it now, outside the clock.
    try:
        from ptxbackend.cache import header_fingerprint, include_dirs
    except ImportError:  # ptxbackend >= issue 12 records the headers a compile read instead
        header_fingerprint, include_dirs = None, lambda options: ()
    for name, _source, options in kernels:
        if include_dirs(options):
            started = time.perf_counter()
            header_fingerprint(include_dirs(options))
            notes.append("%s: one-time header fingerprint of its -I directories (per process, outside the "
                         "clock): %.3f s" % (name, time.perf_counter() - started))

    cc = ctx.device_cc
    rows, worst = [], []
    pooled = {}  # toolkit label -> (paired ratios, paired differences in s) over all its cells
    plot_labels, plot_bare, plot_ours = [], [], []
    first_compiles = {}
    for slot in machine.SLOTS:
        entry = ctx.toolkits.get(slot) or {}
        if "path" not in entry:
            notes.append("%s not measured: %s" % (slot, entry.get("missing", "not found")))
            continue
        saved = _with_env(machine.env_for(entry))
        try:
            compiler = _compiler(entry)
            cache_dir = ctx.ws.fresh("compile-" + slot)
            modes = _modes(slot, entry, cc)
            # One-time: the compiler identity probe in a fresh cache directory (not per kernel).
            started = time.perf_counter()
            try:
                ptxbackend.compile(benchutil.kernel_source("elementwise", variant=1), (), target=modes[-1][1],
                                   compiler=entry["kind"], device_cc="%d.%d" % (cc // 10, cc % 10),
                                   cache_dir=cache_dir)
                first_compiles[slot] = time.perf_counter() - started
            except Exception as exc:
                notes.append("%s: first compile failed: %s" % (slot, benchutil.first_line(exc)))
            for name, source, options in kernels:
                if name.startswith("cupy") and slot in OLD_SLOTS:
                    notes.append("%s with %s: not measured: CuPy 14 kernels include CuPy's CCCL headers, which "
                                 "need C++17 and a CUDA 12+ compiler" % (name, machine.label(slot, entry)))
                    continue
                for mode, target, device_cc in modes:
                    if entry["kind"] == "nvrtc" and mode != "ptx":
                        continue
                    row = {"kernel": name, "toolkit": machine.label(slot, entry), "slot": slot, "mode": mode,
                           "target": target}
                    benchutil.log("compile: %s %s %s" % (name, row["toolkit"], target))
                    if entry["kind"] == "nvcc":  # CuPy's own nvcc backend passes no NVRTC-only option either
                        options = tuple(o for o in options if o not in NVRTC_ONLY)
                    try:
                        bare, ours, paired = _measure_cell(ptxbackend, compiler, target, device_cc, source,
                                                           options, cache_dir, reps, "%s-%s" % (slot, name))
                        ratios, diffs = pooled.setdefault(row["toolkit"], ([], []))
                        ratios.extend(paired)
                        diffs.extend(o - b for o, b in zip(ours, bare))
                    except Exception as exc:
                        row["error"] = benchutil.first_line(exc)[:300]
                        rows.append(row)
                        continue
                    row["bare_s"] = benchutil.summarize(bare, "s")
                    row["ptxbackend_s"] = benchutil.summarize(ours, "s")
                    row["ratio"] = benchutil.ratio(row["ptxbackend_s"], row["bare_s"])
                    row["paired_ratio"] = benchutil.summarize(paired, "x")
                    worst.append(row["ratio"])
                    rows.append(row)
                    plot_labels.append("%s\n%s %s" % (name, slot, target))
                    plot_bare.append(row["bare_s"])
                    plot_ours.append(row["ptxbackend_s"])
        finally:
            _restore(saved)

    table_rows = []
    for row in rows:
        if "error" in row:
            table_rows.append([row["kernel"], row["toolkit"], row["target"], "failed: " + row["error"], "-", "-"])
        else:
            spread = row["paired_ratio"]
            table_rows.append([row["kernel"], row["toolkit"], row["target"], benchutil.fmt_stat(row["bare_s"]),
                               benchutil.fmt_stat(row["ptxbackend_s"]),
                               "%s (%s-%s)" % (benchutil.fmt_ratio(row["ratio"]), benchutil.fmt_num(spread["min"]),
                                               benchutil.fmt_num(spread["max"]))])
    for slot, seconds in sorted(first_compiles.items()):
        notes.append("%s: first ptxbackend.compile() in a fresh cache directory (probes the compiler once, "
                     "then compiles): %.3f s" % (slot, seconds))
    per_toolkit = {}
    for toolkit, (ratios, diffs) in sorted(pooled.items()):
        per_toolkit[toolkit] = {"paired_ratio": benchutil.summarize(ratios, "x"),
                                "overhead_ms": benchutil.summarize([d * 1000.0 for d in diffs], "ms")}
        notes.append("%s, all its cells pooled (%d paired repetitions): ptxbackend/bare %s, overhead %s ms "
                     "(median (min-max))" % (toolkit, len(ratios), benchutil.fmt_stat(per_toolkit[toolkit]["paired_ratio"]),
                                            benchutil.fmt_stat(per_toolkit[toolkit]["overhead_ms"])))
    summary = {"worst_ratio": max(worst) if worst else None,
               "median_ratio": benchutil.summarize(worst, "x")["median"] if worst else None,
               "cells": len(worst), "per_toolkit": per_toolkit,
               "worst_toolkit_ratio": max(v["paired_ratio"]["median"] for v in per_toolkit.values())
               if per_toolkit else None}
    status = "ok" if worst else "skipped"
    return {
        "title": "Cold compile per kernel: bare compiler call vs ptxbackend.compile()",
        "status": status, "notes": notes, "rows": rows, "summary": summary,
        "first_compile_s": first_compiles,
        "table": {"columns": ["kernel", "toolkit", "target", "bare call, s", "ptxbackend.compile(), s",
                              "ratio (paired range)"], "rows": table_rows},
        "plots": [{"file": "compile.png", "title": "Cold compile per kernel", "ylabel": "seconds",
                   "labels": plot_labels, "series": {"bare compiler call": plot_bare,
                                                     "ptxbackend.compile() (miss)": plot_ours}}],
    }

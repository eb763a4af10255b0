"""Chainer 1.24's CuPy v1 through the start-up hook of several ptxbackend trees, side by side, one run.

The user's stack: Chainer 1.24 (it bundles CuPy v1 as the package ``cupy``) with an nvcc that does not
know the GPU (here nvcc 11.2 on an H200, sm_90).  Stock CuPy v1 fails there on its first kernel, so
there is no stock arm with that nvcc: the arms are ptxbackend source trees (``--tree NAME=DIR``, e.g.
0.2.0 unpacked from ``git archive`` and the working tree), all with nvcc 11.2 as ``nvcc`` (target
auto: compute_86 PTX on an H200).  The FIRST tree given is the baseline every other arm is compared
with, round by round.  ``--stock13`` adds, for reference only, stock CuPy v1 (no hook) with CUDA
13's nvcc, which knows sm_90 (``--cubin -arch sm_90``); by default in the first round only
(``--stock13-rounds``), because its cold child is the slowest of all.

A tree arm's child puts DIR first on ``sys.path`` and activates the hook as ``ptxbackend.pth`` does
(``import _ptxbackend_pth; _ptxbackend_pth.install()``) before ``import cupy``, then checks that
``cupy.cuda.compile_with_cache`` and ``cupy.cuda.compiler.compile_with_cache`` are ptxbackend's, that
the package came from DIR and that ptxbackend finds the ``nvcc`` wrapper.  Each child is a fresh
process: import cupy, make the context, one uncounted warm-up kernel, then N (100) distinct
``cupy.ElementwiseKernel``s on float32 arrays created, launched and synchronised; ms/kernel =
total / N.  Cold = a child over empty caches (ptxbackend's, CuPy's ~/.cupy/kernel_cache via HOME and
CUPY_CACHE_DIR, the driver's JIT cache: all per arm and round); warm = a second fresh child over
what the cold one left.  Every ``nvcc`` process is logged by the wrapper (one log per child), so a
warm child can be shown to run no compile.  Rounds interleave the arms ABAB (order reversed every
other round).

    python benchmarks/run.py chainer-ab --site /tmp/chainer-site --nvcc112 /tmp/tk/nvcc112/bin/nvcc112 \\
        --tree 0.2.0=/tmp/pb020 --tree now=. --stock13 --rounds 3 --out ab
    python benchmarks/run.py chainer-ab ... --dry-run     # no GPU needed: arms, trees, wrappers, hooks

Writes results.json (every child's figures) and summary.md (medians over rounds, each round's ratio
to the baseline tree, the issue's targets: cold within 1.05x of the baseline, warm at most 1.0x).
Inherited PTXBACKEND_*, CUPY_*, CUDA_PATH and CUDA_HOME are dropped: every arm runs on defaults, and
the ``nvcc`` first on PATH is the toolkit in use, for CuPy v1 and ptxbackend alike.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

# benchmarks/ for ab, as the other scripts find benchutil; not the checkout's root: a stock child
# must not be able to import ptxbackend from it.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab  # noqa: E402

MARK = "CHAINERAB-RESULT "  # the child's one result line; anything else it prints is noise
TARGET_COLD, TARGET_WARM = 1.05, 1.0  # ratio to the baseline tree, per kernel
LOG_VAR = "CHAINER_AB_NVCC_LOG"  # where the nvcc wrapper appends one line per process
STOCK = "stock13"


# --------------------------------------------------------------------------- the kernels

# Distinct sources: an operation from this list and constants from the index (the usual activation
# and scaling steps of a network's forward and backward passes).  CuPy v1 wraps each body in its own
# kernel with <cupy/carray.cuh>, as every CuPy kernel.
_OPS = ("y = x * {a}f + {b}f",
        "y = x > 0.0f ? x * {a}f : x * {b}f",
        "y = 1.0f / (1.0f + expf(-x * {a}f)) + {b}f",
        "y = tanhf(x * {a}f) * {b}f",
        "y = sqrtf(x * x + {a}f) - {b}f",
        "y = logf(1.0f + expf(x * {a}f)) + {b}f",
        "y = fminf(fmaxf(x, -{a}f), {a}f) * {b}f",
        "y = expf(-fabsf(x) * {a}f) + {b}f")


def kernel_spec(i):
    """(in_params, out_params, operation, name) of kernel ``i``; the same in every arm and round."""
    body = _OPS[i % len(_OPS)].format(a="%d.5" % (i + 1), b="%d.25" % (i % 7 + 1))
    return "float32 x", "float32 y", body, "chainer_ab_k%d" % i


WARMUP = ("float32 x", "float32 y", "y = x + 0.125f", "chainer_ab_warmup")  # not among the N


# --------------------------------------------------------------------------- the child

def _verify(tree, pth_file):
    """Raise unless the arm is what it claims: stock untouched, or the hook from ``tree`` in charge."""
    import cupy.cuda
    import cupy.cuda.compiler as compiler
    functions = {"cupy.cuda.compile_with_cache": cupy.cuda.compile_with_cache,
                 "cupy.cuda.compiler.compile_with_cache": compiler.compile_with_cache}
    replaced = sorted(k for k, f in functions.items() if hasattr(f, "_ptxbackend_original"))
    info = {"cupy_from": os.path.dirname(cupy.__file__), "replaced": replaced, "nvcc_on_path": shutil.which("nvcc")}
    if tree is None:
        ab.assert_stock(replaced)
        return info
    import ptxbackend
    cupy_integration = ab.tree_module("ptxbackend.hook.cupy_integration")
    ab.assert_from_tree(tree, pth_file, ptxbackend.__file__)
    if len(replaced) != len(functions) or not cupy_integration.installed():
        raise SystemExit("tree arm: the hook did not take over CuPy v1's compile_with_cache (replaced %s): %s"
                         % (replaced, cupy_integration.status()))
    found = ab.tree_module("ptxbackend.compilers.nvcc").find_nvcc()
    if os.path.realpath(found) != os.path.realpath(info["nvcc_on_path"] or ""):
        raise SystemExit("tree arm: ptxbackend uses %s, not the nvcc wrapper on PATH (%s)" % (found, info["nvcc_on_path"]))
    info.update(version=ptxbackend.__version__, package_from=os.path.dirname(ptxbackend.__file__),
                status=cupy_integration.status(), ptxbackend_nvcc=found)
    return info


def _summarise_artifacts(records):
    kinds = {}
    for a in records:
        key = "%s %s %s" % (getattr(a, "producer", "?"), getattr(a, "target", "?"), getattr(a, "kind", "?"))
        kinds[key] = kinds.get(key, 0) + 1
    return {"served": len(records), "hits": sum(bool(getattr(a, "cache_hit", False)) for a in records),
            "kinds": kinds}


def _cupy_info(cupy):
    return ab.probe_each({"cupy": getattr(cupy, "__version__", None) or "CuPy v1 (bundled with Chainer)"}, (
        ("driver", lambda: cupy.cuda.runtime.driverGetVersion()),
        ("runtime", lambda: cupy.cuda.runtime.runtimeGetVersion()),
        ("compute_capability", lambda: cupy.cuda.Device().compute_capability)))


def child(args):
    cupy, report, tree = ab.start_child(args, _verify, "arm")
    if args.child == "check":  # the dry run, and the real run's check of every arm before timing
        return ab.report_check(MARK, cupy, report, args.kernels, kernel_spec, _cupy_info)

    import numpy
    records, compile_seconds, stage_seconds = [], [], {}
    if tree:
        ab.probe_engine(records, compile_seconds)
        ab.probe_stages(stage_seconds)
    dirs = ab.cache_dirs()
    x, y, timings = ab.make_context(cupy, 4096, WARMUP)  # warm-up: nvcc --version among others
    report.update(timings)
    if tree:  # 0 would mean the tree's hook reaches the engine some other way: no hit counts then
        report["probe_saw_warmup"] = len(records)
    del records[:], compile_seconds[:]
    for seconds in stage_seconds.values():
        del seconds[:]
    report.update(ab.time_kernels(cupy, x, y, [kernel_spec(i) for i in range(args.kernels)], dirs))
    if tree:
        report["artifacts"] = _summarise_artifacts(records)
        report["compile_us_per_kernel"] = sum(compile_seconds) / args.kernels * 1e6
        report["stages"] = ab.stage_report(stage_seconds, args.kernels)
        import ptxbackend
        if hasattr(ptxbackend, "cache_counters"):  # 0.2.0 has none; the fleet mode reads round trips here
            report["counters"] = ptxbackend.cache_counters()
    report["y_checksum"] = float(cupy.asnumpy(y).astype(numpy.float64).sum())  # the last kernel's output
    report.update(_cupy_info(cupy))
    ab.emit(MARK, report)


# --------------------------------------------------------------------------- the parent

def _parse_arms(specs, stock13):
    # every tree arm runs nvcc 11.2 and needs the modules the hook and find_nvcc live in
    # (the package layout's places first, then 0.4.0's flat ones; ab.tree_module imports either)
    arms = ab.parse_trees(specs, STOCK, needs=((os.path.join("ptxbackend", "hook", "cupy_integration.py"),
                                                os.path.join("ptxbackend", "cupy_integration.py")),
                                               os.path.join("ptxbackend", "compilers", "nvcc.py")),
                             nvcc="nvcc112")
    if not arms:
        raise SystemExit("give at least one --tree NAME=DIR (the first is the baseline)")
    if stock13:
        arms.append({"name": STOCK, "dir": None, "nvcc": "nvcc13"})
    return arms


_WRAPPER = '#!/bin/sh\n[ -n "$%s" ] && echo "$*" >> "$%s"\nexec %s "$@"\n'
_PROBE_SOURCE = 'extern "C" __global__ void probe(float *x) { x[threadIdx.x] *= 2.0f; }\n'


def _make_wrapper(scratch, name, real):
    """A ``nvcc`` script that logs each call and execs the real compiler (not a link: nvcc112 finds its
    bundle from its own path)."""
    directory = os.path.join(scratch, "bin-" + name)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "nvcc")
    with open(path, "w") as f:
        f.write(_WRAPPER % (LOG_VAR, LOG_VAR, _quote(real)))
    os.chmod(path, 0o755)
    return directory


def _quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


def _check_toolkit(name, directory, scratch):
    """``nvcc --version`` through the wrapper and one real compile of a tiny kernel for the arm's target."""
    nvcc = os.path.join(directory, "nvcc")
    env = {k: v for k, v in os.environ.items() if k != LOG_VAR}
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, env=env, timeout=120)
    lines = out.stdout.strip().splitlines()
    release = re.search(r"release ([0-9.]+), V([0-9.]+)", out.stdout)
    info = {"wrapper": nvcc, "version_line": lines[-2] if len(lines) > 1 else out.stdout.strip() + out.stderr.strip(),
            "release": release.group(1) if release else None, "build": release.group(2) if release else None}
    if out.returncode or not release:
        raise SystemExit("%s: `%s --version` failed (rc=%d): %s" % (name, nvcc, out.returncode,
                                                                   (out.stderr + out.stdout).strip()[-500:]))
    work = tempfile.mkdtemp(prefix="probe-", dir=scratch)
    with open(os.path.join(work, "probe.cu"), "w") as f:
        f.write(_PROBE_SOURCE)
    args = ["--ptx", "-arch", "compute_86"] if name == "nvcc112" else ["--cubin", "-arch", "sm_90"]
    t = time.perf_counter()
    done = subprocess.run([nvcc] + args + ["probe.cu"], cwd=work, capture_output=True, text=True, env=env, timeout=120)
    info["probe"] = {"args": " ".join(args), "rc": done.returncode, "s": round(time.perf_counter() - t, 3),
                     "output": sorted(os.listdir(work))}
    if done.returncode:
        raise SystemExit("%s: `nvcc %s probe.cu` failed: %s" % (name, " ".join(args), (done.stderr + done.stdout)[-800:]))
    if name == "nvcc112":
        if not info["release"].startswith("11.2"):
            raise SystemExit("--nvcc112 is release %s, not 11.2" % info["release"])
        # the story's failure: this nvcc must not know the H200
        bad = subprocess.run([nvcc, "--cubin", "-arch", "sm_90", "probe.cu"], cwd=work, capture_output=True,
                             text=True, env=env, timeout=120)
        info["rejects_sm_90"] = bad.returncode != 0 and "sm_90" in (bad.stderr + bad.stdout)
        if not info["rejects_sm_90"]:
            raise SystemExit("--nvcc112 accepted -arch sm_90: not the old toolkit this benchmark is about")
    elif info["release"].startswith("11."):
        raise SystemExit("--nvcc13 is release %s: stock13 needs an nvcc that knows sm_90" % info["release"])
    shutil.rmtree(work, ignore_errors=True)
    return info


def _child_env(arm, caches, log, args):
    # CUDA_PATH, CUDA_HOME: the nvcc first on PATH is the toolkit in use; PYTHONPATH: only the site
    env = ab.child_env(caches, ("PTXBACKEND_", "CUPY_", "CUDA_CACHE_", "CHAINER_AB_"),
                          ("CUDA_PATH", "CUDA_HOME", "PYTHONPATH"))
    env["PATH"] = args.bins[arm["nvcc"]] + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = args.site
    env["HOME"] = caches["home"]  # CuPy v1 keeps its kernel_cache under ~/.cupy too
    env[LOG_VAR] = log
    return env


def _nvcc_calls(log):
    """{'compiles': n, 'preprocess': n, 'other': n} from a wrapper log (one line of arguments per process)."""
    counts = {"processes": 0, "compiles": 0, "preprocess": 0, "other": 0}
    try:
        with open(log) as f:
            lines = [line.split() for line in f if line.strip()]
    except OSError:
        return counts
    for words in lines:
        counts["processes"] += 1
        if any(w in ("-dryrun", "--dryrun", "--version", "-V") for w in words):
            counts["other"] += 1
        elif any(w in ("--preprocess", "-E") for w in words):
            counts["preprocess"] += 1
        elif any(w in ("--ptx", "-ptx", "--cubin", "-cubin", "--fatbin", "-fatbin", "-c", "--compile") for w in words):
            counts["compiles"] += 1
        else:
            counts["other"] += 1
    return counts


def run_child(mode, arm, caches, log, args):
    def count_nvcc(result):  # failed children too: a timeout's nvcc processes say where it hung
        result["nvcc"] = _nvcc_calls(log)
    return ab.launch(__file__, MARK, mode, arm, caches, _child_env(arm, caches, log, args), args, count_nvcc)


def summarise(results):
    """Per arm: cold and warm ms/kernel over rounds, and each round's ratio to the baseline tree."""
    base = results["baseline"]
    per = ab.by_arm_and_phase(results["runs"])
    out = {}
    for arm in results["arms"]:
        row = {}
        for phase in ab.PHASES:
            mine = per.get((arm["name"], phase), {})
            row.update(ab.phase_figures(phase, mine, per.get((base, phase), {})))
            if arm["name"] == base:  # itself: 1.0 by definition, shown as "baseline"
                row[phase + "_ratio"] = None
            row[phase + "_nvcc_compiles"] = [v["nvcc"]["compiles"] for _k, v in sorted(mine.items()) if "nvcc" in v]
            row[phase + "_nvcc_processes"] = [v["nvcc"]["processes"] for _k, v in sorted(mine.items()) if "nvcc" in v]
            row[phase + "_hits"] = ["%d/%d" % (v["artifacts"]["hits"], v["artifacts"]["served"])
                                    for _k, v in sorted(mine.items()) if "artifacts" in v]
            row[phase + "_cupy_files"] = [v["caches"]["cupy"]["after"]["files"] - v["caches"]["cupy"]["before"]["files"]
                                          for _k, v in sorted(mine.items()) if "caches" in v]
        kinds = {}
        for v in per.get((arm["name"], "cold"), {}).values():
            for k, n in v.get("artifacts", {}).get("kinds", {}).items():
                kinds[k] = kinds.get(k, 0) + n
        row["cold_kinds"] = kinds
        warm = per.get((arm["name"], "warm"), {})
        row["warm_compile_per_kernel"] = ab.stats([v.get("compile_us_per_kernel") for v in warm.values()])
        row["warm_stages"] = ab.stage_summary(warm)
        row["warm_median_kernel"] = ab.stats([v.get("median_kernel_ms") for v in warm.values()])
        row["warm_gc"] = ab.stats([v.get("gc", {}).get("ms_per_kernel") for v in warm.values()])
        out[arm["name"]] = row
    return out


def render(results):
    fmt = ab.fmt
    summary = results["summary"]
    m = results["machine"]
    base = results["baseline"]
    tk = results["toolkits"]
    lines = ["# Chainer 1.24's CuPy v1 through the hook of each ptxbackend tree (%s)" % ab.started(results),
             "", "GPU: %s; Python %s; Chainer's %s (driver %s, runtime %s, compute capability %s); nvcc 11.2: %s%s; "
             "%d kernels per child; %d round(s) done%s." % (
                 m.get("gpu"), m.get("python"), m.get("cupy"), m.get("driver"), m.get("runtime"),
                 m.get("compute_capability"), tk["nvcc112"].get("version_line"),
                 "; stock13's nvcc: %s" % tk["nvcc13"].get("version_line") if "nvcc13" in tk else "",
                 results["kernels"], results["rounds_done"],
                 " (stopped by the budget)" if results.get("stopped_by_budget") else ""),
             "", "ms per kernel (median over rounds, min-max); ratio = arm / %s (the baseline) in the same round "
             "(median, min-max); targets: cold <= %.2fx, warm <= %.1fx. nvcc compiles per child, one figure per "
             "round (counted by the logging wrapper; warm should be 0 for the trees)." % (base, TARGET_COLD, TARGET_WARM),
             "", "| arm | cold ms/kernel | warm ms/kernel | cold ratio | warm ratio | cold target | warm target | "
             "nvcc compiles cold / warm |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm in results["arms"]:
        row = summary[arm["name"]]
        verdicts = []
        for phase, target in (("cold", TARGET_COLD), ("warm", TARGET_WARM)):
            ratio = row[phase + "_ratio"]
            if arm["name"] == base:
                verdicts.append("baseline")
            elif arm["dir"] is None or not ratio:
                verdicts.append("-")
            else:
                verdicts.append(ab.verdict(ratio, target))
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s / %s |" % (
            arm["name"], fmt(row["cold"]), fmt(row["warm"]), fmt(row["cold_ratio"]), fmt(row["warm_ratio"]),
            verdicts[0], verdicts[1], row["cold_nvcc_compiles"], row["warm_nvcc_compiles"]))
    lines += ["", "Where a warm kernel's time goes (medians over rounds): the median kernel, the garbage collector "
              "inside the timed loop, and for a tree arm us per kernel in ptxbackend's engine call and in each of "
              "the hook's other steps.", "",
              "| arm | warm median kernel ms | GC ms/kernel | engine call us | other steps us |",
              "| --- | --- | --- | --- | --- |"]
    for arm in results["arms"]:
        row = summary[arm["name"]]
        lines.append("| %s | %s | %s | %s | %s |" % (arm["name"], fmt(row["warm_median_kernel"]), fmt(row["warm_gc"]),
                                                    fmt(row["warm_compile_per_kernel"], "%.1f"),
                                                    ab.stage_text(row["warm_stages"])))
    lines.append("")
    for arm in results["arms"]:
        row = summary[arm["name"]]
        if arm["dir"] is None:
            title = "%s (stock CuPy v1, no hook, `nvcc --cubin -arch sm_XX` of CUDA %s: reference only)" % (
                arm["name"], tk.get("nvcc13", {}).get("release"))
        else:
            title = "%s (%s)" % (arm["name"], ab.tree_label(arm))
        lines += ["## " + title, ""]
        lines.append("Child wall s: cold %s, warm %s; errors: cold %d, warm %d; nvcc processes (all kinds) cold %s, "
                     "warm %s; files CuPy's own kernel_cache gained: cold %s, warm %s." % (
                         fmt(row["cold_wall"], "%.1f"), fmt(row["warm_wall"], "%.1f"), row["cold_errors"],
                         row["warm_errors"], row["cold_nvcc_processes"], row["warm_nvcc_processes"],
                         row["cold_cupy_files"], row["warm_cupy_files"]))
        if arm["dir"] is not None:
            lines[-1] += (" ptxbackend hits/served (of %d kernels; fewer served: CuPy's own nvcc took some back): "
                          "cold %s, warm %s; what it served cold: %s." % (
                              results["kernels"], ", ".join(row["cold_hits"]) or "-", ", ".join(row["warm_hits"]) or "-",
                              ", ".join("%s x%d" % kv for kv in sorted(row["cold_kinds"].items())) or "-"))
        errors = [r for r in results["runs"] if r["arm"] == arm["name"] and "error" in r]
        for r in errors[:2]:
            lines.append("")
            lines.append("Round %d %s failed: `%s`" % (r["round"], r["phase"], r["error"].strip().splitlines()[-1][:300]))
        lines.append("")
    return "\n".join(lines)


def record_check(results, arm, got, args):
    """Keep an arm's check child; stop unless it ran CuPy v1 from --site with the wrapper as ``nvcc``."""
    ab.record_check(results, arm, got)
    if not os.path.realpath(got["arm"]["cupy_from"]).startswith(os.path.realpath(args.site) + os.sep):
        raise SystemExit("arm %s imported cupy from %s, not from --site %s" % (arm["name"], got["arm"]["cupy_from"],
                                                                             args.site))
    want = os.path.join(args.bins[arm["nvcc"]], "nvcc")
    if os.path.realpath(got["arm"]["nvcc_on_path"] or "") != os.path.realpath(want):
        raise SystemExit("arm %s: nvcc on PATH is %s, not the wrapper %s" % (arm["name"], got["arm"]["nvcc_on_path"],
                                                                             want))


def _save(results, out):
    ab.save(results, out, summarise, render)


def _round_arms(arms, r, stock13_rounds):
    # stock13 only in its first rounds: its cold child is the slowest of all
    return [a for a in ab.round_order(arms, r) if a["dir"] is not None or r < stock13_rounds]


def add_site_options(p):
    """--site and --nvcc112: Chainer 1.24's site and the old toolkit (this script's and chainer_fleet's)."""
    p.add_argument("--site", default=os.environ.get("CHAINER_AB_SITE"),
                   help="the folder Chainer 1.24 (its cupy), numpy 1.26, six, filelock are installed in (--target)")
    p.add_argument("--nvcc112", default=os.environ.get("CHAINER_AB_NVCC112", "/tmp/tk/nvcc112/bin/nvcc112"),
                   help="the real nvcc 11.2 (default /tmp/tk/nvcc112/bin/nvcc112)")


def check_site_options(p, args):
    """--out (unless a dry run), --site and --nvcc112 as a run needs them; ``p.error`` otherwise."""
    if not args.dry_run and not args.out:
        p.error("--out is needed (or --dry-run)")
    if not args.site or not os.path.isfile(os.path.join(args.site, "cupy", "cuda", "compiler.py")):
        p.error("--site %r: no cupy/cuda/compiler.py there (pip install --target SITE the Chainer 1.24 wheel)"
                % (args.site,))
    args.site = os.path.abspath(args.site)
    if not (os.path.isfile(args.nvcc112) and os.access(args.nvcc112, os.X_OK)):
        p.error("--nvcc112 %r is not an executable (unpack nvcc112.tar.xz, e.g. to /tmp/tk)" % args.nvcc112)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                   help="a ptxbackend source tree arm; the first is the baseline")
    p.add_argument("--stock13", action="store_true", help="add stock CuPy v1 with CUDA 13's nvcc, for reference")
    p.add_argument("--stock13-rounds", type=int, default=1, help="rounds that include stock13 (default: the first)")
    add_site_options(p)
    p.add_argument("--nvcc13", default=os.environ.get("CHAINER_AB_NVCC13"),
                   help="the real CUDA 13 nvcc for stock13 (default /usr/local/cuda/bin/nvcc, else nvcc on PATH)")
    ab.add_run_options(p, child_timeout=150,
                          budget_help="start no round that would end past this many seconds (from the longest time "
                                      "each arm took)",
                          dry_run_help="check arms, toolkits and hooks in a child each; no kernel")
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    t_main = time.perf_counter()
    if args.rounds < 1 or args.kernels < 1 or args.stock13_rounds < 1:
        p.error("--rounds, --kernels and --stock13-rounds must be at least 1")
    check_site_options(p, args)
    arms = _parse_arms(args.tree, args.stock13)
    if args.stock13:
        args.nvcc13 = args.nvcc13 or ("/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK)
                                      else shutil.which("nvcc"))
        if not args.nvcc13:
            p.error("--stock13: no CUDA 13 nvcc found (give --nvcc13)")
    return ab.in_scratch("chainer-ab-", args, lambda scratch: _run(args, arms, scratch, t_main))


_CACHES = ("cupy", "ptxbackend", "cuda_jit", "home")  # home: CuPy v1's ~/.cupy


def _run(args, arms, scratch, t_main):
    args.bins = {"nvcc112": _make_wrapper(scratch, "nvcc112", os.path.abspath(args.nvcc112))}
    if args.stock13:
        args.bins["nvcc13"] = _make_wrapper(scratch, "nvcc13", os.path.abspath(args.nvcc13))
    results = {"started": time.time(), "kernels": args.kernels, "rounds": args.rounds, "arms": arms,
               "baseline": arms[0]["name"], "site": args.site, "machine": ab.machine(), "toolkits": {},
               "targets": {"cold": TARGET_COLD, "warm": TARGET_WARM}, "checks": {}, "runs": [], "rounds_done": 0}
    for name, directory in sorted(args.bins.items()):
        results["toolkits"][name] = got = _check_toolkit(name, directory, scratch)
        print("toolkit %-8s %s" % (name, json.dumps(got)), flush=True)

    # Each arm once, before any timing: proves every hook takes over (or stays away) and finds the
    # wrapper before the budget is spent, and warms the page cache for CuPy v1 and each tree.
    ab.precompile([p for a in arms if a["dir"] for p in ab.tree_files(a["dir"])] +
                     [os.path.join(args.site, q) for q in ("cupy", "six.py", "filelock")])
    ab.check_arms(results, arms,
                  lambda arm: run_child("check", arm, ab.arm_caches(scratch, "check", arm, _CACHES),
                                        os.path.join(scratch, "check", arm["name"], "nvcc.log"), args),
                  lambda res, arm, got: record_check(res, arm, got, args))
    first = results["checks"][arms[0]["name"]]
    results["machine"].update({k: first.get(k) for k in ("cupy", "driver", "runtime", "compute_capability")})
    plan = ab.plan(args.rounds, lambda r: _round_arms(arms, r, args.stock13_rounds))
    if args.dry_run:
        ab.print_plan(plan)
        return 0

    os.makedirs(args.out, exist_ok=True)
    results["plan"] = plan

    def run_arm(arm, r):
        caches = ab.arm_caches(scratch, "r%d" % r, arm, _CACHES)
        for phase in ab.PHASES:
            log = os.path.join(scratch, "r%d" % r, arm["name"], "nvcc-%s.log" % phase)
            got = run_child("run", arm, caches, log, args)
            yield phase, got, (got["error"].splitlines()[-1][:200] if "error" in got else
                               "%.3f ms/kernel (wall %.1f s, nvcc %s)" % (got["per_kernel_ms"], got["wall_s"], got["nvcc"]))

    # stock13 runs in its first rounds only: estimate each arm from its own past, not from the longest round
    ab.run_rounds(results, args.rounds, lambda r: _round_arms(arms, r, args.stock13_rounds), run_arm,
                  lambda res: _save(res, args.out), args.budget_s, t_main, per_arm_estimate=True)
    _save(results, args.out)
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

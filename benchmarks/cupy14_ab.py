"""Issue 24: stock CuPy 14 and ptxbackend's start-up hook side by side, fresh processes, one run.

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

    python benchmarks/cupy14_ab.py --tree 0.2.0=/tmp/pb020 --tree now=. --rounds 3 --out ab
    python benchmarks/cupy14_ab.py --tree now=. --dry-run     # no GPU: checks arms and hooks only

Writes results.json (every child's figures) and summary.md (medians, ratios to stock per round,
the issue's targets: warm at most 0.5x stock, cold at most 1x stock).  Inherited PTXBACKEND_*
variables are dropped so that every arm runs on defaults.
"""

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

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

def _dir_stats(path):
    files = size = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                size += os.lstat(os.path.join(root, name)).st_size
                files += 1
            except OSError:
                pass
    return {"files": files, "bytes": size}


def _activate_tree(tree):
    """What ptxbackend.pth does at start-up, from ``tree``.

    The parent starts every child with PTXBACKEND_DISABLE=1 so that a ptxbackend installed in this
    Python (an editable install's .pth, say) registers nothing; here that copy is forgotten, the
    switch is turned back on, and the tree's own first stage is imported and installed.  0.2.0's
    module installs itself on import; later ones on install(); install() is idempotent in both.
    """
    os.environ.pop("PTXBACKEND_DISABLE", None)
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "ptxbackend_watcher", False)]
    for name in list(sys.modules):
        if name in ("_ptxbackend_pth", "_ptxbackend_boot", "ptxbackend") or name.startswith("ptxbackend."):
            del sys.modules[name]
    sys.path.insert(0, tree)
    import _ptxbackend_pth
    _ptxbackend_pth.install()
    return _ptxbackend_pth.__file__


def _inside(path, tree):
    return os.path.realpath(path).startswith(os.path.realpath(tree) + os.sep)


def _verify(tree, pth_file):
    """Raise unless the arm is what it claims: stock untouched, or the hook from ``tree`` in charge."""
    import cupy.cuda.compiler as compiler
    replaced = hasattr(compiler._compile_module_with_cache, "_ptxbackend_original")
    if tree is None:
        loaded = sorted(m for m in sys.modules if m == "ptxbackend" or m.startswith("ptxbackend."))
        if replaced or loaded or any(getattr(f, "ptxbackend_watcher", False) for f in sys.meta_path):
            raise SystemExit("stock arm: ptxbackend is active (replaced=%s, modules=%s)" % (replaced, loaded))
        return {}
    import ptxbackend
    from ptxbackend import cupy_integration
    if not (_inside(pth_file, tree) and _inside(ptxbackend.__file__, tree)):
        raise SystemExit("tree arm: hook from %s, package from %s, not from %s" % (pth_file, ptxbackend.__file__, tree))
    if not (replaced and cupy_integration.installed()):
        raise SystemExit("tree arm: the hook did not take over CuPy's compiler: %s" % (cupy_integration.status(),))
    return {"version": ptxbackend.__version__, "from": os.path.dirname(ptxbackend.__file__),
            "status": cupy_integration.status()}


def _probe_engine(records):
    """Record each artifact the hook gets from ptxbackend's engine (hit or compiled, payload, entry).

    CuPy never shows the artifact, so the engine's compile() is wrapped: one Python call and an
    append per kernel (well under a microsecond, against the ~0.5 ms a warm kernel costs).
    """
    from ptxbackend import engine
    original = engine.compile

    clock = time.perf_counter

    def compile(*args, **kwargs):
        started = clock()
        artifact = original(*args, **kwargs)
        artifact_seconds.append(clock() - started)  # the hook's own share of a kernel's first use
        records.append(artifact)
        return artifact
    engine.compile = compile


artifact_seconds = []


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
    info = {"cupy": cupy.__version__}
    for key, get in (("driver", lambda: cupy.cuda.runtime.driverGetVersion()),
                     ("runtime", lambda: cupy.cuda.runtime.runtimeGetVersion()),
                     ("nvrtc", lambda: cupy.cuda.compiler._get_nvrtc_version()),
                     ("device", lambda: cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())):
        try:
            info[key] = get()
        except Exception as exc:  # no GPU here (the dry run): say why instead
            info[key] = "unavailable: %s" % (type(exc).__name__,)
    return info


def child(args):
    perf = time.perf_counter
    tree = args.child_tree or None
    pth_file = _activate_tree(tree) if tree else None
    t = perf()
    import cupy
    report = {"import_cupy_s": perf() - t}
    report["ptxbackend"] = _verify(tree, pth_file)
    if args.child == "check":  # the dry run, and the real run's uncounted priming pass
        report["kernels_built"] = len([cupy.ElementwiseKernel(*kernel_spec(i)) for i in range(args.kernels)])
        report.update(_cupy_info(cupy))
        print(MARK + json.dumps(report))
        return

    import gc
    records = []
    if tree:
        _probe_engine(records)
    dirs = {"ptxbackend": os.environ["PTXBACKEND_CACHE_DIR"], "cupy": os.environ["CUPY_CACHE_DIR"],
            "cuda_jit": os.environ["CUDA_CACHE_PATH"]}
    t = perf()
    import numpy
    # The context is made here; a copy from the host, not cupy.arange, which would compile a kernel.
    x = cupy.asarray(numpy.linspace(-2.0, 2.0, 1024, dtype=numpy.float32))
    y = cupy.empty_like(x)
    cupy.cuda.runtime.deviceSynchronize()
    report["context_s"] = perf() - t
    t = perf()
    cupy.ElementwiseKernel(*WARMUP)(x, y)  # the one-time costs: NVRTC, headers, ptxbackend's settings
    cupy.cuda.runtime.deviceSynchronize()
    report["warmup_s"] = perf() - t
    if tree:  # 0 would mean the tree's hook reaches the engine some other way: no hit counts then
        report["probe_saw_warmup"] = len(records)
    del records[:]
    before = {k: _dir_stats(v) for k, v in dirs.items()}
    specs = [kernel_spec(i) for i in range(args.kernels)]
    gc.collect()
    each = []
    t0 = perf()
    for spec in specs:
        t = perf()
        cupy.ElementwiseKernel(*spec)(x, y)  # the first launch compiles (or finds it cached)
        each.append(perf() - t)
    cupy.cuda.runtime.deviceSynchronize()
    total = perf() - t0
    n = args.kernels
    report.update(total_s=total, per_kernel_ms=total / n * 1e3,
                  median_kernel_ms=statistics.median(each) * 1e3, max_kernel_ms=max(each) * 1e3,
                  caches={k: {"before": before[k], "after": _dir_stats(v)} for k, v in dirs.items()})
    pb = report["caches"]["ptxbackend"]
    report["cache_bytes_per_kernel"] = (pb["after"]["bytes"] - pb["before"]["bytes"]) / n
    if tree:
        report["artifacts"] = _summarise_artifacts(records)
    report.update(_cupy_info(cupy))
    print(MARK + json.dumps(report))


# --------------------------------------------------------------------------- the parent

def _tree_info(name, path):
    path = os.path.abspath(path)
    for need in ("_ptxbackend_pth.py", "_ptxbackend_boot.py", os.path.join("ptxbackend", "__init__.py")):
        if not os.path.isfile(os.path.join(path, need)):
            raise SystemExit("--tree %s=%s: no %s there (give a ptxbackend source tree)" % (name, path, need))
    info = {"name": name, "dir": path}
    for source in ("_version.py", "__init__.py"):
        try:
            with open(os.path.join(path, "ptxbackend", source)) as f:
                found = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
        except OSError:
            continue
        if found:
            info["version"] = found.group(1)
            break
    try:  # a git checkout: which commit, and whether the package differs from it
        top = subprocess.run(["git", "-C", path, "rev-parse", "--show-toplevel"], capture_output=True, text=True)
        if top.returncode == 0 and os.path.realpath(top.stdout.strip()) == os.path.realpath(path):
            info["commit"] = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                                            text=True).stdout.strip()
            dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--", "ptxbackend",
                                    "_ptxbackend_pth.py", "_ptxbackend_boot.py"], capture_output=True, text=True)
            info["uncommitted_files"] = len(dirty.stdout.splitlines())
    except OSError:
        pass
    return info


def _machine():
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
            "host": platform.node()}
    for key, cmd in (("gpu", ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]),
                     ("nvcc", ["nvcc", "--version"])):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            lines = done.stdout.strip().splitlines()
            info[key] = lines[-1] if key == "nvcc" and lines else (lines[0] if lines else None)
        except (OSError, subprocess.SubprocessError) as exc:
            info[key] = "unavailable: %s" % type(exc).__name__
    return info


def _child_env(caches):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PTXBACKEND_") and k not in ("CUPY_CACHE_DIR", "CUDA_CACHE_PATH")}
    # Every child starts with the hook off: stock stays so, a tree arm turns on its own tree's.
    env.update(PTXBACKEND_DISABLE="1", PYTHONDONTWRITEBYTECODE="1", CUPY_CACHE_DIR=caches["cupy"],
               PTXBACKEND_CACHE_DIR=caches["ptxbackend"], CUDA_CACHE_PATH=caches["cuda_jit"])
    return env


def run_child(mode, arm, caches, args):
    for path in caches.values():
        os.makedirs(path, exist_ok=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--child-tree", arm["dir"] or "",
           "--kernels", str(args.kernels)]
    t = time.perf_counter()
    try:  # cwd outside every tree: the child finds ptxbackend only where it is told
        done = subprocess.run(cmd, env=_child_env(caches), cwd=tempfile.gettempdir(), capture_output=True,
                              text=True, timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after %d s" % args.child_timeout, "wall_s": time.perf_counter() - t}
    wall = time.perf_counter() - t
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode or not lines:
        return {"error": "rc=%d: %s" % (done.returncode, (done.stderr + done.stdout).strip()[-2000:]), "wall_s": wall}
    result = json.loads(lines[-1][len(MARK):])
    result["wall_s"] = wall
    if done.stderr.strip():  # e.g. a ptxbackend warning that CuPy took a kernel back
        result["stderr"] = done.stderr.strip()[-2000:]
    return result


def _precompile(arm):
    # Bytecode now, so that no arm's first child pays for compiling the tree's .py files.
    targets = [os.path.join(arm["dir"], p) for p in ("ptxbackend", "_ptxbackend_pth.py", "_ptxbackend_boot.py")]
    subprocess.run([sys.executable, "-m", "compileall", "-q"] + targets, capture_output=True)


def _stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarise(results):
    """Per arm: cold and warm ms/kernel over rounds, and each round's ratio to stock in that round."""
    runs, arms = results["runs"], results["arms"]
    per = {}
    for r in runs:
        per.setdefault((r["arm"], r["phase"]), {})[r["round"]] = r
    out = {}
    for arm in arms:
        row = {}
        for phase in ("cold", "warm"):
            mine = per.get((arm["name"], phase), {})
            stock = per.get(("stock", phase), {})
            row[phase] = _stats([v.get("per_kernel_ms") for v in mine.values()])
            row[phase + "_wall"] = _stats([v["wall_s"] for v in mine.values() if "error" not in v])
            row[phase + "_ratio"] = _stats([v["per_kernel_ms"] / stock[k]["per_kernel_ms"]
                                           for k, v in mine.items()
                                           if "per_kernel_ms" in v and "per_kernel_ms" in stock.get(k, {})])
            row[phase + "_errors"] = sum("error" in v for v in mine.values())
            row[phase + "_hits"] = [v["artifacts"]["hits"] for v in mine.values() if "artifacts" in v]
            row[phase + "_served"] = [v["artifacts"]["served"] for v in mine.values() if "artifacts" in v]
            row[phase + "_cupy_files"] = [v["caches"]["cupy"]["after"]["files"] - v["caches"]["cupy"]["before"]["files"]
                                          for v in mine.values() if "caches" in v]
        cold = [v for v in per.get((arm["name"], "cold"), {}).values() if "caches" in v]
        row["cache_bytes_per_kernel"] = _stats([v["cache_bytes_per_kernel"] for v in cold])
        row["entry_overhead_max"] = max([v["artifacts"].get("entry_overhead_max", 0) for v in cold
                                         if "artifacts" in v] or [None], key=lambda v: -1 if v is None else v)
        out[arm["name"]] = row
    return out


def _fmt(s, spec="%.3f"):
    return "-" if not s else (spec + " (" + spec + "-" + spec + ")") % (s["median"], s["min"], s["max"])


def render(results):
    summary = results["summary"]
    m = results["machine"]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(results["started"]))
    lines = ["# Issue 24: stock CuPy 14 vs the start-up hook (%s)" % when,
             "", "GPU: %s; CuPy %s, NVRTC %s; Python %s; %d kernels per child; %d round(s) done%s." % (
                 m.get("gpu"), m.get("cupy"), m.get("nvrtc"), m.get("python"), results["kernels"],
                 results["rounds_done"], " (stopped by the budget)" if results.get("stopped_by_budget") else ""),
             "", "ms per kernel (median over rounds, min-max); ratio = arm / stock in the same round (median, "
             "min-max); targets: warm <= %.1fx, cold <= %.1fx stock." % (TARGET_WARM, TARGET_COLD), "",
             "| arm | cold ms/kernel | warm ms/kernel | cold ratio | warm ratio |", "| --- | --- | --- | --- | --- |"]
    for arm in results["arms"]:
        row = summary[arm["name"]]
        lines.append("| %s | %s | %s | %s | %s |" % (arm["name"], _fmt(row["cold"]), _fmt(row["warm"]),
                                                     _fmt(row["cold_ratio"]), _fmt(row["warm_ratio"])))
    lines.append("")
    for arm in results["arms"]:
        row = summary[arm["name"]]
        title = arm["name"] + ("" if arm["dir"] is None else " (ptxbackend %s, %s%s)" % (
            arm.get("version", "?"), arm.get("commit", arm["dir"])[:12],
            ", %d uncommitted files" % arm["uncommitted_files"] if arm.get("uncommitted_files") else ""))
        lines += ["## " + title, "", "| phase | ms/kernel | ratio to stock | target | child wall s | errors |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for phase, target in (("cold", TARGET_COLD), ("warm", TARGET_WARM)):
            ratio = row[phase + "_ratio"]
            verdict = "-" if arm["dir"] is None or not ratio else \
                ("met" if ratio["median"] <= target else "**not met**")
            lines.append("| %s | %s | %s | <= %.1fx: %s | %s | %d |" % (
                phase, _fmt(row[phase]), _fmt(ratio), target, verdict, _fmt(row[phase + "_wall"], "%.1f"),
                row[phase + "_errors"]))
        lines += ["", "Files CuPy's own cache gained per round (a tree arm: 0 when the hook served every kernel): "
                  "cold %s, warm %s." % (row["cold_cupy_files"], row["warm_cupy_files"])]
        if arm["dir"] is not None:
            lines[-1] += (" ptxbackend cache per kernel: %s bytes; largest entry overhead besides its payload: %s "
                          "bytes (issue: at most 2048); warm hits/served per round: %s; cold served: %s." % (
                              _fmt(row["cache_bytes_per_kernel"], "%.0f"), row["entry_overhead_max"],
                              ", ".join("%d/%d" % hs for hs in zip(row["warm_hits"], row["warm_served"])) or "-",
                              row["cold_served"]))
        lines.append("")
    return "\n".join(lines)


def _save(results, out):
    results["summary"] = summarise(results)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(render(results))


def _parse_trees(specs):
    arms = [{"name": "stock", "dir": None}]
    for spec in specs:
        name, eq, path = spec.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z0-9._-]+", name) or name == "stock" \
                or name in [a["name"] for a in arms]:
            raise SystemExit("--tree %r: write NAME=DIR, NAME unique, of letters, digits, '.', '_', '-', "
                             "not 'stock'" % spec)
        arms.append(_tree_info(name, path))
    return arms


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR", help="a ptxbackend source tree arm")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kernels", type=int, default=100)
    p.add_argument("--out", help="folder for results.json and summary.md")
    p.add_argument("--budget-s", type=float, help="start no round that the longest round so far would push past this")
    p.add_argument("--child-timeout", type=int, default=300)
    p.add_argument("--keep-caches", action="store_true", help="leave the per-arm cache folders (printed)")
    p.add_argument("--dry-run", action="store_true", help="check arms and hooks in a child each; run no kernel")
    p.add_argument("--child", choices=("check", "run"), help=argparse.SUPPRESS)
    p.add_argument("--child-tree", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if args.rounds < 1 or args.kernels < 1:
        p.error("--rounds and --kernels must be at least 1")
    if not args.dry_run and not args.out:
        p.error("--out is needed (or --dry-run)")
    arms = _parse_trees(args.tree)
    scratch = tempfile.mkdtemp(prefix="cupy14-ab-")
    results = {"started": time.time(), "kernels": args.kernels, "rounds": args.rounds, "arms": arms,
               "machine": _machine(), "checks": {}, "runs": [], "rounds_done": 0}

    # Each arm once, before any timing: proves every hook takes over (or stays away) before the
    # budget is spent, and warms the page cache for CuPy and each tree.
    for arm in arms:
        if arm["dir"]:
            _precompile(arm)
        caches = {k: os.path.join(scratch, "check", arm["name"], k) for k in ("cupy", "ptxbackend", "cuda_jit")}
        got = run_child("check", arm, caches, args)
        results["checks"][arm["name"]] = got
        print("check %-8s %s" % (arm["name"], json.dumps(got)), flush=True)
        if "error" in got:
            raise SystemExit("arm %s failed its check; nothing timed" % arm["name"])
    stock = results["checks"]["stock"]
    results["machine"].update({k: stock.get(k) for k in ("cupy", "nvrtc", "driver", "runtime", "device")})
    if args.dry_run:
        order = [("r%d" % r, [a["name"] for a in (arms if r % 2 == 0 else arms[::-1])]) for r in range(args.rounds)]
        print("dry run: every arm checked; the real run would do, per round, cold then warm of each arm in order:",
              json.dumps(order))
        shutil.rmtree(scratch, ignore_errors=True)
        return 0

    os.makedirs(args.out, exist_ok=True)
    t_start, longest = time.perf_counter(), 0.0
    for r in range(args.rounds):
        elapsed = time.perf_counter() - t_start
        if args.budget_s and r and elapsed + longest > args.budget_s:
            results["stopped_by_budget"] = True
            print("budget: round %d would end near %.0f s of %.0f s; stopping" % (r, elapsed + longest, args.budget_s))
            _save(results, args.out)
            break
        t_round = time.perf_counter()
        for arm in (arms if r % 2 == 0 else arms[::-1]):  # ABAB: the order flips every round
            caches = {k: os.path.join(scratch, "r%d" % r, arm["name"], k) for k in ("cupy", "ptxbackend", "cuda_jit")}
            for phase in ("cold", "warm"):  # warm: a fresh process over what cold left
                got = run_child("run", arm, caches, args)
                got.update(arm=arm["name"], phase=phase, round=r)
                results["runs"].append(got)
                figure = got["error"].splitlines()[-1] if "error" in got else "%.3f ms/kernel (wall %.1f s)" % (got["per_kernel_ms"], got["wall_s"])
                print("round %d %-8s %s: %s" % (r, arm["name"], phase, figure), flush=True)
                _save(results, args.out)  # after every child: a run cut off by a timeout keeps its figures
        longest = max(longest, time.perf_counter() - t_round)
        results["rounds_done"] = r + 1
        _save(results, args.out)
    if args.keep_caches:
        print("caches kept in", scratch)
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

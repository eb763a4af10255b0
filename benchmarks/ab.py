#!/usr/bin/env python3
"""The one A/B runner: ptxbackend source trees (and stock CuPy) as arms, fresh child processes over
their own caches, rotated rounds under a budget, and medians and per-round ratios over rounds.

    python benchmarks/ab.py WORKLOAD [the workload's options]      (or: python benchmarks/run.py SUITE)

Workloads (each a module ab_WORKLOAD.py that owns only its child, its checks and its table):

    hit      ptxbackend.compile()+load() hits, two trees paired (run.py hit)
    miss     ptxbackend's own time per miss of each tree, CuPy 14's headers, NVRTC (run.py miss)
    cupy     stock CuPy 14 / the start-up hook of each tree, cold and warm (run.py cupy-ab)
    chainer  Chainer 1.24's CuPy v1 through the hook of each tree, cold and warm (run.py chainer-ab)
    anatomy  where a warm CuPy 14 kernel's time goes, step by step, per arm (run.py anatomy)
    warm     two runs of run.py's warm section (before/after a change) side by side (run.py warm-compare)

What lives here and nowhere else: parsing ``--tree NAME=DIR`` arms, activating a tree's hook in a
child, the child's environment and caches, launching and reading children, the round order (ABAB,
reversed every other round), the budget, the rounds loop, medians and ratios within a round, and
saving results.json + summary.md.  The child side runs in a fresh process that must not import
ptxbackend before the tree's own copy is on sys.path, so this module imports nothing beyond the
standard library.
"""

import argparse
import contextlib
import importlib
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

# The files a ptxbackend source tree is made of: what it must have, what is byte-compiled ahead of
# the timed children, and what "uncommitted" counts in a git checkout.
TREE_FILES = ("ptxbackend", "_ptxbackend_pth.py", "_ptxbackend_boot.py")
_TREE_NEEDS = ("_ptxbackend_pth.py", "_ptxbackend_boot.py", os.path.join("ptxbackend", "__init__.py"))
_HOOK_MODULES = ("_ptxbackend_pth", "_ptxbackend_boot", "ptxbackend")
PHASES = ("cold", "warm")  # warm: a second fresh process over what cold left


# --------------------------------------------------------------------------- the child

def dir_stats(path):
    files = size = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                size += os.lstat(os.path.join(root, name)).st_size
                files += 1
            except OSError:  # a cache may drop a temporary file while it is walked
                pass
    return {"files": files, "bytes": size}


def activate_tree(tree):
    """What ptxbackend.pth does at start-up, from ``tree``; returns the first stage's file.

    The parent starts every child with PTXBACKEND_DISABLE=1 so that a ptxbackend installed in this
    Python (an editable install's .pth, say) registers nothing; here that copy is forgotten, the
    switch is turned back on, and the tree's own first stage is imported and installed.  0.2.0's
    module installs itself on import; later ones on install(); install() is idempotent in both.
    """
    os.environ.pop("PTXBACKEND_DISABLE", None)
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "ptxbackend_watcher", False)]
    for name in list(sys.modules):
        if name in _HOOK_MODULES or name == "ptxbackend" or name.startswith("ptxbackend."):
            del sys.modules[name]
    sys.path.insert(0, tree)
    import _ptxbackend_pth
    _ptxbackend_pth.install()
    return _ptxbackend_pth.__file__


def import_from_tree(tree):
    """Make ``import ptxbackend`` find ``tree``'s copy, for a child that uses the package itself (no hook).

    The interpreter's own .pth hook (an editable install, say) may have imported another tree's
    top-level modules already; they are forgotten, so nothing of two trees mixes.
    """
    sys.path.insert(0, tree)
    for mod in [m for m in sys.modules if m.startswith("_ptxbackend") or m.split(".")[0] == "ptxbackend"]:
        del sys.modules[mod]


def tree_module(packaged):
    """``ptxbackend.<job>.<name>`` of the package layout, or ``ptxbackend.<name>`` of the flat layout
    (0.4.0 and older): an arm may be either."""
    import importlib
    try:
        return importlib.import_module(packaged)
    except ImportError:
        return importlib.import_module("ptxbackend." + packaged.rsplit(".", 1)[1])


def inside(path, tree):
    return os.path.realpath(path).startswith(os.path.realpath(tree) + os.sep)


def assert_stock(replaced):
    """Raise if anything of ptxbackend is active in a stock arm's child (``replaced``: what the hook took)."""
    loaded = sorted(m for m in sys.modules if m == "ptxbackend" or m.startswith("ptxbackend."))
    if replaced or loaded or any(getattr(f, "ptxbackend_watcher", False) for f in sys.meta_path):
        raise SystemExit("stock arm: ptxbackend is active (replaced=%s, modules=%s)" % (replaced, loaded))


def assert_from_tree(tree, pth_file, package_file):
    """Raise unless hook and package both came from ``tree``: an installed copy would time the wrong code."""
    if not (inside(pth_file, tree) and inside(package_file, tree)):
        raise SystemExit("tree arm: hook from %s, package from %s, not from %s" % (pth_file, package_file, tree))


def probe_each(info, getters):
    """``info[key] = get()`` for each pair; a failure is recorded instead, so that a dry run without a
    GPU still reports what it could."""
    for key, get in getters:
        try:
            info[key] = get()
        except Exception as exc:  # no GPU here (the dry run): say why instead
            info[key] = "unavailable: %s" % (type(exc).__name__,)
    return info


def cache_dirs():
    """The child's three caches, as the parent set them (see child_env)."""
    return {"ptxbackend": os.environ["PTXBACKEND_CACHE_DIR"], "cupy": os.environ["CUPY_CACHE_DIR"],
            "cuda_jit": os.environ["CUDA_CACHE_PATH"]}


def make_context(cupy, size, warmup):
    """Input and output arrays on the device, then one kernel; (x, y, their timings) for the report.

    Both kept out of the timed kernels: the context, and the one-time costs of a first kernel (the
    compiler's start-up, headers, ptxbackend's settings) that every arm pays once per process.
    """
    perf = time.perf_counter
    t = perf()
    import numpy
    # The context is made here; a copy from the host, not cupy.arange, which would compile a kernel.
    x = cupy.asarray(numpy.linspace(-2.0, 2.0, size, dtype=numpy.float32))
    y = cupy.empty_like(x)
    cupy.cuda.runtime.deviceSynchronize()
    timings = {"context_s": perf() - t}
    t = perf()
    cupy.ElementwiseKernel(*warmup)(x, y)
    cupy.cuda.runtime.deviceSynchronize()
    timings["warmup_s"] = perf() - t
    return x, y, timings


def time_kernels(cupy, x, y, specs, dirs):
    """Create and launch each ``cupy.ElementwiseKernel(*spec)`` once, synchronise; the figures a child reports.

    The caches are measured before and after, so that a warm child can be shown to have added nothing.
    """
    perf = time.perf_counter
    import gc
    before = {k: dir_stats(v) for k, v in dirs.items()}
    specs = list(specs)
    gc.collect()  # not inside the timed loop
    collector = _GcMeter()
    each = []
    gc.callbacks.append(collector)
    t0 = perf()
    try:
        for spec in specs:
            t = perf()
            cupy.ElementwiseKernel(*spec)(x, y)  # the first launch compiles (or finds it cached)
            each.append(perf() - t)
        cupy.cuda.runtime.deviceSynchronize()
        total = perf() - t0
    finally:
        gc.callbacks.remove(collector)
    n = len(specs)
    return {"total_s": total, "per_kernel_ms": total / n * 1e3, "median_kernel_ms": statistics.median(each) * 1e3,
            "max_kernel_ms": max(each) * 1e3, "gc": collector.report(n),
            "caches": {k: {"before": before[k], "after": dir_stats(v)} for k, v in dirs.items()}}


class _GcMeter(object):
    """The cyclic collector's runs inside the timed loop, per generation, and the time they took: a
    mean per kernel can hide one full collection that a median does not see."""

    def __init__(self):
        self.started = None
        self.runs = [0, 0, 0]
        self.seconds = 0.0

    def __call__(self, phase, info):
        if phase == "start":
            self.started = time.perf_counter()
        elif self.started is not None:
            self.seconds += time.perf_counter() - self.started
            self.runs[info.get("generation", 0)] += 1
            self.started = None

    def report(self, n):
        return {"runs_by_generation": self.runs, "ms_per_kernel": self.seconds / n * 1e3}


def timed(function, seconds):
    """``function``, appending the seconds each call took to ``seconds``."""
    clock = time.perf_counter

    def wrapper(*args, **kwargs):
        started = clock()
        try:
            return function(*args, **kwargs)
        finally:
            seconds.append(clock() - started)
    return wrapper


def hook_entry(engine):
    """The name of the engine function a tree's CuPy hook calls: ``compile_with`` (settings resolved
    once per kernel) where the tree has it, ``compile`` in older trees."""
    return "compile_with" if hasattr(engine, "compile_with") else "compile"


def probe_engine(records, seconds):
    """Record each artifact the hook gets from ptxbackend's engine, and how long its compile() took.

    CuPy never shows the artifact, so the engine function the hook calls is wrapped: one Python call
    and an append per kernel (well under a microsecond, against the ~0.2-0.5 ms a warm kernel costs).
    """
    engine = tree_module("ptxbackend.compiling.engine")
    name = hook_entry(engine)
    compile_ = timed(getattr(engine, name), seconds)

    def compile(*args, **kwargs):
        artifact = compile_(*args, **kwargs)
        records.append(artifact)
        return artifact
    setattr(engine, name, compile)


# The hook's own steps around the engine call (timed by probe_engine), by their names in
# ptxbackend.hook.cupy_integration; a tree without one of them is timed without it (0.2.0 resolves its settings
# with load_settings, the working tree once with compile_settings).
HOOK_STAGES = ("compile_settings", "load_settings", "_cupy_options", "_use_cupy_context", "_load")


def probe_stages(seconds):
    """Time the hook's steps besides the engine call into ``seconds`` ({name: [s, ...]}): where a warm
    kernel's time inside the cache function goes when compile() and the module load do not explain it."""
    cupy_integration = tree_module("ptxbackend.hook.cupy_integration")
    for name in HOOK_STAGES:
        if callable(getattr(cupy_integration, name, None)):
            setattr(cupy_integration, name, timed(getattr(cupy_integration, name), seconds.setdefault(name, [])))


def stage_report(seconds, n):
    """us per kernel (the sum over the N kernels / N), the median call and the calls, per stage."""
    return dict((name, {"us_per_kernel": sum(v) / n * 1e6, "median_us": statistics.median(v) * 1e6,
                        "calls": len(v)}) for name, v in seconds.items() if v)


def stage_summary(mine, phase="warm"):
    """{stage: stats of its us per kernel over the rounds} of one arm's children in ``phase``."""
    names = sorted(set(n for v in mine.values() for n in v.get("stages", {})))
    return dict((n, stats([v.get("stages", {}).get(n, {}).get("us_per_kernel") for v in mine.values()]))
                for n in names)


def stage_text(stage_stats):
    return ", ".join("%s %.1f" % (n.strip("_"), v["median"]) for n, v in sorted(stage_stats.items()) if v) or "-"


def start_child(args, verify, key):
    """What every A/B child does first: its arm's tree put in place, CuPy imported (timed) and the arm
    checked by ``verify(tree, pth_file)`` into ``report[key]``.  ``(cupy, report, tree)``."""
    tree = args.child_tree or None
    pth_file = activate_tree(tree) if tree else None
    started = time.perf_counter()
    import cupy
    report = {"import_cupy_s": time.perf_counter() - started}
    report[key] = verify(tree, pth_file)
    return cupy, report, tree


def report_check(mark, cupy, report, kernels, kernel_spec, info):
    """A check child's report (the dry run, and every arm's check before timing): the kernels built,
    none launched, and CuPy's facts."""
    report["kernels_built"] = len([cupy.ElementwiseKernel(*kernel_spec(i)) for i in range(kernels)])
    report.update(info(cupy))
    emit(mark, report)


def emit(mark, report):
    print(mark + json.dumps(report))


# --------------------------------------------------------------------------- the parent: arms

def tree_info(name, path, needs=(), **fields):
    """The arm for ``--tree NAME=DIR``: checked to be a ptxbackend tree, with its version and commit.

    ``needs``: files the workload relies on beyond every tree's, each a path or a tuple of paths of
    which one will do (a module's place in the package layout and in 0.4.0's flat one); ``fields``:
    the workload's own keys, kept right after name and dir as results.json has always had them.
    """
    path = os.path.abspath(path)
    for need in _TREE_NEEDS + tuple(needs):
        choices = need if isinstance(need, tuple) else (need,)
        if not any(os.path.isfile(os.path.join(path, c)) for c in choices):
            raise SystemExit("--tree %s=%s: no %s there (give a ptxbackend source tree)"
                             % (name, path, " or ".join(choices)))
    info = {"name": name, "dir": path}
    info.update(fields)
    for source in ("_version.py", "__init__.py"):  # 0.2.0 has no _version.py
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
            dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--"] + list(TREE_FILES),
                                   capture_output=True, text=True)
            info["uncommitted_files"] = len(dirty.stdout.splitlines())
    except OSError:
        pass
    return info


def parse_trees(specs, reserved, needs=(), **fields):
    """The tree arms of ``--tree NAME=DIR`` options; ``reserved`` is the name of the script's stock arm."""
    arms = []
    for spec in specs:
        name, eq, path = spec.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z0-9._-]+", name) or name == reserved \
                or name in [a["name"] for a in arms]:
            raise SystemExit("--tree %r: write NAME=DIR, NAME unique, of letters, digits, '.', '_', '-', "
                             "not %r" % (spec, reserved))
        arms.append(tree_info(name, path, needs, **fields))
    return arms


def tree_files(tree):
    return [os.path.join(tree, p) for p in TREE_FILES]


def precompile(paths):
    # Bytecode now, so that no arm's first child pays for compiling the tree's (or a site's) .py files.
    subprocess.run([sys.executable, "-m", "compileall", "-q"] + [p for p in paths if os.path.exists(p)],
                   capture_output=True)


def in_scratch(prefix, args, run):
    """``run(scratch)`` in a fresh folder, removed afterwards unless --keep-caches keeps it (then printed)."""
    scratch = tempfile.mkdtemp(prefix=prefix)
    try:
        return run(scratch)
    finally:
        if args.keep_caches and not args.dry_run:
            print("caches kept in", scratch)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------- the parent: children

def arm_caches(scratch, stage, arm, kinds=("cupy", "ptxbackend", "cuda_jit")):
    """Cache folders of one arm in one stage ("check", "r0", ...): never shared, so cold is really cold."""
    return {k: os.path.join(scratch, stage, arm["name"], k) for k in kinds}


def child_env(caches, drop_prefixes, drop_names):
    """os.environ without what would change the arms' settings, plus the hook off and the child's caches."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop_prefixes) and k not in drop_names}
    # Every child starts with the hook off: stock stays so, a tree arm turns on its own tree's.
    env.update(PTXBACKEND_DISABLE="1", PYTHONDONTWRITEBYTECODE="1", CUPY_CACHE_DIR=caches["cupy"],
               PTXBACKEND_CACHE_DIR=caches["ptxbackend"], CUDA_CACHE_PATH=caches["cuda_jit"])
    return env


def launch(script, mark, mode, arm, caches, env, args, annotate=None):
    """Run ``script --child MODE`` for ``arm``; its result line as a dict, or {"error": ...}.

    ``annotate(result)`` adds the script's own figures to every outcome, failed ones included, right
    after wall_s (results.json keeps its key order).
    """
    annotate = annotate or (lambda result: None)
    for path in caches.values():
        os.makedirs(path, exist_ok=True)
    cmd = [sys.executable, os.path.abspath(script), "--child", mode, "--child-tree", arm["dir"] or "",
           "--kernels", str(args.kernels)]
    t = time.perf_counter()
    try:  # cwd outside every tree: the child finds ptxbackend only where it is told
        with quiet_directory() as cwd:
            done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                                  timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        result = {"error": "timed out after %d s" % args.child_timeout, "wall_s": time.perf_counter() - t}
        annotate(result)
        return result
    wall = time.perf_counter() - t
    lines = [line for line in done.stdout.splitlines() if line.startswith(mark)]
    if done.returncode or not lines:
        result = {"error": "rc=%d: %s" % (done.returncode, (done.stderr + done.stdout).strip()[-2000:]), "wall_s": wall}
        annotate(result)
        return result
    result = json.loads(lines[-1][len(mark):])
    result["wall_s"] = wall
    annotate(result)
    if done.stderr.strip():  # e.g. a ptxbackend warning that CuPy took a kernel back
        result["stderr"] = done.stderr.strip()[-2000:]
    return result


@contextlib.contextmanager
def quiet_directory():
    """An empty directory of its own for a child to run in: NVRTC watches its working directory, and in
    a shared one (/tmp) other programs' files (nvcc's tmpxft_*) come and go while it compiles."""
    path = tempfile.mkdtemp(prefix="ab-child-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def json_child(script, args, env=None, cwd=None, what="child"):
    """Run ``script ARGS`` in a fresh interpreter that prints its result as its last line of JSON; that
    result, or SystemExit with the child's last words (a package-using workload: hit, miss)."""
    with quiet_directory() as empty:
        done = subprocess.run([sys.executable, os.path.abspath(script)] + list(args), capture_output=True, text=True,
                              env=dict(os.environ, **(env or {})), cwd=cwd or empty)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise SystemExit("%s: rc=%d: %s" % (what, done.returncode, (done.stderr + done.stdout).strip()[-2000:]))
    return json.loads(lines[-1])


def record_check(results, arm, got):
    """Keep and print an arm's check; stop before any timing if it failed (a broken arm wastes the budget)."""
    results["checks"][arm["name"]] = got
    print("check %-8s %s" % (arm["name"], json.dumps(got)), flush=True)
    if "error" in got:
        raise SystemExit("arm %s failed its check; nothing timed" % arm["name"])


def record_run(results, got, arm, phase, r, figure):
    got.update(arm=arm["name"], phase=phase, round=r)
    results["runs"].append(got)
    print("round %d %-8s %s: %s" % (r, arm["name"], phase, figure), flush=True)


# --------------------------------------------------------------------------- the parent: rounds

def round_order(arms, r):
    # ABAB: the order flips every round, so that neither arm always runs on the other's leftovers.
    return arms if r % 2 == 0 else arms[::-1]


def plan(rounds, arms_of_round):
    return [("r%d" % r, [a["name"] for a in arms_of_round(r)]) for r in range(rounds)]


def print_plan(order):
    print("dry run: every arm checked; the real run would do, per round, cold then warm of each arm in order:",
          json.dumps(order))


def over_budget(results, budget_s, r, elapsed, estimate):
    """True (and said, and marked in results) when round ``r`` would end past the budget.

    Round 0 always runs: a run with no figures at all would tell nothing.
    """
    if budget_s and r and elapsed + estimate > budget_s:
        results["stopped_by_budget"] = True
        print("budget: round %d would end near %.0f s of %.0f s; stopping" % (r, elapsed + estimate, budget_s))
        return True
    return False


def run_rounds(results, rounds, arms_of_round, run_arm, save, budget_s, t0, per_arm_estimate=False):
    """The timed rounds of every workload: round ``r`` runs ``arms_of_round(r)`` in that order, each
    through ``run_arm(arm, r)``, which yields ``(phase, result, figure)`` per child; every result is
    recorded and saved as it comes, so a run cut off by a timeout keeps its figures.

    The budget (``budget_s`` from ``t0``) stops before a round that would end past it, estimated from
    the longest round so far, or, with ``per_arm_estimate`` (arms that differ between rounds), from
    each arm's own longest.
    """
    longest, spent = 0.0, {}
    for r in range(rounds):
        todo = arms_of_round(r)
        if per_arm_estimate:
            estimate = sum(spent.get(a["name"], max(spent.values() or [0])) for a in todo)
        else:
            estimate = longest
        if over_budget(results, budget_s, r, time.perf_counter() - t0, estimate):
            break
        t_round = time.perf_counter()
        for arm in todo:
            t_arm = time.perf_counter()
            for phase, got, figure in run_arm(arm, r):
                record_run(results, got, arm, phase, r, figure)
                save(results)
            spent[arm["name"]] = max(spent.get(arm["name"], 0), time.perf_counter() - t_arm)
        longest = max(longest, time.perf_counter() - t_round)
        results["rounds_done"] = r + 1
        save(results)
    save(results)  # also when the budget stopped it: results.json says so
    return results


def check_arms(results, arms, check_arm, record=None):
    """Each arm once, before any timing: proves every hook takes over (or stays away) before the
    budget is spent, and warms the page cache for CuPy and each tree.  ``record(results, arm, got)``
    (default record_check) stops the run at the first arm that failed."""
    for arm in arms:
        (record or record_check)(results, arm, check_arm(arm))
    return results["checks"]


def machine(compute_cap=True):
    """The host as every workload's results.json records it."""
    info = {"python": sys.version.split()[0], "executable": sys.executable, "platform": platform.platform(),
            "cpus": os.cpu_count(), "host": platform.node()}
    query = "--query-gpu=name,driver_version" + (",compute_cap" if compute_cap else "")
    for key, cmd in (("gpu", ["nvidia-smi", query, "--format=csv,noheader"]), ("nvcc", ["nvcc", "--version"])):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            lines = done.stdout.strip().splitlines()
            info[key] = lines[-1] if key == "nvcc" and lines else (lines[0] if lines else None)
        except (OSError, subprocess.SubprocessError) as exc:
            info[key] = "unavailable: %s" % type(exc).__name__
    return info


# --------------------------------------------------------------------------- summaries

def by_arm_and_phase(runs):
    """{(arm, phase): {round: run}}: rounds pair each arm's figure with its reference's of the same round."""
    per = {}
    for r in runs:
        per.setdefault((r["arm"], r["phase"]), {})[r["round"]] = r
    return per


def stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def phase_figures(phase, mine, ref, figure="per_kernel_ms", label=None):
    """ms/kernel, child wall time, per-round ratio to ``ref`` and errors of one arm in one phase.

    ``mine`` and ``ref``: {round: run}; a ratio only where both ran in the same round.  ``figure``: which
    of a child's per-kernel figures; ``label`` (default: the phase) prefixes the keys returned.
    """
    label = label or phase
    return {label: stats([v.get(figure) for v in mine.values()]),
            label + "_wall": stats([v["wall_s"] for v in mine.values() if "error" not in v]),
            label + "_ratio": stats([v[figure] / ref[k][figure] for k, v in mine.items()
                                     if figure in v and figure in ref.get(k, {})]),
            label + "_errors": sum("error" in v for v in mine.values())}


def percentile(values, q):
    """The ``q`` quantile (0..1) of ``values`` by nearest rank: what paired deltas report beside the median."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def fmt(s, spec="%.3f"):
    return "-" if not s else (spec + " (" + spec + "-" + spec + ")") % (s["median"], s["min"], s["max"])


def started(results):
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(results["started"]))


def tree_label(arm):
    return "ptxbackend %s, %s%s" % (arm.get("version", "?"), arm.get("commit", arm["dir"])[:12],
                                    ", %d uncommitted files" % arm["uncommitted_files"]
                                    if arm.get("uncommitted_files") else "")


def verdict(ratio, target):
    return "met" if ratio["median"] <= target else "**not met**"


def save(results, out, summarise, render):
    results["summary"] = summarise(results)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(render(results))


def add_run_options(p, child_timeout, budget_help, dry_run_help):
    """The options every A/B script has, after its own; their order is the order of --help."""
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kernels", type=int, default=100)
    p.add_argument("--out", help="folder for results.json and summary.md")
    p.add_argument("--budget-s", type=float, help=budget_help)
    p.add_argument("--child-timeout", type=int, default=child_timeout)
    p.add_argument("--keep-caches", action="store_true", help="leave the per-arm cache folders (printed)")
    p.add_argument("--dry-run", action="store_true", help=dry_run_help)
    # how the parent starts its children (launch); not for people
    p.add_argument("--child", choices=("check", "run"), help=argparse.SUPPRESS)
    p.add_argument("--child-tree", help=argparse.SUPPRESS)


# --------------------------------------------------------------------------- the entry point

# workload -> (module, what it measures); run.py's suites name these.
WORKLOADS = (
    ("hit", "ab_hit", "ptxbackend.compile()+load() hits of two trees, paired ABBA, 0 and 9 headers"),
    ("miss", "ab_miss", "ptxbackend's own time per miss (compile() minus NVRTC) of each tree, rotated"),
    ("cupy", "ab_cupy", "stock CuPy 14 / the start-up hook of each tree, cold and warm, ABAB"),
    ("chainer", "ab_chainer", "Chainer 1.24's CuPy v1 through the hook of each tree, cold and warm"),
    ("anatomy", "ab_anatomy", "where a warm CuPy 14 kernel's time goes, per arm, step by step"),
    ("warm", "ab_warm", "two warm-section runs (before/after a change) against the hit budgets"),
)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    modules = dict((name, module) for name, module, _ in WORKLOADS)
    if not argv or argv[0] in ("-h", "--help", "--list"):
        out = sys.stdout if argv else sys.stderr
        out.write("usage: ab.py WORKLOAD [options]; WORKLOAD --help lists its options\n")
        for name, module, what in WORKLOADS:
            out.write("  %-8s %-14s %s\n" % (name, module + ".py", what))
        return 0 if argv else 2
    if argv[0] not in modules:
        sys.stderr.write("ab.py: no workload %r; the workloads: %s\n" % (argv[0], ", ".join(sorted(modules))))
        return 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.argv[0] = "ab.py " + argv[0]  # what the workload's --help and errors call it
    return importlib.import_module(modules[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())

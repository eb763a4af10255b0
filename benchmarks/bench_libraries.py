"""Section 5: the user story's library start-up (GPU only; skipped by --quick).

An old library with no code for the GPU (cuRAND 10.2 from nvidia-curand-cu11==10.2.10.91: creating
its generator makes the driver JIT-compile its kernels), create + first call in a fresh process,
through ptxbackend.deploy.library_warmup.child(), with the driver's JIT cache:
  off        CUDA_CACHE_DISABLE=1
  too small  CUDA_CACHE_MAXSIZE=1048576
  default    unset (the driver's default size), fresh CUDA_CACHE_PATH
  ptxbackend as the start-up hook configures it (_ptxbackend_boot.start() in the child: 4 GiB), fresh path
Each: a 1st and a 2nd process (and two more when the 2nd is cheap).  Reference: a cuRAND with native
code for the GPU (the CUDA toolkit's libcurand.so.10), with the JIT cache off, 3 processes.
Each cold first process costs 20-27 s on an H200.
"""

import glob
import os

import benchutil
from ptxbackend.deploy.library_warmup import tree_size

CONFIGS = (
    ("off", "CUDA_CACHE_DISABLE=1", {"CUDA_CACHE_DISABLE": "1"}, False),
    ("small", "CUDA_CACHE_MAXSIZE=1048576 (too small)", {"CUDA_CACHE_MAXSIZE": "1048576"}, False),
    ("default", "driver default (unset), fresh CUDA_CACHE_PATH", {}, False),
    ("ptxbackend", "as ptxbackend configures it (hook: CUDA_CACHE_MAXSIZE=4 GiB)", {}, True),
)
CHEAP_S = 5.0


def lib_child(args):
    """Child: (optionally) the start-up hook, then libwarm's first library call."""
    if args.get("hook"):
        import _ptxbackend_boot
        _ptxbackend_boot.start()
    from ptxbackend.deploy.library_warmup import child
    result = child(args["kind"], args["path"])
    result["cuda_cache_maxsize"] = os.environ.get("CUDA_CACHE_MAXSIZE")
    result["cuda_cache_disable"] = os.environ.get("CUDA_CACHE_DISABLE")
    return result


def _native_curand(explicit, old_path):
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    roots = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    for root in roots:
        if not root:
            continue
        for sub in ("lib64", os.path.join("targets", "x86_64-linux", "lib")):
            for path in sorted(glob.glob(os.path.join(root, sub, "libcurand.so.*"))):
                if os.path.realpath(path) != os.path.realpath(old_path or ""):
                    return path
    return None


def _spawn(path, env_changes, hook, cache_path):
    env = {"CUDA_CACHE_PATH": cache_path, "CUDA_CACHE_DISABLE": None, "CUDA_CACHE_MAXSIZE": None,
           "PTXBACKEND_DISABLE": None if hook else "1", "CUDA_MODULE_LOADING": None}
    env.update(env_changes)
    return benchutil.spawn("bench_libraries", "lib_child", {"kind": "curand", "path": path, "hook": hook},
                           benchutil.clean_env(env), timeout=600)


def _new_machine(ctx, old, warmed, rows, stats, notes):
    """The "new machine" row: the warmed driver cache packed (warm --libs --driver-jit-bundle), installed
    into a fresh cache root (cache import), and used by fresh processes through the start-up hook alone."""
    from ptxbackend.deploy import jit_bundle as driverjit
    try:
        machine = driverjit.this_machine()
        bundle = os.path.join(ctx.ws.fresh("libjit-bundle"), "curand-jit.tgz")
        driverjit.pack(warmed, [old], bundle, machine)
        root = ctx.ws.fresh("libjit-new-machine")
        driverjit.install(bundle, root, machine)
        env = benchutil.clean_env({"CUDA_CACHE_PATH": None, "CUDA_CACHE_DISABLE": None, "CUDA_CACHE_MAXSIZE": None,
                                   "CUDA_MODULE_LOADING": None, "PTXBACKEND_CACHE_DIR": root})
        processes = [benchutil.spawn("bench_libraries", "lib_child", {"kind": "curand", "path": old, "hook": True},
                                     env, timeout=600) for _ in range(3)]
    except Exception as exc:  # reported in the section, never fatal to the run
        notes.append("new machine: %s" % benchutil.first_line(exc))
        return
    first = benchutil.summarize([processes[0]["first_call_s"]], "s")
    later = benchutil.summarize([p["first_call_s"] for p in processes[1:]], "s")
    stats["new_machine"] = {"first_process_s": first, "later_processes_s": later,
                            "bundle_bytes": os.path.getsize(bundle), "jit_cache": processes[0].get("jit_cache")}
    rows.append(["cuRAND 10.2 (no sm_%d code)" % ctx.device_cc,
                 "a new machine: the driver-JIT bundle imported, the hook sets CUDA_CACHE_PATH",
                 "CUDA_CACHE_PATH=%s" % processes[0].get("jit_cache"), benchutil.fmt_stat(first),
                 benchutil.fmt_stat(later), "%.1f MB bundle" % (os.path.getsize(bundle) / 1e6)])
    notes.append("new machine: on this same machine, the 'ptxbackend' row's warmed cache packed and installed "
                 "into a fresh cache root, as `cache import` does on a line PC; the two-machine run is in "
                 "docs/deployment.md.")


def run(ctx):
    title = "Library start-up: an old cuRAND without code for the GPU"
    if not ctx.gpu.get("available"):
        return ctx.skipped(title, "needs a GPU (%s)" % ctx.gpu.get("why", "none found"))
    if ctx.quick:
        return ctx.skipped(title, "skipped by --quick (each cold process costs 20-27 s on an H200)")
    old = ctx.args.curand or os.environ.get("PTXBACKEND_BENCH_CURAND")
    if not old or not os.path.isfile(old):
        return ctx.skipped(title, "needs libcurand.so.10 from nvidia-curand-cu11==10.2.10.91: pass --curand PATH "
                                  "or set PTXBACKEND_BENCH_CURAND (got %r)" % old)
    notes = ["first_call_s: curandCreateGenerator + the first curandGenerateNormal (1M floats) + synchronize, "
             "timed inside a fresh process (ptxbackend.deploy.library_warmup.child): the create call is where cuRAND loads "
             "(JIT-compiles) its kernels; library: %s" % old]
    rows, stats, paths = [], {}, {}
    for key, label, changes, hook in CONFIGS:
        cache_path = paths[key] = ctx.ws.fresh("libjit-" + key)
        processes = []
        try:
            for index in range(4):
                if index >= 2 and processes[1]["first_call_s"] > CHEAP_S:
                    break
                benchutil.log("libraries: %s, process %d" % (key, index + 1))
                processes.append(_spawn(old, changes, hook, cache_path))
        except benchutil.ChildError as exc:
            notes.append("%s: %s" % (key, exc))
            if not processes:
                continue
        first = benchutil.summarize([processes[0]["first_call_s"]], "s")
        later = benchutil.summarize([p["first_call_s"] for p in processes[1:]], "s")
        stats[key] = {"first_process_s": first, "later_processes_s": later,
                      "cuda_cache_maxsize": processes[0].get("cuda_cache_maxsize"),
                      "jit_cache_bytes": tree_size(cache_path)}
        rows.append(["cuRAND 10.2 (no sm_%d code)" % ctx.device_cc, label,
                     "CUDA_CACHE_MAXSIZE=%s" % processes[0].get("cuda_cache_maxsize"),
                     benchutil.fmt_stat(first), benchutil.fmt_stat(later),
                     "%.1f MB" % (stats[key]["jit_cache_bytes"] / 1e6)])
    if "ptxbackend" in stats:
        _new_machine(ctx, old, paths["ptxbackend"], rows, stats, notes)
    native = _native_curand(ctx.args.curand_native or os.environ.get("PTXBACKEND_BENCH_CURAND_NATIVE"), old)
    summary = {}
    if native:
        runs = []
        try:
            for index in range(3):
                benchutil.log("libraries: native cuRAND, process %d" % (index + 1))
                runs.append(_spawn(native, {"CUDA_CACHE_DISABLE": "1"}, False, ctx.ws.fresh("libjit-native")))
        except benchutil.ChildError as exc:
            notes.append("native cuRAND: %s" % exc)
        if runs:
            first = benchutil.summarize([runs[0]["first_call_s"]], "s")
            later = benchutil.summarize([r["first_call_s"] for r in runs[1:]], "s")
            stats["native"] = {"first_process_s": first, "later_processes_s": later, "path": native}
            rows.append(["cuRAND with native code (%s)" % os.path.basename(os.path.realpath(native)),
                         "CUDA_CACHE_DISABLE=1 (no JIT possible or needed)", "-",
                         benchutil.fmt_stat(first), benchutil.fmt_stat(later), "-"])
            reference = benchutil.summarize([r["first_call_s"] for r in runs], "s")["median"]
            summary["native_first_call_s"] = reference
            ours = stats.get("ptxbackend", {}).get("later_processes_s", {}).get("median")
            summary["ptxbackend_second_call_s"] = ours
            summary["ratio_to_native"] = (ours / reference) if ours and reference else None
            notes.append("Target ratio: old cuRAND's later processes under ptxbackend's JIT cache setting / "
                         "the native cuRAND's first call (median of its 3 processes).")
    else:
        notes.append("no cuRAND with native code found (--curand-native PATH, or the CUDA toolkit's lib64)")
    return {"title": title, "status": "ok" if stats else "error", "notes": notes, "stats": stats, "summary": summary,
            "table": {"columns": ["library", "driver JIT cache", "seen by the child", "1st process, s",
                                  "later processes, s", "JIT cache size after"], "rows": rows},
            "plots": [{"file": "libraries.png", "title": "First cuRAND call in a fresh process", "ylabel": "seconds",
                       "log": True, "labels": [k for k in stats],
                       "series": {"1st process": [stats[k]["first_process_s"] for k in stats],
                                  "later processes": [stats[k]["later_processes_s"] for k in stats]}}]}

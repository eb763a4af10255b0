"""Where a warm CuPy 14 kernel's time goes, per arm, on the machine it runs on (one run, fresh processes).

For each arm (``stock``, and each ``--tree NAME=DIR`` through its start-up hook), a cold child fills
the arm's caches with 2N distinct kernels (ab_cupy's), then a warm child:

1. times N of them as a program sees them (``ElementwiseKernel(...)(x, y)``, first use);
2. times the parts of a hit one by one, each over the kernels it captured: ptxbackend's
   ``compile()`` in the timed first uses, then the same calls again, CuPy's ``Module.load`` of the
   same image, ``cudaMemGetInfo`` (the hook makes CuPy's context current with it), settings;
3. profiles the other N kernels' first use (cProfile), top functions by own time: the system calls
   (``posix.stat``, ``open``, ``read``) show there with their counts.

It also times the file system calls a hit makes on each place involved (the caches, CuPy's include
directory, the working directory): ``stat`` of a file and of a missing name, ``open``+``read``+``close``,
with each place's file system type, and, for a tree arm, how ``ptxbackend doctor`` keeps its headers
checked.  Those answers are what explain a hit that is fast on one machine and slow on another.

    python benchmarks/run.py anatomy --tree 0.2.0=/tmp/pb020 --tree now=. --out anatomy
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab  # noqa: E402
from ab_cupy import WARMUP, kernel_spec  # noqa: E402

MARK = "ANATOMY-RESULT "


def _us(seconds):
    return round(seconds * 1e6, 2)


def _median_us(function, repeat):
    clock = time.perf_counter
    each = []
    for _ in range(repeat):
        t = clock()
        function()
        each.append(clock() - t)
    return _us(statistics.median(each))


def _mounts():
    found = []
    try:
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                fields = line.split()
                if "-" in fields:
                    found.append((fields[4], fields[fields.index("-") + 1]))
    except OSError:
        pass
    return sorted(found, key=lambda m: len(m[0]), reverse=True)


def _fs_type(path, mounts):
    real = os.path.realpath(path)
    for point, kind in mounts:
        if real == point or real.startswith(point.rstrip("/") + "/"):
            return "%s (%s)" % (kind, point)
    return "?"


def _any_file(directory):
    for root, _dirs, files in os.walk(directory):
        for name in files:
            return os.path.join(root, name)
    return None


def file_system_costs(places):
    """Per place: its file system, and the median cost of the calls a hit makes there."""
    mounts = _mounts()
    out = {}
    for label, directory in places.items():
        if not directory or not os.path.isdir(directory):
            continue
        row = {"dir": directory, "fs": _fs_type(directory, mounts)}
        sample = _any_file(directory)
        missing = os.path.join(directory, "ptxbackend-anatomy-absent.h")
        row["stat_missing_us"] = _median_us(lambda: os.path.lexists(missing), 2000)
        row["stat_dir_us"] = _median_us(lambda: os.stat(directory), 2000)
        if sample:
            def read():
                fd = os.open(sample, os.O_RDONLY)
                try:
                    os.fstat(fd)
                    os.read(fd, 1 << 16)
                finally:
                    os.close(fd)
            row["stat_file_us"] = _median_us(lambda: os.stat(sample), 2000)
            row["open_fstat_read_close_us"] = _median_us(read, 2000)
        out[label] = row
    out["getpid_us"] = _median_us(os.getpid, 2000)
    out["time_us"] = _median_us(time.time, 2000)
    return out


# --------------------------------------------------------------------------- the child

def child(args):
    perf = time.perf_counter
    tree = args.child_tree or None
    if tree:
        ab.activate_tree(tree)
    import cupy
    import cupy.cuda.compiler as compiler
    report = {"arm_tree": tree}
    calls = []
    if tree:
        from ptxbackend.compiling import engine
        entry = ab.hook_entry(engine)
        original = getattr(engine, entry)

        def capture(*a, **kw):
            t = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                calls.append((a, kw, time.perf_counter() - t))
        setattr(engine, entry, capture)
    x, y, timings = ab.make_context(cupy, 1024, WARMUP)
    report.update(timings)
    n = args.kernels
    if args.child == "fill":
        for i in range(2 * n):
            cupy.ElementwiseKernel(*kernel_spec(i))(x, y)
        cupy.cuda.runtime.deviceSynchronize()
        print(MARK + json.dumps(report))
        return
    import gc
    gc.collect()
    each = []
    t0 = perf()
    for i in range(n):
        t = perf()
        cupy.ElementwiseKernel(*kernel_spec(i))(x, y)
        each.append(perf() - t)
    cupy.cuda.runtime.deviceSynchronize()
    report["per_kernel_ms"] = (perf() - t0) / n * 1e3
    report["median_kernel_ms"] = statistics.median(each) * 1e3

    # the parts, over what the timed kernels did
    report["memGetInfo_us"] = _median_us(cupy.cuda.runtime.memGetInfo, 500)
    if tree:
        import ptxbackend
        from ptxbackend.compiling import engine
        setattr(engine, entry, original)
        captured = calls[-n:]
        report["compile_first_use_us"] = _us(statistics.median(c[2] for c in captured))
        seconds = []
        artifacts = []
        for a, kw, _s in captured:
            t = perf()
            artifacts.append(original(*a, **kw))
            seconds.append(perf() - t)
        report["compile_again_us"] = _us(statistics.median(seconds))
        report["compile_again_us_p90"] = _us(sorted(seconds)[int(len(seconds) * 0.9)])
        report["hits"] = sum(bool(getattr(a, "cache_hit", False)) for a in artifacts)
        images = [bytes(a.image) for a in artifacts]
        loads = []
        for image in images:
            t = perf()
            compiler.function.Module().load(image)
            loads.append(perf() - t)
        report["module_load_us"] = _us(statistics.median(loads))
        report["image_bytes_median"] = statistics.median(len(i) for i in images)
        try:
            from ptxbackend.config import load_settings
            report["load_settings_us"] = _median_us(load_settings, 500)
        except ImportError:
            pass
        try:
            from ptxbackend.dependencies import depsets
            include = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
            report["watch_mode"] = {p: depsets.watch_mode(p) for p in (include, os.getcwd())}
            report["depsets_sets"] = len(depsets._sets)
        except (ImportError, AttributeError) as exc:
            report["watch_mode"] = "n/a (%s)" % exc
        report["version"] = ptxbackend.__version__

    # the profile, over kernels this process has not used yet (all cached by the fill child)
    profiler = cProfile.Profile()
    gc.collect()
    profiler.enable()
    for i in range(n, 2 * n):
        cupy.ElementwiseKernel(*kernel_spec(i))(x, y)
    cupy.cuda.runtime.deviceSynchronize()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(28)
    report["profile_tottime"] = text.getvalue().split("\n", 6)[-1][:6000]
    text = io.StringIO()
    stats.stream = text
    stats.sort_stats("cumtime").print_stats(32)
    report["profile_cumtime"] = text.getvalue().split("\n", 6)[-1][:6000]

    include = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
    report["fs"] = file_system_costs({"cupy_include": include, "cwd": os.getcwd(),
                                      "ptxbackend_cache": os.environ.get("PTXBACKEND_CACHE_DIR"),
                                      "cupy_cache": os.environ.get("CUPY_CACHE_DIR"), "tmp": "/tmp",
                                      "home": os.path.expanduser("~")})
    print(MARK + json.dumps(report))


# --------------------------------------------------------------------------- the parent

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--kernels", type=int, default=100)
    p.add_argument("--out", default="anatomy")
    p.add_argument("--child-timeout", type=int, default=150)
    p.add_argument("--child", choices=("fill", "warm"), help=argparse.SUPPRESS)
    p.add_argument("--child-tree", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    arms = [{"name": "stock", "dir": None}] + ab.parse_trees(args.tree, "stock")
    os.makedirs(args.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="anatomy-")
    results = {}
    try:
        for arm in arms:
            caches = ab.arm_caches(scratch, "a", arm)
            env = ab.child_env(caches, ("PTXBACKEND_",), ("CUPY_CACHE_DIR", "CUDA_CACHE_PATH"))
            fill = ab.launch(__file__, MARK, "fill", arm, caches, env, args)
            warm = ab.launch(__file__, MARK, "warm", arm, caches, env, args)
            results[arm["name"]] = {"fill": fill, "warm": warm}
            print("== %s: fill %s; warm %s" % (arm["name"], fill.get("error") or "%.1f s" % fill["wall_s"],
                                                warm.get("error") or ""), flush=True)
            for key in ("per_kernel_ms", "median_kernel_ms", "memGetInfo_us", "compile_first_use_us",
                        "compile_again_us", "compile_again_us_p90", "hits", "module_load_us", "image_bytes_median",
                        "load_settings_us", "watch_mode", "depsets_sets", "version"):
                if key in warm:
                    print("   %-20s %s" % (key, warm[key]))
            for label, row in (warm.get("fs") or {}).items():
                print("   fs %-16s %s" % (label, row))
            print("   -- profile, own time --\n" + warm.get("profile_tottime", ""))
            print("   -- profile, cumulative --\n" + warm.get("profile_cumtime", ""), flush=True)
    finally:
        with open(os.path.join(args.out, "anatomy.json"), "w") as f:
            json.dump(results, f, indent=1)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

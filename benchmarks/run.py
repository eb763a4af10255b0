#!/usr/bin/env python3
"""ptxbackend benchmarks: the cubin path against the PTX path, side by side, with one command.

    python benchmarks/run.py SUITE [--quick] [SUITE'S OPTIONS]   (one measurement, named for what it
                                                       measures; --quick: its smallest size)
    python benchmarks/run.py --list                    (the suites and the script behind each)
    python benchmarks/run.py [--quick] [--out DIR] [--sections compile,warm,...]
    python benchmarks/run.py --sections warm --ptxbackend-src OLD --out BEFORE  (an older ptxbackend)

Detects what the machine has (GPU, compilers, CuPy), runs every section that can run there, and
writes DIR/results.json, DIR/results.md and PNG plots.  See benchmarks/README.md.
"""

import argparse
import json
import os
import sys
import time
import traceback

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_warm  # noqa: E402
import benchutil  # noqa: E402
import machine  # noqa: E402
import report  # noqa: E402

SECTIONS = report.SECTION_ORDER
DEFAULT_DEVICE_CC = 90  # the H200, when there is no GPU to ask


class Context(object):
    """What every section gets: the options, the machine, a workspace."""

    def __init__(self, args, ws, gpu, toolkits, cupy, legacy, ptxbackend_src=None):
        self.args = args
        self.ptxbackend_src = ptxbackend_src or {}  # which ptxbackend the children import (describe below)
        self.quick = args.quick
        self.ws = ws
        self.gpu = gpu
        self.toolkits = toolkits
        self.cupy = cupy
        self.legacy = legacy
        self.device_cc = gpu.get("cc") if gpu.get("available") else _parse_cc(args.device_cc)
        self.ptx_arch = min(86, self.device_cc)  # what nvcc 11.2 gets on an H200: compute_86

    def reps(self, full, quick):
        if self.args.reps:
            return self.args.reps
        return quick if self.quick else full

    def skipped(self, title, why):
        benchutil.log("skipped: %s: %s" % (title, why))
        return {"title": title, "status": "skipped", "notes": [why], "summary": {}}


def _parse_cc(text):
    major, _, minor = str(text).partition(".")
    return int(major) * 10 + int(minor or 0)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Sections: %s. Environment: PTXBACKEND_TEST_NVCC112, PTXBACKEND_TEST_NVRTC, "
                                       "PTXBACKEND_BENCH_CURAND, PTXBACKEND_BENCH_CURAND_NATIVE, "
                                       "PTXBACKEND_BENCH_NVCC112_ARCHIVE." % ", ".join(SECTIONS))
    p.add_argument("--quick", action="store_true", help="fewer repetitions and kernels; skips the library section")
    p.add_argument("--out", default="benchmark-results", help="output directory (default: ./benchmark-results)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help="comma list of sections to run (default: all); results of other sections already in "
                        "OUT/results.json are kept")
    p.add_argument("--merge", metavar="RESULTS_JSON",
                   help="keep the sections of this earlier results.json that this run does not repeat")
    p.add_argument("--reps", type=int, default=0, help="repetitions per figure (default: per section)")
    p.add_argument("--device-cc", default="9.0", help="compute capability to build for without a GPU (default 9.0)")
    p.add_argument("--legacy-results", metavar="FILE", help="JSON from the legacy Chainer 1.24 harness (README)")
    p.add_argument("--curand", metavar="PATH", help="libcurand.so.10 of nvidia-curand-cu11==10.2.10.91")
    p.add_argument("--curand-native", metavar="PATH", help="a cuRAND with native code for the GPU "
                                                           "(default: the CUDA toolkit's)")
    p.add_argument("--nvcc", metavar="PATH", help="the CUDA 12/13 nvcc (default: CUDA_PATH, PATH, /usr/local/cuda)")
    p.add_argument("--nvcc112", metavar="PATH", help="nvcc 11.2 (default: PTXBACKEND_TEST_NVCC112 or the bundle)")
    p.add_argument("--nvcc112-archive", metavar="TAR", help="nvcc112.tar.xz to unpack (default: ../shared/toolkits)")
    p.add_argument("--nvrtc117", metavar="PATH", help="libnvrtc of NVRTC 11.7 (default: PTXBACKEND_TEST_NVRTC or the wheel)")
    p.add_argument("--nvrtc13", metavar="PATH", help="libnvrtc of NVRTC 12/13 (default: the toolkit's)")
    p.add_argument("--ptxbackend-src", metavar="DIR",
                   help="measure the ptxbackend package in DIR/ptxbackend (e.g. `git archive COMMIT ptxbackend | "
                        "tar -x -C DIR`) instead of the checkout's: this process and every child import it from "
                        "there; results.json records its version, DIR and git tree id. Not with the hook section, "
                        "which installs the checkout's wheel")
    p.add_argument("--warm-rows", metavar="KEYS",
                   help="comma list of warm-section rows to measure (default: all): %s" % ", ".join(bench_warm.ROWS))
    p.add_argument("--no-plots", action="store_true", help="do not draw PNG plots")
    p.add_argument("--keep-tmp", action="store_true", help="keep the temporary directory (its path is logged)")
    args = p.parse_args(argv)
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        p.error("unknown section(s) %s; choose from %s" % (", ".join(unknown), ", ".join(SECTIONS)))
    args.sections = chosen
    if args.ptxbackend_src:
        if not os.path.isfile(os.path.join(args.ptxbackend_src, "ptxbackend", "__init__.py")):
            p.error("--ptxbackend-src %s: no ptxbackend/__init__.py there" % args.ptxbackend_src)
        if "hook" in chosen:
            p.error("--ptxbackend-src does not apply to the hook section (it installs the checkout's wheel): "
                    "choose --sections without hook")
        args.ptxbackend_src = os.path.realpath(args.ptxbackend_src)
    if args.warm_rows is not None:
        rows = [r.strip() for r in args.warm_rows.split(",") if r.strip()]
        unknown = [r for r in rows if r not in bench_warm.ROWS]
        if unknown or not rows:
            p.error("--warm-rows: unknown row(s) %s; choose from %s" % (", ".join(unknown) or "(none given)",
                                                                        ", ".join(bench_warm.ROWS)))
        args.warm_rows = rows
    return args


def _load_previous(args):
    path = args.merge or os.path.join(args.out, "results.json")
    if not args.merge and set(args.sections) == set(SECTIONS):
        return {}
    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        previous = json.load(handle)
    return {k: v for k, v in (previous.get("sections") or {}).items() if k not in args.sections}


def _ptxbackend_version():
    try:
        import ptxbackend
        return ptxbackend.__version__
    except Exception as exc:
        return "not importable (%s)" % benchutil.first_line(exc)


def _load_legacy(path):
    if not path:
        return {}
    with open(path) as handle:
        return bench_warm.normalize_legacy(json.load(handle), source=path)


def _use_ptxbackend_from(directory):
    """Import ptxbackend from ``directory`` here and in every child (benchutil.child_path)."""
    loaded = benchutil.imported_ptxbackend()
    if loaded and loaded["dir"] != directory:
        raise SystemExit("--ptxbackend-src: this process already imported ptxbackend from %s" % loaded["dir"])
    sys.path.insert(0, directory)
    benchutil.set_ptxbackend_src(directory)


def _describe_ptxbackend():
    """Which ptxbackend this run measures: asked of a child, since the children are what is measured."""
    wanted = benchutil.ptxbackend_src()
    found = benchutil.describe_ptxbackend_src(wanted)
    try:
        child = benchutil.spawn("benchutil", "ptxbackend_probe", {}, benchutil.clean_env(), timeout=120)
    except benchutil.ChildError as exc:
        child = {"version": None, "dir": None, "error": str(exc)}
    found["version"] = child.get("version")
    if child.get("dir") and child["dir"] != wanted:
        raise SystemExit("children import ptxbackend from %s, not from %s: check PYTHONPATH and installed copies"
                         % (child["dir"], wanted))
    return found


def _isolate_environment(ws):
    """Runs must not depend on the user's ptxbackend settings or config file."""
    for key in list(os.environ):
        if key.startswith("PTXBACKEND_") and not key.startswith(("PTXBACKEND_TEST_", "PTXBACKEND_BENCH_")):
            del os.environ[key]
    os.environ["XDG_CONFIG_HOME"] = os.path.join(ws.root, "config-home")  # no config file there
    os.environ["PTXBACKEND_CACHE_DIR"] = ws.fresh("default-cache")


# Suites by what they measure -> (what runs it, what it measures).  "ab.py WORKLOAD" is the one A/B
# runner (arms, rotated rounds, ratios; ab_WORKLOAD.py holds the workload); "SCRIPT.py" a script of
# its own; either runs in a fresh interpreter with the suite's own options (``run.py SUITE --help``),
# so its imports (CuPy, an old ptxbackend tree) never leak into another's.  "section NAME" is this
# runner with ``--sections NAME`` and its options (results.json, results.md, plots).
SUITES = (
    ("hit", "ab.py hit", "warm hit: compile()+load() of cached kernels, two trees paired (ABBA), "
                         "no headers and 9 headers"),
    ("miss", "ab.py miss", "ptxbackend's own time per miss (compile() minus NVRTC), trees interleaved"),
    ("cupy-ab", "ab.py cupy", "stock CuPy 14 vs the start-up hook of source trees, cold and warm, ABAB"),
    ("chainer-ab", "ab.py chainer", "Chainer 1.24's CuPy v1 through the hook of source trees, cold and warm"),
    ("compile", "section compile", "cold compile: the cubin path against the PTX path, per kernel"),
    ("warm", "section warm", "warm start of N kernels: floor, cubin, PTX, stock CuPy"),
    ("warm-compare", "ab.py warm", "two warm runs (before/after a change, --ptxbackend-src) against the "
                                   "hit budgets"),
    ("kernels", "section kernels", "kernel run time: cubin against driver-JIT PTX (GPU)"),
    ("fleet", "section fleet", "M machines x K kernels against one Valkey: compiles, first use, dead remote"),
    ("chainer-fleet", "chainer_fleet.py", "Chainer 1.24 as two machines of one fleet store"),
    ("fleet-scale", "bench_fleet_scale.py", "the fleet store as machines and kernels grow"),
    ("libraries", "section libraries", "an old library's start-up through the driver's JIT cache (GPU)"),
    ("concurrency", "section concurrency", "P processes cold on the same K kernels, one cache"),
    ("deps", "bench_deps.py", "what a dependency set costs a header-heavy hit (CuPy 14's headers)"),
    ("pch", "bench_pch.py", "NVRTC 13 with and without its precompiled header"),
    ("hook", "section hook", "the start-up hook's cost: python -c pass with and without it"),
    ("anatomy", "ab.py anatomy", "where a warm kernel's time goes, step by step"),
)


# ``run.py SUITE --quick`` for a script suite: its smallest size, as these options placed before the
# user's (argparse keeps the last value given, so an explicit option still wins).  A section suite takes
# --quick itself; warm-compare has no size.
QUICK = {
    "hit": ["--pairs", "1"],
    "miss": ["--kernels", "2", "--pairs", "2"],
    "cupy-ab": ["--rounds", "1", "--kernels", "10"],
    "chainer-ab": ["--rounds", "1", "--kernels", "10"],
    "anatomy": ["--kernels", "10"],
    "chainer-fleet": ["--rounds", "1", "--kernels", "10"],
    "fleet-scale": ["--processes", "4", "--kernels", "50"],
    "deps": ["--kernels", "10", "--reps", "3"],
    "pch": ["--kernels", "4", "--rounds", "2"],
}


def _suite_main(argv):
    """``run.py SUITE ...`` and ``run.py --list``; None when argv is the section runner's."""
    if not argv:
        return None
    if argv[0] == "--list":
        width = max(len(n) for n, _, _ in SUITES)
        for name, script, what in SUITES:
            print("%-*s  %-22s %s" % (width, name, script, what))
        return 0
    if argv[0].startswith("-"):
        return None
    names = dict((n, s) for n, s, _ in SUITES)
    if argv[0] not in names:
        sys.stderr.write("run.py: no suite %r; the suites: %s (run.py --list)\n"
                         % (argv[0], ", ".join(n for n, _, _ in SUITES)))
        return 2
    if names[argv[0]].startswith("section "):
        return main(["--sections", names[argv[0]].split()[1]] + list(argv[1:]))
    import subprocess
    script = names[argv[0]].split()
    script[0] = os.path.join(os.path.dirname(os.path.abspath(__file__)), script[0])
    rest = list(argv[1:])
    if "--quick" in rest:
        rest.remove("--quick")
        rest = QUICK.get(argv[0], []) + rest
    return subprocess.call([sys.executable] + script + rest)


def main(argv=None):
    code = _suite_main(sys.argv[1:] if argv is None else argv)
    if code is not None:
        return code
    args = parse_args(argv)
    if args.ptxbackend_src:
        _use_ptxbackend_from(args.ptxbackend_src)
    started = time.time()
    ws = benchutil.Workspace(keep=args.keep_tmp)
    benchutil.log("workspace %s" % ws.root)
    try:
        _isolate_environment(ws)
        kept = _load_previous(args)
        legacy = _load_legacy(args.legacy_results)
        benchutil.log("detecting the machine")
        gpu = machine.detect_gpu()
        toolkits = machine.find_toolkits(ws, args)
        cupy = machine.cupy_info()
        source = _describe_ptxbackend()
        benchutil.log("ptxbackend %s from %s (git tree %s%s)" % (
            source["version"], source["dir"], source["tree"],
            ", commit %s%s" % (source["commit"][:10], " + changes" if source["modified"] else "")
            if source["commit"] else ""))
        ctx = Context(args, ws, gpu, toolkits, cupy, legacy, source)
        results = {"schema": 1, "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                   "args": {"quick": args.quick, "sections": args.sections, "reps": args.reps,
                            "legacy_results": args.legacy_results, "device_cc_without_gpu": args.device_cc,
                            "ptxbackend_src": args.ptxbackend_src, "warm_rows": args.warm_rows},
                   "ptxbackend": source,
                   "machine": machine.host_info(), "gpu": gpu, "toolkits": toolkits, "cupy": cupy,
                   "device_cc_used": ctx.device_cc, "ptx_target": "compute_%d" % ctx.ptx_arch,
                   "sections": dict(kept), "section_seconds": {}}
        for name, entry in sorted(toolkits.items()):
            benchutil.log("toolkit %s: %s" % (name, entry.get("version") and "%s %s" % (entry["kind"], entry["version"])
                                               or entry.get("missing")))
        for name in SECTIONS:
            if name not in args.sections:
                continue
            benchutil.log("=== section %s" % name)
            section_started = time.time()
            module = __import__("bench_" + name)
            try:
                results["sections"][name] = module.run(ctx)
            except Exception as exc:
                benchutil.log("section %s failed: %s" % (name, benchutil.first_line(exc)))
                results["sections"][name] = {"title": name, "status": "error", "summary": {},
                                             "notes": ["failed: %s" % benchutil.tail(traceback.format_exc(), 4, 800)]}
            results["section_seconds"][name] = round(time.time() - section_started, 1)
            # A merged report mixes runs: each section says which one measured it, with what.
            results["sections"][name]["run"] = {
                "created": results["created"], "ptxbackend": _ptxbackend_version(), "ptxbackend_src": source,
                "toolkits": dict((slot, "%s %s" % (entry["kind"], entry["version"]) if "path" in entry
                                  else "not found") for slot, entry in sorted(toolkits.items()))}
            results["duration_s"] = round(time.time() - started, 1)
            report.write_results(results, args.out, plots=False)  # partial results survive a kill
        results["duration_s"] = round(time.time() - started, 1)
        json_path, md_path = report.write_results(results, args.out, plots=not args.no_plots)
        benchutil.log("wrote %s and %s in %.0f s" % (json_path, md_path, results["duration_s"]))
        for target in results["targets"]:
            benchutil.log("target %-13s %s (%s)" % (target["status"], target["target"], target["value"]))
        return 0
    finally:
        ws.close()


if __name__ == "__main__":
    sys.exit(main())

"""benchmarks/: the entry point starts, and the results writer turns measurements into valid files.

No timings are asserted.  The real (quick) benchmark run is opt-in: PTXBACKEND_TEST_BENCHMARKS=1.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO

# The benchmarks run on the machines that measure (Python 3.7 and later: subprocess's capture_output,
# CuPy); the package itself, and its tests, still run on 3.6.
pytestmark = pytest.mark.skipif(sys.version_info < (3, 7), reason="the benchmarks need Python 3.7 or later")

BENCH = os.path.join(REPO, "benchmarks")


@pytest.fixture
def bench_modules(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    import benchutil
    import report
    return benchutil, report


def fake_results(benchutil):
    _stat = benchutil.summarize
    return {
        "schema": 1, "created": "2026-11-29 12:00:00 UTC", "duration_s": 12.5,
        "args": {"quick": True, "sections": ["compile", "warm", "hook", "concurrency", "kernels"]},
        "machine": {"hostname": "box", "cpu_count": 2, "python": "3.12.1"},
        "gpu": {"available": True, "name": "NVIDIA H200", "cc": 90, "driver_build": "580.159.03",
                "driver_cuda_version": "13.0"},
        "toolkits": {"nvcc13": {"kind": "nvcc", "version": "13.0.88", "path": "/x/nvcc", "origin": "PATH"},
                     "nvrtc13": {"missing": "not here | anywhere"}},
        "cupy": {"cupy_version": "14.2.0", "hook_active": False},
        "sections": {
            "compile": {"title": "Cold compile", "status": "ok", "notes": ["a note"],
                        "summary": {"worst_ratio": 1.04, "median_ratio": 1.01, "cells": 2},
                        "table": {"columns": ["kernel", "ratio"], "rows": [["elementwise", "1.01x"], ["matmul", "1.04x"]]},
                        "plots": [{"file": "compile.png", "title": "t", "ylabel": "s", "labels": ["a", "b"],
                                   "series": {"bare": [_stat([1.0, 1.1], "s"), _stat([2.0], "s")],
                                              "ours": [_stat([1.05], "s"), None]}}]},
            "warm": {"title": "Warm start", "status": "ok", "notes": [],
                     "summary": {"n": 100, "floor_ms": 0.05, "pb_cubin_ms": 0.06, "cupy_stock_ms": 0.3,
                                 "legacy_ptxbackend_warm_ms_per_kernel": 0.2},
                     "table": {"columns": ["path", "N=100"], "rows": [["floor", "0.05"]]}},
            "kernels": {"title": "Kernels", "status": "skipped", "notes": ["needs a GPU"], "summary": {}},
            "hook": {"title": "Hook", "status": "ok", "notes": [],
                     "summary": {"pass_ratio": 1.08, "boot_import_ms": 0.4, "pass_delta_ms": 1.0},
                     "table": {"columns": ["command", "ms"], "rows": [["python -c pass", "12 (11-13, n=30)"]]}},
            "concurrency": {"title": "Concurrency", "status": "ok", "notes": [],
                            "summary": {"processes": 16, "kernels": 50, "compiles": [50, 50], "each_once": True},
                            "table": {"columns": ["run"], "rows": [["16 processes"]]}},
        },
    }


def test_run_py_help_works():
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "run.py"), "--help"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0, proc.stderr
    assert "--quick" in proc.stdout and "--out" in proc.stdout and "--legacy-results" in proc.stdout
    assert "--ptxbackend-src" in proc.stdout and "--warm-rows" in proc.stdout


SUITE_NAMES = ("hit", "miss", "cupy-ab", "chainer-ab", "fleet", "libraries", "concurrency", "deps", "hook",
               "compile", "warm", "warm-compare", "kernels", "chainer-fleet", "fleet-scale", "pch", "anatomy")


def _listed_suites():
    """Every suite run.py names (read from its source, so a suite added later is started here too)."""
    import ast
    with open(os.path.join(BENCH, "run.py")) as handle:
        tree = ast.parse(handle.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["SUITES"]:
            return [entry[0] for entry in ast.literal_eval(node.value)]
    raise AssertionError("run.py has no SUITES")


def _run_py(argv, timeout=120, env=None):
    return subprocess.run([sys.executable, os.path.join(BENCH, "run.py")] + argv, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout, env=env)


def test_run_py_lists_the_suites_by_what_they_measure():
    proc = _run_py(["--list"])
    assert proc.returncode == 0, proc.stderr
    listed = {}
    for line in proc.stdout.splitlines():
        words = line.split()
        listed[words[0]] = "bench_%s.py" % words[2] if words[1] == "section" else words[1]
    assert set(SUITE_NAMES) <= set(listed) and set(listed) == set(_listed_suites()), listed
    for script in listed.values():
        assert os.path.isfile(os.path.join(BENCH, script)), script


@pytest.mark.parametrize("suite", _listed_suites())
def test_each_suite_starts_its_script(suite):
    proc = _run_py([suite, "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


def test_an_unknown_suite_is_one_clear_line():
    proc = _run_py(["warmhit"])
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no suite 'warmhit'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def _tree_040(tmp_path):
    """0.4.0 (flat layout) from git history, or None outside a git checkout."""
    dest = tmp_path / "pb040"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", REPO, "archive", "4f6f762"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    if archive.returncode != 0:
        return None
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return str(dest)


def test_hit_suite_pairs_two_trees_compile_only(nvrtc12_pair, tmp_path):
    """The hit suite on a CPU box: 0.4.0's flat layout (or this tree) against this tree's packages, one
    pair, NVRTC, every timed kernel a hit (ab_hit asserts it)."""
    before = _tree_040(tmp_path) or REPO
    out = tmp_path / "hit.json"
    env = dict(os.environ, PTXBACKEND_NVRTC=os.path.join(nvrtc12_pair[1], "libnvrtc.so.12"))
    proc = _run_py(["hit", "--before", before, "--pairs", "1", "--compile-only", "--out", str(out)],
                   timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["rows"]) == {"no headers total_us", "no headers compile_us", "headers total_us",
                                   "headers compile_us"}
    assert report["versions"]["before"]["from"] == os.path.join(before, "ptxbackend")
    assert report["versions"]["after"]["from"] == os.path.join(REPO, "ptxbackend")
    for row in report["rows"].values():
        assert row["before"] > 0 and row["after"] > 0 and row["ratio"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--ptxbackend-src", "/nonexistent-dir"], "no ptxbackend/__init__.py"),
    (["--ptxbackend-src", REPO, "--sections", "warm,hook"], "hook section"),
    (["--warm-rows", "pb_cubin,nonsense"], "unknown row(s) nonsense"),
])
def test_run_py_refuses_bad_warm_options(argv, message):
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "run.py")] + argv, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_summarize_reports_median_and_spread(bench_modules):
    benchutil, _ = bench_modules
    stat = benchutil.summarize([3.0, 1.0, 2.0, 10.0], "ms")
    assert (stat["median"], stat["min"], stat["max"], stat["reps"]) == (2.5, 1.0, 10.0, 4)
    assert stat["q1"] <= stat["median"] <= stat["q3"]
    assert benchutil.summarize([], "s")["median"] is None
    assert benchutil.fmt_stat(stat).startswith("2.50 (1.00-10.0, n=4)")


def test_targets_say_met_not_met_and_not_measured(bench_modules):
    benchutil, report = bench_modules
    targets = {t["target"]: t for t in report.evaluate_targets(fake_results(benchutil))}
    by_word = lambda word: [t for name, t in targets.items() if word in name][0]  # noqa: E731
    assert by_word("<= 1.5x the floor")["status"] == "met"              # 0.06 / 0.05 = 1.2
    assert by_word("20x faster")["status"] == "met" and "anchor" in by_word("20x faster")["detail"]
    assert by_word("faster than CuPy 14")["status"] == "met"           # 0.2 < 0.3
    assert by_word("within 5% of the bare")["status"] == "met"
    assert by_word("PTX-JIT")["status"] == "not measured"
    assert by_word("hook cost")["status"] == "not met"                 # pass 1.08x
    assert by_word("library first call")["status"] == "not measured"
    assert by_word("compiles each kernel once")["status"] == "met"
    assert all(t["status"] in ("met", "not met", "not measured") for t in targets.values())


def test_writer_produces_valid_json_and_markdown(bench_modules, tmp_path):
    benchutil, report = bench_modules
    results = fake_results(benchutil)
    json_path, md_path = report.write_results(results, str(tmp_path), plots=False)
    data = json.loads(open(json_path).read())
    assert data["machine"]["hostname"] == "box" and len(data["targets"]) == 9
    assert data["sections"]["compile"]["plots"][0]["series"]["bare"][0]["median"] == pytest.approx(1.05)
    text = open(md_path).read()
    assert "## Targets" in text and "## Toolkits" in text
    for title in ("Cold compile", "Warm start", "Kernels", "Hook", "Concurrency"):
        assert title in text
    assert "Status: **skipped**." in text and "needs a GPU" in text
    assert "not here \\| anywhere" in text  # a | inside a cell does not break the table
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            assert line.endswith(" |")


def test_plots_or_a_note(bench_modules, tmp_path):
    benchutil, report = bench_modules
    results = fake_results(benchutil)
    report.write_results(results, str(tmp_path), plots=True)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib" in results["plot_note"]
        return
    assert (tmp_path / "compile.png").stat().st_size > 0
    assert "![compile](compile.png)" in (tmp_path / "results.md").read_text()


def test_legacy_results_are_read_in_every_documented_shape(bench_modules):
    import bench_warm
    got = bench_warm.normalize_legacy({
        "stock_warm_ms_per_kernel": 3.07,
        "benchmarks": {"ptxbackend_warm_ms_per_kernel": [0.2, 0.25, 0.3],
                       "stock_hit_ms_per_kernel": {"median": 2.9, "min": 2.8, "max": 3.1, "reps": 3},
                       "ptxbackend_hit_ms_per_kernel": {"1": 0.5, "100": [0.05, 0.06]}},
        "unrelated": 1}, source="f.json")
    assert got["stock_warm_ms_per_kernel"]["median"] == 3.07
    assert got["ptxbackend_warm_ms_per_kernel"]["median"] == 0.25
    assert got["stock_hit_ms_per_kernel"]["max"] == 3.1
    assert got["ptxbackend_hit_ms_per_kernel"]["100"]["median"] == pytest.approx(0.055)
    assert "unrelated" not in got


@pytest.mark.skipif(os.environ.get("PTXBACKEND_TEST_BENCHMARKS") != "1",
                    reason="the benchmark run itself is opt-in: PTXBACKEND_TEST_BENCHMARKS=1")
def test_quick_benchmark_run(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "run.py"), "--quick", "--out", str(out)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert set(data["sections"]) == {"compile", "warm", "kernels", "hook", "libraries", "concurrency", "fleet"}
    assert all(s["status"] in ("ok", "skipped") for s in data["sections"].values()), \
        {k: s.get("notes") for k, s in data["sections"].items() if s["status"] not in ("ok", "skipped")}
    assert "## Targets" in (out / "results.md").read_text()


@pytest.mark.parametrize("toolkit", ["nvcc13", "nvcc112", "nvrtc117"])
def test_header_tree_kernel_compiles_to_the_plain_kernel(bench_modules, toolkit, request, monkeypatch, tmp_path):
    """The warm section's headers row: the tree compiles with every old and new compiler, and to the
    very code of the plain row, so that the two rows differ only in ptxbackend's own work."""
    benchutil, _ = bench_modules
    import ptxbackend
    path = request.getfixturevalue(toolkit)
    kind = "nvrtc" if toolkit.startswith("nvrtc") else "nvcc"
    monkeypatch.setenv("PTXBACKEND_NVRTC" if kind == "nvrtc" else "PTXBACKEND_NVCC", path)
    include = str(tmp_path / "include")
    names = benchutil.write_header_tree(include)
    assert benchutil.HEADER_ROOT in names and len(names) == 9
    for name in names:  # no standard library headers: NVRTC has none
        with open(os.path.join(include, name)) as handle:
            includes = [line for line in handle if line.lstrip().startswith("#include")]
        assert all("<bench/" in line for line in includes), (name, includes)
    source = benchutil.kernel_source("elementwise", 7, benchutil.HEADER_ROOT)
    assert source.startswith("#include <bench/carray.cuh>\n")
    build = dict(compiler=kind, target="compute_86", device_cc="9.0")  # what the warm section builds on an H200
    cold = ptxbackend.compile(source, ("-I", include), **build)
    hit = ptxbackend.compile(source, ("-I", include), **build)
    plain = ptxbackend.compile(benchutil.kernel_source("elementwise", 7), (), **build)
    assert not cold.cache_hit and hit.cache_hit and hit.key == cold.key != plain.key
    assert cold.kind == "ptx" and b".entry bench_axpby_strided" in cold.image
    assert cold.image == plain.image


def test_children_import_ptxbackend_from_ptxbackend_src(bench_modules, monkeypatch, tmp_path):
    benchutil, _ = bench_modules
    package = tmp_path / "old" / "ptxbackend"
    (package / "cache").mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.0.old"\n')
    (package / "cache" / "__init__.py").write_text("")
    (package / "tool.sh").write_text("#!/bin/sh\n")
    (package / "tool.sh").chmod(0o755)
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "x.pyc").write_bytes(b"not in git")
    monkeypatch.setattr(benchutil, "_ptxbackend_src", None)
    benchutil.set_ptxbackend_src(str(tmp_path / "old"))
    got = benchutil.spawn("benchutil", "ptxbackend_probe", {}, benchutil.clean_env(), timeout=120)
    assert got == {"version": "0.0.old", "dir": os.path.realpath(str(tmp_path / "old"))}
    assert benchutil.clean_env()["PYTHONPATH"].startswith(os.path.realpath(str(tmp_path / "old")) + os.pathsep)
    described = benchutil.describe_ptxbackend_src(benchutil.ptxbackend_src())
    assert described["commit"] is None  # not a work tree of its own (tmp_path is in none)
    git = __import__("shutil").which("git")
    if git:  # the tree id is git's own: `git rev-parse COMMIT:ptxbackend` names an archive of COMMIT
        repo = str(tmp_path / "old")
        subprocess.check_call([git, "init", "-q", repo])
        subprocess.check_call([git, "-C", repo, "add", "ptxbackend/__init__.py", "ptxbackend/cache",
                               "ptxbackend/tool.sh"])
        tree = subprocess.check_output([git, "-C", repo, "write-tree"], universal_newlines=True).strip()
        expected = subprocess.check_output([git, "-C", repo, "rev-parse", tree + ":ptxbackend"],
                                           universal_newlines=True).strip()
        assert described["tree"] == expected


def _warm_results(benchutil, hit_us, compile_us, tree, host="box"):
    stats = {}
    for key in hit_us:
        stats[key] = {n: {"per_kernel_ms": benchutil.summarize([v / 1000.0 for v in hit_us[key][n]], "ms"),
                          "compile_ms": benchutil.summarize([v / 1000.0 for v in compile_us[key][n]], "ms")}
                      for n in hit_us[key]}
    source = {"version": "0.2.0", "dir": "/x", "tree": tree, "commit": None}
    return {"created": "c", "machine": {"hostname": host}, "gpu": {"name": "NVIDIA H200", "driver_build": "580"},
            "ptxbackend": source,
            "sections": {"warm": {"status": "ok", "stats": stats, "run": {"created": "c", "ptxbackend_src": source},
                                  "rows": [["pb_cubin", "plain hit"], ["pb_cubin_hdr", "hit with headers"]]}}}


def test_compare_warm_judges_the_issue_budgets(bench_modules, tmp_path):
    benchutil, _ = bench_modules
    import ab_warm as compare_warm
    before = _warm_results(benchutil, {"pb_cubin": {"1": [300.0], "100": [180.0, 190.0, 200.0]},
                                       "pb_cubin_hdr": {"100": [185.0, 190.0, 195.0]}},
                           {"pb_cubin": {"1": [80.0], "100": [60.0]}, "pb_cubin_hdr": {"100": [62.0]}}, "a" * 40)
    after = _warm_results(benchutil, {"pb_cubin": {"1": [290.0], "100": [195.0, 199.0, 205.0]},
                                      "pb_cubin_hdr": {"100": [220.0, 230.0, 240.0]}},
                          {"pb_cubin": {"1": [81.0], "100": [70.0]}, "pb_cubin_hdr": {"100": [105.0]}}, "b" * 40)
    paths = []
    for name, data in (("before", before), ("after", after)):
        (tmp_path / name).mkdir()
        paths.append(str(tmp_path / name / "results.json"))
        with open(paths[-1], "w") as handle:
            json.dump(data, handle)
    text, verdicts = compare_warm.render(*paths)
    assert verdicts["pb_cubin"][0] == pytest.approx(9.0) and verdicts["pb_cubin"][2]       # +9 <= +10
    assert verdicts["pb_cubin_hdr"][0] == pytest.approx(40.0) and not verdicts["pb_cubin_hdr"][2]  # +40 > +30
    assert "two separate runs on the same machine" in text and "warning" not in text
    assert "| plain hit | 100 | 190.0 (180-200) | 199.0 (195-205) | +9.0 | +10 | met |" in text
    assert "| hit with headers, compile() only | 100 | 62.0 | 105.0 | +43.0 | - | - |" in text
    assert "| plain hit | 1 | 300.0 | 290.0 | -10.0 | - | - |" in text
    assert compare_warm.main(paths) == 0
    assert (tmp_path / "after" / "compare-warm.md").read_text() == text
    with open(paths[1], "w") as handle:
        json.dump(_warm_results(benchutil, {"pb_cubin": {"100": [1.0]}}, {"pb_cubin": {"100": [1.0]}}, "a" * 40,
                                host="other"), handle)
    text, _ = compare_warm.render(*paths)
    assert "differ in host" in text and "same ptxbackend" in text and "with headers, N=100: not measured" in text


def _ab_child(per_kernel, median, gc_ms, full, stages=None):
    child = {"per_kernel_ms": per_kernel, "median_kernel_ms": median, "with_first_ms": per_kernel, "wall_s": 3.0,
             "gc": {"runs_by_generation": [40, 4, full], "ms_per_kernel": gc_ms},
             "caches": {"cupy": {"before": {"files": 0}, "after": {"files": 0}},
                        "ptxbackend": {"before": {"bytes": 0}, "after": {"bytes": 0}}},
             "cache_function_ms_per_kernel": per_kernel / 2, "cache_bytes_per_kernel": 0}
    if stages is not None:
        child["artifacts"] = {"hits": 100, "served": 100, "in_compile_us_per_kernel": 72.0}
        child["stages"] = {name: {"us_per_kernel": us, "median_us": us, "calls": 100} for name, us in stages.items()}
    return child


def test_cupy14_ab_summary_shows_the_collector_and_the_hook_s_steps(monkeypatch):
    """The warm-time table separates a few slow kernels (mean against median), the garbage collector and
    each of the hook's steps, so the next H200 run says where a tree arm's time inside the cache function goes."""
    monkeypatch.syspath_prepend(BENCH)
    import ab_cupy as cupy14_ab
    runs = []
    for phase in ("cold", "warm"):
        for arm, child in (("stock", _ab_child(0.6, 0.4, 0.15, 1)),
                           ("now", _ab_child(0.45, 0.3, 0.05, 0, {"_use_cupy_context": 4.4, "_load": 61.0}))):
            runs.append(dict(child, arm=arm, phase=phase, round=0))
    results = {"started": 0, "kernels": 100, "rounds_done": 1, "runs": runs,
               "machine": {"gpu": "H200"}, "arms": [{"name": "stock", "dir": None}, {"name": "now", "dir": "/t"}]}
    results["summary"] = cupy14_ab.summarise(results)
    warm = results["summary"]["now"]
    assert warm["warm_gc"]["median"] == 0.05 and warm["warm_gc_full_runs"] == [0]
    assert warm["warm_stages"]["_load"]["median"] == 61.0
    text = cupy14_ab.render(results)
    row = [line for line in text.splitlines() if line.startswith("| now |") and "use_cupy_context 4.4" in line][0]
    assert "| 0.300 (0.300-0.300) | 0.050 (0.050-0.050) | [0] |" in row and "| 72.0 (72.0-72.0) |" in row
    assert "load 61.0" in row
    assert "| stock | 0.600 (0.600-0.600) | 0.400 (0.400-0.400) | 0.150 (0.150-0.150) | [1] |" in text


# --------------------------------------------------------------------------- the one A/B runner (ab.py)

def _ab(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    import ab
    return ab


def test_ab_rounds_rotate_the_arms_save_every_child_and_stop_at_the_budget(monkeypatch):
    """The rounds loop every workload uses: ABAB order reversed each round, each child recorded and saved
    as it comes, round 0 always run, and no round started that the longest so far would push past the budget."""
    ab = _ab(monkeypatch)
    arms = [{"name": "stock", "dir": None}, {"name": "now", "dir": "/t"}]
    ran, saved = [], []

    def run_arm(arm, r):
        for phase in ab.PHASES:
            ran.append((r, arm["name"], phase))
            time.sleep(0.05)
            yield phase, {"per_kernel_ms": 1.0 + r, "wall_s": 0.05}, "fig"

    results = {"checks": {}, "runs": [], "rounds_done": 0}
    ab.run_rounds(results, 4, lambda r: ab.round_order(arms, r), run_arm,
                  lambda res: saved.append(len(res["runs"])), None, time.perf_counter())
    assert [(r, a) for r, a, p in ran if p == "cold"] == [(0, "stock"), (0, "now"), (1, "now"), (1, "stock"),
                                                           (2, "stock"), (2, "now"), (3, "now"), (3, "stock")]
    assert results["rounds_done"] == 4 and len(results["runs"]) == 16 and saved[:2] == [1, 2]
    assert "stopped_by_budget" not in results
    per = ab.by_arm_and_phase(results["runs"])
    assert ab.phase_figures("warm", per[("now", "warm")], per[("stock", "warm")])["warm_ratio"]["median"] == 1.0

    results = {"checks": {}, "runs": [], "rounds_done": 0}
    ab.run_rounds(results, 4, lambda r: ab.round_order(arms, r), run_arm, lambda res: None, 0.25,
                  time.perf_counter())
    assert results["rounds_done"] == 1 and results["stopped_by_budget"] is True  # round 1 would end past 0.25 s


def test_ab_lists_its_workloads_and_refuses_an_unknown_one_in_a_line():
    listed = subprocess.run([sys.executable, os.path.join(BENCH, "ab.py"), "--list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True)
    assert listed.returncode == 0
    names = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert names == ["hit", "miss", "cupy", "chainer", "anatomy", "warm"]
    for name in names:
        assert os.path.isfile(os.path.join(BENCH, "ab_%s.py" % name))
    bad = subprocess.run([sys.executable, os.path.join(BENCH, "ab.py"), "nope"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no workload 'nope'" in bad.stderr


def test_a_tree_arm_may_have_either_layout(monkeypatch, tmp_path):
    """The Chainer A/B needs the hook's module in the package layout (hook/cupy_integration.py) or in
    0.4.0's flat one; a tree with neither is refused before any child runs."""
    monkeypatch.syspath_prepend(BENCH)
    import ab_chainer
    trees = [("now", REPO)]
    flat = _tree_040(tmp_path)
    if flat:
        trees.append(("flat", flat))
    arms = ab_chainer._parse_arms(["%s=%s" % t for t in trees], False)
    assert [a["name"] for a in arms] == [t[0] for t in trees] and arms[0]["version"]
    broken = tmp_path / "broken"
    shutil.copytree(os.path.join(REPO, "ptxbackend"), str(broken / "ptxbackend"))
    for name in ("_ptxbackend_pth.py", "_ptxbackend_boot.py"):
        shutil.copy(os.path.join(REPO, name), str(broken))
    os.remove(str(broken / "ptxbackend" / "hook" / "cupy_integration.py"))
    with pytest.raises(SystemExit, match="no ptxbackend/hook/cupy_integration.py or ptxbackend/cupy_integration.py"):
        ab_chainer._parse_arms(["b=%s" % broken], False)


def test_miss_suite_runs_two_trees_in_rotated_rounds(nvrtc_pch, tmp_path):
    """The miss suite on a CPU box: 0.4.0's flat layout (or this tree) against this tree, NVRTC 13, two
    rounds of two kernels; each tree's own ms per miss and its ratio to the first."""
    pytest.importorskip("cupy")
    before = _tree_040(tmp_path) or REPO
    lib = [n for n in os.listdir(nvrtc_pch) if n.startswith("libnvrtc.so")][0]
    env = dict(os.environ, PTXBACKEND_NVRTC=os.path.join(nvrtc_pch, lib))
    proc = _run_py(["miss", "--tree", "before=" + before, "--tree", "now=" + REPO, "--kernels", "2",
                    "--pairs", "2"], timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| before |", "| now |"))]
    assert len(rows) == 2 and rows[0].endswith("| 1.00 |"), proc.stdout
    assert float(rows[1].split("|")[3]) > 0
    assert "before: ptxbackend" in proc.stdout and "now: ptxbackend" in proc.stdout


@pytest.mark.parametrize("suite, shows", [
    ("deps", "| ratio | "),
    ("pch", "on / off, the rest, per round:"),
    ("fleet-scale", '"states"'),
])
def test_cpu_script_suites_run_at_their_quick_size(suite, shows, nvrtc_pch):
    """``run.py SUITE --quick`` on a CPU box: the suite's smallest size, its figures printed (no timing is
    judged here), so a suite broken by a change fails CI rather than the next measurement."""
    if suite == "deps":
        pytest.importorskip("cupy")
    lib = [n for n in os.listdir(nvrtc_pch) if n.startswith("libnvrtc.so")][0]
    proc = _run_py([suite, "--quick"], timeout=600, env=dict(os.environ, PTXBACKEND_NVRTC=os.path.join(nvrtc_pch, lib)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert shows in proc.stdout, proc.stdout[-3000:]

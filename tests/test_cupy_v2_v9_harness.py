"""CPU checks of the CuPy v2-v9 harness (tests/cupy_v2_v9/), with real gcc-built libraries.

- stubgen.py: a stub exports exactly the functions the modules import from its library (by prefix;
  the driver's rule: cu + a capital), under a version node named like the library; a consumer built
  against the real library loads against the stub, and a stub that is called aborts naming itself
  (on stderr and in PTXB_STUB_LOG);
- stubgen.py --forward: a consumer asking for ``@libnvrtc.so.11.1`` reaches another library's
  functions through the forwarder, and a missing real library aborts naming it;
- chunk_plugin.py: V2V9_IDS_FILE gets the collection (after V2V9_DESELECT), V2V9_RANGE runs those
  positions, V2V9_PROGRESS gets each outcome as junit would name it, and a crash leaves what came before;
  V2V9_COMBINATION_SHARD splits the real cupy.testing's full dtype combinations into disjoint shards;
- ledger.py: missing ranges, a crash found after the fact, the round trip, stale entries, the comparison;
- harness.py: step d resumes from earlier calls' ledgers and compares over all of them (real pytest
  processes, one of whose tests aborts), and its warm-up runs shards that are not counted; its COMPILED / HIT / DELEGATED regexes against the log lines
  ptxbackend really writes (the delegation's digest is the sha256 of the source CuPy saves), via log_facts;
- the scripts' syntax (Python, and ``bash -n``).
"""

import hashlib
import importlib.util
import io
import json
import logging
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import types

import pytest

from conftest import REPO, SAXPY, _missing
from ptxbackend.hook import cupy_integration as ci

HERE = os.path.join(REPO, "tests", "cupy_v2_v9")
STUBGEN = os.path.join(HERE, "stubgen.py")
# harness.py is imported under its own name: tests/legacy has a `harness` module too.
_spec = importlib.util.spec_from_file_location("cupy_v2_v9_harness", os.path.join(HERE, "harness.py"))
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)
import ledger  # noqa: E402  (harness.py put tests/cupy_v2_v9 on sys.path)
CALL = "import ctypes, sys; print(getattr(ctypes.CDLL(sys.argv[1]), sys.argv[2])(*map(int, sys.argv[3:])))"


def _run(cmd, **kwargs):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    return proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")


def _tools():
    for tool in ("gcc", "nm", "readelf"):
        if not shutil.which(tool):
            _missing("`%s`" % tool)


def _write(path, text):
    with open(path, "w") as handle:
        handle.write(text)
    return path


def _lib(out, soname, code, version_node=False, link=()):
    """A shared library from C ``code`` (with the soname, optionally a version node of that name)."""
    if not os.path.isdir(os.path.dirname(out)):
        os.makedirs(os.path.dirname(out))
    cmd = ["gcc", "-shared", "-fPIC", "-o", out, _write(out + ".c", code)]
    if soname:
        cmd += ["-Wl,-soname," + soname]
    if version_node:
        cmd += ["-Wl,--version-script," + _write(out + ".map", "%s { global: *; };\n" % soname)]
    for lib_dir, name in link:
        cmd += ["-L" + lib_dir, "-l:" + name]
    code_, _out, err = _run(cmd)
    assert code_ == 0, err
    return out


def _stubgen(*args):
    return _run([sys.executable, STUBGEN] + list(args))


def _build_stub(src_dir, lib_dir, soname):
    """Exactly build.sh's command for a stub or forwarder."""
    code, _out, err = _run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname," + soname,
                            "-Wl,--version-script," + os.path.join(src_dir, soname + ".map"),
                            "-o", os.path.join(lib_dir, soname), os.path.join(src_dir, soname + ".c"), "-ldl"])
    assert code == 0, err
    return os.path.join(lib_dir, soname)


def _map_symbols(path):
    with open(path) as handle:
        return set(line.strip().rstrip(";") for line in handle if line.startswith("    "))


# --------------------------------------------------------------------------- stubgen.py: stubs

@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    """Real libraries, two consumer modules (one in a subfolder) and the stubs stubgen makes for them."""
    _tools()
    root = str(tmp_path_factory.mktemp("stubs"))
    real, mods, src, out = (os.path.join(root, d) for d in ("real", "mods", "src", "out"))
    # cuBLAS as CuPy 9's modules see it: versioned (cublasCreate_v2@libcublas.so.8.0)
    _lib(os.path.join(real, "libcublas.so.8.0"), "libcublas.so.8.0",
         "int cublasCreate_v2(void **h) { return 0; }\nint cublasDestroy_v2(void *h) { return 0; }\n", True)
    _lib(os.path.join(real, "libcufft.so.8.0"), "libcufft.so.8.0", "int cufftPlan1d(void *p, int n) { return 0; }\n")
    _lib(os.path.join(real, "libcuda.so.1"), "libcuda.so.1", "int cuInit(unsigned f) { return 0; }\n")
    _lib(os.path.join(real, "libcudart.so.8.0"), "libcudart.so.8.0", "int cudaMalloc(void **p, long n) { return 0; }\n")
    _lib(os.path.join(mods, "a.so"), None,
         "int cublasCreate_v2(void **h);\nint cublasDestroy_v2(void *h);\n"
         "int use_cublas(void) { void *h = 0; int r = cublasCreate_v2(&h); return r + cublasDestroy_v2(h); }\n",
         link=[(real, "libcublas.so.8.0")])
    _lib(os.path.join(mods, "sub", "b.so"), None,
         "#include <stdio.h>\nint cublasCreate_v2(void **h);\nint cufftPlan1d(void *p, int n);\n"
         "int cuInit(unsigned f);\nint cudaMalloc(void **p, long n);\n"
         "int use_all(void) { void *h = 0; printf(\"x\"); return cublasCreate_v2(&h) + cufftPlan1d(h, 1)"
         " + cuInit(0) + cudaMalloc(&h, 1); }\n",
         link=[(real, n) for n in ("libcublas.so.8.0", "libcufft.so.8.0", "libcuda.so.1", "libcudart.so.8.0")])
    code, text, err = _stubgen(mods, src, "libcublas.so.8.0", "libcufft.so.8.0", "libcuda.so.1")
    assert code == 0, text + err
    os.makedirs(out)
    for soname in ("libcublas.so.8.0", "libcufft.so.8.0", "libcuda.so.1"):
        _build_stub(src, out, soname)
    return {"mods": mods, "src": src, "out": out}


def test_stub_exports_exactly_the_imported_functions_under_its_version_node(stubs):
    lib = os.path.join(stubs["out"], "libcublas.so.8.0")
    _code, out, _err = _run(["nm", "-D", "--defined-only", lib])
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert set(r[2].split("@")[0] for r in rows if r[1] == "T") == {"cublasCreate_v2", "cublasDestroy_v2"}
    assert set(r[2].split("@")[0] for r in rows if r[1] != "T") <= {"libcublas.so.8.0"}  # the node itself
    _code, out, _err = _run(["readelf", "-V", lib])
    nodes = [line.split("Name:")[1].strip() for line in out.splitlines()  # .gnu.version_d, past BASE
             if "Rev:" in line and "Flags: none" in line]
    assert nodes == ["libcublas.so.8.0"], out


def test_each_library_gets_only_its_own_prefix_and_the_driver_only_cu_capital(stubs):
    src = stubs["src"]
    assert _map_symbols(os.path.join(src, "libcublas.so.8.0.map")) == {"cublasCreate_v2", "cublasDestroy_v2"}
    assert _map_symbols(os.path.join(src, "libcufft.so.8.0.map")) == {"cufftPlan1d"}
    assert _map_symbols(os.path.join(src, "libcuda.so.1.map")) == {"cuInit"}  # not cudaMalloc (cudart)
    with open(os.path.join(src, "symbols.json")) as handle:
        assert json.load(handle) == {"libcublas.so.8.0": ["cublasCreate_v2", "cublasDestroy_v2"],
                                     "libcufft.so.8.0": ["cufftPlan1d"], "libcuda.so.1": ["cuInit"]}


@pytest.mark.parametrize("target", ["consumer", "stub"])
def test_a_called_stub_aborts_naming_itself(stubs, target, tmp_path):
    """Through the consumer: its versioned imports resolve against the stub, then the call aborts; the
    line also goes to PTXB_STUB_LOG (pytest's captured stderr is lost on abort)."""
    if target == "consumer":
        argv = [os.path.join(stubs["mods"], "a.so"), "use_cublas"]
        expected = "STUB CALLED: libcublas.so.8.0 cublasCreate_v2"
    else:
        argv = [os.path.join(stubs["out"], "libcublas.so.8.0"), "cublasDestroy_v2"]
        expected = "STUB CALLED: libcublas.so.8.0 cublasDestroy_v2"
    record = str(tmp_path / "stubs-called.txt")
    env = dict(os.environ, LD_LIBRARY_PATH=stubs["out"], PTXB_STUB_LOG=record)
    code, out, err = _run([sys.executable, "-c", CALL] + argv, env=env)
    assert code == -signal.SIGABRT, (code, out, err)
    assert expected in err and "version" not in err, err
    with open(record) as handle:
        assert expected in handle.read()


def test_a_name_no_module_imports_from_is_refused(stubs, tmp_path):
    code, out, err = _stubgen(stubs["mods"], str(tmp_path / "x"), "libcurand.so.8.0")
    assert code != 0 and "no module imports anything from libcurand.so.8.0" in err


# --------------------------------------------------------------------------- stubgen.py --forward

@pytest.fixture(scope="module")
def forward(tmp_path_factory):
    _tools()
    if platform.machine() != "x86_64":
        pytest.skip("the forwarder's trampolines are x86-64")
    root = str(tmp_path_factory.mktemp("forward"))
    real, build, mods, src, run = (os.path.join(root, d) for d in ("real", "build", "mods", "src", "run"))
    _lib(os.path.join(real, "libreal.so.2"), "libreal.so.2",
         "int nvrtcAnswer(void) { return 42; }\nint nvrtcAdd(int a, int b) { return a + b; }\n", True)
    # what the module was linked against: the old name and version node, other answers
    _lib(os.path.join(build, "libnvrtc.so.11.1"), "libnvrtc.so.11.1",
         "int nvrtcAnswer(void) { return -1; }\nint nvrtcAdd(int a, int b) { return -2; }\n", True)
    _lib(os.path.join(mods, "consumer.so"), None,
         "int nvrtcAnswer(void);\nint nvrtcAdd(int a, int b);\n"
         "int answer(void) { return nvrtcAnswer(); }\nint add(int a, int b) { return nvrtcAdd(a, b); }\n",
         link=[(build, "libnvrtc.so.11.1")])
    code, text, err = _stubgen("--forward", "libreal.so.2", mods, src, "libnvrtc.so.11.1")
    assert code == 0, text + err
    os.makedirs(run)
    _build_stub(src, run, "libnvrtc.so.11.1")
    shutil.copy(os.path.join(real, "libreal.so.2"), run)
    return {"consumer": os.path.join(mods, "consumer.so"), "run": run, "root": root}


def test_forwarder_reaches_the_real_library(forward):
    env = dict(os.environ, LD_LIBRARY_PATH=forward["run"])
    for argv, expected in ((["answer"], "42"), (["add", "1000", "234"], "1234")):
        code, out, err = _run([sys.executable, "-c", CALL, forward["consumer"]] + argv, env=env)
        assert (code, out.strip()) == (0, expected), err
        assert "version" not in err, err


def test_forwarder_without_its_real_library_aborts_naming_it(forward):
    alone = os.path.join(forward["root"], "alone")
    os.makedirs(alone)
    shutil.copy(os.path.join(forward["run"], "libnvrtc.so.11.1"), alone)
    code, out, err = _run([sys.executable, "-c", CALL, forward["consumer"], "answer"],
                          env=dict(os.environ, LD_LIBRARY_PATH=alone))
    assert code == -signal.SIGABRT, (code, out, err)
    assert "libnvrtc.so.11.1 cannot load libreal.so.2" in err, err


# --------------------------------------------------------------------------- chunk_plugin.py

PLUGIN_TESTS = """import os, pytest

def test_00():
    pass

def test_01():
    assert os.environ.get("PTXB_T_FAIL") != "1"

@pytest.fixture
def broken():
    raise RuntimeError("setup")

def test_02(broken):
    pass

def test_03():
    pytest.skip("no")

@pytest.mark.xfail(reason="known")
def test_04():
    assert False

def test_05():
    if os.environ.get("PTXB_T_CRASH") == "1":
        os.abort()

@pytest.mark.parametrize("i", range(3))
def test_p(i):
    pass
"""


def _plugin(tmp_path, **env):
    """Run pytest with chunk_plugin over PLUGIN_TESTS; returns (rc, stdout, progress lines, collected ids)."""
    if not os.path.exists(str(tmp_path / "test_many.py")):
        _write(str(tmp_path / "test_many.py"), PLUGIN_TESTS)
    progress, ids = str(tmp_path / "progress.jsonl"), str(tmp_path / "ids.json")
    for path in (progress, ids):
        if os.path.exists(path):
            os.remove(path)
    env = dict(os.environ, PYTHONPATH=HERE, PYTHONDONTWRITEBYTECODE="1", V2V9_PROGRESS=progress,
               V2V9_IDS_FILE=ids, **env)
    code, out, err = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "chunk_plugin", "-q",
                           "test_many.py"], env=env, cwd=str(tmp_path))
    with open(ids) as handle:
        collected = json.load(handle)
    return code, out + err, ledger.progress(progress), collected


def test_progress_records_each_outcome_as_junit_names_it(tmp_path):
    code, out, done, ids = _plugin(tmp_path, PTXB_T_FAIL="1")
    assert code == 1, out
    assert ids == ["test_many.py::test_%02d" % i for i in range(6)] + ["test_many.py::test_p[%d]" % i
                                                                       for i in range(3)]
    assert done == {0: (ids[0], "passed"), 1: (ids[1], "failed"), 2: (ids[2], "error"), 3: (ids[3], "skipped"),
                    4: (ids[4], "skipped"), 5: (ids[5], "passed"), 6: (ids[6], "passed"), 7: (ids[7], "passed"),
                    8: (ids[8], "passed")}


@pytest.mark.parametrize("deselect", ["", "test_p,test_03"])
def test_a_range_runs_those_positions_of_the_collection_after_deselection(tmp_path, deselect):
    _code, out, everything, ids = _plugin(tmp_path, V2V9_DESELECT=deselect)
    if deselect:
        assert ids == ["test_many.py::test_%02d" % i for i in (0, 1, 2, 4, 5)]
    assert sorted(everything) == list(range(len(ids))), out
    code, out, done, ids2 = _plugin(tmp_path, V2V9_DESELECT=deselect, V2V9_RANGE="1:4")
    assert ids2 == ids  # the whole collection, whatever the range
    assert done == {i: everything[i] for i in (1, 2, 3)}, out


@pytest.mark.parametrize("deselect, dropped", [("test_many.py::test_03", ["test_03"]),
                                               ("test_other.py::test_03", []), ("test_03", ["test_03"])])
def test_a_deselection_can_name_the_file_of_the_function(tmp_path, deselect, dropped):
    """CuPy 13.6's test_userkernel.py and test_reduction.py both have a test_cached_code; only the first
    draws from cuRAND."""
    _code, out, _done, ids = _plugin(tmp_path, V2V9_DESELECT=deselect)
    assert [i for i in ["test_00", "test_03"] if "test_many.py::" + i not in ids] == dropped, out


def test_a_crash_leaves_the_outcomes_before_it_and_the_harness_finds_the_crashed_test(tmp_path):
    code, out, done, ids = _plugin(tmp_path, PTXB_T_CRASH="1", V2V9_RANGE="3:8")
    assert code == -signal.SIGABRT, out
    assert sorted(done) == [3, 4]
    assert ledger.after_exit(3, 8, done) == (5, (6, 8))  # test_05 crashed; 6-7 go to a new process
    assert ledger.after_exit(3, 6, {3: "x", 4: "x", 5: "x"}) == (None, None)
    assert ledger.after_exit(3, 6, {3: "x", 4: "x"}) == (5, None)


def test_nvtx_symbols_belong_to_libnvtoolsext_only():
    import stubgen  # harness.py put tests/cupy_v2_v9 on sys.path
    assert stubgen.belongs("nvtxRangePushA", "libnvToolsExt.so.1")  # CuPy 10-11 link NVTX
    assert not stubgen.belongs("cublasCreate_v2", "libnvToolsExt.so.1")
    assert not stubgen.belongs("nvtxRangePushA", "libnvrtc.so.11.1")


def test_the_releases_that_build_sass_as_shipped_get_the_ptx_baseline():
    # CuPy 9+ asks NVRTC 11.7 for an sm_86 cubin, which the H200 cannot run: step a expects that failure and
    # step d's stock baseline needs CUPY_COMPILE_WITH_PTX=1; 7.8.0 builds PTX the driver links.
    assert [harness.builds_sass_as_shipped(v) for v in ("7.8.0", "9.6.0", "13.6.0")] == [False, True, True]
    assert set(harness.NEEDS_STUBBED_LIBRARY) == {"7.8.0", "9.6.0", "13.6.0"}


# --------------------------------------------------------------------------- ledger.py

def test_missing_ranges_cover_exactly_what_is_missing_in_bounded_pieces():
    assert ledger.missing_ranges(10, set(), 4) == [(0, 4), (4, 8), (8, 10)]
    assert ledger.missing_ranges(10, {0, 1, 5}, 3) == [(2, 5), (6, 9), (9, 10)]
    assert ledger.missing_ranges(3, {0, 1, 2}, 2) == []
    assert ledger.missing_ranges(0, set(), 2) == []


def test_ledger_round_trip_stale_entries_and_comparison(tmp_path):
    ids = {"a.py": ["a::t0", "a::t1", "a::t2"], "b.py": ["b::t0"]}
    entries = {("a.py", "stock", 0): ("a::t0", "passed"), ("a.py", "hook", 0): ("a::t0", "passed"),
               ("a.py", "stock", 1): ("a::t1", "failed"), ("a.py", "hook", 1): ("a::t1", "passed"),
               ("a.py", "stock", 2): ("a::t2", "skipped"),
               ("b.py", "stock", 0): ("b::t0", "passed"), ("b.py", "hook", 0): ("b::t0", "passed")}
    path = str(tmp_path / "l.jsonl.gz")
    ledger.write(path, entries)
    later = str(tmp_path / "m.jsonl.gz")
    ledger.write(later, {("a.py", "hook", 2): ("a::t2", "skipped")})
    merged = ledger.read([path, later])
    expected = dict(entries)
    expected[("a.py", "hook", 2)] = ("a::t2", "skipped")
    assert merged == expected
    assert ledger.stale(merged, ids) == []
    assert ledger.stale(merged, {"a.py": ["a::t0", "a::OTHER"], "b.py": ids["b.py"]}) == [
        ("a.py", "hook", 1), ("a.py", "hook", 2), ("a.py", "stock", 1), ("a.py", "stock", 2)]
    report = ledger.compare(merged, ids)
    assert report["complete"] is True
    assert report["differences"] == [{"file": "a.py", "i": 1, "id": "a::t1", "stock": "failed", "hook": "passed"}]
    assert report["files"]["a.py"]["stock"] == {"passed": 1, "failed": 1, "skipped": 1}
    assert report["totals"] == {"stock": {"passed": 2, "failed": 1, "skipped": 1},
                                "hook": {"passed": 3, "skipped": 1}}
    del merged[("b.py", "hook", 0)]
    report = ledger.compare(merged, ids)
    assert report["complete"] is False and report["files"]["b.py"]["done_in_both"] == 0


# --------------------------------------------------------------------------- harness.py step d

STEP_D_TESTS = """import os

def test_ok():
    pass

def test_differs():
    assert "PTXBACKEND_CACHE_DIR" not in os.environ   # set in the hook mode only

def test_crash():
    os.abort()

""" + "".join("def test_more_%d():\n    pass\n\n" % i for i in range(4))


def _step_d(tmp_path, ledger_dir, files, **extra):
    """Harness.step_tests over two small files of plain pytest tests (this interpreter in both modes)."""
    tests = tmp_path / "cupy_tests"
    for f in files:
        path = tests / "tests" / "cupy_tests" / f
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            _write(str(path), STEP_D_TESTS)
    work, out = tmp_path / "work", tmp_path / "out"
    for d in (work / "logs", out, tmp_path / "libs"):
        d.mkdir(parents=True, exist_ok=True)
    env = {"V2V9_VERSION": "7.8.0", "OUT": str(out), "V2V9_WORK": str(work), "V2V9_PYTHON": sys.executable,
           "V2V9_HOOK_PYTHON": sys.executable, "V2V9_LIBS": str(tmp_path / "libs"), "V2V9_TESTS": str(tests),
           "V2V9_CUDA_PATH": str(tmp_path), "V2V9_LEDGER": str(ledger_dir), "V2V9_TESTS_PER_PROCESS": "3",
           "V2V9_PROCESSES": "2", "V2V9_TEST_FILES": " ".join(files)}
    env.update(extra)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        h = harness.Harness()
        h.step_tests()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return h.summary, str(out / "v2v9-7.8.0-ledger.jsonl.gz")


def test_step_d_resumes_from_the_ledger_and_compares_over_all_calls(tmp_path):
    files = ["core_tests/test_one.py", "math_tests/test_two.py"]
    empty = tmp_path / "ledger0"
    empty.mkdir()
    summary, written = _step_d(tmp_path, empty, files[:1])
    d = summary["steps"]["d_cupy_tests"]
    row = d["files_report"]["core_tests/test_one.py"]
    assert (row["collected"], row["done_in_both"]) == (7, 7)
    assert row["stock"] == {"passed": 6, "crashed": 1}, d["processes"]
    assert row["hook"] == {"passed": 5, "failed": 1, "crashed": 1}
    assert [(x["i"], x["stock"], x["hook"]) for x in d["differences"]] == [(1, "passed", "failed")]
    # ranges 0-3, 3-6, 6-7 a mode; test 2 crashes the 0-3 processes at their last test: nothing to re-run
    assert d["this_call"]["processes"] == 6 and d["this_call"]["tests"] == 14
    # a second call with that ledger runs only what is new: the second file
    carried = tmp_path / "ledger1"
    carried.mkdir()
    shutil.copy(written, str(carried / "call1.jsonl.gz"))
    summary, written = _step_d(tmp_path, carried, files)
    d = summary["steps"]["d_cupy_tests"]
    assert d["ledger_in"] == {"entries": 14, "stale": 0}
    assert d["this_call"]["tests"] == 14 and all("test_two" in p["tag"] for p in d["processes"])
    assert [(x["file"], x["i"]) for x in d["differences"]] == [(f, 1) for f in files]
    checks = {c["check"].split(" (")[0]: c["ok"] for c in d["checks"]}
    assert checks["every test ran in both modes, over this call and earlier ones"] is True
    assert checks["earlier calls' outcomes match this collection"] is True
    # an earlier outcome filed under another test's position is dropped and reported, then run again
    entries = ledger.read([written])
    entries[("core_tests/test_one.py", "hook", 6)] = ("core_tests/test_one.py::test_renamed", "passed")
    del entries[("core_tests/test_one.py", "stock", 5)]
    ledger.write(str(carried / "call1.jsonl.gz"), entries)
    summary, _ = _step_d(tmp_path, carried, files)
    d = summary["steps"]["d_cupy_tests"]
    assert d["ledger_in"]["stale"] == 1
    assert sorted(p["tag"] for p in d["processes"]) == ["d_hook_core_tests_test_one_6-7",
                                                          "d_stock_core_tests_test_one_5-6"]
    checks = {c["check"].split(" (")[0]: c["ok"] for c in d["checks"]}
    assert checks["earlier calls' outcomes match this collection"] is False


# --------------------------------------------------------------------------- harness.py log lines

def _log_facts(text, logs):
    """Harness.log_facts for one process whose stub record would be ``logs/p.stubs-called``."""
    return harness.Harness.log_facts(text, os.path.join(logs, "p.stubs-called"))


def test_compiled_and_hit_match_ptxbackends_own_log_lines(nvcc13, tmp_path):
    env = dict(os.environ, PTXBACKEND_LOG="debug", PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"),
               PTXBACKEND_COMPILER="nvcc", PTXBACKEND_NVCC=nvcc13,
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    program = ("import ptxbackend\na = ptxbackend.compile(%r, target='compute_75')\n"
               "print(a.key, a.target, a.producer, a.cache_hit)" % SAXPY)
    runs = []
    for _ in range(2):
        code, out, err = _run([sys.executable, "-c", program], env=env, cwd=str(tmp_path))
        assert code == 0, err
        runs.append((out.split(), err))
    (key, target, producer, hit), err = runs[0]
    assert (target, hit) == ("compute_75", "False")
    assert harness.COMPILED.findall(err) == [(key[:12], "compute_75", producer)], err
    assert not harness.HIT.search(err), err
    (key2, _t, _p, hit2), err2 = runs[1]
    assert (key2, hit2) == (key, "True")
    facts = _log_facts(err2, str(tmp_path))
    assert (facts["compiled"], facts["hits"], facts["delegated"]) == ([], 1, []), err2


def test_delegated_matches_the_hook_log_and_names_the_source_digest(tmp_path):
    compiler = types.ModuleType("cupy.cuda.compiler")
    compiler.runtime = types.SimpleNamespace(is_hip=False)
    calls = []

    def compile_with_cache(source, options=(), arch=None, cache_dir=None, extra_source=None, backend='nvrtc', *,
                           enable_cooperative_groups=False, name_expressions=None, log_stream=None, jitify=False):
        calls.append(source)
        return "CuPy's own module"
    compiler.compile_with_cache = compile_with_cache
    assert ci.generation(compiler) == "v2-v9"
    replacement = ci._make_replacement(compiler, "v2-v9", compile_with_cache)
    first = 'extern "C" __global__ void k1(float* x) { x[0] = 1.0f; }\n'
    second = 'template<typename T> __global__ void k2(T* x) { x[0] = T(2); }\n'

    logger = logging.getLogger("ptxbackend")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))  # as PTXBACKEND_LOG writes them
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        assert replacement(first, ("-DX=1",), jitify=True) == "CuPy's own module"
        assert replacement(second, name_expressions=["k2<float>"]) == "CuPy's own module"
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    text = stream.getvalue()
    assert calls == [first, second]
    expected = [("jitify", hashlib.sha256(first.encode()).hexdigest()),
                ("name_expressions", hashlib.sha256(second.encode()).hexdigest())]
    assert harness.DELEGATED.findall(text) == expected, text
    logs = str(tmp_path)
    facts = _log_facts(text + "ptxbackend harness: STUB CALLED: libcublas.so.11 cublasCreate_v2\n", logs)
    assert (facts["compiled"], facts["hits"], facts["delegated"], facts["stub_called"]) == ([], 0, expected, True)
    assert _log_facts(text, logs)["stub_called"] is False
    _write(os.path.join(logs, "other.stubs-called"), "ptxbackend harness: STUB CALLED: libcurand.so.10 x\n")
    assert _log_facts(text, logs)["stub_called"] is False  # another process's record is not this one's
    _write(os.path.join(logs, "p.stubs-called"), "ptxbackend harness: STUB CALLED: libcurand.so.10 x\n")
    assert _log_facts(text, logs)["stub_called"] is True  # a stub's own record, when pytest lost its stderr


# --------------------------------------------------------------------------- the scripts' syntax

@pytest.mark.parametrize("script", sorted(f for f in os.listdir(HERE) if f.endswith(".py")))
def test_python_scripts_compile(script):
    with open(os.path.join(HERE, script), "rb") as handle:
        compile(handle.read(), script, "exec")  # no bytecode written into the checkout


@pytest.mark.parametrize("script", ["build.sh", "run_gpu.sh"])
def test_shell_scripts_parse(script):
    if not shutil.which("bash"):
        pytest.skip("no bash")
    code, out, err = _run(["bash", "-n", os.path.join(HERE, script)])
    assert code == 0, out + err


# --------------------------------------------------------------------------- stage_foreign.py

def _elf_sm(cubin):
    """The SM a CUDA cubin is for: the low byte of the ELF header's e_flags (offset 48 in ELF64)."""
    return struct.unpack_from("<I", cubin, 48)[0] & 0xFF


def test_stage_foreign_writes_what_another_gpu_model_would(nvrtc117, tmp_path):
    """What step c stages: for each cached kernel with its saved source, the same source built by the same
    NVRTC for another architecture, in CuPy's file format (md5 hex of the cubin, then the cubin), under
    the same name; headers come from CuPy's include folder and the CUDA include folder."""
    cache, include, cuda_include = (str(tmp_path / d) for d in ("kernel_cache", "cupy_include", "cuda_include"))
    for folder in (cache, os.path.join(include, "cupy"), cuda_include):
        os.makedirs(folder)
    _write(os.path.join(include, "cupy", "carray.cuh"), "#include <scale.h>\n")
    _write(os.path.join(cuda_include, "scale.h"), "#define PTXB_SCALE 2.0f\n")
    name = os.path.join(cache, "0123456789abcdef0123456789abcdef_2.cubin")
    _write(name, "a cubin from this GPU")
    _write(name + ".cu", '#include <cupy/carray.cuh>\n'
                         'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= PTXB_SCALE; }\n')
    script = os.path.join(HERE, "stage_foreign.py")
    sms = []
    for arch in ("sm_80", "sm_86"):
        proc = subprocess.run([sys.executable, script, cache, include, nvrtc117, arch, cuda_include],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.returncode == 0, proc.stdout.decode()
        with open(name, "rb") as handle:
            data = handle.read()
        assert data[:32] == hashlib.md5(data[32:]).hexdigest().encode("ascii")  # CuPy 7.8's own check
        assert data[32:36] == b"\x7fELF"
        sms.append(_elf_sm(data[32:]))
    assert sms == [80, 86]
    # Without the CUDA include folder the source does not compile, and nothing is written.
    proc = subprocess.run([sys.executable, script, cache, include, nvrtc117, "sm_80", str(tmp_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.returncode != 0 and b"scale.h" in proc.stdout
    with open(name, "rb") as handle:
        assert handle.read() == data


COMBINATION_TEST = """import json, os
from cupy import testing

@testing.for_all_dtypes_combination(names=["a", "b"], full=True)
def test_full(a, b):
    with open(os.environ["PTXB_T_SEEN"], "a") as handle:
        handle.write(json.dumps([str(a), str(b)]) + "\\n")

@testing.for_dtypes_combination(["f", "d"], names=["c", "d"], full=True)
def test_direct(c, d):
    with open(os.environ["PTXB_T_SEEN"], "a") as handle:
        handle.write(json.dumps([str(c), str(d)]) + "\\n")
"""


def _combinations_seen(tmp_path, shard):
    seen = tmp_path / ("seen-%s" % shard.replace("/", "-"))
    env = dict(os.environ, PYTHONPATH=HERE, PYTHONDONTWRITEBYTECODE="1", PTXB_T_SEEN=str(seen))
    if shard:
        env["V2V9_COMBINATION_SHARD"] = shard
    code, out, err = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "chunk_plugin", "-q",
                           "test_combinations.py"], env=env, cwd=str(tmp_path))
    assert code == 0, out + err
    return [tuple(json.loads(line)) for line in seen.read_text().splitlines()] if seen.exists() else []


def test_a_combination_shard_walks_every_nth_dtype_combination_of_cupys_own_decorators(tmp_path):
    """With the real cupy.testing (CuPy 14 here; 9.6's has the same full=True path): the shards of a
    warm-up are disjoint and together every combination a plain run walks."""
    pytest.importorskip("cupy.testing")
    _write(str(tmp_path / "test_combinations.py"), COMBINATION_TEST)
    everything = _combinations_seen(tmp_path, "")
    assert len(everything) > 100 and len(set(everything)) == len(everything)
    shards = [_combinations_seen(tmp_path, "%d/3" % k) for k in range(3)]
    assert all(shards) and sorted(sum(shards, [])) == sorted(everything)
    assert max(len(x) for x in shards) - min(len(x) for x in shards) <= 2  # two tests, each split evenly


def test_step_d_warm_up_runs_each_range_in_shards_and_counts_only_the_runs_after_it(tmp_path):
    pytest.importorskip("cupy.testing")  # a warm-up process loads cupy.testing to share combinations out
    empty = tmp_path / "ledger0"
    empty.mkdir()
    summary, _ = _step_d(tmp_path, empty, ["core_tests/test_one.py"], V2V9_WARM_SHARDS="2")
    d = summary["steps"]["d_cupy_tests"]
    assert d["warm_up"]["processes"] == 4  # ranges 0-3, 3-6, 6-7 as one span per mode, two shards each
    assert d["this_call"]["processes"] == 6  # the counted runs keep their ranges
    assert sorted(set(p["tag"][:6] for p in d["processes"])) == ["d_hook", "d_stoc"]
    row = d["files_report"]["core_tests/test_one.py"]
    assert row["stock"] == {"passed": 6, "crashed": 1} and row["hook"] == {"passed": 5, "failed": 1, "crashed": 1}

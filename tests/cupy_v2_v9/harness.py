"""Issue 15's acceptance run on the GPU machine: one real CuPy v2-v9 release, stock and with the hook.

Started by run_gpu.sh (see README.md), under the GPU machine's own python3; the
programs under test run under the old interpreter that build.sh staged.  Reads
its inputs from the environment (V2V9_*), writes $OUT/v2v9-<version>.json,
appends to $OUT/summary.txt, keeps one log per process, and exits 1 if a check
failed.  Every step runs even after a failure.

Modes, each with its own HOME, CuPy kernel cache and ptxbackend cache:
- stock: the old interpreter itself, where ptxbackend is not installed;
- hook: a venv of that interpreter (system site-packages visible) with the
  project's wheel installed: its .pth start-up hook is the only link, the
  program and CuPy's tests never import ptxbackend.
"""

import collections
import concurrent.futures
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ledger  # noqa: E402
T_START = time.time()
TEST_FILES = ("core_tests/test_elementwise.py", "core_tests/test_reduction.py", "core_tests/test_userkernel.py",
              "core_tests/test_raw.py", "math_tests/test_arithmetic.py", "math_tests/test_sumprod.py")
COMPILED = re.compile(r"ptxbackend: compiled (\w+) for (\S+) with (\S+)")
HIT = re.compile(r"ptxbackend: (?:no compiler; )?cache hit ")
DELEGATED = re.compile(r"ptxbackend: CuPy compiles this kernel itself \((.*); source sha256 ([0-9a-f?]+)\)")
STUB = "STUB CALLED"
# Tests that call a library that is a stub here, so they would abort: deselected in both modes, by name.
# cuRAND (its real CUDA 11 build is 55 MB, more than a call can carry beside the rest): the tests that draw
# their inputs with cupy.random, and test_raw_picklable, whose child process does.  cuBLAS: TestCubReduction's
# F-order cases (CuPy transposes them with cuBLAS) abort in cublasCreate_v2.
NEEDS_STUBBED_LIBRARY = {
    "7.8.0": ("test_manual_indexing", "test_cuFloatComplex", "test_cuDoubleComplex"),
    "9.6.0": ("test_manual_indexing", "test_cuFloatComplex", "test_cuDoubleComplex", "test_grid_sync_rawmodule",
              "test_jitify2", "test_jitify3", "test_texture_input", "test_raw_picklable",
              "test_cub_sum", "test_cub_sum_empty_axis", "test_cub_prod", "test_cub_cumsum", "test_cub_cumprod"),
}
# CuPy 13.6.0 (issue 29): 9.6.0's list, and test_cached_code (its inputs come from cupy.random: it aborted in
# the cuRAND stub in both modes in the first H200 call).
NEEDS_STUBBED_LIBRARY["13.6.0"] = NEEDS_STUBBED_LIBRARY["9.6.0"] + ("test_userkernel.py::test_cached_code",)
# CuPy 13's test_raw.py runs `nvcc --version` while it is collected (a skipIf at module level), and an
# old-toolkit machine here has no nvcc: without an answer the whole file fails to collect, in both modes.
NVCC_VERSION_ONLY = {"13.6.0": "11.7"}
_NVCC_STAND_IN = """#!/bin/sh
# Stands in for an old toolkit's nvcc in the CuPy harness: answers --version only (CuPy 13's test_raw.py
# asks it at collection); every other use fails, in both modes alike.
for a in "$@"; do
  if [ "$a" = --version ] || [ "$a" = -V ]; then
    echo "nvcc: NVIDIA (R) Cuda compiler driver"
    echo "Cuda compilation tools, release %s, V%s.0 (ptxbackend harness stand-in: --version only)"
    exit 0
  fi
done
echo "ptxbackend harness: the nvcc stand-in does not compile (no nvcc on this old-toolkit machine): $*" >&2
exit 1
"""


def builds_sass_as_shipped(version):
    """CuPy 9+ asks NVRTC 11.1+ for a cubin of min(GPU, the newest architecture its table knows for that
    NVRTC): sm_86 for NVRTC 11.7, which an H200 cannot run.  v2-v8 build PTX or let the driver link."""
    return int(version.split(".")[0]) >= 9


def say(text):
    print("[%6.1fs] %s" % (time.time() - T_START, text))
    sys.stdout.flush()


class Harness(object):
    def __init__(self):
        env = os.environ
        self.version = env["V2V9_VERSION"]
        self.out = env["OUT"]
        self.work = env["V2V9_WORK"]
        # One log, result and progress file per process: dozens, and only 8 files come back from the GPU
        # machine, so they go to one folder that is packed into $OUT at the end.
        self.logs = os.path.join(self.work, "logs")
        self.python = env["V2V9_PYTHON"]          # the stock interpreter (no ptxbackend)
        self.hook_python = env["V2V9_HOOK_PYTHON"]  # its venv with ptxbackend's wheel installed
        self.libs = env["V2V9_LIBS"]
        self.tests = env["V2V9_TESTS"]
        self.budget = float(env.get("V2V9_BUDGET_S", "500"))
        self.nvrtc = os.path.join(self.libs, "libnvrtc.so.11.2")
        self.cuda_path = env["V2V9_CUDA_PATH"]
        self.deselect = NEEDS_STUBBED_LIBRARY.get(self.version, ())
        self.summary = {"version": self.version, "ok": None, "failures": [], "steps": {}, "machine": {}}
        self.stock_extra = {}
        self.tests_per_process = int(env.get("V2V9_TESTS_PER_PROCESS", "200"))
        self.workers = int(env.get("V2V9_PROCESSES", str(max(2, (os.cpu_count() or 4) - 1))))
        # Earlier calls' outcomes of step d (ledger.py): the folder is carried with the staged release
        self.ledger_dir = env.get("V2V9_LEDGER", "")
        # >1: fill the caches first, each range's dtype combinations shared over this many processes
        self.warm_shards = int(env.get("V2V9_WARM_SHARDS", "0"))

    # ------------------------------------------------------------------ plumbing
    def check(self, step, condition, message):
        self.summary["steps"].setdefault(step, {}).setdefault("checks", []).append(
            {"ok": bool(condition), "check": message})
        say("  %s %s" % ("PASS" if condition else "FAIL", message))
        if not condition:
            self.summary["failures"].append("%s: %s" % (step, message))

    def env(self, name, hook, extra=None):
        """A clean environment for one scenario: its own HOME, CuPy cache and (hook) ptxbackend cache."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PTXBACKEND_", "CUPY_", "V2V9_", "CUDA_", "PYTHON"))}
        home = os.path.join(self.work, "home-" + name)
        os.makedirs(home, exist_ok=True)
        # An old-toolkit machine: CUDA 11.7's headers (CuPy passes -I$CUDA_PATH/include; NVRTC 11.7 cannot
        # read CUDA 13's cuda_fp16.h) and no nvcc on PATH (this machine's CUDA 13 nvcc knows sm_90).
        path = [d for d in env.get("PATH", "").split(os.pathsep) if d and not os.path.exists(os.path.join(d, "nvcc"))]
        env.update(HOME=home, LD_LIBRARY_PATH=self.libs, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1",
                   PATH=os.pathsep.join(path), CUDA_PATH=self.cuda_path,
                   CUPY_CACHE_DIR=os.path.join(home, "cupy-kernel-cache"), CUPY_CACHE_SAVE_CUDA_SOURCE="1")
        release = NVCC_VERSION_ONLY.get(self.version)
        if release:
            env["NVCC"] = self._nvcc_stand_in(release)  # read by CuPy only; ptxbackend looks on PATH/CUDA_PATH
        if hook:
            # The machine's CUDA 13 NVRTC is found first otherwise: name the old one, as a user of an
            # old-toolkit machine would have only that one.
            env.update(PTXBACKEND_NVRTC=self.nvrtc, PTXBACKEND_LOG="debug",
                       PTXBACKEND_CACHE_DIR=os.path.join(self.work, "ptxb-cache-" + name))
        else:
            env.update(self.stock_extra)
        env.update(extra or {})
        return env

    def _nvcc_stand_in(self, release):
        path = os.path.join(self.work, "nvcc-stand-in", "nvcc")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as handle:
                handle.write(_NVCC_STAND_IN % (release, release))
            os.chmod(path, 0o755)
        return path

    def run(self, name, argv, env, timeout, cwd=None):
        log = os.path.join(self.logs, "%s.log" % name)
        # A stub writes its line here too: pytest captures stderr, and an abort loses what it captured.
        record = os.path.join(self.logs, "%s.stubs-called" % name)
        env = dict(env, PTXB_STUB_LOG=record)
        t0 = time.time()
        with open(log, "w") as handle:
            try:
                rc = subprocess.run(argv, env=env, cwd=cwd or self.work, stdout=handle, stderr=subprocess.STDOUT,
                                    timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout after %ds" % timeout
        with open(log, errors="replace") as handle:
            text = handle.read()
        return {"rc": rc, "seconds": round(time.time() - t0, 2), "log": os.path.basename(log), "text": text,
                "stub_record": record}

    def program(self, name, hook, extra=None, env=None):
        result_path = os.path.join(self.logs, "%s.json" % name)
        if os.path.exists(result_path):
            os.remove(result_path)
        env = env or self.env(name, hook, extra)
        info = self.run(name, [self.hook_python if hook else self.python, os.path.join(HERE, "program.py"),
                               result_path], env, 240)
        result = None
        if os.path.exists(result_path):
            with open(result_path) as handle:
                result = json.load(handle)
        info.update(self.log_facts(info["text"], info["stub_record"]))
        tail = " | ".join(info["text"].strip().splitlines()[-2:])
        say("%s: rc=%s %.1f s, compiled %d, hits %d, delegated %d%s" % (
            name, info["rc"], info["seconds"], len(info["compiled"]), info["hits"], len(info["delegated"]),
            "" if info["rc"] == 0 else "  [" + tail[:300] + "]"))
        return info, result, env

    @staticmethod
    def log_facts(text, stub_record=None):
        return {"compiled": COMPILED.findall(text), "hits": len(HIT.findall(text)),
                "delegated": DELEGATED.findall(text),
                "stub_called": STUB in text or bool(stub_record and os.path.exists(stub_record))}

    @staticmethod
    def census(root):
        """{'<producer>/<target>/<kind>': n} of ptxbackend's entries, JIT results counted apart."""
        census = {}
        for path in glob.glob(os.path.join(root, "v*", "*", "*", "*", "*.*")):
            producer, target = path.split(os.sep)[-4:-2]
            if producer not in ("locks", "meta", "depsets") and os.path.isfile(path):
                key = "%s/%s/%s" % (producer, target, path.rsplit(".", 1)[1])
                census[key] = census.get(key, 0) + 1
        jit = glob.glob(os.path.join(root, "v*", "*", "*", "jit", "*", "*", "*.cubin"))
        if jit:
            census["jit cubins"] = len(jit)
        return census

    @staticmethod
    def cupy_cache(home_env):
        """(cubin files, sha256 of each saved source) in CuPy's own kernel cache."""
        directory = home_env["CUPY_CACHE_DIR"]
        cubins = glob.glob(os.path.join(directory, "*.cubin"))
        sources = set()
        for path in glob.glob(os.path.join(directory, "*.cubin.cu")):
            with open(path, "rb") as handle:
                sources.add(hashlib.sha256(handle.read()).hexdigest())
        return cubins, sources

    def program_ok(self, step, result, info, what):
        ok = info["rc"] == 0 and result is not None and result["ok"]
        self.check(step, ok, "%s: every result equals numpy's (%s)" % (
            what, ", ".join("%s %s" % (c["family"], c.get("case", "")) for c in (result or {}).get("checks", [])
                            if c["ok"]) or info["log"]))
        self.check(step, not info["stub_called"], "%s: no stand-in (stub) library function was called" % what)
        return ok

    # ------------------------------------------------------------------ steps
    def machine(self):
        m = self.summary["machine"]
        try:
            m["gpu"] = subprocess.check_output(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap",
                                                "--format=csv,noheader"]).decode().strip()
        except Exception as exc:
            m["gpu"] = "nvidia-smi failed: %s" % exc
        m["harness_python"] = sys.version.split()[0]
        m["libs"] = sorted(os.listdir(self.libs))
        say("machine: %s" % json.dumps(m))

    def step_stock(self):
        """a: stock CuPy on the H200 with NVRTC 11.7 (which does not know sm_90)."""
        s = self.summary["steps"].setdefault("a_stock", {})
        info, result, env = self.program("a_stock", hook=False)
        s["plain"] = {"rc": info["rc"], "seconds": info["seconds"], "result": result}
        if builds_sass_as_shipped(self.version):
            # CuPy 9+ builds an sm_86 cubin (the newest NVRTC 11.1+ architecture it knows) when its wheel's
            # CUDA is >= 11.1; the H200 (sm_90) cannot run it.  CuPy's own way out is PTX for compute_86.
            errors = [c.get("error", "") for c in (result or {}).get("checks", []) if not c["ok"]]
            s["plain_errors"] = sorted(set(errors))
            self.check("a_stock", info["rc"] != 0 and any("NO_BINARY_FOR_GPU" in e or "no kernel image" in e
                                                          for e in errors),
                       "stock CuPy %s fails on the H200 as shipped: %s" % (self.version, (errors or ["?"])[0][:160]))
            self.stock_extra = {"CUPY_COMPILE_WITH_PTX": "1"}
            info, result, env = self.program("a_stock_ptx", hook=False)
            s["ptx"] = {"rc": info["rc"], "seconds": info["seconds"], "result": result}
            self.program_ok("a_stock", result, info, "stock with CUPY_COMPILE_WITH_PTX=1 (the baseline)")
        else:
            self.program_ok("a_stock", result, info, "stock CuPy %s (PTX for compute_80, driver-linked)"
                            % self.version)
        cubins, _ = self.cupy_cache(env)
        s["cupy_cache_files"] = len(cubins)
        self.check("a_stock", len(cubins) > 0, "stock CuPy filled its own kernel cache (%d files)" % len(cubins))
        self.stock_env = env

    def step_hook(self):
        """b: the same program with ptxbackend's hook: cold, warm (a second process), PTXBACKEND_TARGET."""
        s = self.summary["steps"].setdefault("b_hook", {})
        info, result, env = self.program("b_hook_cold", hook=True)
        s["cold"] = {"rc": info["rc"], "seconds": info["seconds"], "compiled": len(info["compiled"]),
                     "targets": sorted(set(t for _k, t, _p in info["compiled"])),
                     "producers": sorted(set(p for _k, _t, p in info["compiled"])), "result": result}
        self.program_ok("b_hook", result, info, "with the hook, cold")
        self.check("b_hook", bool(result and result["hook_active"]) and len(info["compiled"]) > 0,
                   "the hook took over CuPy's compile_with_cache with no `import ptxbackend` (%d kernels compiled "
                   "by %s for %s)" % (len(info["compiled"]), s["cold"]["producers"], s["cold"]["targets"]))
        census = self.census(env["PTXBACKEND_CACHE_DIR"])
        cubins, _ = self.cupy_cache(env)
        s["census"], s["cupy_cache_files"] = census, len(cubins)
        self.check("b_hook", sum(v for k, v in census.items() if k != "jit cubins") > 0 and not cubins,
                   "the kernels are in ptxbackend's cache (%s); CuPy's own cache is empty (%d files)"
                   % (census, len(cubins)))
        warm, result2, _ = self.program("b_hook_warm", hook=True, env=env)
        s["warm"] = {"rc": warm["rc"], "seconds": warm["seconds"], "compiled": len(warm["compiled"]),
                     "hits": warm["hits"]}
        self.program_ok("b_hook", result2, warm, "with the hook, a second process")
        self.check("b_hook", warm["rc"] == 0 and not warm["compiled"] and warm["hits"] > 0,
                   "a second process compiles nothing (%d compiles, %d cache hits)"
                   % (len(warm["compiled"]), warm["hits"]))
        if result and result2:
            same = [a.get("max_rel_err") == b.get("max_rel_err") for a, b in zip(result["checks"], result2["checks"])]
            self.check("b_hook", all(same) and len(same) == len(result["checks"]),
                       "the warm process computes exactly what the cold one did")
        info, result, env75 = self.program("b_hook_target75", hook=True, extra={"PTXBACKEND_TARGET": "compute_75"})
        targets = sorted(set(t for _k, t, _p in info["compiled"]))
        census = self.census(env75["PTXBACKEND_CACHE_DIR"])
        s["target75"] = {"rc": info["rc"], "targets": targets, "census": census}
        self.program_ok("b_hook", result, info, "with PTXBACKEND_TARGET=compute_75")
        self.check("b_hook", targets == ["compute_75"] and census and all(
            "/compute_75/" in k for k in census if k != "jit cubins"),
            "PTXBACKEND_TARGET=compute_75 is honoured (compiled for %s; cache %s)" % (targets, census))

    def step_foreign(self):
        """c (v2-v7): a CuPy cache shared with another GPU model that clamps to the same architecture."""
        s = self.summary["steps"].setdefault("c_shared_cache", {})
        env = getattr(self, "stock_env", None)
        if env is None:
            return
        include = glob.glob(os.path.join(os.path.dirname(os.path.dirname(self.python)), "lib", "python3*",
                                         "site-packages", "cupy", "core", "include"))
        staged = self.run("c_stage_sm80", [self.python, os.path.join(HERE, "stage_foreign.py"),
                                           env["CUPY_CACHE_DIR"], include[0] if include else "?", self.nvrtc,
                                           "sm_80", os.path.join(self.cuda_path, "include")], env, 120)
        say("c: %s" % staged["text"].strip().splitlines()[-1:])
        s["staged"] = {"rc": staged["rc"], "text": staged["text"][-400:]}
        self.check("c_shared_cache", staged["rc"] == 0, "an sm_80 machine's cubins staged under the same CuPy keys")
        info, result, _ = self.program("c_stock_shared", hook=False, env=env)
        errors = sorted(set(c.get("error", "") for c in (result or {}).get("checks", []) if not c["ok"]))
        s["stock"] = {"rc": info["rc"], "errors": errors}
        self.check("c_shared_cache", info["rc"] != 0 and any("NO_BINARY_FOR_GPU" in e or "no kernel image" in e
                                                             for e in errors),
                   "stock CuPy %s loads the other GPU's cubin from the shared cache and fails: %s"
                   % (self.version, (errors or ["(it did not fail)"])[0][:160]))
        hook_env = self.env("c_hook_shared", hook=True)
        hook_env["CUPY_CACHE_DIR"] = env["CUPY_CACHE_DIR"]  # the same poisoned CuPy cache
        info, result, _ = self.program("c_hook_shared", hook=True, env=hook_env)
        s["hook"] = {"rc": info["rc"]}
        self.program_ok("c_shared_cache", result, info, "with the hook over the same shared CuPy cache")

    def step_tests(self):
        """d: CuPy's own tests from the tag, stock and with the hook: the same outcomes."""
        s = self.summary["steps"].setdefault("d_cupy_tests", {})
        wanted = os.environ.get("V2V9_TEST_FILES", "").split() or TEST_FILES
        files = [f for f in wanted if os.path.exists(os.path.join(self.tests, "tests", "cupy_tests", f))]
        s["files"] = files
        s["missing"] = [f for f in wanted if f not in files]
        deadline = T_START + self.budget - 25  # what is left is for the ledger, the JSON and the logs tarball
        if builds_sass_as_shipped(self.version) and not self.stock_extra:
            self.stock_extra = {"CUPY_COMPILE_WITH_PTX": "1"}  # step a's baseline, when step a did not run
        # Both modes in the same environment (9.6's baseline needs CUPY_COMPILE_WITH_PTX=1): only the hook
        # differs.  Step b shows the hook working without that variable.
        modes = {"stock": self.env("d_stock", hook=False), "hook": self.env("d_hook", hook=True,
                                                                            extra=self.stock_extra)}
        s["stock_env"] = s["hook_env"] = self.stock_extra
        s["deselected_need_a_stubbed_library"] = list(self.deselect)
        with concurrent.futures.ThreadPoolExecutor(len(files) or 1) as pool:
            ids = dict(zip(files, pool.map(lambda f: self.collect(f, modes["stock"]), files)))
        s["collected"] = {f: len(v) for f, v in ids.items()}
        # Earlier calls' outcomes (a file too big for one call runs over several); an entry whose test is
        # not the one collected at its position now is dropped, and the check below says so.
        earlier = ledger.read(sorted(glob.glob(os.path.join(self.ledger_dir, "*.jsonl.gz"))))
        stale = ledger.stale(earlier, ids)
        for key in stale:
            del earlier[key]
        s["ledger_in"] = {"entries": len(earlier), "stale": len(stale)}
        self.check("d_cupy_tests", not stale, "earlier calls' outcomes match this collection (%d entries, %d "
                   "for other tests)" % (len(earlier), len(stale)))
        # Each process runs a range of tests that have no outcome yet in its mode; the small files first,
        # and the two modes side by side, so that a call cut short leaves comparable outcomes.
        jobs = collections.deque()
        for f in sorted(files, key=lambda f: len(ids[f])):
            ranges = {m: ledger.missing_ranges(len(ids[f]), set(i for (g, mm, i) in earlier if g == f and mm == m),
                                               self.tests_per_process) for m in modes}
            for k in range(max(len(r) for r in ranges.values())):
                jobs.extend((m, f) + ranges[m][k] for m in modes if k < len(ranges[m]))
        say("d: %s tests collected; %d ranges to run (at most %d tests each), %d processes at a time, until %.0f s"
            % (s["collected"], len(jobs), self.tests_per_process, self.workers, deadline - T_START))
        warm = self.warm_up(modes, list(jobs), deadline) if self.warm_shards > 1 else []
        s["warm_up"] = {"processes": len(warm), "shards": self.warm_shards,
                        "compiled": sum(p["compiled"] for p in warm),
                        "process_seconds": {m: round(sum(p["seconds"] for p in warm if p["mode"] == m), 1)
                                            for m in modes}}
        new, processes, lock = {}, [], threading.Lock()

        def worker():
            while True:
                with lock:
                    if not jobs or time.time() > deadline - 30:
                        return
                    mode, f, start, stop = jobs.popleft()
                    tag = "d_%s_%s_%d-%d" % (mode, f.replace("/", "_").replace(".py", ""), start, stop)
                progress = os.path.join(self.logs, tag + ".progress.jsonl")
                info, facts = self.pytest_range(tag, mode, modes[mode], f, start, stop, deadline,
                                                V2V9_PROGRESS=progress)
                done = ledger.progress(progress)
                crashed = rest = None
                if isinstance(info["rc"], int):  # it ended by itself: a test without an outcome crashed it
                    crashed, rest = ledger.after_exit(start, stop, done)
                    if crashed is not None:
                        done[crashed] = (ids[f][crashed], "crashed")
                with lock:
                    if rest:
                        jobs.appendleft((mode, f) + rest)
                    new.update(((f, mode, i), v) for i, v in done.items())
                    processes.append({"tag": tag, "mode": mode, "rc": info["rc"], "seconds": info["seconds"],
                                      "tests": len(done), "compiled": len(facts["compiled"]), "hits": facts["hits"],
                                      "delegated": facts["delegated"], "stub_called": facts["stub_called"],
                                      "crashed": crashed})
                say("  d %-5s %-28s %-11s rc=%s %6.1f s, %d tests, %d compiled%s" % (
                    mode, f, "%d-%d" % (start, stop), info["rc"], info["seconds"], len(done),
                    len(facts["compiled"]), "" if crashed is None else ", test %d crashed" % crashed))

        threads = [threading.Thread(target=worker) for _ in range(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        merged = dict(earlier)
        merged.update(new)
        ledger.write(os.path.join(self.out, "v2v9-%s-ledger.jsonl.gz" % self.version), merged)
        report = ledger.compare(merged, ids)
        s["this_call"] = {"processes": len(processes), "tests": len(new), "left": len(jobs),
                          "compiled": {m: sum(p["compiled"] for p in processes if p["mode"] == m) for m in modes},
                          "process_seconds": round(sum(p["seconds"] for p in processes), 1)}
        s["processes"] = processes
        s["files_report"], s["differences"] = report["files"], report["differences"]
        for f, row in report["files"].items():
            say("  %s: %d collected, %d with an outcome in both modes; stock %s, hook %s"
                % (f, row["collected"], row["done_in_both"], row["stock"], row["hook"]))
        self.check("d_cupy_tests", report["complete"],
                   "every test ran in both modes, over this call and earlier ones (%s of %s; this call: %d tests "
                   "in %d processes)" % (sum(r["done_in_both"] for r in report["files"].values()),
                                         sum(s["collected"].values()), len(new), len(processes)))
        s["totals"] = totals = report["totals"]
        self.check("d_cupy_tests", not report["differences"] and (not report["complete"] or
                                                                   totals["stock"] == totals["hook"]),
                   "the same outcome for every test that ran in both modes: stock %s, hook %s (%d differ)"
                   % (totals["stock"], totals["hook"], len(report["differences"])))
        self.check("d_cupy_tests", not any(p["stub_called"] for p in processes + warm),
                   "no stand-in (stub) library function was called by any test")
        census = self.census(modes["hook"]["PTXBACKEND_CACHE_DIR"])
        cubins, sources = self.cupy_cache(modes["hook"])
        delegated = [d for p in processes + warm if p["mode"] == "hook" for d in p["delegated"]]
        reasons = {}
        for reason, _digest in delegated:
            reasons[reason] = reasons.get(reason, 0) + 1
        unexplained = sorted(sources - set(d for _r, d in delegated))
        # The warm-up's processes are where a test that walks every dtype combination compiles its kernels
        warmed = sum(p["compiled"] for p in warm if p["mode"] == "hook")
        compiled = s["this_call"]["compiled"]["hook"] + warmed
        s["hook_cache"] = {"census": census, "cupy_cache_files": len(cubins), "delegated_calls": reasons,
                           "cupy_cache_sources_not_delegated": unexplained}
        entries = sum(v for k, v in census.items() if k != "jit cubins")
        # With V2V9_KEEP_CACHES an earlier call on this machine may have compiled them all: then hits show it
        kept = os.environ.get("V2V9_KEEP_CACHES") == "1"
        hits = sum(p["hits"] for p in processes if p["mode"] == "hook")
        self.check("d_cupy_tests", entries > 0 and (compiled > 0 or (kept and hits > 0)),
                   "with the hook, ptxbackend compiled the kernels into its cache (%d compiles logged, %d of them "
                   "in the warm-up; %d cache hits%s; %s)"
                   % (compiled, warmed, hits, ", the caches kept from an earlier call" if kept else "", census))
        self.check("d_cupy_tests", len(sources) == len(cubins) and not unexplained,
                   "CuPy's own cache holds only kernels delegated on purpose (%d files; delegations %s)"
                   % (len(cubins), reasons))

    def pytest_range(self, tag, mode, env, f, start, stop, deadline, **extra):
        """One pytest process over tests ``start..stop-1`` of file ``f`` in ``mode``: (run info, log facts)."""
        env = dict(env, PYTHONPATH=HERE, V2V9_DESELECT=",".join(self.deselect), V2V9_RANGE="%d:%d" % (start, stop),
                   **extra)
        # --capture=no: ptxbackend's debug lines (which kernel went to CuPy, and why) must reach the log
        info = self.run(tag, [self.hook_python if mode == "hook" else self.python, "-m", "pytest",
                              "-p", "no:cacheprovider", "-p", "chunk_plugin", "-q", "-rfE", "--capture=no",
                              os.path.join("tests", "cupy_tests", f)],
                        env, max(1, deadline - time.time()), cwd=self.tests)
        return info, self.log_facts(info["text"], info["stub_record"])

    def warm_up(self, modes, jobs, deadline):
        """Fill each mode's kernel caches for the ranges about to run, their dtype combinations shared out.

        A test that walks every dtype combination (``full=True``: 9.6.0's @slow TestUfuncSlow, thousands of
        kernels) compiles them one after another in one process, longer than a call lasts.  Here each range
        runs in ``V2V9_WARM_SHARDS`` processes side by side, each with every n-th combination
        (chunk_plugin's V2V9_COMBINATION_SHARD); their outcomes are thrown away.  The counted runs that
        follow are the tests as written, finding their kernels in the caches stock CuPy and ptxbackend keep.
        """
        spans = []  # adjacent ranges of one mode and file as one: the counted runs may split them finer
        for mode, f, start, stop in sorted(jobs):
            if spans and spans[-1][:2] == (mode, f) and spans[-1][3] == start:
                spans[-1] = (mode, f, spans[-1][2], stop)
            else:
                spans.append((mode, f, start, stop))
        shards = [span + (k,) for span in spans for k in range(self.warm_shards)]
        say("d warm-up: %d processes (%d ranges x %d shards)" % (len(shards), len(spans), self.warm_shards))

        def one(job):
            mode, f, start, stop, k = job
            if time.time() > deadline - 30:
                return None
            tag = "w_%s_%s_%d-%d_%d" % (mode, f.replace("/", "_").replace(".py", ""), start, stop, k)
            info, facts = self.pytest_range(tag, mode, modes[mode], f, start, stop, deadline,
                                            V2V9_COMBINATION_SHARD="%d/%d" % (k, self.warm_shards))
            return {"tag": tag, "mode": mode, "rc": info["rc"], "seconds": info["seconds"],
                    "compiled": len(facts["compiled"]),
                    "delegated": facts["delegated"], "stub_called": facts["stub_called"]}
        with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
            done = [p for p in pool.map(one, shards) if p is not None]
        say("d warm-up: %d processes ran, %d kernels compiled by ptxbackend, %.0f process-seconds"
            % (len(done), sum(p["compiled"] for p in done), sum(p["seconds"] for p in done)))
        return done

    def collect(self, f, env):
        """The node ids pytest collects from one file, in order (no GPU work)."""
        name = f.replace("/", "_").replace(".py", "")
        path = os.path.join(self.work, "ids-%s.json" % name)
        self.run("d_collect_" + name,
                 [self.python, "-m", "pytest", "-p", "no:cacheprovider", "-p", "chunk_plugin", "--collect-only", "-q",
                  os.path.join("tests", "cupy_tests", f)],
                 dict(env, V2V9_IDS_FILE=path, PYTHONPATH=HERE, V2V9_DESELECT=",".join(self.deselect)), 300,
                 cwd=self.tests)
        try:
            with open(path) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return []

    # ------------------------------------------------------------------ driver
    def main(self):
        os.makedirs(self.out, exist_ok=True)
        os.makedirs(self.logs, exist_ok=True)
        self.machine()
        steps = [self.step_stock, self.step_hook]
        if self.version.startswith("7."):
            steps.append(self.step_foreign)
        steps.append(self.step_tests)
        only = os.environ.get("V2V9_STEPS")  # e.g. "step_tests"
        if only:
            steps = [step for step in steps if step.__name__ in only.split(",")]
        for step in steps:
            say("=== %s: %s" % (step.__name__, (step.__doc__ or "").strip().splitlines()[0]))
            try:
                step()
            except Exception as exc:  # a broken step must not hide the others
                import traceback
                traceback.print_exc()
                self.check(step.__name__, False, "the step crashed: %s: %s" % (type(exc).__name__, exc))
        self.summary["ok"] = not self.summary["failures"]
        self.summary["seconds"] = round(time.time() - T_START, 1)
        with open(os.path.join(self.out, "v2v9-%s.json" % self.version), "w") as handle:
            json.dump(self.summary, handle, indent=1, sort_keys=True, default=str)
        lines = ["CuPy %s: %s in %.0f s" % (self.version, "ALL CHECKS PASSED" if self.summary["ok"] else
                                             "%d CHECKS FAILED" % len(self.summary["failures"]),
                                             self.summary["seconds"])]
        for step, data in self.summary["steps"].items():
            for c in data.get("checks", []):
                lines.append("  %s %s: %s" % ("PASS" if c["ok"] else "FAIL", step, c["check"]))
        with open(os.path.join(self.out, "summary.txt"), "a") as handle:
            handle.write("\n".join(lines) + "\n")
        with tarfile.open(os.path.join(self.out, "v2v9-%s-logs.tar.xz" % self.version), "w:xz") as archive:
            archive.add(self.logs, arcname="v2v9-%s-logs" % self.version)
        print("\n".join(lines))
        return 0 if self.summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(Harness().main())

"""Issue 4's acceptance run on the GPU machine: steps a-g.  Started by run_gpu.sh (see README.md).

Reads its inputs from the environment run_gpu.sh sets up (LEGACY_*), writes
$OUT/legacy.json (the summary), $OUT/summary.txt and one log per process, and
exits 1 if any assertion failed.  Every step runs even after a failure.

Phases: first without ptxbackend installed at all (a: the story's failure, c: the
stock cubin reference with CUDA 13's nvcc, cold and warm); then with the
project's wheel installed in the interpreter's environment, so its .pth start-up
hook is active (a again with PTXBACKEND_DISABLE=1, b, d, e, f, g).  ptxbackend is
uninstalled again at the end.
"""

import concurrent.futures
import fnmatch
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))
import compare  # noqa: E402
import junit_outcomes  # noqa: E402


def cache_layout():
    """The cache tree of the ptxbackend in this checkout (``v2``), read from its source."""
    sys.path.insert(0, REPO)
    try:
        from ptxbackend.cache.store import LAYOUT
    finally:
        sys.path.remove(REPO)
    return LAYOUT

STORY = "nvcc fatal   : Value 'sm_90' is not defined for option 'gpu-architecture'"
PY = sys.executable
T_START = time.time()


def now():
    return "%6.1fs" % (time.time() - T_START)


def say(text):
    print("[%s] %s" % (now(), text))
    sys.stdout.flush()


def count_files(path, pattern="*"):
    if not os.path.isdir(path):
        return 0
    return sum(1 for base, _dirs, files in os.walk(path) for f in files if fnmatch.fnmatch(f, pattern))


def lines_of(path):
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [line.rstrip("\n") for line in handle if line.strip()]


class Harness(object):
    def __init__(self):
        self.out = os.environ["OUT"]
        self.work = os.environ["LEGACY_WORK"]
        self.site = os.environ["LEGACY_SITE"]
        self.nvcc112 = os.environ.get("LEGACY_NVCC112") or None
        self.nvcc13 = os.environ["LEGACY_NVCC13"]
        self.nvrtc = os.environ.get("LEGACY_NVRTC") or None
        self.wheels = os.environ.get("LEGACY_PTXBACKEND_WHEELS", "").split()
        self.tests = os.environ.get("LEGACY_CUPY_TESTS") or None
        self.test_files = os.environ.get("LEGACY_CUPY_TEST_FILES", "").split()
        self.steps = set(os.environ.get("LEGACY_STEPS", "a,b,c,d,e,f,g,h").split(","))
        self.budget = float(os.environ.get("LEGACY_BUDGET_S", "420"))
        self.cache = os.environ.get("LEGACY_PTXB_CACHE", "/tmp/ptxb-cache")
        self.valkey = os.environ.get("LEGACY_VALKEY_SERVER") or None
        self.summary = {"ok": None, "failures": [], "skipped": {}, "steps": {}, "machine": {},
                        "thresholds": {"grad_vs_cpu": 1e-4, "loss_vs_cpu": 1e-3, "loss_vs_stock_gpu": 1e-4}}
        self.bin = {}
        self.installed = False

    # ------------------------------------------------------------------ plumbing
    def check(self, step, condition, message):
        entry = self.summary["steps"].setdefault(step, {}).setdefault("checks", [])
        entry.append({"ok": bool(condition), "check": message})
        say("  %s %s" % ("PASS" if condition else "FAIL", message))
        if not condition:
            self.summary["failures"].append("%s: %s" % (step, message))

    def skip(self, step, why):
        self.summary["skipped"][step] = why
        say("SKIP step %s: %s" % (step, why))

    def wrapper(self, name, real):
        """A `nvcc` script that logs each call to $LEGACY_NVCC_LOG and execs the real one (not a link)."""
        directory = os.path.join(self.work, "bin-" + name)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "nvcc")
        with open(path, "w") as handle:
            handle.write('#!/bin/sh\n[ -n "$LEGACY_NVCC_LOG" ] && echo "$*" >> "$LEGACY_NVCC_LOG"\n'
                         'exec %s "$@"\n' % real)
        os.chmod(path, 0o755)
        self.bin[name] = directory

    def env(self, nvcc, home, hook=True, cache=None, extra=None, nvcc_log=None):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PTXBACKEND_", "CUPY_", "LEGACY_", "CUDA_CACHE_"))
               and k not in ("CUDA_PATH", "CUDA_HOME", "PYTHONPATH")}
        # the `nvcc` on PATH is the toolkit in use, for stock CuPy v1 and for ptxbackend alike
        env["PATH"] = self.bin[nvcc] + os.pathsep + env.get("PATH", "")
        env["PYTHONPATH"] = self.site
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["HOME"] = home  # a fresh ~/.cupy/kernel_cache and driver JIT cache per scenario
        os.makedirs(home, exist_ok=True)
        if hook is False:
            env["PTXBACKEND_DISABLE"] = "1"
        if cache:
            env["PTXBACKEND_CACHE_DIR"] = cache
        if nvcc_log:
            env["LEGACY_NVCC_LOG"] = nvcc_log
        env.update(extra or {})
        return env

    def run(self, name, argv, env, timeout, cwd=None):
        log = os.path.join(self.out, name + ".log")
        t0 = time.time()
        with open(log, "w") as handle:
            try:
                proc = subprocess.run(argv, env=env, cwd=cwd or self.work, stdout=handle,
                                      stderr=subprocess.STDOUT, timeout=timeout)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout after %ds" % timeout
        seconds = round(time.time() - t0, 3)
        with open(log) as handle:
            text = handle.read()
        return {"rc": rc, "seconds": seconds, "log": os.path.basename(log), "text": text}

    def train(self, name, env, device, timeout=240):
        """launch.py + train.py; returns (run info, train result or None, launcher record or None)."""
        result_path = os.path.join(self.out, name + ".json")
        record_path = os.path.join(self.out, name + ".compiles.json")
        for path in (result_path, record_path):
            if os.path.exists(path):
                os.remove(path)
        info = self.run(name, [PY, os.path.join(HERE, "launch.py"), "--record", record_path, "--",
                               os.path.join(HERE, "train.py"), "--out", result_path, "--device", device],
                        env, timeout)
        result = record = None
        if os.path.exists(result_path):
            with open(result_path) as handle:
                result = json.load(handle)
        if os.path.exists(record_path):
            with open(record_path) as handle:
                record = json.load(handle)
        tail = "\n".join(info["text"].strip().splitlines()[-3:])
        say("%s: rc=%s in %.1f s%s" % (name, info["rc"], info["seconds"], "" if info["rc"] == 0 else
                                       "\n    " + tail.replace("\n", "\n    ")))
        return info, result, record

    def timing(self, info, result, record, nvcc_log=None):
        meta = (result or {}).get("meta", {})
        out = {"process_seconds": info["seconds"], "import_seconds": meta.get("import_seconds"),
               "gpu_seconds": meta.get("gpu_seconds"), "gpu_first_step_seconds": meta.get("gpu_first_step_seconds"),
               "kernels_requested": len((record or {}).get("compiles", [])),
               "kernel_request_seconds": round(sum(c.get("seconds", 0) for c in (record or {}).get("compiles", [])), 3)}
        per_kernel = sorted(1e3 * c["seconds"] for c in (record or {}).get("compiles", []) if "seconds" in c)
        if per_kernel:
            # compile_with_cache per call, as Chainer sees it (benchmarks/run.py --legacy-results reads these)
            out["ms_per_kernel"] = {"median": round(per_kernel[len(per_kernel) // 2], 4),
                                    "min": round(per_kernel[0], 4), "max": round(per_kernel[-1], 4),
                                    "reps": len(per_kernel)}
        if nvcc_log is not None:
            calls = lines_of(nvcc_log)
            out["nvcc_processes"] = len(calls)
            out["nvcc_cubin_processes"] = sum(1 for c in calls if "--cubin" in c)
        return out

    def pip(self, *args):
        return subprocess.run([PY, "-m", "pip"] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})

    def install_ptxbackend(self):
        proc = self.pip("install", "-q", "--no-deps", "--no-index", "--force-reinstall", *self.wheels)
        probe = subprocess.run([PY, "-c", "import _ptxbackend_boot, ptxbackend, sys; print(ptxbackend.__file__)"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=self.work,
                               env=dict(os.environ, PYTHONPATH=self.site))
        self.installed = proc.returncode == 0 and probe.returncode == 0
        self.summary["machine"]["ptxbackend_installed_at"] = probe.stdout.decode().strip()
        say("installed ptxbackend: %s" % probe.stdout.decode().strip())
        if proc.returncode:
            say(proc.stdout.decode())
        return self.installed

    def uninstall_ptxbackend(self):
        self.pip("uninstall", "-y", "ptxbackend")
        self.installed = False

    def load_cache_census(self, root):
        """{'<producer>/<target>/<kind>': count} of compiler outputs (JIT cubins listed apart)."""
        census = {}
        base = os.path.join(root, cache_layout())
        for path in glob.glob(os.path.join(base, "*", "*", "*", "*")):
            rel = os.path.relpath(path, base).split(os.sep)
            if len(rel) == 4 and rel[0] not in ("locks", "meta") and "." in rel[3] and os.path.isfile(path):
                key = "%s/%s/%s" % (rel[0], rel[1], rel[3].rsplit(".", 1)[1])
                census[key] = census.get(key, 0) + 1
        jit = glob.glob(os.path.join(base, "*", "*", "jit", "*", "*", "*.cubin"))
        if jit:
            census["jit cubins"] = len(jit)
        return census

    # ------------------------------------------------------------------ the steps
    def machine(self):
        m = self.summary["machine"]
        try:
            m["gpu"] = subprocess.check_output(
                ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"]
            ).decode().strip()
        except Exception as exc:
            m["gpu"] = "nvidia-smi failed: %s" % exc
        m["python"] = sys.version.split()[0]
        for name in ("nvcc112", "nvcc13"):
            if name in self.bin:
                out = subprocess.run([os.path.join(self.bin[name], "nvcc"), "--version"], stdout=subprocess.PIPE,
                                     env=dict(os.environ, LEGACY_NVCC_LOG="")).stdout.decode()
                m[name] = (out.strip().splitlines() or ["?"])[-1]
        m["nvrtc"] = self.nvrtc
        m["cuda_env_removed"] = {k: os.environ[k] for k in ("CUDA_PATH", "CUDA_HOME") if k in os.environ}
        say("machine: %s" % json.dumps(m))

    def stock_failure(self, step, hook_state):
        name = "a_stock_nvcc112_" + hook_state
        log = os.path.join(self.out, name + ".nvcc.log")
        env = self.env("nvcc112", os.path.join(self.work, "home-" + name), hook=hook_state != "disabled",
                       nvcc_log=log)
        info, result, record = self.train(name, env, "gpu", timeout=120)
        s = self.summary["steps"].setdefault(step, {})
        compiles = (record or {}).get("compiles", [])
        s.update(rc=info["rc"], log=info["log"], kernels_requested=len(compiles),
                 first_kernel=compiles[0] if compiles else None,
                 compile_function=(record or {}).get("compile_function"),
                 story_line=next((l.strip() for l in info["text"].splitlines() if "nvcc fatal" in l), None))
        self.check(step, info["rc"] not in (0,) and STORY in info["text"],
                   "stock Chainer 1.24 + nvcc 11.2 (ptxbackend %s) fails with `%s`" % (hook_state, STORY))
        self.check(step, len(compiles) == 1 and STORY in (compiles[0].get("error") or ""),
                   "it is the first kernel that fails (%d requested)" % len(compiles))
        self.check(step, not (record or {}).get("hook_active"), "CuPy's own compile function was used (%s)"
                   % (record or {}).get("compile_function"))

    def step_c(self):
        home = os.path.join(self.work, "home-stock")
        shutil.rmtree(home, ignore_errors=True)
        s = self.summary["steps"].setdefault("c", {})
        log = os.path.join(self.out, "c_stock_nvcc13_cold.nvcc.log")
        env = self.env("nvcc13", home, nvcc_log=log)  # phase 1: ptxbackend is not installed
        info, result, record = self.train("c_stock_nvcc13_cold", env, "gpu,cpu")
        s["cold"] = self.timing(info, result, record, log)
        s["kernel_cache_cubins"] = count_files(os.path.join(home, ".cupy", "kernel_cache"), "*.cubin")
        self.check("c", info["rc"] == 0 and result is not None, "stock Chainer 1.24 + CUDA 13 nvcc (sm_90 cubin) "
                   "trains (%s)" % info["log"])
        self.check("c", not (record or {}).get("hook_active"), "CuPy's own compile function was used")
        self.stock = result
        if result:
            cmp = compare.compare(result, result, "gpu", "cpu", loss_rtol=1e-3, grad_tol=1e-4)
            s["gpu_vs_cpu"] = {"ok": cmp["ok"], "problems": cmp["problems"],
                               "loss_max_rel": compare.worst(cmp, "loss_max_rel"),
                               "grad_max_rel": compare.worst(cmp, "grad_max_rel"),
                               "output_max_rel": compare.worst(cmp, "output_max_rel")}
            say("  stock GPU vs CPU (info): %s" % json.dumps(s["gpu_vs_cpu"]))
        log = os.path.join(self.out, "c_stock_nvcc13_warm.nvcc.log")
        env = self.env("nvcc13", home, nvcc_log=log)
        info, result, record = self.train("c_stock_nvcc13_warm", env, "gpu")
        s["warm"] = self.timing(info, result, record, log)
        self.check("c", info["rc"] == 0, "stock warm run (its kernel_cache holds %d cubins)"
                   % s["kernel_cache_cubins"])

    def step_b(self):
        shutil.rmtree(self.cache, ignore_errors=True)
        home = os.path.join(self.work, "home-ptxb")
        shutil.rmtree(home, ignore_errors=True)
        self.ptxb_home = home
        s = self.summary["steps"].setdefault("b", {})
        log = os.path.join(self.out, "b_ptxbackend_nvcc112.nvcc.log")
        env = self.env("nvcc112", home, cache=self.cache, nvcc_log=log)
        info, result, record = self.train("b_ptxbackend_nvcc112", env, "gpu,cpu")
        s["cold"] = self.timing(info, result, record, log)
        served = (record or {}).get("ptxbackend", [])
        s["served"] = {"kernels": len(served), "errors": [e for e in served if e.get("error")],
                       "kinds": sorted(set("%s %s %s" % (e.get("producer"), e.get("target"), e.get("kind"))
                                           for e in served if not e.get("error")))}
        self.check("b", (record or {}).get("hook_active"), "the start-up hook replaced CuPy v1's compile function "
                   "(%s)" % (record or {}).get("compile_function"))
        self.check("b", info["rc"] == 0 and result is not None,
                   "Chainer 1.24 + nvcc 11.2 + ptxbackend trains on the H200 (%s)" % info["log"])
        self.check("b", served and not s["served"]["errors"] and all(
            e.get("kind") == "ptx" and e.get("target") == "compute_86" and str(e.get("producer")).startswith("nvcc-11.2")
            for e in served), "every kernel (%d) became compute_86 PTX from nvcc 11.2 (%s)"
            % (len(served), ", ".join(s["served"]["kinds"])))
        self.check("b", s["cold"].get("nvcc_cubin_processes") == 0, "no `nvcc --cubin` was run (%d nvcc processes)"
                   % s["cold"].get("nvcc_processes", -1))
        self.ptxb = result
        if result:
            cmp = compare.compare(result, result, "gpu", "cpu", loss_rtol=1e-3, grad_tol=1e-4)
            s["gpu_vs_cpu"] = cmp
            for problem in cmp["problems"]:
                say("    " + problem)
            self.check("b", cmp["ok"], "GPU vs CPU: first-step gradients within 1e-4 of the link's largest "
                       "gradient (worst %.2g), every loss within 1e-3 relative (worst %.2g); outputs %.2g"
                       % (compare.worst(cmp, "grad_max_rel"), compare.worst(cmp, "loss_max_rel"),
                          compare.worst(cmp, "output_max_rel")))
            if getattr(self, "stock", None):
                cmp = compare.compare(result, self.stock, "gpu", "gpu", loss_rtol=1e-4, grad_tol=1e-4)
                s["gpu_vs_stock_cubin_gpu"] = cmp
                for problem in cmp["problems"]:
                    say("    " + problem)
                self.check("b", cmp["ok"], "vs stock Chainer + CUDA 13 cubin on the same GPU: every loss within "
                           "1e-4 relative (worst %.2g), gradients %.2g, outputs %.2g"
                           % (compare.worst(cmp, "loss_max_rel"), compare.worst(cmp, "grad_max_rel"),
                              compare.worst(cmp, "output_max_rel")))
            else:
                self.skip("b vs stock", "step c (the stock cubin reference) did not run or failed")

    def step_d(self):
        s = self.summary["steps"].setdefault("d", {})
        census = self.load_cache_census(self.cache)
        ptx = glob.glob(os.path.join(self.cache, cache_layout(), "nvcc-11.2.*", "compute_86", "[0-9a-f][0-9a-f]", "*.ptx"))
        kernel_cache = os.path.join(self.ptxb_home, ".cupy", "kernel_cache")
        s.update(cache=self.cache, census=census, compute_86_ptx_entries=len(ptx),
                 kernel_cache=kernel_cache, kernel_cache_files=count_files(kernel_cache))
        say("  cache census: %s" % json.dumps(census))
        self.check("d", len(ptx) > 0, "ptxbackend's cache holds %d compute_86 .ptx entries under "
                   "%s/nvcc-11.2.*/compute_86/" % (len(ptx), cache_layout()))
        b_kernels = self.summary["steps"].get("b", {}).get("served", {}).get("kernels", 0)
        self.check("d", len(ptx) <= b_kernels and len(ptx) >= 1, "one entry per distinct kernel (%d entries, %d "
                   "kernel requests)" % (len(ptx), b_kernels))
        self.check("d", count_files(kernel_cache) == 0, "~/.cupy/kernel_cache stays empty (%s: %d files)"
                   % (kernel_cache, count_files(kernel_cache)))

    def write_benchmark_figures(self):
        """$OUT/legacy-bench.json: per-kernel compile_with_cache times for `benchmarks/run.py --legacy-results`."""
        steps = self.summary["steps"]
        figures = {}
        for key, step, part in (("stock_warm_ms_per_kernel", "c", "warm"), ("ptxbackend_warm_ms_per_kernel", "e", "warm"),
                                ("stock_cold_ms_per_kernel", "c", "cold"), ("ptxbackend_cold_ms_per_kernel", "b", "cold")):
            value = steps.get(step, {}).get(part, {}).get("ms_per_kernel")
            if value:
                figures[key] = value
        with open(os.path.join(self.out, "legacy-bench.json"), "w") as handle:
            json.dump({"benchmarks": figures}, handle, indent=1)

    def step_e(self):
        s = self.summary["steps"].setdefault("e", {})
        log = os.path.join(self.out, "e_ptxbackend_nvcc112_warm.nvcc.log")
        env = self.env("nvcc112", self.ptxb_home, cache=self.cache, nvcc_log=log)
        info, result, record = self.train("e_ptxbackend_nvcc112_warm", env, "gpu")
        s["warm"] = self.timing(info, result, record, log)
        served = (record or {}).get("ptxbackend", [])
        s["cache_hits"] = sum(1 for e in served if e.get("cache_hit"))
        s["kernels"] = len(served)
        self.check("e", info["rc"] == 0 and result is not None, "the warm process trains (%s)" % info["log"])
        self.check("e", s["warm"].get("nvcc_processes") == 0, "no nvcc process at all in the warm process (%d)"
                   % s["warm"].get("nvcc_processes", -1))
        self.check("e", served and s["cache_hits"] == len(served), "every kernel was a cache hit (%d of %d)"
                   % (s["cache_hits"], len(served)))
        if result and getattr(self, "ptxb", None):
            cmp = compare.compare(result, self.ptxb, "gpu", "gpu", loss_rtol=1e-6)
            s["vs_cold_run"] = {"loss_max_rel": compare.worst(cmp, "loss_max_rel"),
                                "output_max_rel": compare.worst(cmp, "output_max_rel")}
        stock = self.summary["steps"].get("c", {}).get("warm")
        if stock:
            s["stock_cubin_warm"] = stock
            say("  warm start: ptxbackend (nvcc 11.2 PTX, cached) %.2f s process, %.3f s first GPU step, %.2f s GPU "
                "training; stock (CUDA 13 cubin, kernel_cache warm) %.2f s, %.3f s, %.2f s; nvcc processes %d vs %d"
                % (s["warm"]["process_seconds"], s["warm"]["gpu_first_step_seconds"] or -1,
                   s["warm"]["gpu_seconds"] or -1, stock["process_seconds"],
                   stock["gpu_first_step_seconds"] or -1, stock["gpu_seconds"] or -1,
                   s["warm"].get("nvcc_processes", -1), stock.get("nvcc_processes", -1)))

    def step_f(self):
        s = self.summary["steps"].setdefault("f", {})
        cache = self.cache + "-nvrtc"
        shutil.rmtree(cache, ignore_errors=True)
        home = os.path.join(self.work, "home-nvrtc")
        shutil.rmtree(home, ignore_errors=True)
        log = os.path.join(self.out, "f_ptxbackend_nvrtc117.nvcc.log")
        # nvcc 13 on PATH: a kernel NVRTC cannot build falls back to CuPy's own nvcc (--cubin), visibly
        env = self.env("nvcc13", home, cache=cache, nvcc_log=log,
                       extra={"PTXBACKEND_COMPILER": "nvrtc", "PTXBACKEND_NVRTC": self.nvrtc})
        info, result, record = self.train("f_ptxbackend_nvrtc117", env, "gpu,cpu")
        s["cold"] = self.timing(info, result, record, log)
        served = (record or {}).get("ptxbackend", [])
        failed = [e for e in served if e.get("error")]
        s["nvrtc"] = {"kernels": len(served), "built": len(served) - len(failed),
                      "kinds": sorted(set("%s %s %s" % (e.get("producer"), e.get("target"), e.get("kind"))
                                          for e in served if not e.get("error"))),
                      "failed": [{"kernel": e["kernel"], "error": e["error"]} for e in failed],
                      "fell_back_to_cupy_nvcc": s["cold"].get("nvcc_cubin_processes")}
        s["census"] = self.load_cache_census(cache)
        say("  NVRTC 11.7: %d kernels built, %d failed %s" % (len(served) - len(failed), len(failed),
                                                             sorted(set(e["kernel"] for e in failed))))
        for e in failed[:5]:
            say("    %s: %s" % (e["kernel"], e["error"].replace("\n", "\n      ")))
        self.check("f", (record or {}).get("hook_active") and len(served) > 0,
                   "ptxbackend served CuPy v1 with NVRTC 11.7 (%d kernel requests)" % len(served))
        self.check("f", info["rc"] == 0 and result is not None, "the same training runs (%s)" % info["log"])
        if result:
            cmp = compare.compare(result, result, "gpu", "cpu", loss_rtol=1e-3, grad_tol=1e-4)
            s["gpu_vs_cpu"] = cmp
            self.check("f", cmp["ok"], "NVRTC GPU vs CPU: gradients (worst %.2g), losses (worst %.2g)"
                       % (compare.worst(cmp, "grad_max_rel"), compare.worst(cmp, "loss_max_rel")))
            if getattr(self, "stock", None):
                cmp = compare.compare(result, self.stock, "gpu", "gpu", loss_rtol=1e-4, grad_tol=1e-4)
                s["gpu_vs_stock_cubin_gpu"] = cmp
                self.check("f", cmp["ok"], "NVRTC vs stock cubin GPU: losses within 1e-4 (worst %.2g)"
                           % compare.worst(cmp, "loss_max_rel"))

    def step_g(self):
        s = self.summary["steps"].setdefault("g", {})
        files = self.test_files or sorted(os.path.relpath(p, self.tests) for p in
                                          glob.glob(os.path.join(self.tests, "*", "test_*.py")))
        modes = {
            "ptxbackend": dict(hook=True, cache=os.path.join(self.work, "g-ptxb-cache")),
            "stock": dict(hook=False, cache=None),
        }
        remaining = self.budget - (time.time() - T_START) - 15
        timeout = int(max(60, min(360, remaining)))
        s.update(files=files, timeout_per_file=timeout,
                 modes={"ptxbackend": "installed, hook active, nvcc 13 on PATH",
                        "stock": "installed but PTXBACKEND_DISABLE=1 (CuPy's own nvcc --cubin), nvcc 13 on PATH"})
        jobs = []
        for mode, cfg in modes.items():
            home = os.path.join(self.work, "home-g-" + mode)
            shutil.rmtree(home, ignore_errors=True)
            if cfg["cache"]:
                shutil.rmtree(cfg["cache"], ignore_errors=True)
            env = self.env("nvcc13", home, hook=cfg["hook"], cache=cfg["cache"])
            env["PYTHONPATH"] = self.site + os.pathsep + os.path.join(HERE, "nose_shim")
            for f in files:
                jobs.append((mode, f, env))
        # the biggest files first: they bound the wall time
        jobs.sort(key=lambda j: -os.path.getsize(os.path.join(self.tests, j[1])))
        say("g: %d pytest processes (%d files x %d modes), %d s limit each" % (len(jobs), len(files), len(modes),
                                                                              timeout))

        def one(job):
            mode, f, env = job
            tag = "g_%s_%s" % (mode, f.replace("/", "_").replace(".py", ""))
            xml = os.path.join(self.out, tag + ".xml")
            info = self.run(tag, [PY, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "--rootdir",
                                  self.tests, "--junitxml", xml, os.path.join(self.tests, f)], env, timeout,
                            cwd=self.tests)
            return mode, f, info, xml

        workers = max(2, min(len(jobs), (os.cpu_count() or 4) - 2))
        results = {m: {"files": {}, "outcomes": {}} for m in modes}
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for mode, f, info, xml in pool.map(one, jobs):
                outcomes = junit_outcomes.parse_junit(xml)
                counts = junit_outcomes.tally(outcomes)
                results[mode]["files"][f] = {"rc": info["rc"], "seconds": info["seconds"], "counts": counts,
                                             "log": info["log"]}
                results[mode]["outcomes"].update(("%s::%s" % (f, k), v) for k, v in outcomes.items())
                say("  g %-10s %-40s rc=%s %5.1f s %s" % (mode, f, info["rc"], info["seconds"], counts))
        for mode in modes:
            results[mode]["totals"] = junit_outcomes.tally(results[mode]["outcomes"])
        s["ptxbackend"] = {k: v for k, v in results["ptxbackend"].items() if k != "outcomes"}
        s["stock"] = {k: v for k, v in results["stock"].items() if k != "outcomes"}
        mine, theirs = results["ptxbackend"]["outcomes"], results["stock"]["outcomes"]
        differ = junit_outcomes.differences(mine, theirs)
        s["differences"] = [{"test": k, "ptxbackend": mine.get(k), "stock": theirs.get(k)} for k in differ]
        s["not_passed"] = {m: sorted(k for k, v in results[m]["outcomes"].items() if v != "passed")
                           for m in modes}
        s["ptxbackend_cache"] = self.load_cache_census(modes["ptxbackend"]["cache"])
        s["kernel_cache_files"] = {m: count_files(os.path.join(self.work, "home-g-" + m, ".cupy", "kernel_cache"),
                                                  "*.cubin") for m in modes}
        self.check("g", sum(results["stock"]["totals"].values()) > 0 and all(
            isinstance(r["rc"], int) for m in modes for r in results[m]["files"].values()),
            "CuPy v1's tests ran to completion in both modes (stock: %s)" % results["stock"]["totals"])
        self.check("g", not differ and results["ptxbackend"]["totals"] == results["stock"]["totals"],
                   "pass/fail counts with ptxbackend %s == without %s (%d tests differ)"
                   % (results["ptxbackend"]["totals"], results["stock"]["totals"], len(differ)))
        self.check("g", sum(s["ptxbackend_cache"].values()) > 0 and s["kernel_cache_files"]["ptxbackend"] == 0,
                   "with the hook, kernels came from ptxbackend's cache (%s) and none from ~/.cupy/kernel_cache"
                   % s["ptxbackend_cache"])

    def step_h(self):
        """Two machines of one fleet (issue 14): fresh local caches, fresh driver JIT caches, one Valkey."""
        sys.path.insert(0, os.path.join(os.path.dirname(HERE)))
        import valkey_server
        s = self.summary["steps"].setdefault("h", {})
        server = valkey_server.Server(self.valkey, os.path.join(self.work, "valkey")).start()
        key = os.path.join(self.work, "fleet.key")
        with open(key, "wb") as handle:
            handle.write(os.urandom(32).hex().encode())
        os.chmod(key, 0o600)
        extra = {"PTXBACKEND_REMOTE": server.url, "PTXBACKEND_REMOTE_KEY_FILE": key,
                 "PTXBACKEND_REMOTE_NAMESPACE": "legacy-h200", "PTXBACKEND_REMOTE_TIMEOUT": "2"}
        runs = {}
        try:
            for machine in ("a", "b"):
                name = "h_fleet_machine_" + machine
                log = os.path.join(self.out, name + ".nvcc.log")
                env = self.env("nvcc112", os.path.join(self.work, "home-" + name), extra=extra,
                               cache=os.path.join(self.work, "cache-" + name), nvcc_log=log)
                info, result, record = self.train(name, env, "gpu")
                calls = lines_of(log)
                compiles = sum(1 for c in calls if "--ptx" in c.split() and "-dryrun" not in c.split())
                runs[machine] = (info, result, record)
                s[machine] = dict(self.timing(info, result, record, log), nvcc_compiles=compiles,
                                  nvcc_other=len(calls) - compiles, jit_links=(record or {}).get("jit_links"),
                                  cache_stats=(record or {}).get("cache_stats"), rc=info["rc"],
                                  served=len((record or {}).get("ptxbackend", [])))
                say("  machine %s: %s" % (machine, json.dumps(s[machine], default=str)[:600]))
        finally:
            server.stop()
        a, b = s.get("a", {}), s.get("b", {})
        self.check("h", a.get("rc") == 0 and b.get("rc") == 0, "both machines train (Chainer 1.24 + nvcc 11.2 + "
                   "ptxbackend + one valkey-server)")
        self.check("h", a.get("nvcc_compiles", 0) > 0 and a.get("jit_links", 0) > 0,
                   "machine A compiled (%s nvcc compiles) and JIT-linked (%s) its kernels"
                   % (a.get("nvcc_compiles"), a.get("jit_links")))
        self.check("h", b.get("nvcc_compiles") == 0, "machine B ran nvcc to compile 0 times (%s other nvcc "
                   "processes: the compiler identity probe)" % b.get("nvcc_other"))
        self.check("h", b.get("jit_links") == 0, "machine B ran the driver JIT 0 times (%s links)" % b.get("jit_links"))
        remote = (b.get("cache_stats") or {}).get("remote_hits", 0)
        self.check("h", remote >= b.get("served", 1), "machine B's kernels came from the fleet store (%d remote hits "
                   "for %d kernels)" % (remote, b.get("served", 0)))
        ra, rb = runs.get("a", (None, None))[1], runs.get("b", (None, None))[1]
        same = bool(ra and rb) and all(ra["runs"][k]["losses"] == rb["runs"][k]["losses"] for k in ra["runs"])
        s["losses_identical"] = same
        self.check("h", same, "losses identical on both machines (%d runs)" % len((ra or {}).get("runs", {})))

    # ------------------------------------------------------------------ driver
    def main(self):
        os.makedirs(self.out, exist_ok=True)
        self.wrapper("nvcc13", self.nvcc13)
        if self.nvcc112:
            self.wrapper("nvcc112", self.nvcc112)
        self.machine()
        want = self.steps
        nvcc112_steps = {"a", "b", "d", "e"} & want
        if not self.nvcc112 and nvcc112_steps:
            for step in sorted(nvcc112_steps):
                self.skip(step, ".device/nvcc112.tar.xz was not carried: no nvcc 11.2")
            want = want - nvcc112_steps
        try:
            say("=== phase 1: ptxbackend not installed")
            self.uninstall_ptxbackend()
            if "a" in want:
                say("--- a: stock Chainer 1.24 + nvcc 11.2, ptxbackend not installed")
                self.stock_failure("a", "uninstalled")
            if "c" in want:
                say("--- c: stock Chainer 1.24 + CUDA 13 nvcc (the cubin path), cold then warm")
                self.step_c()
            say("=== phase 2: ptxbackend installed (its .pth start-up hook)")
            if not self.install_ptxbackend():
                self.check("install", False, "pip install of the ptxbackend wheel")
                return
            if "a" in want:
                say("--- a: the same with PTXBACKEND_DISABLE=1")
                self.stock_failure("a", "disabled")
            if "b" in want:
                say("--- b: Chainer 1.24 + nvcc 11.2 + ptxbackend")
                self.step_b()
                if "d" in want:
                    say("--- d: ptxbackend's cache and ~/.cupy/kernel_cache")
                    self.step_d()
                if "e" in want:
                    say("--- e: a second process, warm")
                    self.step_e()
            elif want & {"d", "e"}:
                self.skip("d,e", "they inspect step b's cache: run b too")
            if "f" in want:
                if self.nvrtc:
                    say("--- f: NVRTC 11.7 as the compiler")
                    self.step_f()
                else:
                    self.skip("f", "NVRTC 11.7 not carried (.device/nvidia_cuda_nvrtc_cu11-11.7.99-*.whl): "
                                   "run again with LEGACY_STEPS=c,f carrying it (README)")
            if "h" in want:
                if self.valkey and self.nvcc112:
                    say("--- h: two machines of one fleet (a Valkey), nvcc 11.2")
                    self.step_h()
                else:
                    self.skip("h", "no valkey-server (LEGACY_VALKEY_SERVER) or no nvcc 11.2")
            if "g" in want:
                if self.tests and os.path.isdir(self.tests):
                    say("--- g: CuPy v1's own tests, with and without ptxbackend (nvcc 13)")
                    self.step_g()
                else:
                    self.skip("g", "no CuPy v1 tests in .device/legacy/cupy_tests")
        finally:
            self.uninstall_ptxbackend()
            self.summary["ok"] = not self.summary["failures"]
            self.summary["seconds"] = round(time.time() - T_START, 1)
            with open(os.path.join(self.out, "legacy.json"), "w") as handle:
                json.dump(self.summary, handle, indent=1, default=str)
            self.write_benchmark_figures()
            lines = ["legacy harness: %s in %.0f s" % ("PASSED" if self.summary["ok"] else "FAILED",
                                                      self.summary["seconds"])]
            for step, data in sorted(self.summary["steps"].items()):
                for c in data.get("checks", []):
                    lines.append("  %s %s: %s" % ("PASS" if c["ok"] else "FAIL", step, c["check"]))
            for step, why in sorted(self.summary["skipped"].items()):
                lines.append("  SKIP %s: %s" % (step, why))
            with open(os.path.join(self.out, "summary.txt"), "w") as handle:
                handle.write("\n".join(lines) + "\n")
            print("\n".join(lines))
        return 0


if __name__ == "__main__":
    harness = Harness()
    harness.main()
    sys.exit(0 if harness.summary["ok"] else 1)

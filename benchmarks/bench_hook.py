"""Section 4: what the start-up hook costs.

- ``python -c pass`` in two fresh venvs (``--without-pip``) of this interpreter, one with the project's
  wheel extracted into its site-packages (what pip does with a pure wheel, as tests/test_hook.py
  does), interleaved, medians;
- ``python -X importtime -c pass`` in the hook venv: the start-up module's own import time;
- with CuPy: ``python -c "import cupy"`` with the hook on and with PTXBACKEND_DISABLE=1, in this
  interpreter (where CuPy lives).  When the hook is not installed here, the child starts it itself
  (``import _ptxbackend_pth``, what ptxbackend.pth runs) in both variants, and PTXBACKEND_DISABLE=1
  makes it return at once.
"""

import compileall
import glob
import os
import re
import shutil
import subprocess
import sys
import zipfile

import benchutil

HOOK_FILES = ("_ptxbackend_boot.py", "_ptxbackend_env.py", "_ptxbackend_pth.py", "ptxbackend.pth", "ptxbackend.start")
START_MODULE = "_ptxbackend_pth"
_IMPORTTIME_RE = re.compile(r"^import time:\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\S+)\s*$")


def _build_wheel(ws, notes):
    """The project's wheel; None (with a note) when pip cannot build it here (no network, no setuptools)."""
    out = ws.fresh("wheel")
    attempts = []
    try:
        import setuptools  # noqa: F401  -- present: build without an isolated environment (no network)
        attempts.append(["--no-build-isolation"])
    except ImportError:
        pass
    attempts.append(["--retries", "0", "--timeout", "10"])  # an isolated build needs an index: fail fast offline
    for extra in attempts:
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
               "-w", out] + extra + [benchutil.REPO]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              timeout=300)
        found = glob.glob(os.path.join(out, "ptxbackend-*.whl"))
        if proc.returncode == 0 and found:
            return found[0]
        notes.append("pip wheel %s failed: %s" % (" ".join(extra), benchutil.tail(proc.stderr, 2, 300)))
    return None


def _site(python):
    return subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   universal_newlines=True).strip()


def _make_venvs(ws, notes):
    wheel = _build_wheel(ws, notes)
    made = {}
    for name in ("plain", "hook"):
        root = os.path.join(ws.fresh("venvs"), name)
        subprocess.check_call([sys.executable, "-m", "venv", "--without-pip", root])
        made[name] = os.path.join(root, "bin", "python")
    site = _site(made["hook"])
    if wheel:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)  # a pure wheel's root goes to purelib
        notes.append("hook venv: %s extracted into its site-packages and byte-compiled, as pip installs it"
                     % os.path.basename(wheel))
    else:
        for name in HOOK_FILES:
            shutil.copy(os.path.join(benchutil.REPO, name), site)
        shutil.copytree(os.path.join(benchutil.REPO, "ptxbackend"), os.path.join(site, "ptxbackend"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        notes.append("hook venv: no wheel could be built, so the files a wheel holds (ptxbackend/, "
                     "_ptxbackend_boot.py, _ptxbackend_env.py, _ptxbackend_pth.py, ptxbackend.pth, ptxbackend.start) were "
                     "copied in")
    compileall.compile_dir(site, quiet=1)  # pip byte-compiles what it installs
    for module in ("filelock", "platformdirs"):
        try:
            imported = __import__(module)
            shutil.copytree(os.path.dirname(imported.__file__), os.path.join(site, module),
                            ignore=shutil.ignore_patterns("__pycache__"))
        except (ImportError, OSError) as exc:
            notes.append("%s not copied into the hook venv (%s): not needed for `python -c pass`" % (module, exc))
    return made


def _venv_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PTXBACKEND_", "CUDA_CACHE", "PYTHON"))}
    return env


def _hook_state(python, env):
    code = "import sys; print(any(getattr(f, 'ptxbackend_watcher', False) for f in sys.meta_path))"
    return subprocess.check_output([python, "-c", code], env=env, universal_newlines=True).strip() == "True"


def _interleaved(commands, runs):
    """{name: [seconds]} for ``runs`` rounds of every (name, argv, env), alternating the order."""
    times = {name: [] for name, _argv, _env in commands}
    for i in range(runs):
        order = commands if i % 2 == 0 else list(reversed(commands))
        for name, argv, env in order:
            times[name].append(benchutil.time_command(argv, env) * 1000.0)
    return times


def _importtime(python, env, runs):
    self_us, cumulative_us = [], []
    for _ in range(runs):
        proc = subprocess.run([python, "-X", "importtime", "-c", "pass"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, cwd="/")
        for line in proc.stderr.splitlines():
            match = _IMPORTTIME_RE.match(line)
            if match and match.group(3) == START_MODULE:
                self_us.append(int(match.group(1)))
                cumulative_us.append(int(match.group(2)))
    return self_us, cumulative_us


def run(ctx):
    notes = []
    runs = ctx.reps(full=60, quick=30)
    rows, summary, stats = [], {}, {}
    try:
        _venv_part(ctx, notes, rows, summary, stats, runs)
    except Exception as exc:  # no venv module, a broken pip...: the CuPy part can still run
        notes.append("python -c pass not measured: %s" % benchutil.first_line(exc))
    try:
        _cupy_part(ctx, notes, rows, summary, stats)
    except Exception as exc:
        notes.append("import cupy not measured: %s" % benchutil.first_line(exc))
    notes.insert(0, "Wall time of whole processes, ms: median (min-max, runs), runs interleaved.")
    plot_labels, series = [], {"without / disabled": [], "with the hook": []}
    for label, off, on in (("python -c pass", "pass_plain_ms", "pass_hook_ms"),
                           ("import cupy", "import_cupy_disabled_ms", "import_cupy_hook_ms")):
        if on in stats:
            plot_labels.append(label)
            series["without / disabled"].append(stats[off])
            series["with the hook"].append(stats[on])
    return {"title": "Start-up hook cost", "status": "ok" if stats else "error", "notes": notes, "stats": stats,
            "summary": summary, "table": {"columns": ["command", "variant", "ms", "ratio"], "rows": rows},
            "plots": [{"file": "hook.png", "title": "Process start-up with and without the hook", "ylabel": "ms",
                       "labels": plot_labels, "series": series}]}


def _venv_part(ctx, notes, rows, summary, stats, runs):
    venvs = _make_venvs(ctx.ws, notes)
    env = _venv_env()
    state = {name: _hook_state(python, env) for name, python in venvs.items()}
    if state != {"plain": False, "hook": True}:
        notes.append("unexpected hook state in the venvs: %s" % state)
    benchutil.log("hook: python -c pass x%d per venv" % runs)
    times = _interleaved([(name, [python, "-c", "pass"], env) for name, python in sorted(venvs.items())], runs)
    plain, hook = benchutil.summarize(times["plain"]), benchutil.summarize(times["hook"])
    stats["pass_plain_ms"], stats["pass_hook_ms"] = plain, hook
    pass_ratio = benchutil.ratio(hook, plain)
    rows.append(["python -c pass", "venv without ptxbackend", benchutil.fmt_stat(plain), "-"])
    rows.append(["python -c pass", "venv with the ptxbackend wheel", benchutil.fmt_stat(hook),
                 "%s (+%.2f ms)" % (benchutil.fmt_ratio(pass_ratio), hook["median"] - plain["median"])])
    self_us, cumulative_us = _importtime(venvs["hook"], env, max(10, runs // 3))
    if cumulative_us:
        imp_self = benchutil.summarize([u / 1000.0 for u in self_us])
        imp_cum = benchutil.summarize([u / 1000.0 for u in cumulative_us])
        stats["boot_import_self_ms"], stats["boot_import_cumulative_ms"] = imp_self, imp_cum
        rows.append(["-X importtime: " + START_MODULE, "self / cumulative",
                     "%s / %s" % (benchutil.fmt_stat(imp_self), benchutil.fmt_stat(imp_cum)), "-"])
        summary["boot_import_ms"] = imp_cum["median"]
    else:
        notes.append("-X importtime printed no %s line" % START_MODULE)
    summary["pass_ratio"] = pass_ratio
    summary["pass_delta_ms"] = hook["median"] - plain["median"]


def _cupy_part(ctx, notes, rows, summary, stats):
    if ctx.cupy.get("cupy_version"):
        cupy_runs = ctx.reps(full=20, quick=7)
        installed = ctx.cupy.get("hook_active")
        if installed:
            code = "import cupy"
            base = {k: v for k, v in os.environ.items() if not k.startswith(("PTXBACKEND_", "CUDA_CACHE"))}
            notes.append("import cupy: this interpreter has the hook installed; toggled with PTXBACKEND_DISABLE=1")
        else:
            code = "import _ptxbackend_pth; import cupy"
            base = benchutil.clean_env()
            notes.append("import cupy: the hook is not installed in this interpreter; both variants run "
                         "`import _ptxbackend_pth` (what ptxbackend.pth runs), PTXBACKEND_DISABLE=1 makes it "
                         "return at once")
        on = dict(base)
        off = dict(base, PTXBACKEND_DISABLE="1")
        check = ("%s; import sys; m = sys.modules['cupy.cuda.compiler']; "
                 "print(any(hasattr(getattr(m, a, None), '_ptxbackend_original') for a in "
                 "('_compile_module_with_cache', 'compile_with_cache')))" % code)
        served = [subprocess.run([sys.executable, "-c", check], env=e, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, universal_newlines=True).stdout.strip() for e in (on, off)]
        if served != ["True", "False"]:
            notes.append("import cupy: CuPy's compile function replaced (hook on, off) = %s, expected True, False"
                         % served)
        benchutil.log("hook: import cupy x%d per variant" % cupy_runs)
        times = _interleaved([("on", [sys.executable, "-c", code], on), ("off", [sys.executable, "-c", code], off)],
                             cupy_runs)
        c_on, c_off = benchutil.summarize(times["on"]), benchutil.summarize(times["off"])
        stats["import_cupy_hook_ms"], stats["import_cupy_disabled_ms"] = c_on, c_off
        r = benchutil.ratio(c_on, c_off)
        rows.append(["python -c 'import cupy'", "PTXBACKEND_DISABLE=1", benchutil.fmt_stat(c_off), "-"])
        rows.append(["python -c 'import cupy'", "hook on (CuPy handed to ptxbackend)", benchutil.fmt_stat(c_on),
                     "%s (+%.1f ms)" % (benchutil.fmt_ratio(r), c_on["median"] - c_off["median"])])
        summary["import_cupy_ratio"] = r
        summary["import_cupy_delta_ms"] = c_on["median"] - c_off["median"]
    else:
        notes.append("import cupy not measured: CuPy is not importable here")

"""Hook robustness: whatever the environment, the interpreter starts, exits 0, prints at most a line.

The hook is installed from a real wheel (built once per session) into real virtual environments,
as in test_hook.py; CuPy is absent, broken, or a small stand-in with CuPy v1's layout.
Figures go to lines starting with ``reliability:`` (run with ``-s``).
"""

import glob
import io
import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO, figures

pytestmark = pytest.mark.reliability

GARBAGE = [b"garbage", b"", b" ", b"-1", b"0", b"1", b"nan", b"9" * 4000, b"\xff\xfe\x80", u"\u00e9\u2603".encode("utf-8"),
           b"\x01\x1b[31mred", b"../../etc/passwd", b"1G; rm -rf /", b"%s%n%d", b"line\nbreak", u"\u00b2G".encode("utf-8")]


def documented_variables():
    with io.open(os.path.join(REPO, "docs", "configuration.md"), encoding="utf-8") as handle:
        return sorted(set(re.findall(r"PTXBACKEND_[A-Z0-9_]*[A-Z0-9]", handle.read())))


@pytest.fixture
def venv(hook_venv, tmp_path):
    """A private copy of the session venv: this test may break it as it likes."""
    root, site = hook_venv
    copy = str(tmp_path / "venv")
    shutil.copytree(root, copy, symlinks=True)
    return os.path.join(copy, "bin", "python"), os.path.join(copy, site)


def run(python, args, env=None, pythonpath=None):
    """Run with a clean environment plus ``env`` (bytes allowed); return (rc, stdout, stderr lines)."""
    clean = {k: v for k, v in os.environb.items()
             if not k.startswith((b"PTXBACKEND_", b"CUDA_CACHE", b"PYTHONPATH"))}
    for name, value in (env or {}).items():
        clean[os.fsencode(name)] = os.fsencode(value)
    if pythonpath:
        clean[b"PYTHONPATH"] = os.fsencode(pythonpath)
    proc = subprocess.run([python] + list(args), env=clean, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd="/", timeout=120)
    return proc.returncode, proc.stdout, proc.stderr.splitlines()


def fake_cupy(base, compiler_body="def compile_with_cache(*a, **k):\n    return 'stock'\n",
              package_body="from cupy.cuda import compiler\nfrom cupy.cuda.compiler import compile_with_cache\n"):
    """A stand-in with CuPy v1's layout (cupy.cuda.compiler.compile_with_cache)."""
    pkg = os.path.join(str(base), "cupy")
    os.makedirs(os.path.join(pkg, "cuda"))
    with open(os.path.join(pkg, "__init__.py"), "w") as handle:
        handle.write("from cupy import cuda\n")
    with open(os.path.join(pkg, "cuda", "__init__.py"), "w") as handle:
        handle.write(package_body)
    with open(os.path.join(pkg, "cuda", "compiler.py"), "w") as handle:
        handle.write(compiler_body)
    return str(base)


def test_garbage_in_every_variable_leaves_python_working(venv):
    python, _site = venv
    variables = documented_variables()
    assert "PTXBACKEND_DISABLE" in variables and "PTXBACKEND_JIT_CACHE_MAXSIZE" in variables
    bad = []
    cases = lines = 0
    for value in GARBAGE:
        for env in [{name: value} for name in variables] + [dict.fromkeys(variables, value)]:
            code, out, err = run(python, ["-c", "pass"], env)
            cases += 1
            lines += len(err)
            if code != 0 or out or len(err) > 1 or (err and not err[0].startswith(b"ptxbackend: ")):
                bad.append((sorted(env)[0] if len(env) == 1 else "all", value, code, out, err))
    figures("hook: garbage in every variable, python -c pass", variables=len(variables), values=len(GARBAGE),
            cases=cases, stderr_lines=lines, failures=len(bad))
    assert bad == []


def test_garbage_everywhere_and_cupy_imported(venv, tmp_path):
    python, _site = venv
    path = fake_cupy(tmp_path / "cupy-v1")
    bad = []
    for value in GARBAGE:
        env = dict.fromkeys(documented_variables(), value)
        env.pop("PTXBACKEND_DISABLE")  # the hook must act, with every other knob broken
        code, out, err = run(python, ["-c", "import cupy.cuda.compiler as c; print(c.compile_with_cache)"],
                             env, pythonpath=path)
        if code != 0 or len(err) > 1 or b"function" not in out:
            bad.append((value, code, out, err))
    figures("hook: garbage everywhere, CuPy imported", cases=len(GARBAGE), failures=len(bad))
    assert bad == []


def test_cupy_missing(venv):
    python, _site = venv
    assert run(python, ["-c", "pass"]) == (0, b"", [])
    code, _out, err = run(python, ["-c", "import cupy"])
    assert code == 1 and b"No module named 'cupy'" in err[-1]
    assert not any(line.startswith(b"ptxbackend") for line in err)
    figures("hook: CuPy missing", cases=2, failures=0)


@pytest.mark.parametrize("where", ["cupy/cuda/__init__.py", "cupy/cuda/compiler.py"])
def test_cupy_raising_on_import(venv, tmp_path, where):
    python, _site = venv
    broken = "raise RuntimeError('CUDA driver library not found')\n"
    path = fake_cupy(tmp_path / "broken", **({"package_body": broken} if where.endswith("__init__.py")
                                            else {"compiler_body": broken}))
    assert run(python, ["-c", "pass"], pythonpath=path) == (0, b"", [])
    code, _out, err = run(python, ["-c", "import cupy"], pythonpath=path)
    assert code == 1 and err[-1] == b"RuntimeError: CUDA driver library not found"  # CuPy's own error
    assert not any(line.startswith(b"ptxbackend") for line in err)
    figures("hook: CuPy raising in %s" % where, cases=2, failures=0)


def _break(site, how):
    package = os.path.join(site, "ptxbackend")
    boot = os.path.join(site, "_ptxbackend_boot.py")
    pth_module = os.path.join(site, "_ptxbackend_pth.py")
    if how == "start module removed":
        os.unlink(pth_module)
    elif how == "start module truncated":
        with open(pth_module, "rb") as handle:
            text = handle.read()
        with open(pth_module, "wb") as handle:
            handle.write(text[:len(text) // 2])
    elif how == "package removed":
        shutil.rmtree(package)
    elif how == "boot module removed":
        os.unlink(boot)
    elif how == "only the .pth left":
        shutil.rmtree(package)
        os.unlink(boot)
    elif how == "package __init__ raises":
        with open(os.path.join(package, "__init__.py"), "w") as handle:
            handle.write("raise ImportError('half removed')\n")
    elif how == "cupy_integration removed":
        os.unlink(os.path.join(package, "hook", "cupy_integration.py"))
    elif how == "boot module truncated":
        with open(boot, "rb") as handle:
            text = handle.read()
        with open(boot, "wb") as handle:
            handle.write(text[:len(text) // 2])  # cut mid-statement, as an interrupted copy does
    elif how == "boot module empty":
        open(boot, "w").close()
    for pycache in glob.glob(os.path.join(site, "__pycache__")) + glob.glob(os.path.join(package, "__pycache__")):
        shutil.rmtree(pycache)


HALF = ["package removed", "boot module removed", "only the .pth left", "package __init__ raises",
        "cupy_integration removed", "boot module truncated", "boot module empty", "start module removed",
        "start module truncated"]


@pytest.mark.parametrize("how", HALF)
def test_half_uninstalled_package(venv, tmp_path, how):
    python, site = venv
    _break(site, how)
    path = fake_cupy(tmp_path / "cupy-v1")
    results = [run(python, ["-c", "pass"]), run(python, ["-c", "pass"], pythonpath=path),
               run(python, ["-c", "import cupy.cuda.compiler as c; print(c.compile_with_cache())"],
                   pythonpath=path)]
    for code, out, err in results[:2]:
        assert code == 0 and out == b"" and len(err) <= 1, (how, code, out, err)
    code, out, err = results[2]
    assert code == 0 and out.strip() == b"stock" and len(err) <= 1, (how, code, out, err)  # CuPy's own
    assert all(line.startswith(b"ptxbackend") for _c, _o, e in results for line in e)
    figures("hook: half uninstalled (%s)" % how, runs=3, exit_codes_nonzero=0,
            stderr_lines=sum(len(e) for _c, _o, e in results))

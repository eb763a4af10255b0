"""The start-up hook, installed from a real wheel into a real virtual environment."""

import os
import shutil
import subprocess
import zipfile

import pytest

from conftest import REPO


HOOK_STATE = ("import sys, os; print(any(getattr(f, 'ptxbackend_watcher', False) for f in sys.meta_path), "
              "os.environ.get('CUDA_CACHE_MAXSIZE'))")


@pytest.fixture(scope="module")
def wheel(hook_wheel):
    return hook_wheel


@pytest.fixture(scope="module")
def venv(hook_venv, tmp_path_factory):
    """This module's own copy of the session venv: some tests break it (and repair it)."""
    root, site = hook_venv
    copy = str(tmp_path_factory.mktemp("hook-venv") / "venv")
    shutil.copytree(root, copy, symlinks=True)
    return os.path.join(copy, "bin", "python"), os.path.join(copy, site)


def run(python, *args, **env_changes):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PTXBACKEND_", "CUDA_CACHE", "PYTHONPATH"))}
    env.update(env_changes)
    return subprocess.run([python] + list(args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          encoding="utf-8", errors="replace", cwd="/")


def test_wheel_puts_the_hook_in_site_packages(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {"ptxbackend.pth", "ptxbackend.start", "_ptxbackend_boot.py", "_ptxbackend_pth.py"} <= set(names)
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("ptxbackend.start").decode().strip() == "_ptxbackend_pth:install"
        line = archive.read("ptxbackend.pth").decode()
    assert line.startswith("import ") and line.count("\n") == 1


def test_hook_is_active_and_sizes_the_jit_cache(venv):
    python, _ = venv
    proc = run(python, "-c", HOOK_STATE)
    assert (proc.returncode, proc.stdout.split(), proc.stderr) == (0, ["True", "4294967296"], "")


def test_hook_respects_the_users_jit_cache_size_and_our_knob(venv):
    python, _ = venv
    assert run(python, "-c", HOOK_STATE, CUDA_CACHE_MAXSIZE="123").stdout.split() == ["True", "123"]
    assert run(python, "-c", HOOK_STATE, PTXBACKEND_JIT_CACHE_MAXSIZE="1G").stdout.split() == ["True", "1073741824"]
    assert run(python, "-c", HOOK_STATE, PTXBACKEND_JIT_CACHE_MAXSIZE="0").stdout.split() == ["True", "None"]


def test_disable_leaves_everything_alone(venv):
    python, _ = venv
    proc = run(python, "-c", HOOK_STATE, PTXBACKEND_DISABLE="1")
    assert (proc.stdout.split(), proc.stderr) == (["False", "None"], "")


def test_python_S_runs_no_hook_and_I_does(venv):
    python, _ = venv
    assert run(python, "-S", "-c", HOOK_STATE).stdout.split() == ["False", "None"]
    assert run(python, "-I", "-c", HOOK_STATE).stdout.split()[0] == "True"


def test_hook_imports_nothing_at_start(venv):
    python, _ = venv
    code = "import sys; print(' '.join(sorted(sys.modules)))"
    with_hook = set(run(python, "-c", code).stdout.split())
    without = set(run(python, "-c", code, PTXBACKEND_DISABLE="1").stdout.split())
    assert with_hook == without  # the tiny _ptxbackend_pth only; the boot module waits for CuPy
    assert "_ptxbackend_pth" in with_hook
    assert "_ptxbackend_boot" not in with_hook and "ptxbackend" not in with_hook


def test_pth_file_is_the_rendered_line():
    import _ptxbackend_boot
    with open(os.path.join(REPO, "ptxbackend.pth")) as handle:
        assert handle.read() == _ptxbackend_boot.pth_line()


@pytest.mark.parametrize("value", ["", "garbage", "-5", "9999999999999G", "\u00e9"])
def test_garbage_jit_cache_size_costs_one_line(venv, value):
    python, _ = venv
    proc = run(python, "-c", "pass", PTXBACKEND_JIT_CACHE_MAXSIZE=value)
    assert proc.returncode == 0 and len(proc.stderr.splitlines()) <= 1


def test_broken_cupy_does_not_break_python(venv, tmp_path):
    python, _ = venv
    fake = tmp_path / "broken" / "cupy" / "cuda"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("from cupy import cuda\n")
    (fake / "__init__.py").write_text("raise RuntimeError('CUDA driver library not found')\n")
    assert run(python, "-c", "pass", PYTHONPATH=str(tmp_path / "broken")).returncode == 0
    proc = run(python, "-c", "import cupy", PYTHONPATH=str(tmp_path / "broken"))
    assert proc.returncode == 1 and "CUDA driver library not found" in proc.stderr  # CuPy's own error


def test_half_uninstalled_package_is_silent(venv, tmp_path):
    python, site = venv
    names = ("_ptxbackend_boot.py", "_ptxbackend_pth.py")
    cache = os.path.join(site, "__pycache__")
    for name in names:
        os.rename(os.path.join(site, name), os.path.join(str(tmp_path), name))
    if os.path.isdir(cache):
        os.rename(cache, os.path.join(str(tmp_path), "__pycache__"))
    try:
        proc = run(python, "-c", "pass")
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    finally:
        for name in names:
            os.rename(os.path.join(str(tmp_path), name), os.path.join(site, name))


def test_boot_module_without_package_reports_once_on_cupy_import(venv, tmp_path):
    python, site = venv
    os.rename(os.path.join(site, "ptxbackend"), os.path.join(str(tmp_path), "ptxbackend"))
    fake = tmp_path / "fakecupy" / "cupy" / "cuda"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("from cupy.cuda import compiler\n")
    (fake / "__init__.py").write_text("from cupy.cuda import compiler\n")
    (fake / "compiler.py").write_text("def compile_with_cache(*a, **k):\n    return 'stock'\n")
    try:
        proc = run(python, "-c", "import cupy.cuda.compiler as c; print(c.compile_with_cache())",
                   PYTHONPATH=str(tmp_path / "fakecupy"))
        assert proc.returncode == 0 and proc.stdout.strip() == "stock"
        assert len(proc.stderr.splitlines()) == 1 and "ptxbackend" in proc.stderr
    finally:
        os.rename(os.path.join(str(tmp_path), "ptxbackend"), os.path.join(site, "ptxbackend"))


def test_hook_points_the_driver_at_an_imported_jit_cache_and_never_over_the_users(venv, tmp_path):
    python, _ = venv
    code = "import os; print(os.environ.get('CUDA_CACHE_PATH'))"
    root = tmp_path / "cache"
    assert run(python, "-c", code, PTXBACKEND_CACHE_DIR=str(root)).stdout.split() == ["None"]
    (root / "driver-jit").mkdir(parents=True)  # what `ptxbackend cache import` of a driver-JIT bundle makes
    assert run(python, "-c", code, PTXBACKEND_CACHE_DIR=str(root)).stdout.split() == [str(root / "driver-jit")]
    assert run(python, "-c", code, PTXBACKEND_CACHE_DIR=str(root),
               CUDA_CACHE_PATH="/mine").stdout.split() == ["/mine"]
    assert run(python, "-c", code, PTXBACKEND_CACHE_DIR=str(root),
               PTXBACKEND_DISABLE="1").stdout.split() == ["None"]

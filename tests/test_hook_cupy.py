"""The start-up hook takes over a real CuPy in a program that never imports ptxbackend.

A virtual environment holds the built wheel (so its ``ptxbackend.pth``); CuPy comes from this
environment's site-packages through a plain path entry.  The child program imports only ``cupy``.
"""

import json
import os
import shutil
import subprocess

import pytest

from conftest import cache_files

# The child: nothing of ptxbackend is imported by the program itself.
CHILD = r'''
import json, sys
import cupy
from cupy.cuda import compiler
name = "_compile_module_with_cache" if hasattr(compiler, "_compile_module_with_cache") else "compile_with_cache"
function = getattr(compiler, name)
out = {"function": "%s.%s" % (function.__module__, getattr(function, "__qualname__", "?")),
       "replaced": getattr(function, "_ptxbackend_original", None) is not None,
       "ptxbackend_imported_by": "the hook" if "ptxbackend" in sys.modules else None}
if sys.argv[1] == "gpu":
    kernel = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * 2.5f + 1.0f", "ptxb_hook_take_over")
    out["result"] = kernel(cupy.arange(4, dtype=cupy.float32)).get().tolist()
else:
    # No GPU: CuPy's own entry point compiles through ptxbackend (PTXBACKEND_DEVICE_CC); only making
    # CuPy's context current (stubbed here, in CuPy's runtime module) and loading need a device.
    from cupy._core import core

    class NoDeviceRuntime(object):
        def __init__(self, real):
            self._real = real

        def memGetInfo(self):
            return 0, 0

        def __getattr__(self, name):
            return getattr(self._real, name)
    compiler.runtime = NoDeviceRuntime(compiler.runtime)
    try:
        core.compile_with_cache('extern "C" __global__ void ptxb_hook_take_over(float* x) { x[0] = 1.0f; }')
    except Exception as exc:
        out["load_error"] = type(exc).__name__
print(json.dumps(out))
'''


@pytest.fixture
def cupy_venv(hook_venv, tmp_path):
    """The session's hook venv (the built wheel), plus a path entry to the site-packages holding CuPy."""
    cupy = pytest.importorskip("cupy")
    root, site = hook_venv
    copy = str(tmp_path / "venv")
    shutil.copytree(root, copy, symlinks=True)
    cupy_site = os.path.dirname(os.path.dirname(cupy.__file__))
    # A plain path line: that directory's own .pth files (this checkout's editable install) stay unread.
    with open(os.path.join(copy, site, "zz-cupy-from-the-test-environment.pth"), "w") as handle:
        handle.write(cupy_site + "\n")
    return os.path.join(copy, "bin", "python")


def _run_child(python, mode, cache, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PTXBACKEND_", "PYTHONPATH"))}
    env.update(PTXBACKEND_CACHE_DIR=str(cache), PTXBACKEND_TARGET="compute_75", **extra)
    proc = subprocess.run([python, "-c", CHILD, mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_hook_takes_over_cupy_without_any_ptxbackend_import(cupy_venv, nvcc13, tmp_path):
    cache = tmp_path / "cache"
    # nvcc 13: this environment's NVRTC 11.7 wheel (a test extra) is older than CuPy 14's headers need.
    out = _run_child(cupy_venv, "cpu", cache, PTXBACKEND_DEVICE_CC="9.0", PTXBACKEND_COMPILER="nvcc",
                     PTXBACKEND_NVCC=nvcc13)
    assert out["replaced"] and out["function"].startswith("ptxbackend.hook.cupy_integration.")
    assert out["ptxbackend_imported_by"] == "the hook"
    entries = [p for p in cache_files(cache) if p.endswith(".ptx")]
    assert len(entries) == 1 and os.sep + "compute_75" + os.sep in entries[0]


def test_hook_is_off_with_PTXBACKEND_DISABLE(cupy_venv, tmp_path):
    out = _run_child(cupy_venv, "cpu", tmp_path / "cache", PTXBACKEND_DEVICE_CC="9.0", PTXBACKEND_DISABLE="1")
    assert not out["replaced"] and out["ptxbackend_imported_by"] is None
    assert cache_files(tmp_path / "cache") == []


@pytest.mark.gpu
@pytest.mark.skipif("not __import__('conftest').gpu_available()", reason="needs an NVIDIA GPU and driver")
def test_hook_takes_over_cupy_and_runs_an_elementwise_kernel_on_the_gpu(cupy_venv, tmp_path):
    cache = tmp_path / "cache"
    out = _run_child(cupy_venv, "gpu", cache, CUPY_CACHE_DIR=str(tmp_path / "cupy-cache"))
    assert out["replaced"] and out["ptxbackend_imported_by"] == "the hook"
    assert out["result"] == [1.0, 3.5, 6.0, 8.5]
    assert any(os.sep + "compute_75" + os.sep in p for p in cache_files(cache) if p.endswith(".ptx"))

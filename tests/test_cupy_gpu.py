"""CuPy through ptxbackend on a real GPU (the H200 with cupy-cuda13x 14.2 and CUDA 13).

The comparison runs each side in a fresh interpreter: CuPy keeps every kernel it
has loaded for the life of the process, so a second run in the same process
would reuse the first run's kernels instead of compiling them again.
"""

import json
import os
import random

import pytest

from conftest import run_python
from ptxbackend.hook import cupy_integration as ci

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif("not __import__('conftest').gpu_available()",
                                 reason="needs an NVIDIA GPU and driver")]

# Runs in a fresh interpreter; PTXB_TEST_MODE is 'ptxbackend' or 'stock', PTXB_TEST_SALT makes the
# kernels' sources unique to this test run.
WORKLOAD = r'''
import json, logging, os
import numpy
import cupy
from cupy.cuda import compiler
from ptxbackend.hook import cupy_integration as ci

mode, salt = os.environ["PTXB_TEST_MODE"], int(os.environ["PTXB_TEST_SALT"])
if mode == "ptxbackend":
    ci.install()
else:
    ci.uninstall()
warnings = []
handler = logging.Handler(logging.WARNING)
handler.emit = lambda record: warnings.append(record.getMessage())
logging.getLogger("ptxbackend").addHandler(handler)

backend = getattr(compiler, "_kernel_cache_backend", None)
cupy_cache = getattr(backend, "_cache_dir", None) or compiler.get_cache_dir()
def files(root, suffix=""):
    return sorted(os.path.join(b, n) for b, _d, names in os.walk(root) for n in names if n.endswith(suffix))
def ptx_entries():
    return len(files(os.environ["PTXBACKEND_CACHE_DIR"], ".ptx"))

out = {"installed": ci.installed(), "cupy_cache": cupy_cache}
x = cupy.arange(4096, dtype=cupy.float32) / 512
n = numpy.int32(x.size)

ew = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * 3.25f + %d.0f" % salt, "ptxb_ew_%d" % salt)
out["elementwise"] = ew(x).get().tolist()

red = cupy.ReductionKernel("float32 x", "float32 y", "x * x + %d.0f" % salt, "a + b", "y = a", "0",
                           "ptxb_red_%d" % salt)
out["reduction"] = float(red(x))

raw = cupy.RawKernel(r"""
extern "C" __global__ void ptxb_raw_%d(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = sinf(x[i]) * x[i] + %d.0f;
}""" % (salt, salt), "ptxb_raw_%d" % salt)
y = cupy.empty_like(x)
raw((16,), (256,), (x, y, n))
out["raw"] = y.get().tolist()

module = cupy.RawModule(code=r"""
extern "C" __global__ void ptxb_twice_%d(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * y[i];
}
extern "C" __global__ void ptxb_plus_%d(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] + %d.0f;
}""" % (salt, salt, salt))
z = x.copy()
module.get_function("ptxb_twice_%d" % salt)((16,), (256,), (z, n))
module.get_function("ptxb_plus_%d" % salt)((16,), (256,), (z, n))
out["raw_module"] = z.get().tolist()

i = cupy.arange(1000, dtype=cupy.int64)
out["array"] = [float((x * 2 + 1).sum()), cupy.exp(x).get().tolist(), int((i * 3 % 7).sum()),
                cupy.sort(x[::-1]).get().tolist(), float(cupy.linalg.norm(x)), float(x.mean())]
cupy.cuda.Device().synchronize()
out["cupy_cache_files_before_delegated"] = len(files(cupy_cache))
out["ptx_entries_before_delegated"] = ptx_entries()

templated = cupy.RawModule(code=r"""
template<typename T> __global__ void ptxb_tpl(T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * (T)%d;
}""" % salt, name_expressions=["ptxb_tpl<float>"])
w = x.copy()
templated.get_function("ptxb_tpl<float>")((16,), (256,), (w, n))
out["name_expressions"] = w.get().tolist()
cupy.cuda.Device().synchronize()
out["cupy_cache_files_after"] = len(files(cupy_cache))
out["ptx_entries_after"] = ptx_entries()
out["warnings"] = warnings
print(json.dumps(out))
'''

RESULTS = ("elementwise", "reduction", "raw", "raw_module", "array", "name_expressions")


@pytest.fixture
def cupy_module():
    pytest.importorskip("cupy")
    import cupy
    return cupy


def _run(mode, salt, tmp_path):
    cupy_cache = tmp_path / ("cupy-cache-" + mode)
    cupy_cache.mkdir()
    env = {"PTXB_TEST_MODE": mode, "PTXB_TEST_SALT": str(salt), "CUPY_CACHE_DIR": str(cupy_cache),
           "CUPY_CACHE_IN_MEMORY": "0", "PTXBACKEND_TARGET": "compute_75",
           "PTXBACKEND_DISABLE": "1" if mode == "stock" else "0"}
    result = json.loads(run_python(WORKLOAD, env=env).strip().splitlines()[-1])
    assert result["cupy_cache"] == str(cupy_cache)
    return result


def _close(a, b):
    import numpy
    numpy.testing.assert_allclose(numpy.asarray(a, dtype=float), numpy.asarray(b, dtype=float),
                                  rtol=1e-6, atol=0)


def test_cupy_kernels_through_ptxbackend_match_stock_cupy(cupy_module, tmp_path):
    salt = random.randrange(1, 1 << 20)
    stock = _run("stock", salt, tmp_path)
    ours = _run("ptxbackend", salt, tmp_path)

    assert (stock["installed"], ours["installed"]) == (False, True)
    for name in RESULTS:
        if name == "array":
            for a, b in zip(stock[name], ours[name]):
                _close(a, b)
        else:
            _close(stock[name], ours[name])

    # Every kernel before the delegated one came from ptxbackend: CuPy's cache got nothing.
    assert ours["warnings"] == []
    assert ours["cupy_cache_files_before_delegated"] == 0
    assert stock["cupy_cache_files_before_delegated"] > 0  # the check above can see files
    # name_expressions went to CuPy's own function, which cached it; ptxbackend built nothing for it.
    assert ours["cupy_cache_files_after"] > 0
    assert ours["ptx_entries_after"] == ours["ptx_entries_before_delegated"] >= 5

    ptx = []
    for base, _dirs, names in os.walk(os.environ["PTXBACKEND_CACHE_DIR"]):
        ptx.extend(os.path.join(base, n) for n in names if n.endswith(".ptx"))
    assert len(ptx) == ours["ptx_entries_after"]
    assert all(os.sep + "compute_75" + os.sep in path for path in ptx)


@pytest.fixture
def installed_here(cupy_module, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_TARGET", "compute_75")
    was = ci.installed()
    ci.uninstall()
    import cupy.cuda.compiler
    original = cupy.cuda.compiler._compile_module_with_cache
    ci.install()
    yield cupy.cuda.compiler, original
    ci.uninstall()
    if was:
        ci.install()


def test_the_replacement_serves_without_cupys_compiler_and_delegates_name_expressions(installed_here):
    from test_cupy_integration import run_watching
    import cupy
    compiler, original = installed_here
    salt = random.randrange(1, 1000)
    source = r'''
extern "C" __global__ void ptxb_fill(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = %d.0f;
}
template<typename T> __global__ void ptxb_tpl(T* y) { y[threadIdx.x] += (T)1; }
''' % salt
    entered, error, module = run_watching(original.__code__, compiler._compile_module_with_cache, source)
    assert error is None and entered is None
    assert isinstance(module, cupy.cuda.function.Module)
    y = cupy.zeros(300, dtype=cupy.float32)
    module.get_function("ptxb_fill")((2,), (256,), (y, cupy.int32(y.size)))
    assert y.get().tolist() == [float(salt)] * 300

    entered, error, module = run_watching(original.__code__, compiler._compile_module_with_cache, source,
                                          name_expressions=["ptxb_tpl<float>"])
    assert error is None and entered["name_expressions"] == ["ptxb_tpl<float>"]
    module.get_function(module.mapping["ptxb_tpl<float>"])((1,), (300,), (y,))
    assert y.get().tolist() == [float(salt + 1)] * 300

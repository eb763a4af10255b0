"""CPU checks of the cuDNN algorithm steering (issue 39), through the real start-up hook's import path.

The library is a stand-in built here with gcc, exporting the cuDNN calls involved under their real names
and signatures, with the H200's failure built in: the heuristic picks forward algorithm 1, and algorithm
1 returns success without writing its output.  ``cupy.cuda.cudnn`` is a stand-in for Chainer 1.24's
module (same function names and argument order, ctypes underneath).  What is checked is the wiring and
the decision; that the steered algorithms are right on the H200 is the device run's claim
(tests/legacy/run_cudnn_gpu.sh).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

STANDIN_C = r"""
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
typedef struct { int dtype; } desc_t;
int cudnnGetVersion(void) { return 7102; }
int cudnnCreateTensorDescriptor(desc_t **d) { *d = calloc(1, sizeof(desc_t)); return 0; }
int cudnnSetTensor4dDescriptor(desc_t *d, int format, int dtype, int n, int c, int h, int w) {
    d->dtype = dtype; return 0; }
int cudnnGetTensorNdDescriptor(const desc_t *d, int req, int *dtype, int *nb, int *dims, int *strides) {
    *dtype = d->dtype; *nb = 4; return 0; }
/* Algorithm 3 refuses every shape, as DIRECT does in cuDNN 7; algorithm 6 needs 64 MiB of workspace. */
static int ws(int algo, size_t *size) { *size = algo == 6 ? (64u << 20) : 0; return algo == 3 ? 9 : 0; }
int cudnnGetConvolutionForwardWorkspaceSize(void *h, void *x, void *w, void *c, void *y, int algo, size_t *s) {
    return ws(algo, s); }
int cudnnGetConvolutionBackwardDataWorkspaceSize(void *h, void *w, void *dy, void *c, void *dx, int algo,
                                                 size_t *s) { return ws(algo, s); }
int cudnnGetConvolutionBackwardFilterWorkspaceSize(void *h, void *x, void *dy, void *c, void *dw, int algo,
                                                   size_t *s) { return ws(algo, s); }
int cudnnGetConvolutionForwardAlgorithm(void *h, void *x, void *w, void *c, void *y, int pref, size_t limit,
                                        int *algo) { *algo = 1; return 0; }
int cudnnGetConvolutionBackwardDataAlgorithm(void *h, void *w, void *dy, void *c, void *dx, int pref,
                                             size_t limit, int *algo) { *algo = 1; return 0; }
int cudnnGetConvolutionBackwardFilterAlgorithm(void *h, void *x, void *dy, void *c, void *dw, int pref,
                                               size_t limit, int *algo) { *algo = 1; return 0; }
/* The H200's failure: algorithm 1 reports success and leaves the output as it was. */
int cudnnConvolutionForward(void *h, const void *alpha, void *xd, const float *x, void *wd, const float *w,
                            void *cd, int algo, void *ws, size_t wss, const void *beta, void *yd, float *y) {
    if (algo != 1) y[0] = x[0] * w[0];
    return 0; }
int cudnnConvolutionBackwardData(void *h, const void *alpha, void *wd, const float *w, void *dyd,
                                 const float *dy, void *cd, int algo, void *ws, size_t wss, const void *beta,
                                 void *dxd, float *dx) {
    if (algo != 1) dx[0] = w[0] * dy[0];
    return 0; }
int cudnnConvolutionBackwardFilter(void *h, const void *alpha, void *xd, const float *x, void *dyd,
                                   const float *dy, void *cd, int algo, void *ws, size_t wss,
                                   const void *beta, void *dwd, float *dw) {
    if (algo != 1) dw[0] = x[0] * dy[0];
    return 0; }
"""

# Chainer 1.24's cupy/cuda/cudnn.pyx functions, same names and argument order, on the stand-in.
MODULE_PY = r'''
import ctypes, os
_lib = ctypes.CDLL(os.environ["STANDIN_CUDNN"])
P = ctypes.c_void_p
def _algo(fn, args):
    out = ctypes.c_int()
    assert fn(*[P(a) for a in args[:5]], ctypes.c_int(args[5]), ctypes.c_size_t(args[6]), ctypes.byref(out)) == 0
    return out.value
def createTensorDescriptor():
    d = P(); _lib.cudnnCreateTensorDescriptor(ctypes.byref(d)); return d.value
def setTensor4dDescriptor(desc, fmt, dtype, n, c, h, w):
    _lib.cudnnSetTensor4dDescriptor(P(desc), fmt, dtype, n, c, h, w)
def getConvolutionForwardAlgorithm(handle, srcDesc, filterDesc, convDesc, destDesc, preference, limit):
    return _algo(_lib.cudnnGetConvolutionForwardAlgorithm, (handle, srcDesc, filterDesc, convDesc, destDesc, preference, limit))
def getConvolutionBackwardDataAlgorithm(handle, filterDesc, diffDesc, convDesc, gradDesc, preference, limit):
    return _algo(_lib.cudnnGetConvolutionBackwardDataAlgorithm, (handle, filterDesc, diffDesc, convDesc, gradDesc, preference, limit))
def getConvolutionBackwardFilterAlgorithm(handle, srcDesc, diffDesc, convDesc, gradDesc, preference, limit):
    return _algo(_lib.cudnnGetConvolutionBackwardFilterAlgorithm, (handle, srcDesc, diffDesc, convDesc, gradDesc, preference, limit))
def _run(fn, a):
    assert fn(P(a[0]), P(a[1]), P(a[2]), P(a[3]), P(a[4]), P(a[5]), P(a[6]), ctypes.c_int(a[7]), P(a[8]),
              ctypes.c_size_t(a[9]), P(a[10]), P(a[11]), P(a[12])) == 0
def convolutionForward(handle, alpha, srcDesc, srcData, filterDesc, filterData, convDesc, algo, workSpace,
                       workSpaceSizeInBytes, beta, destDesc, destData):
    _run(_lib.cudnnConvolutionForward, (handle, alpha, srcDesc, srcData, filterDesc, filterData, convDesc, algo,
                                        workSpace, workSpaceSizeInBytes, beta, destDesc, destData))
def convolutionBackwardData_v3(handle, alpha, filterDesc, filterData, diffDesc, diffData, convDesc, algo,
                               workSpace, workSpaceSizeInBytes, beta, gradDesc, gradData):
    _run(_lib.cudnnConvolutionBackwardData, (handle, alpha, filterDesc, filterData, diffDesc, diffData, convDesc,
                                             algo, workSpace, workSpaceSizeInBytes, beta, gradDesc, gradData))
def convolutionBackwardFilter_v3(handle, alpha, srcDesc, srcData, diffDesc, diffData, convDesc, algo,
                                 workSpace, workSpaceSizeInBytes, beta, gradDesc, gradData):
    _run(_lib.cudnnConvolutionBackwardFilter, (handle, alpha, srcDesc, srcData, diffDesc, diffData, convDesc,
                                               algo, workSpace, workSpaceSizeInBytes, beta, gradDesc, gradData))
'''

# The user's kind of call sequence (Chainer 1.24's Convolution2DFunction), through the import hook.
PROGRAM = r'''
import ctypes, json, os, sys
import _ptxbackend_boot
_ptxbackend_boot.start()
from ptxbackend.hook import cudnn_steering
cudnn_steering._device_identity = lambda: {"name": "NVIDIA H200", "cc": [9, 0]}  # no GPU on this machine
from cupy.cuda import cudnn as libcudnn
out = {"wrapped": cudnn_steering.status()["wrapped"]}
for dtype_name, dtype in (("float32", 0), ("float64", 1)):
    x_desc = libcudnn.createTensorDescriptor()
    libcudnn.setTensor4dDescriptor(x_desc, 0, dtype, 1, 1, 1, 1)
    nan = float("nan")
    x, w, y = (ctypes.c_float * 1)(2.0), (ctypes.c_float * 1)(3.0), (ctypes.c_float * 1)(nan)
    dx, dw = (ctypes.c_float * 1)(nan), (ctypes.c_float * 1)(nan)
    addr = ctypes.addressof
    limit = 8 << 20
    fwd = libcudnn.getConvolutionForwardAlgorithm(0, x_desc, 0, 0, x_desc, 2, limit)
    libcudnn.convolutionForward(0, 0, x_desc, addr(x), 0, addr(w), 0, fwd, 0, limit, 0, x_desc, addr(y))
    bwd_data = libcudnn.getConvolutionBackwardDataAlgorithm(0, 0, x_desc, 0, x_desc, 2, limit)
    libcudnn.convolutionBackwardData_v3(0, 0, 0, addr(w), x_desc, addr(x), 0, bwd_data, 0, limit, 0, x_desc, addr(dx))
    # Chainer's deterministic mode fixes algorithm 1 without asking the heuristic
    libcudnn.convolutionBackwardFilter_v3(0, 0, x_desc, addr(x), x_desc, addr(w), 0, 1, 0, limit, 0, x_desc, addr(dw))
    out[dtype_name] = {"forward_algo": fwd, "backward_data_algo": bwd_data, "y": y[0] if y[0] == y[0] else None,
                       "dx": dx[0] if dx[0] == dx[0] else None, "dw": dw[0] if dw[0] == dw[0] else None}
status = cudnn_steering.status()
out.update(why_not=status["why_not"], steered=status["steered"])
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the stand-in library")
    base = tmp_path_factory.mktemp("cudnn-standin")
    src = base / "standin.c"
    src.write_text(STANDIN_C)
    lib = base / "lib" / "libcudnn.so.7"
    lib.parent.mkdir()
    subprocess.check_call([gcc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)])
    pkg = base / "site" / "cupy" / "cuda"
    pkg.mkdir(parents=True)
    (base / "site" / "cupy" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "cudnn.py").write_text(MODULE_PY)
    return base, str(lib)


def _entry(lib, forward, data=None, filt=None, device=("NVIDIA H200", [9, 0])):
    from ptxbackend.gpu import cudnn_algos

    def table(spec):
        return {dtype: {str(a): dict(verdict=v, detail="output not written (NaN stays)" if v == "wrong" else "")
                        for a, v in algos.items()} for dtype, algos in spec.items()}
    return {"library": cudnn_algos.library_identity(lib), "device": {"name": device[0], "cc": device[1]},
            "driver": "580.159.04", "cudnn_version": 7102, "tested_at": "2026-12-03T18:00:00Z",
            "verdicts": {"forward": table(forward), "backward_data": table(data or forward),
                         "backward_filter": table(filt or forward)}}


H200_LIKE = {"float32": {0: "good", 1: "wrong", 2: "good", 3: "unsupported", 5: "good"}}


def _run(standin, tmp_path, entry, **env_extra):
    from ptxbackend.gpu import cudnn_algos
    base, lib = standin
    cache = tmp_path / "cache"
    env = dict(os.environ, PTXBACKEND_CACHE_DIR=str(cache), STANDIN_CUDNN=lib,
               PYTHONPATH=os.pathsep.join([str(base / "site"), REPO]))
    env.pop("PTXBACKEND_DISABLE", None)
    env.update(env_extra)
    if entry is not None:
        meta = subprocess.check_output(
            [sys.executable, "-c", "from ptxbackend.config import load_settings; from ptxbackend.cache.stores "
             "import open_store; print(open_store(load_settings()).meta_dir)"], env=env,
            universal_newlines=True).strip()
        cudnn_algos.save(meta, entry)
    proc = subprocess.run([sys.executable, "-c", PROGRAM], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_wrong_algorithm_is_steered_to_a_verified_one(standin, tmp_path):
    out = _run(standin, tmp_path, _entry(standin[1], H200_LIKE))
    assert len(out["wrapped"]) == 6
    f32 = out["float32"]
    # The heuristic's algorithm 1 would leave the output unwritten; steered to 0, every output is computed
    assert f32["forward_algo"] == 0 and f32["backward_data_algo"] == 0
    assert (f32["y"], f32["dx"], f32["dw"]) == (6.0, 6.0, 6.0)
    # float64 has no verdicts in this entry: nothing to steer by, the library's choice stands
    assert out["float64"]["forward_algo"] == 1 and out["float64"]["y"] is None
    assert "forward float32 1->0 x1" in out["steered"]  # the chooser; the runner then sees 0 already
    assert "backward_filter float32 1->0 x1" in out["steered"]


def test_without_steering_the_output_stays_unwritten(standin, tmp_path):
    """The failure the steering exists for, on the same stand-in and verdicts."""
    out = _run(standin, tmp_path, _entry(standin[1], H200_LIKE), PTXBACKEND_CUDNN_STEERING="0")
    assert out["wrapped"] == []
    assert out["float32"]["forward_algo"] == 1 and out["float32"]["y"] is None and out["float32"]["dw"] is None


def test_steering_skips_an_algorithm_the_shape_refuses_or_that_needs_more_workspace(standin, tmp_path):
    # 0 and 2 not good; of the good ones, in the order tried: 6 needs 64 MiB > Chainer's 8 MiB limit, 3 refuses
    # the shape (NOT_SUPPORTED): 5 it is
    verdicts = {"float32": {0: "wrong", 1: "wrong", 2: "failed", 3: "good", 5: "good", 6: "good"}}
    # backward data tries 3 before 5: 3 refuses the shape, so 5
    data = {"float32": {0: "wrong", 1: "wrong", 2: "wrong", 3: "good", 5: "good"}}
    out = _run(standin, tmp_path, _entry(standin[1], verdicts, data=data))
    assert out["float32"]["forward_algo"] == 5 and out["float32"]["y"] == 6.0
    assert out["float32"]["backward_data_algo"] == 5 and out["float32"]["dx"] == 6.0


def test_verdicts_for_another_gpu_or_library_file_are_not_used(standin, tmp_path):
    out = _run(standin, tmp_path, _entry(standin[1], H200_LIKE, device=("NVIDIA A100", [8, 0])))
    assert out["float32"]["forward_algo"] == 1 and out["steered"] == []
    assert "warm --libs cudnn" in out["why_not"]
    entry = _entry(standin[1], H200_LIKE)
    entry["library"]["size"] += 1  # the file was replaced since the self-test
    out = _run(standin, tmp_path / "b", entry)
    assert out["float32"]["forward_algo"] == 1 and "warm --libs cudnn" in out["why_not"]


def test_verdict_file_is_data_and_private(standin, tmp_path):
    from ptxbackend.gpu import cudnn_algos
    meta = tmp_path / "meta"
    path = cudnn_algos.save(str(meta), _entry(standin[1], H200_LIKE))
    assert os.stat(path).st_mode & 0o077 == 0
    assert len(cudnn_algos.load(str(meta))) == 1
    # An entry with an unknown verdict word, or a planted symlink, is not used
    data = json.load(open(path))
    data["entries"][0]["verdicts"]["forward"]["float32"]["1"]["verdict"] = "__import__('os')"
    with open(path, "w") as handle:
        json.dump(data, handle)
    assert cudnn_algos.load(str(meta)) == []
    os.unlink(path)
    good = tmp_path / "elsewhere.json"
    good.write_text(json.dumps({"schema": 1, "entries": [_entry(standin[1], H200_LIKE)]}))
    os.symlink(str(good), path)
    assert cudnn_algos.load(str(meta)) == []


def test_doctor_lines_say_what_is_steered_and_why(standin):
    from ptxbackend.gpu import cudnn_algos
    lines = cudnn_algos.describe(_entry(standin[1], H200_LIKE))
    text = "\n".join(lines)
    assert "forward float32: algorithm 1 (IMPLICIT_PRECOMP_GEMM) wrong (output not written (NaN stays)) -> " \
           "algorithm 0 (IMPLICIT_GEMM)" in text
    assert "NVIDIA H200 (sm_90)" in lines[0]


def test_doctor_reports_the_steering_from_the_verdict_file(standin, tmp_path):
    from ptxbackend.gpu import cudnn_algos
    base, lib = standin
    env = dict(os.environ, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"), LD_LIBRARY_PATH=os.path.dirname(lib))
    meta = subprocess.check_output(
        [sys.executable, "-c", "from ptxbackend.config import load_settings; from ptxbackend.cache.stores "
         "import open_store; print(open_store(load_settings()).meta_dir)"], env=env, universal_newlines=True).strip()
    cudnn_algos.save(meta, _entry(lib, H200_LIKE))
    out = subprocess.run([sys.executable, "-m", "ptxbackend", "doctor"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, universal_newlines=True, timeout=120).stdout
    assert "forward float32: algorithm 1 (IMPLICIT_PRECOMP_GEMM) wrong" in out, out
    assert "STALE" not in out
    os.utime(lib, ns=(0, 0))  # the library file changed since the self-test
    out = subprocess.run([sys.executable, "-m", "ptxbackend", "doctor"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, universal_newlines=True, timeout=120).stdout
    assert "STALE" in out, out


def test_selftest_reference_and_comparison():
    """The self-test's plain-Python reference against numpy's, and what its comparison calls wrong."""
    numpy = pytest.importorskip("numpy")
    from ptxbackend.deploy import cudnn_selftest as st
    for case in st.CASES:
        _name, n, c, h, w, k, r, s, pad, stride = case
        ref = st.reference(case)
        oh, ow = ref["out_hw"]
        x = numpy.array(ref["x"]).reshape(n, c, h, w)
        wt = numpy.array(ref["w"]).reshape(k, c, r, s)
        dy = numpy.array(ref["dy"]).reshape(n, k, oh, ow)
        xp = numpy.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        cols = numpy.stack([xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
                            for i in range(r) for j in range(s)], axis=2)  # n, c, r*s, oh, ow
        y = numpy.einsum("ncpij,kcp->nkij", cols, wt.reshape(k, c, r * s))
        dw = numpy.einsum("ncpij,nkij->kcp", cols, dy).reshape(k, c, r, s)
        dcols = numpy.einsum("kcp,nkij->ncpij", wt.reshape(k, c, r * s), dy)
        dxp = numpy.zeros_like(xp)
        for p, (i, j) in enumerate((i, j) for i in range(r) for j in range(s)):
            dxp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += dcols[:, :, p]
        dx = dxp[:, :, pad:pad + h, pad:pad + w]
        assert numpy.allclose(numpy.array(ref["y"]).reshape(y.shape), y)
        assert numpy.allclose(numpy.array(ref["dw"]).reshape(dw.shape), dw)
        assert numpy.allclose(numpy.array(ref["dx"]).reshape(dx.shape), dx)
    assert st.compare([1.0, 2.0], [1.0, 2.0], 1e-6) is None
    assert st.compare([float("nan")] * 2, [1.0, 2.0], 1e-6) == "output not written (NaN stays)"
    assert "max error" in st.compare([1.0, 2.1], [1.0, 2.0], 1e-3)
    assert st.compare([1.0, 2.0 + 1e-5], [1.0, 2.0], 1e-3) is None


def test_selftest_results_of_several_processes_merge_and_a_dead_one_is_never_steered_to():
    from ptxbackend.deploy import cudnn_selftest as st
    from ptxbackend.gpu import cudnn_algos
    base = {"library": "l", "cudnn_version": 7102, "device": {"name": "NVIDIA H200", "cc": [9, 0]}, "driver": "d",
            "cases": ["c"], "seconds": 1.0, "heuristic": [{"direction": "forward", "dtype": "float32", "algo": 1}],
            "verdicts": {"forward": {"float32": {"0": {"verdict": "good"}, "1": {"verdict": "wrong"}}}}}
    dead = {"verdicts": {"backward_data": st.died("backward_data", 3, "killed by signal 11")}, "heuristic": [],
            "seconds": 0.0}
    good = {"verdicts": {"backward_data": {"float32": {"0": {"verdict": "good"}}}}, "heuristic": [], "seconds": 2.0}
    merged = st.merge([base, dead, good])
    assert merged["seconds"] == 3.0 and merged["device"]["cc"] == [9, 0]
    assert merged["verdicts"]["backward_data"]["float64"]["3"]["verdict"] == "failed"
    assert "signal 11" in merged["verdicts"]["backward_data"]["float16"]["3"]["detail"]
    good_sets = cudnn_algos.good_algorithms({"verdicts": merged["verdicts"]})
    assert good_sets["backward_data"]["float32"] == {0} and good_sets["forward"]["float32"] == {0}


def test_steering_decision_fuzzed():
    """Generated verdict tables, heuristic picks, workspace needs and refusals: the steered algorithm is the
    heuristic's when verified good, else the first verified one (in the preference order) that takes the shape
    within the limit, else the heuristic's (and counted as unsteerable)."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st
    from ptxbackend.gpu import cudnn_algos

    class Answers(object):  # what cuDNN would answer for one call's descriptors
        def __init__(self, dtype, needs):
            self._dtype, self._needs = dtype, needs

        def dtype(self, desc):
            return self._dtype

        def workspace(self, direction, handle, a, b, conv, c, algo):
            return self._needs.get(algo)

    algos = st.integers(0, 7)

    @settings(max_examples=300, deadline=None)
    @given(direction=st.sampled_from(cudnn_algos.DIRECTIONS), dtype=st.sampled_from(["float16", "float32", "float64"]),
           good=st.sets(algos), picked=algos, limit=st.integers(0, 1 << 24),
           needs=st.dictionaries(algos, st.one_of(st.none(), st.integers(0, 1 << 25))))
    def check(direction, dtype, good, picked, limit, needs):
        steer = cudnn_algos.Steering(Answers(dtype, needs), {direction: {dtype: set(good)}})
        got = steer.choose(direction, picked, 1, 2, 3, 4, 5, 6, workspace_limit=limit)
        fits = [a for a in cudnn_algos.PREFERENCE[direction]
                if a in good and needs.get(a) is not None and needs[a] <= limit]
        if picked in good:
            assert got == picked
        elif fits:
            assert got == fits[0]
        else:
            assert got == picked and steer.counts == {(direction, dtype, picked, None): 1}
    check()


def test_the_device_is_named_by_major_and_minor(monkeypatch):
    # the driver gives 90 for 9.0: verdict files and the steering both name the GPU [9, 0]
    from ptxbackend.gpu import cudnn_algos, driver
    monkeypatch.setattr(driver, "current_device", lambda: 0)
    monkeypatch.setattr(driver, "device_name", lambda ordinal=0: "NVIDIA H200")
    monkeypatch.setattr(driver, "compute_capability", lambda ordinal=0: 90)
    assert cudnn_algos.device_identity() == {"name": "NVIDIA H200", "cc": [9, 0]}
    assert cudnn_algos.device_identity(0)["cc"] == [9, 0]

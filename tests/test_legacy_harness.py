"""CPU checks of the legacy harness (tests/legacy/): Chainer 1.24 on today's stack.

- the patches apply cleanly to the real chainer==1.24.0 sdist from PyPI (downloaded
  once per machine into /tmp; skipped offline unless PTXBACKEND_REQUIRE_TOOLKITS=1);
- the comparison rules of issue 4 (gradients on their link's scale, losses relative);
- the harness's small helpers, the nose shim, the scripts' syntax;
- train.py on the CPU, when a Chainer 1.24 is importable (not in CI: build.sh makes one).
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import warnings

import pytest

from conftest import REPO

LEGACY = os.path.join(REPO, "tests", "legacy")
PATCHES = sorted(os.path.join(LEGACY, "patches", p) for p in os.listdir(os.path.join(LEGACY, "patches"))
                 if p.endswith(".patch"))
SDIST_DIR = os.path.join("/tmp", "ptxbackend-legacy-sdist")
sys.path.insert(0, LEGACY)
import compare  # noqa: E402


def _need(what):
    if os.environ.get("PTXBACKEND_REQUIRE_TOOLKITS") == "1":
        pytest.fail("%s is required here (PTXBACKEND_REQUIRE_TOOLKITS=1)" % what)
    pytest.skip("%s not available" % what)


def _run(cmd, **kwargs):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


@pytest.fixture(scope="session")
def sdist():
    """chainer-1.24.0.tar.gz from PyPI, cached in /tmp across sessions."""
    path = os.path.join(SDIST_DIR, "chainer-1.24.0.tar.gz")
    if not os.path.exists(path):
        os.makedirs(SDIST_DIR, exist_ok=True)
        constraint = os.path.join(SDIST_DIR, "constraints.txt")
        with open(constraint, "w") as handle:
            # pip prepares the sdist's metadata with its own (unpatched) setup.py, which
            # imports pkg_resources: give that isolated build a setuptools that has it
            handle.write("setuptools<70\n")
        # pip 25.3 and later apply only --build-constraint to that build (PIP_BUILD_CONSTRAINT).
        env = dict(os.environ, PIP_CONSTRAINT=constraint, PIP_BUILD_CONSTRAINT=constraint, PIP_USE_PEP517="1")
        code, out = _run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                          "--no-deps", "--no-binary", ":all:", "-d", SDIST_DIR, "chainer==1.24.0"], env=env)
        if code != 0 or not os.path.exists(path):
            _need("the chainer 1.24.0 sdist from PyPI (pip download failed:\n%s)" % out[-2000:])
    return path


@pytest.fixture(scope="session")
def patched(sdist, tmp_path_factory):
    """The sdist unpacked and patched, with patch's output per patch file."""
    if not shutil.which("patch"):
        _need("the `patch` program")
    root = str(tmp_path_factory.mktemp("chainer"))
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(root, filter="tar")
        else:
            tar.extractall(root)
    src = os.path.join(root, "chainer-1.24.0")
    outputs = {}
    for path in PATCHES:
        with open(path, "rb") as handle:
            code, out = _run(["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch"],
                             stdin=handle, cwd=src)
        outputs[os.path.basename(path)] = (code, out)
    return src, outputs


def test_patches_exist_and_say_why():
    assert len(PATCHES) >= 6
    for path in PATCHES:
        with open(path) as handle:
            text = handle.read()
        assert text.startswith("# "), "%s: start with a comment that says why" % path
        assert "\ndiff --git a/" in text


def test_patches_apply_cleanly_to_the_real_sdist(patched):
    _src, outputs = patched
    for name, (code, out) in sorted(outputs.items()):
        assert code == 0, "%s does not apply:\n%s" % (name, out)
        assert "fuzz" not in out and "offset" not in out, "%s applies only loosely:\n%s" % (name, out)


def test_patched_python_compiles(patched):
    src, _outputs = patched
    touched = set()
    for path in PATCHES:
        with open(path) as handle:
            touched.update(line[6:].strip() for line in handle if line.startswith("+++ b/"))
    for rel in sorted(touched):
        if rel.endswith(".py"):
            with open(os.path.join(src, rel)) as handle, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # 2017 code: invalid escapes in docstrings
                compile(handle.read(), rel, "exec")


def test_patched_kernel_header_needs_no_cuda_header(patched):
    """Every CuPy v1 kernel starts with carray.cuh: it must build under nvcc and NVRTC alike."""
    src, _outputs = patched
    with open(os.path.join(src, "cupy", "core", "carray.cuh")) as handle:
        header = handle.read()
    assert "__float2half_rn(" not in header and "__half2float(" not in header
    assert "#include" not in header
    with open(os.path.join(src, "cupy", "core", "reduction.pxi")) as handle:
        assert "__syncwarp()" in handle.read()


def test_patched_setup_does_not_need_pkg_resources_or_nvtx(patched):
    src, _outputs = patched
    for rel in ("chainer_setup_build.py", os.path.join("chainer", "__init__.py")):
        with open(os.path.join(src, rel)) as handle:
            assert "import pkg_resources" not in handle.read(), rel
    with open(os.path.join(src, "chainer_setup_build.py")) as handle:
        assert "CUPY_NO_NVTX" in handle.read()


# --------------------------------------------------------------------------- comparison rules

def _result(device, losses, grads, outputs=((1.0, 2.0),), checksum=10.0):
    return {"runs": {"%s/cnn/sgd" % device: {"losses": list(losses), "first_grads": grads,
                                             "outputs": [list(o) for o in outputs],
                                             "init_checksum": checksum}}}


CPU_GRADS = {"/conv/W": [0.2, -0.1, 0.05], "/conv/b": [2.8e-8, -1.0e-8], "/fc/W": [0.5, 0.25], "/fc/b": [0.1]}


def test_identical_results_compare_equal():
    ref = _result("cpu", [2.0, 1.5, 1.0], CPU_GRADS)
    mine = _result("gpu", [2.0, 1.5, 1.0], CPU_GRADS)
    result = compare.compare(mine, ref, "gpu", "cpu", loss_rtol=1e-3, grad_tol=1e-4)
    assert result["ok"], result["problems"]
    assert compare.worst(result, "grad_max_rel") == 0.0


def test_zero_gradient_bias_before_batchnorm_is_judged_on_its_links_scale():
    """Rounding noise on an exactly-zero gradient is 3x off per array, 1e-7 of the link: fine."""
    gpu = dict(CPU_GRADS, **{"/conv/b": [8.0e-8, 1.0e-8]})
    result = compare.compare(_result("gpu", [2.0], gpu), _result("cpu", [2.0], CPU_GRADS), "gpu", "cpu",
                             loss_rtol=1e-3, grad_tol=1e-4)
    assert result["ok"], result["problems"]
    assert result["runs"]["cnn/sgd"]["grad_rel_to_link_max"]["/conv/b"] < 1e-6


def test_a_wrong_gradient_or_loss_is_reported():
    gpu = dict(CPU_GRADS, **{"/fc/W": [0.5, 0.2501]})
    result = compare.compare(_result("gpu", [2.0, 1.5], gpu), _result("cpu", [2.0, 1.503], CPU_GRADS),
                             "gpu", "cpu", loss_rtol=1e-3, grad_tol=1e-4)
    assert not result["ok"]
    text = "\n".join(result["problems"])
    assert "/fc/W" in text and "loss 1" in text
    assert "/conv/W" not in text


def test_different_initial_weights_are_reported():
    result = compare.compare(_result("gpu", [2.0], CPU_GRADS, checksum=11.0), _result("cpu", [2.0], CPU_GRADS),
                             "gpu", "cpu", loss_rtol=1e-3)
    assert any("initial weights" in p for p in result["problems"])


# --------------------------------------------------------------------------- harness helpers

def test_parse_junit(tmp_path):
    import junit_outcomes
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite name="pytest">'
                   '<testcase classname="core_tests.test_x.TestA" name="test_ok" time="0.1"/>'
                   '<testcase classname="core_tests.test_x.TestA" name="test_bad"><failure message="x"/></testcase>'
                   '<testcase classname="core_tests.test_x.TestB" name="test_skip"><skipped/></testcase>'
                   '<testcase classname="core_tests.test_x.TestB" name="test_err"><error message="y"/></testcase>'
                   '</testsuite></testsuites>')
    assert junit_outcomes.parse_junit(str(xml)) == {"TestA::test_ok": "passed", "TestA::test_bad": "failed",
                                                    "TestB::test_skip": "skipped", "TestB::test_err": "error"}
    assert junit_outcomes.parse_junit(str(tmp_path / "missing.xml")) == {}


def test_nose_shim_attr():
    sys.path.insert(0, os.path.join(LEGACY, "nose_shim"))
    try:
        from nose.plugins import attrib
    finally:
        sys.path.pop(0)

    @attrib.attr("gpu", gpu=2, slow=True)
    def f():
        pass
    assert f.gpu == 2 and f.slow is True


def test_launch_kernel_names():
    import launch
    source = 'class float16 {};\nextern "C" __global__ void cupy_add(CArray<float, 1> x) {}\n'
    assert launch._kernel_name(source) == "cupy_add"
    assert launch._kernel_name(b"nothing here") == "?"


@pytest.mark.parametrize("script", ["build.sh", "run_gpu.sh"])
def test_scripts_parse(script):
    if not shutil.which("bash"):
        pytest.skip("no bash")
    code, out = _run(["bash", "-n", os.path.join(LEGACY, script)])
    assert code == 0, out


# --------------------------------------------------------------------------- train.py on the CPU

def test_train_on_cpu_through_the_launcher(tmp_path):
    code, out = _run([sys.executable, "-c", "import chainer, sys; sys.exit(chainer.__version__ != '1.24.0')"],
                     cwd=str(tmp_path))
    if code != 0:
        pytest.skip("Chainer 1.24 is not importable here (tests/legacy/build.sh builds one)")
    result_path, record_path = str(tmp_path / "train.json"), str(tmp_path / "record.json")
    code, out = _run([sys.executable, os.path.join(LEGACY, "launch.py"), "--record", record_path, "--",
                      os.path.join(LEGACY, "train.py"), "--device", "cpu", "--iters", "5", "--out", result_path],
                     cwd=str(tmp_path))
    assert code == 0, out
    with open(result_path) as handle:
        result = json.load(handle)
    assert sorted(result["runs"]) == ["cpu/cnn/adam", "cpu/cnn/sgd", "cpu/mlp/adam", "cpu/mlp/sgd"]
    for run in result["runs"].values():
        assert len(run["losses"]) == 5 and run["losses"][-1] < run["losses"][0]
    assert result["runs"]["cpu/cnn/sgd"]["first_grads"] == result["runs"]["cpu/cnn/adam"]["first_grads"]
    conv_b = result["runs"]["cpu/cnn/sgd"]["first_grads"]["/conv/b"]
    assert max(abs(g) for g in conv_b) < 1e-5  # the bias right before BatchNormalization
    assert result["meta"]["cudnn_enabled"] is False
    with open(record_path) as handle:
        assert json.load(handle)["compiles"] == []  # no GPU work: no kernel


def test_harness_figures_feed_the_benchmarks(tmp_path):
    """The per-kernel times the harness writes are what `benchmarks/run.py --legacy-results` reads."""
    import types
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    sys.path.insert(0, os.path.join(REPO, "tests", "legacy"))
    try:
        import bench_warm
        import harness
    finally:
        del sys.path[:2]
    fake = types.SimpleNamespace(out=str(tmp_path), summary={"steps": {
        "c": {"warm": {"ms_per_kernel": {"median": 3.07, "min": 2.9, "max": 3.3, "reps": 34}}},
        "e": {"warm": {"ms_per_kernel": {"median": 0.2, "min": 0.1, "max": 0.4, "reps": 34}}}}})
    harness.Harness.write_benchmark_figures(fake)
    with open(str(tmp_path / "legacy-bench.json")) as handle:
        data = json.load(handle)
    assert set(data["benchmarks"]) == {"stock_warm_ms_per_kernel", "ptxbackend_warm_ms_per_kernel"}
    assert bench_warm.normalize_legacy(data, "legacy-bench.json")


def test_patched_cudnn_module_accepts_cudnn_7_and_its_api(patched):
    """cuDNN 7.1 (cupy-cuda80's, the user's generation) is accepted and mapped, not skipped silently."""
    src, _outputs = patched
    with open(os.path.join(src, "install", "build.py")) as handle:
        assert "maximum_cudnn_version = 7999" in handle.read()
    with open(os.path.join(src, "cupy", "cuda", "cupy_cudnn.h")) as handle:
        header = handle.read()
    for mapped in ("#define cudnnSetConvolution2dDescriptor_v5 cudnnSetConvolution2dDescriptor",
                   "#define cudnnSetRNNDescriptor cudnnSetRNNDescriptor_v5",
                   "cupy_cudnnSetConvolution2dDescriptor_v4"):
        assert mapped in header
    with open(os.path.join(src, "cupy", "cuda", "cudnn.pyx")) as handle:
        assert "13: 'CUDNN_STATUS_RUNTIME_FP_OVERFLOW'" in handle.read()
    with open(os.path.join(src, "chainer", "functions", "activation", "softmax.py")) as handle:
        assert "numpy.int)" not in handle.read()


def test_build_insists_on_the_cudnn_module():
    """build.sh fails when setup.py skips cupy.cuda.cudnn (it exits 0 then): the module is in the list."""
    with open(os.path.join(REPO, "tests", "legacy", "build.sh")) as handle:
        text = handle.read()
    assert 'expected="$expected cupy/cuda/cudnn"' in text
    assert "NEEDED.*libcudnn" in text


def test_staged_cudnn_build_when_present():
    """After `bash tests/legacy/build.sh`: the staged Chainer wheel holds cupy.cuda.cudnn, linked to
    libcudnn.so.7, and the library parts are listed with their SHA-256."""
    staged = os.path.join(REPO, ".device", "legacy-cudnn")
    wheels = [n for n in os.listdir(os.path.join(staged, "wheels"))] if os.path.isdir(staged) else []
    chainer = [n for n in wheels if n.startswith("chainer-1.24.0-")]
    if not chainer:
        pytest.skip("no .device/legacy-cudnn/wheels/chainer-1.24.0-*.whl: run bash tests/legacy/build.sh")
    import zipfile
    with zipfile.ZipFile(os.path.join(staged, "wheels", chainer[0])) as z:
        names = [n for n in z.namelist() if n.startswith("cupy/cuda/cudnn.") and n.endswith(".so")]
        assert names, "cupy.cuda.cudnn is not in the wheel"
        data = z.read(names[0])
    assert b"libcudnn.so.7" in data
    with open(os.path.join(staged, "SHA256SUMS")) as handle:
        sums = handle.read()
    parts = sorted(n for n in os.listdir(staged) if n.startswith("libcudnn.so.7.xz.part-"))
    assert parts and all(p in sums for p in parts)
    assert "f7f1afa951ea854b05897990717eb947a8cdc7b3caf4348846736f49252e776f  libcudnn.so.7" in sums

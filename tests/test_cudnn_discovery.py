"""Issue 28: `warm --libs cudnn` and `doctor` find cuDNN where a user of the CUDA 8 generation has it
(an installed CuPy's cupy/.data/lib, /usr/local/cuda/lib64, LD_LIBRARY_PATH), and say in one line what
to install when it is absent.  The search part uses a real small shared library built here and staged in
those layouts; the opt-in test at the end loads the real cuDNN 7 from the cupy-cuda80 7.8.0 wheel."""

import ctypes
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO

CUDNN_SOURCE = ("#include <stddef.h>\nsize_t cudnnGetVersion(void) { return %d; }\n"
                "size_t cudnnGetCudartVersion(void) { return 8000; }\n")


def _build_cudnn(directory, version=7102, name="libcudnn.so.7"):
    """A real shared object named like cuDNN, answering ``cudnnGetVersion`` with ``version``."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler (cc/gcc) to build the small stand-in library")
    os.makedirs(str(directory), exist_ok=True)
    source = os.path.join(str(directory), "cudnn_stub.c")
    with open(source, "w") as handle:
        handle.write(CUDNN_SOURCE % version)
    path = os.path.join(str(directory), name)
    subprocess.check_call([cc, "-shared", "-fPIC", "-o", path, source])
    os.remove(source)
    return path


def _cupy_site(tmp_path, version=7102):
    """A site directory holding an installed CuPy's bundled cuDNN, as cupy-cuda80 7.8.0 lays it out."""
    site = tmp_path / "site"
    return site, _build_cudnn(site / "cupy" / ".data" / "lib", version)


def _env(tmp_path, site=None, **changes):
    env = dict(os.environ, CUDA_PATH="", CUDA_HOME="", LD_LIBRARY_PATH="")
    env["PYTHONPATH"] = os.pathsep.join([REPO] + ([str(site)] if site else []))
    env.update(changes)
    return env


def _cli(env, *args, **kwargs):
    return subprocess.run([sys.executable, "-m", "ptxbackend"] + list(args), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, cwd=kwargs.get("cwd", REPO))


def _doctor_line(proc):
    lines = [line for line in proc.stdout.splitlines() if line.startswith("cudnn: ")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return lines[0]


def test_doctor_and_warm_find_the_cudnn_an_installed_cupy_bundles(tmp_path):
    site, path = _cupy_site(tmp_path)
    assert ctypes.CDLL(path).cudnnGetVersion() == 7102  # a real library, loadable
    env = _env(tmp_path, site)
    assert _doctor_line(_cli(env, "doctor")) == "cudnn: %s" % path
    proc = _cli(env, "warm", "--libs", "cudnn")
    # Found; initialising it then needs a GPU (here: a one-line driver failure, never "not found").
    assert path in proc.stdout and "no libcudnn" not in proc.stdout and "Traceback" not in proc.stderr


def test_cupys_bundled_cudnn_outranks_ld_library_path_as_its_rpath_does(tmp_path, monkeypatch):
    site, bundled = _cupy_site(tmp_path)
    other = _build_cudnn(tmp_path / "ld", version=7605)
    from ptxbackend.gpu import libraries as libsearch
    monkeypatch.setenv("CUDA_PATH", "")
    monkeypatch.setenv("LD_LIBRARY_PATH", os.path.dirname(other))
    monkeypatch.setattr(sys, "path", sys.path + [str(site)])
    assert libsearch.find_cuda_library("cudnn")[0] == bundled
    monkeypatch.setattr(sys, "path", sys.path[:-1])  # without CuPy's copy the LD_LIBRARY_PATH one is found
    assert libsearch.find_cuda_library("cudnn")[0] == other


def test_doctor_finds_cudnn_on_ld_library_path(tmp_path):
    path = _build_cudnn(tmp_path / "cuda" / "lib64")
    env = _env(tmp_path, LD_LIBRARY_PATH=os.path.dirname(path))
    assert _doctor_line(_cli(env, "doctor")) == "cudnn: %s" % path


def test_cudnn_in_a_toolkit_named_by_cuda_path_is_found(tmp_path):
    # /usr/local/cuda/lib64 is the same toolkit layout at its default place (not writable by a test).
    path = _build_cudnn(tmp_path / "cuda" / "lib64")
    env = _env(tmp_path, CUDA_PATH=str(tmp_path / "cuda"))
    assert _doctor_line(_cli(env, "doctor")) == "cudnn: %s" % path


def test_absent_cudnn_is_one_line_saying_what_to_install_or_set(tmp_path):
    if os.path.isdir("/usr/local/cuda/lib64") and any(n.startswith("libcudnn.so") for n in
                                                       os.listdir("/usr/local/cuda/lib64")):
        pytest.skip("this machine has cuDNN in /usr/local/cuda/lib64")
    env = _env(tmp_path)
    line = _doctor_line(_cli(env, "doctor"))
    assert line.startswith("cudnn: not found: no libcudnn.so* found: pip install nvidia-cudnn-cu12")
    for place in ("cupy/.data/lib", "/usr/local/cuda/lib64", "LD_LIBRARY_PATH"):
        assert place in line, line
    proc = _cli(env, "warm", "--libs", "cudnn")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    failed = [line for line in proc.stdout.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and "pip install nvidia-cudnn-cu12" in failed[0] and "LD_LIBRARY_PATH" in failed[0]


def test_a_cupy_data_lib_in_the_working_directory_python_put_first_is_not_searched(tmp_path, monkeypatch):
    # ./cupy/.data/lib/libcudnn.so.7 planted where the user runs `python -m ptxbackend warm --libs cudnn`:
    # loading it would run its constructor.  The same tree as a site directory is CuPy's (first test).
    planted = _build_cudnn(tmp_path / "cupy" / ".data" / "lib")
    from ptxbackend.gpu import libraries as libsearch
    monkeypatch.chdir(str(tmp_path))
    monkeypatch.setenv("CUDA_PATH", "")
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    for first in ("", str(tmp_path)):  # python -c puts '', python -m the directory itself
        monkeypatch.setattr(sys, "path", [first] + [p for p in sys.path if p not in ("", str(tmp_path))])
        assert os.path.dirname(planted) not in [d for _w, d in libsearch.cupy_bundled_places()]
        found, _looked = libsearch.find_cuda_library("cudnn")
        assert found != planted, first
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))] + [str(tmp_path)])
    assert libsearch.find_cuda_library("cudnn")[0] == planted


# The real cuDNN 7 (203 MB inside the 300 MB wheel): opt-in, since CI does not fetch the wheel.
WHEEL = os.environ.get("PTXBACKEND_TEST_CUPY80_WHEEL",
                       "/tmp/ptxb-v2v9-build/dl/cp37/cupy_cuda80-7.8.0-cp37-cp37m-manylinux1_x86_64.whl")
MEMBER = "cupy/.data/lib/libcudnn.so.7"


@pytest.mark.skipif(not os.path.isfile(WHEEL), reason="the cupy-cuda80 7.8.0 wheel is not at %s (set "
                    "PTXBACKEND_TEST_CUPY80_WHEEL; pip download --no-deps cupy-cuda80==7.8.0 --python-version 3.7 "
                    "--only-binary=:all: --platform manylinux1_x86_64)" % WHEEL)
def test_the_real_cudnn7_of_cupy_cuda80_is_found_and_loads_without_a_gpu(tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(WHEEL) as wheel:
        wheel.extract(MEMBER, str(site))
    path = str(site / MEMBER)
    env = _env(tmp_path, site)
    assert _doctor_line(_cli(env, "doctor")) == "cudnn: %s" % path
    probe = ("import ctypes, sys; l = ctypes.CDLL(sys.argv[1]); "
             "print(l.cudnnGetVersion(), l.cudnnGetCudartVersion())")
    proc = subprocess.run([sys.executable, "-c", probe, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["7102", "8000"]  # cuDNN 7.1.2 on the CUDA 8.0 runtime linked in

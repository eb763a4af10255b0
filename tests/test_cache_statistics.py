"""`ptxbackend cache stats`: hits, misses and compiles kept across runs, without I/O on a hit."""

import json
import os
import subprocess
import sys

from conftest import REPO, run_python

PROGRAM = r'''
import ptxbackend
for i in range(3):
    ptxbackend.compile('extern "C" __global__ void k(float* y) { y[0] = %d; }' % i, target="compute_75",
                       compiler="nvcc")
'''


def stats(cache, *extra):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-m", "ptxbackend", "cache", "stats", "--json"] + list(extra), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_cold_then_a_warm_run_show_the_misses_then_only_hits(nvcc13, tmp_path):
    cache = tmp_path / "cache"
    run_python(PROGRAM, env={"PTXBACKEND_CACHE_DIR": str(cache)})
    cold = stats(cache)
    assert (cold["misses"], cold["local_hits"], cold["compiles"], cold["compile_errors"]) == (3, 0, 3, 0)
    assert cold["compile_seconds"] > 0 and cold["since"] and cold["hit_rate"] == 0.0
    run_python(PROGRAM, env={"PTXBACKEND_CACHE_DIR": str(cache)})
    warm = stats(cache)
    assert (warm["misses"], warm["local_hits"], warm["compiles"]) == (3, 3, 3)  # the warm run only hit
    assert warm["since"] == cold["since"] and warm["hit_rate"] == 0.5 and warm["time_saved_seconds"] > 0
    zeroed = stats(cache, "--zero")
    assert (zeroed["misses"], zeroed["local_hits"], zeroed["compiles"]) == (0, 0, 0)
    assert stats(cache)["local_hits"] == 0


def test_a_failed_compile_is_counted_as_an_error(nvcc13, tmp_path):
    cache = tmp_path / "cache"
    run_python("import ptxbackend\ntry:\n    ptxbackend.compile('oops', target='compute_75', compiler='nvcc')\n"
               "except ptxbackend.CompileError:\n    pass\n", env={"PTXBACKEND_CACHE_DIR": str(cache)})
    found = stats(cache)
    assert (found["compile_errors"], found["misses"], found["compiles"]) == (1, 1, 0)


def test_a_planted_link_at_the_statistics_file_is_neither_read_nor_written_through(nvcc13, tmp_path):
    cache = tmp_path / "cache"
    run_python(PROGRAM, env={"PTXBACKEND_CACHE_DIR": str(cache)})
    path = cache / "v4" / "meta" / "statistics.json"
    victim = tmp_path / "victim.json"
    victim.write_text(json.dumps({"local_hits": 1000000}))
    path.unlink()
    os.symlink(str(victim), str(path))
    assert stats(cache)["local_hits"] == 0  # not read through the link
    run_python(PROGRAM, env={"PTXBACKEND_CACHE_DIR": str(cache)})
    assert json.loads(victim.read_text()) == {"local_hits": 1000000}  # not written through it
    assert not os.path.islink(str(path)) and stats(cache)["local_hits"] == 3


def test_no_statistics_file_means_no_cache_is_made_by_looking(tmp_path):
    found = stats(tmp_path / "none")
    assert found["misses"] == 0 and not (tmp_path / "none").exists()

"""Concurrency: many processes, one cold cache, the real nvcc; stale and held locks.

The nvcc is the real one behind a logging wrapper (conftest's ``logging_nvcc``), so compiler
processes are counted, not guessed.  Figures go to lines starting with ``reliability:`` (``-s``).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import ptxbackend
from ptxbackend.compiling import engine
from ptxbackend.errors import CacheError
from conftest import REPO, count_calls, figures

pytestmark = pytest.mark.reliability

PROCESSES = 16
KERNELS = 50

CHILD = r'''
import hashlib, json, os, random, sys, time
import ptxbackend
index, kernel_file, go = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(kernel_file) as handle:
    kernels = json.load(handle)
order = list(range(len(kernels)))
random.Random(index).shuffle(order)
while not os.path.exists(go):  # all start together: the most contention
    time.sleep(0.005)
digests, misses = {}, 0
for i in order:
    art = ptxbackend.compile(kernels[i], target="compute_75")
    digests[i] = hashlib.sha256(art.image).hexdigest()
    misses += not art.cache_hit
print(json.dumps({"digests": digests, "misses": misses}))
'''

HOLDER = r'''
import sys, time
from ptxbackend.cache import DirectoryStore
store = DirectoryStore(sys.argv[1])
with store.lock(sys.argv[2]):
    print("locked", flush=True)
    time.sleep(600)
'''


def kernel(i):
    return 'extern "C" __global__ void k%d(float* y) { y[threadIdx.x] = y[threadIdx.x] * 2.0f + %d.0f; }\n' % (i, i)


def test_sixteen_processes_fifty_kernels_cold_compile_each_kernel_once(logging_nvcc, tmp_path):
    wrapper, calls = logging_nvcc
    kernel_file, go = tmp_path / "kernels.json", tmp_path / "go"
    kernel_file.write_text(json.dumps([kernel(i) for i in range(KERNELS)]))
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_NVCC=wrapper)
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(i), str(kernel_file), str(go)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
             for i in range(PROCESSES)]
    started = time.time()
    go.write_text("")
    results = [p.communicate(timeout=500) for p in procs]
    elapsed = time.time() - started
    errors = [(p.returncode, err) for p, (_out, err) in zip(procs, results) if p.returncode != 0 or err]
    assert errors == []
    reports = [json.loads(out) for out, _err in results]
    disagreements = sum(1 for i in range(KERNELS) if len(set(r["digests"][str(i)] for r in reports)) != 1)
    compiles = count_calls(calls, "--ptx")
    misses = sum(r["misses"] for r in reports)
    figures("concurrency", processes=PROCESSES, kernels=KERNELS, compiler_runs=compiles, misses=misses,
            hits=PROCESSES * KERNELS - misses, identity_probes=count_calls(calls, "--version"),
            errors=len(errors), byte_disagreements=disagreements, seconds="%.1f" % elapsed)
    assert compiles == KERNELS and misses == KERNELS  # every kernel present, so each exactly once
    assert disagreements == 0


def _hold_lock(store_root, entry_name):
    env = dict(os.environ, PYTHONPATH=REPO)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, store_root, entry_name], env=env,
                              stdout=subprocess.PIPE, universal_newlines=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_lock_left_by_a_killed_process_does_not_block(logging_nvcc, monkeypatch):
    wrapper, calls = logging_nvcc
    monkeypatch.setenv("PTXBACKEND_NVCC", wrapper)
    # No wait at all: a lock the kernel dropped with its killed holder is free at the first try, so a
    # zero time-out must succeed (a stale lock would fail it at once, with no clock in the test).
    monkeypatch.setenv("PTXBACKEND_LOCK_TIMEOUT", "0")
    art = ptxbackend.compile(kernel(1000), target="compute_75")
    os.unlink(art.path)  # the next compile misses and needs the lock
    holder = _hold_lock(art.store.root, art.name)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock_path = art.store.local._lock_path(art.name)
    assert os.path.exists(lock_path)  # the killed holder's lock file is still there
    started = time.time()
    again = ptxbackend.compile(kernel(1000), target="compute_75")
    waited = time.time() - started
    assert not again.cache_hit and again.image == art.image and count_calls(calls, "--ptx") == 2
    figures("stale lock of a SIGKILLed holder", kills=1, seconds_to_compile="%.2f" % waited, hangs=0)


def test_lock_held_by_a_live_process_gives_a_clear_error_after_the_timeout(nvcc13, monkeypatch):
    art = ptxbackend.compile(kernel(2000), target="compute_75")
    os.unlink(art.path)
    holder = _hold_lock(art.store.root, art.name)
    try:
        monkeypatch.setenv("PTXBACKEND_LOCK_TIMEOUT", "1")
        engine._reset_for_tests()  # a process started with the setting
        started = time.time()
        with pytest.raises(CacheError) as info:
            ptxbackend.compile(kernel(2000), target="compute_75")
        waited = time.time() - started
        message = str(info.value)
        assert "waited 1 s" in message and "PTXBACKEND_LOCK_TIMEOUT" in message
        assert art.store.local._lock_path(art.name) in message and "another process" in message
        assert not os.path.exists(art.path)  # nothing half-done was filed
    finally:
        holder.kill()
        holder.wait()
    assert not ptxbackend.compile(kernel(2000), target="compute_75").cache_hit  # free again: works
    figures("lock held by a live process", timeout_s=1, waited_s="%.2f" % waited, error="CacheError", hangs=0)

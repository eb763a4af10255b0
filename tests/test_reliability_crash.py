"""Crash mid-write: writers killed with SIGKILL at random moments never leave a loadable bad entry.

Two levels.  The store: a forked child rewrites real entries (real nvcc output, compiled once) in a
loop and is killed hundreds of times; after every kill each entry must be whole or absent.  The
engine: a process compiling real kernels with the real nvcc is killed with its whole process group
(nvcc included, as a power cut would); afterwards every kernel is a correct hit or is rebuilt.
Figures go to lines starting with ``reliability:`` (run with ``-s``).
"""

import logging
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import ptxbackend
from ptxbackend import engine
from ptxbackend.cache import entry
from ptxbackend.cache.store import LAYOUT
from conftest import REPO, figures

pytestmark = pytest.mark.reliability

STORE_KILLS = 300
ENGINE_KILLS = 12


def kernel(i, unroll=1):
    """Distinct real kernels; ``unroll`` makes a large one (a long write)."""
    return ('extern "C" __global__ void k%d(float* y, float a)\n{\n    float v = y[threadIdx.x];\n'
            '    #pragma unroll\n    for (int j = 0; j < %d; ++j) v = v * a + %d.0f + j;\n'
            '    y[threadIdx.x] = v;\n}\n' % (i, unroll, i))


def temporaries(root):
    found = set()
    for base, _dirs, files in os.walk(str(root)):
        found.update(os.path.join(base, f) for f in files if f.startswith(".tmp-"))
    return found


def real_entries():
    """(path, key, kind, payload, metadata) of real compiles through the engine."""
    found = []
    for i, unroll in enumerate((1, 1, 1, 400)):
        for target in ("compute_75", "sm_75"):
            art = ptxbackend.compile(kernel(i, unroll), target=target, device_cc="7.5")  # any GPU here
            with open(art.path, "rb") as handle:
                payload, meta = entry.decode(handle.read(), art.key, art.kind)
            found.append((art.path, art.key, art.kind, payload, meta))
    return art.store, found


def _writer_loop(store, entries):
    """The child: rewrite every entry, in a fresh random order each pass, until killed."""
    rng = random.Random(os.getpid())
    order = list(range(len(entries)))
    try:
        while True:
            rng.shuffle(order)
            for index in order:
                path, _key, _kind, payload, meta = entries[index]
                store.write(path, payload, meta)
    finally:
        os._exit(1)


def test_store_writer_killed_hundreds_of_times_leaves_no_bad_entry(nvcc13):
    store, entries = real_entries()
    seed = int(os.environ.get("PTXBACKEND_TEST_SEED", "20261201"))  # the same kills in every run
    rng = random.Random(seed)
    mid_write = corrupt_loads = torn = present = absent = 0
    known_tmp = set()
    started = time.time()
    for _ in range(STORE_KILLS):
        for path, _key, _kind, _payload, _meta in rng.sample(entries, 3):
            if os.path.exists(path):  # so the writer creates files too, not only replaces them
                os.unlink(path)
        pid = os.fork()
        if pid == 0:
            _writer_loop(store, entries)
        time.sleep(rng.uniform(0, 0.012))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        now_tmp = temporaries(store.root)
        mid_write += len(now_tmp - known_tmp)  # a kill between mkstemp and rename leaves one
        known_tmp = now_tmp
        for path, key, kind, payload, _meta in entries:
            existed = os.path.exists(path)
            found = store.read(path, key, kind)
            if found is None:
                absent += 1
                torn += existed  # a file there that did not verify: a torn write
            elif found[0] != payload:
                corrupt_loads += 1
            else:
                present += 1
    elapsed = time.time() - started
    # The leftovers of killed writers are reclaimed once no live writer can own them.
    old = time.time() - 7200
    for path in known_tmp:
        os.utime(path, (old, old))
    store.prune()
    left = temporaries(store.root)
    good, bad = store.verify()
    figures("crash mid-write (store)", kills=STORE_KILLS, killed_mid_write=mid_write, reads=present + absent,
            whole=present, absent=absent, torn=torn, corrupt_loads=corrupt_loads, verify_bad=len(bad),
            temp_files_reclaimed=len(known_tmp) - len(left), seconds="%.1f" % elapsed, seed=seed)
    assert corrupt_loads == 0 and torn == 0 and bad == []
    assert mid_write > 0, "no kill landed inside a write: the test proved nothing"
    assert left == set()


def test_compiling_process_killed_with_its_compiler_leaves_no_bad_entry(nvcc13, tmp_path):
    kernels = [kernel(100 + i) for i in range(6)]
    reference = {src: ptxbackend.compile(src, target="compute_75", cache_dir=str(tmp_path / "ref")).image
                 for src in kernels}
    cache, tmpdir = tmp_path / "cache", tmp_path / "tmp"
    tmpdir.mkdir()
    code = ("import ptxbackend, sys\nfor src in %r:\n    ptxbackend.compile(src, target='compute_75')\n"
            "print('done')\n" % (kernels,))
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(cache), TMPDIR=str(tmpdir))
    # How long an uninterrupted cold run takes here: kills are spread over that, whatever the machine.
    started = time.time()
    subprocess.check_call([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                          env=dict(env, PTXBACKEND_CACHE_DIR=str(tmp_path / "timing")))
    cold_run = time.time() - started
    seed = int(os.environ.get("PTXBACKEND_TEST_SEED", "20261201"))  # the same kills in every run
    rng = random.Random(seed)
    finished = 0
    for _ in range(ENGINE_KILLS):
        store_dir = cache / LAYOUT
        if store_dir.exists():  # fresh misses each round: kills land in compiles and writes
            for base, _dirs, files in os.walk(str(store_dir)):
                for name in files:
                    if name.endswith(".ptx") and rng.random() < 0.75:
                        os.unlink(os.path.join(base, name))
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        time.sleep(rng.uniform(0.05, 0.7 * cold_run))
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the process and its nvcc, like a power cut
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        finished += out.strip() == b"done"
        assert b"Traceback" not in err, err.decode()
    engine._reset_for_tests()
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(logging.WARNING)
    logging.getLogger("ptxbackend").addHandler(handler)
    try:
        results = [ptxbackend.compile(src, target="compute_75", cache_dir=str(cache)) for src in kernels]
    finally:
        logging.getLogger("ptxbackend").removeHandler(handler)
    wrong = sum(1 for src, art in zip(kernels, results) if art.image != reference[src])
    hits = sum(1 for art in results if art.cache_hit)
    leaked = [n for n in os.listdir(str(tmpdir)) if n.startswith("ptxbackend-nvcc-")]
    figures("crash mid-write (compile, process group killed)", kills=ENGINE_KILLS - finished,
            runs_finished=finished, kernels=len(kernels), hits_after=hits, rebuilt_after=len(kernels) - hits,
            corrupt_loads=wrong, warnings=len(records), nvcc_workdirs_left_in_TMPDIR=len(leaked), seed=seed, cold_run_s="%.2f" % cold_run)
    assert wrong == 0 and records == []
    assert ENGINE_KILLS - finished >= ENGINE_KILLS // 2

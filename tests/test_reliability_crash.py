"""Crash mid-write: writers killed with SIGKILL at chosen moments never leave a loadable bad entry.

Two levels.  The store: a forked child writes a real entry (real nvcc output, compiled once) and kills
itself at a moment chosen by a seeded generator: before the write, part-way through it (at a chosen
byte), before the rename, or after it.  The kills land where they are told to, so the test knows
exactly how many interrupted a write, and checks each outcome.  The engine: a process compiling real
kernels with the real nvcc kills its whole process group (nvcc included, as a power cut would) while
nvcc runs or while its entry is written; afterwards every kernel is a correct hit or is rebuilt.
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
from ptxbackend.compiling import engine
from ptxbackend.cache import entry
from conftest import REPO, figures, store_name

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


STAGES = ("before the write", "part-way through the write", "before the rename", "after the rename")


def _die(*_args):
    os.kill(os.getpid(), signal.SIGKILL)


def _write_and_die(store, path, payload, meta, stage, cut):
    """The child: write one entry and SIGKILL itself at ``stage`` (``cut`` bytes in, for a torn write)."""
    try:
        real_fdopen, real_replace = os.fdopen, os.replace

        class TornFile(object):
            def __init__(self, handle):
                self._handle = handle

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def write(self, data):
                self._handle.write(data[:cut])
                self._handle.flush()  # the first bytes reach the file, the rest never do
                _die()

        def replace(src, dst):
            if stage == STAGES[2]:
                _die()
            real_replace(src, dst)
            _die()

        if stage == STAGES[0]:
            _die()
        if stage == STAGES[1]:
            os.fdopen = lambda fd, *a, **k: TornFile(real_fdopen(fd, *a, **k))
        os.replace = replace
        store.write(store_name(store, path), payload, meta)
    finally:
        os._exit(1)  # not reached: the kill comes first


def test_store_writer_killed_hundreds_of_times_leaves_no_bad_entry(nvcc13):
    store, entries = real_entries()
    seed = int(os.environ.get("PTXBACKEND_TEST_SEED", "20261201"))  # the same kills in every run
    rng = random.Random(seed)
    landed = dict.fromkeys(STAGES, 0)
    corrupt_loads = torn = present = absent = temp_left = 0
    known_tmp = temporaries(store.root)
    for _ in range(STORE_KILLS):
        path, key, kind, payload, meta = rng.choice(entries)
        stage = rng.choice(STAGES)
        old = os.path.exists(path)
        if rng.random() < 0.5 and old:  # so the writer creates files too, not only replaces them
            os.unlink(path)
            old = False
        pid = os.fork()
        if pid == 0:
            _write_and_die(store, path, payload, meta, stage, rng.randrange(1, 4096))
        _pid, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, "the child was not killed"
        landed[stage] += 1
        now_tmp = temporaries(store.root)
        new_tmp = now_tmp - known_tmp
        known_tmp = now_tmp
        temp_left += len(new_tmp)
        # Only a kill between the temporary file's creation and the rename leaves one behind.
        assert len(new_tmp) == (1 if stage in STAGES[1:3] else 0), stage
        found = store.read(store_name(store, path), key, kind)
        if found is None:
            absent += 1
            torn += os.path.exists(path)  # a file there that did not verify: a torn write
            assert not (stage == STAGES[3] or old), "a whole entry was lost: %s" % stage
        elif found[0] != payload:
            corrupt_loads += 1
        else:
            present += 1
    # The leftovers of killed writers are reclaimed once no live writer can own them.
    old = time.time() - 7200
    for path in known_tmp:
        os.utime(path, (old, old))
    store.local.prune()
    left = temporaries(store.root)
    good, bad = store.local.verify()
    figures("crash mid-write (store)", kills=STORE_KILLS, killed_mid_write=landed[STAGES[1]] + landed[STAGES[2]],
            reads=present + absent, whole=present, absent=absent, torn=torn, corrupt_loads=corrupt_loads,
            verify_bad=len(bad), temp_files_reclaimed=temp_left - len(left), seed=seed,
            **{stage.replace(" ", "_").replace("-", "_"): count for stage, count in landed.items()})
    assert corrupt_loads == 0 and torn == 0 and bad == []
    assert left == set()


# The child of the engine-level test: compiles every kernel; while compiling kernel ``victim`` it kills its
# own process group (itself and nvcc) after ``delay`` seconds of nvcc's run, or just before or after its
# entry's rename.
CHILD = """
import os, signal, subprocess, sys, time
import ptxbackend
kernels, victim, stage, delay = eval(sys.argv[1])
current = [None]
real_popen, real_replace = subprocess.Popen, os.replace

def power_cut():
    os.killpg(0, signal.SIGKILL)

class Popen(real_popen):
    def __init__(self, cmd, *args, **kwargs):
        real_popen.__init__(self, cmd, *args, **kwargs)
        if current[0] == victim and stage == "compiler" and "-dryrun" not in cmd and "--ptx" in cmd:
            time.sleep(delay)
            power_cut()

def replace(src, dst):
    if current[0] == victim and dst.endswith(".ptx"):
        if stage == "before rename":
            power_cut()
        real_replace(src, dst)
        if stage == "after rename":
            power_cut()
    else:
        real_replace(src, dst)

subprocess.Popen, os.replace = Popen, replace
for index, source in enumerate(kernels):
    current[0] = index
    ptxbackend.compile(source, target="compute_75")
print("done")
"""


def test_compiling_process_killed_with_its_compiler_leaves_no_bad_entry(nvcc13, tmp_path):
    kernels = [kernel(100 + i) for i in range(6)]
    ref_root = str(tmp_path / "ref")
    built = [ptxbackend.compile(src, target="compute_75", cache_dir=ref_root) for src in kernels]
    reference = {src: art.image for src, art in zip(kernels, built)}
    relative = [os.path.relpath(art.path, ref_root) for art in built]  # the same place in every cache
    cache, tmpdir = tmp_path / "cache", tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(cache), TMPDIR=str(tmpdir))
    seed = int(os.environ.get("PTXBACKEND_TEST_SEED", "20261201"))  # the same kills in every run
    rng = random.Random(seed)
    finished = 0
    stages = {}
    for _ in range(ENGINE_KILLS):
        # Fresh misses each round, so kills land in compiles and writes.  The victim is a kernel
        # this round compiles (its entry is missing), so its kill always lands.
        paths = [str(cache / rel) for rel in relative]
        for path in paths:
            if os.path.exists(path) and rng.random() < 0.75:
                os.unlink(path)
        missing = [i for i, path in enumerate(paths) if not os.path.exists(path)]
        if not missing:
            os.unlink(paths[0])
            missing = [0]
        victim = rng.choice(missing)
        stage = rng.choice(("compiler", "before rename", "after rename"))
        stages[stage] = stages.get(stage, 0) + 1
        argument = repr((kernels, victim, stage, rng.uniform(0, 0.2)))
        proc = subprocess.Popen([sys.executable, "-c", CHILD, argument], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        out, err = proc.communicate()
        finished += out.strip() == b"done"
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, err.decode())
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
    work = os.path.join(str(cache), "v4", "work")  # nvcc's private directories (a SIGKILL leaves them)
    leaked = [n for n in os.listdir(str(tmpdir)) if n.startswith("ptxbackend-nvcc-")] + \
        [n for n in (os.listdir(work) if os.path.isdir(work) else ()) if n.startswith("nvcc-")]
    figures("crash mid-write (compile, process group killed)", kills=ENGINE_KILLS - finished,
            runs_finished=finished, kernels=len(kernels), hits_after=hits, rebuilt_after=len(kernels) - hits,
            corrupt_loads=wrong, warnings=len(records), nvcc_workdirs_left_in_TMPDIR=len(leaked), seed=seed,
            **{stage.replace(" ", "_"): count for stage, count in stages.items()})
    assert wrong == 0 and records == []
    assert finished == 0

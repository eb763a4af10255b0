"""CPU checks of the cuDNN 7 harness (tests/cudnn7/, issue 28): the program's numpy reference and its
arguments up to the first CUDA call, the scenario runner's records and deadline, and the staging's
checks.  The GPU part is run_gpu.sh on the GPU machine (tests/cudnn7/README.md)."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO
from test_cudnn_discovery import WHEEL, _build_cudnn

numpy = pytest.importorskip("numpy")
HERE = os.path.join(REPO, "tests", "cudnn7")
PROGRAM = os.path.join(HERE, "program.py")
sys.path.insert(0, HERE)
import program  # noqa: E402  (the harness's own module, found through HERE)


def _naive(x, w, pad):
    """The convolution written out as loops: an independent check of program.reference."""
    n, c, h, width = x.shape
    k, _c, r, s = w.shape
    y = numpy.zeros((n, k, h, width))
    for b in range(n):
        for o in range(k):
            for i in range(h):
                for j in range(width):
                    for ch in range(c):
                        for di in range(r):
                            for dj in range(s):
                                ii, jj = i + di - pad, j + dj - pad
                                if 0 <= ii < h and 0 <= jj < width:
                                    y[b, o, i, j] += x[b, ch, ii, jj] * w[o, ch, di, dj]
    return y


def test_the_numpy_reference_is_the_cross_correlation_cudnn_computes():
    x, w = program.inputs()
    conv, relu = program.reference(x, w)
    assert conv.shape == (2, 4, 8, 8) and conv.dtype == numpy.float32
    assert numpy.abs(conv - _naive(x, w, program.PAD)).max() < 1e-5
    assert (relu == numpy.maximum(conv, 0)).all() and (relu == 0).any() and (relu > 0).any()


def _program(*args):
    return subprocess.run([sys.executable, PROGRAM] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)


def test_the_dry_run_stops_before_the_first_cuda_call_and_reports_the_version(tmp_path):
    lib = _build_cudnn(tmp_path, version=7102)
    proc = _program("--lib", lib, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["dry_run"] and result["cudnn_version"] == 7102
    assert [step for step, _s in result["steps"]][-1] == "cudnnGetCudartVersion"
    assert "CUDA context" not in proc.stderr


def test_the_program_fails_in_one_line_naming_what_it_could_not_do(tmp_path):
    proc = _program("--lib", str(tmp_path / "absent.so.7"), "--dry-run")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("program.py: error: ") and "absent.so.7" in proc.stderr
    proc = _program("--dry-run")  # no --lib: argparse's usage line
    assert proc.returncode == 2 and "--lib" in proc.stderr


@pytest.mark.skipif(not os.path.isfile(WHEEL), reason="the cupy-cuda80 7.8.0 wheel is not at %s" % WHEEL)
def test_the_dry_run_on_the_real_cudnn7(tmp_path):
    import zipfile
    with zipfile.ZipFile(WHEEL) as wheel:
        path = wheel.extract("cupy/.data/lib/libcudnn.so.7", str(tmp_path))
    result = json.loads(_program("--lib", path, "--dry-run").stdout)
    assert (result["cudnn_version"], result["cudart_version"]) == (7102, 8000)


def _scenarios(tmp_path, lib, steps, **extra):
    env = dict(os.environ, CUDNN7_HOME=str(tmp_path / "home"), CUDNN7_LIB=lib, CUDNN7_VENV_PYTHON=sys.executable,
               CUDNN7_SITE=str(tmp_path), OUT=str(tmp_path / "out"), CUDNN7_STARTED=str(time.time()),
               CUDNN7_STEPS=steps, PYTHONPATH=REPO)
    env.update(extra)
    os.makedirs(env["CUDNN7_HOME"], exist_ok=True)
    return subprocess.run([sys.executable, os.path.join(HERE, "scenarios.py")], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)


def _records(tmp_path):
    with open(str(tmp_path / "out" / "cudnn7-runs.jsonl")) as handle:
        return [json.loads(line) for line in handle]


def test_the_scenarios_record_every_process_with_its_own_jit_cache_and_doctors_words(tmp_path):
    # No GPU here: each program run stops at libcuda, which is what the records must then say.
    lib = _build_cudnn(tmp_path / "lib")
    proc = _scenarios(tmp_path, lib, "small")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = dict((r["label"], r) for r in _records(tmp_path))
    assert records["doctor"]["cuda_cache"] == {"CUDA_CACHE_PATH": str(tmp_path / "home" / "small" / "jit"),
                                               "CUDA_CACHE_MAXSIZE": str(64 << 20)}
    assert any("CUDA_CACHE_MAXSIZE=67108864 bytes is small" in line for line in records["doctor"]["stdout_tail"])
    import site
    hooked = any(os.path.isfile(os.path.join(d, "ptxbackend.pth")) for d in site.getsitepackages())
    assert records["hook, CUDA_CACHE_MAXSIZE unset"]["stdout_tail"] == ["CUDA_CACHE_MAXSIZE after the hook: %s"
                                                                       % ((4 << 30) if hooked else None)]
    assert records["hook, CUDA_CACHE_MAXSIZE set small"]["stdout_tail"][-1].endswith(str(64 << 20))
    assert records["first"]["rc"] == 1 and not records["first"]["timed_out"]
    assert os.path.isfile(str(tmp_path / "out" / "summary.txt"))
    # The device machine returns only files named in these characters: "hook, CUDA_..." logs came back as none.
    names = os.listdir(str(tmp_path / "out"))
    assert "small-hook_CUDA_CACHE_MAXSIZE_unset-1.log" in names, names
    assert all(re.match(r"^[A-Za-z0-9._-]+$", name) for name in names), names


def test_a_process_is_cut_at_the_calls_deadline_and_the_next_call_goes_on_over_the_same_jit_cache(tmp_path):
    # A stand-in "python3" whose program sleeps: the call's deadline cuts it and the records say so.
    stand_in = tmp_path / "python3"
    stand_in.write_text(u"#!/bin/sh\necho 'cudnnCreate ...' >&2\nexec sleep 60\n")
    os.chmod(str(stand_in), 0o755)
    path = str(tmp_path) + os.pathsep + os.environ.get("PATH", "")
    begun = time.time()
    proc = _scenarios(tmp_path, "/nonexistent", "stock", CUDNN7_DEADLINE_S="36", PATH=path)
    assert time.time() - begun < 36, "ran past the call's deadline"
    assert proc.returncode == 0 and "out of time in stock" in proc.stdout, proc.stdout + proc.stderr
    first = _records(tmp_path)
    assert [(r["label"], r["timed_out"]) for r in first] == [("first", True)]
    assert first[0]["stderr_tail"] == ["cudnnCreate ..."]
    # The next call: the warm-up finishes in a new process over the same JIT cache, then the second start.
    stand_in.write_text(u'#!/bin/sh\necho \'{"conv_max_error": 0.0, "conv_sha256": "ab"}\'\n')
    proc = _scenarios(tmp_path, "/nonexistent", "stock", PATH=path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = _records(tmp_path)
    assert [(r["label"], r["process"], r["rc"]) for r in records] == [("first", 1, -15), ("first", 2, 0),
                                                                      ("second", 1, 0)]
    assert len(set(r["cuda_cache"]["CUDA_CACHE_PATH"] for r in records)) == 1
    assert "first                                    2 process(es)" in proc.stdout


def _stage(tmp_path, staged, home):
    env = dict(os.environ, CUDNN7_STAGED=str(staged), CUDNN7_HOME=str(home), OUT=str(tmp_path / "out"),
               CUDNN7_STAGE_ONLY="1")
    return subprocess.run(["bash", os.path.join(HERE, "run_gpu.sh")], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True)


def _staged_parts(tmp_path, lib):
    """What build.sh leaves in .device/cudnn7 (xz, split, SHA256SUMS), for a small real library."""
    import hashlib
    staged = tmp_path / "staged"
    staged.mkdir()
    compressed = subprocess.check_output(["xz", "-c", lib])
    size = len(compressed) // 3 + 1
    parts = [compressed[i:i + size] for i in range(0, len(compressed), size)]
    sums = ["%s  libcudnn.so.7" % hashlib.sha256(open(lib, "rb").read()).hexdigest(),
            "%s  libcudnn.so.7.xz" % hashlib.sha256(compressed).hexdigest()]
    for index, part in enumerate(parts):
        name = "libcudnn.so.7.xz.part-%02d" % index
        (staged / name).write_bytes(part)
        sums.append("%s  %s" % (hashlib.sha256(part).hexdigest(), name))
    (staged / "SHA256SUMS").write_text(u"\n".join(sums) + "\n")
    return staged, ["libcudnn.so.7.xz.part-%02d" % i for i in range(len(parts))]


@pytest.mark.skipif(not (shutil.which("xz") and shutil.which("bash")), reason="needs xz and bash, as run_gpu.sh does")
def test_run_gpu_assembles_the_library_over_calls_and_refuses_a_part_that_does_not_match(tmp_path):
    lib = _build_cudnn(tmp_path / "lib")
    staged, parts = _staged_parts(tmp_path, lib)
    assert len(parts) == 3
    home = tmp_path / "home"
    data = dict((name, (staged / name).read_bytes()) for name in parts)
    for name in parts[1:]:  # the first call carries the first part only
        (staged / name).unlink()
    proc = _stage(tmp_path, staged, home)
    assert proc.returncode == 0 and "still to carry: %s" % " ".join(parts[1:]) in proc.stdout, proc.stdout
    # The second call brings a part changed in one byte: refused by the call that brought it.
    (staged / parts[1]).write_bytes(data[parts[1]][:-1] + bytes([data[parts[1]][-1] ^ 1]))
    proc = _stage(tmp_path, staged, home)
    assert proc.returncode == 2 and "%s: sha256" % parts[1] in proc.stdout, proc.stdout
    assert not (home / "parts" / parts[1]).exists()
    for name in parts[1:]:  # the same part as built, and the last one: the library is put together
        (staged / name).write_bytes(data[name])
    proc = _stage(tmp_path, staged, home)
    assert proc.returncode == 0, proc.stdout
    placed = home / "site" / "cupy" / ".data" / "lib" / "libcudnn.so.7"
    assert placed.read_bytes() == open(lib, "rb").read()

"""The command line never shows a traceback for a user's mistake: one clear line (or a few), exit 1 or 2."""

import gzip
import os
import subprocess
import sys

import pytest

from conftest import REPO


def _files(tmp):
    """Bad input files of every kind a user can hand the commands."""
    (tmp / "empty").write_bytes(b"")
    (tmp / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (tmp / "bad-line.jsonl").write_text('{"source": "x"}\nnot json\n')
    with gzip.open(str(tmp / "not-a-tar.tgz"), "wb") as handle:
        handle.write(b"hello")
    (tmp / "truncated.tgz").write_bytes(gzip.compress(b"x" * 5000)[:40])
    (tmp / "a-dir").mkdir()
    (tmp / "cache-file").write_text("x")
    (tmp / "broken.cu").write_text('extern "C" __global__ void k() { this is not cuda; }\n')
    (tmp / "config.ini").write_text("[ptxbackend\ntarget = \n")
    os.chmod(str(tmp / "config.ini"), 0o600)


CASES = [
    (["compile", "{t}/missing.cu"], {}),
    (["compile", "{t}/a-dir"], {}),
    (["compile", "{t}/broken.cu", "--target", "compute_75"], {}),
    (["compile", "{t}/broken.cu", "--target", "sm_1"], {}),
    (["compile", "{t}/broken.cu", "--device-cc", "banana"], {}),
    (["compile", "{t}/broken.cu", "--compiler", "clang"], {}),
    (["cache", "import"], {}),
    (["cache", "import", "{t}/missing.tgz"], {}),
    (["cache", "import", "{t}/binary.bin"], {}),
    (["cache", "import", "{t}/not-a-tar.tgz"], {}),
    (["cache", "import", "{t}/truncated.tgz"], {}),
    (["cache", "import", "{t}/a-dir"], {}),
    (["cache", "export", "{t}/no-such-dir/out.tgz"], {}),
    (["cache", "prune", "--max-size", "lots"], {}),
    (["cache", "frobnicate"], {}),
    (["cache", "info"], {"PTXBACKEND_CACHE_DIR": "{t}/cache-file"}),
    (["cache", "info"], {"PTXBACKEND_CONFIG": "{t}/config.ini"}),
    (["cache", "info"], {"PTXBACKEND_CONFIG": "{t}/no-such-config.ini"}),
    (["doctor"], {"PTXBACKEND_CONFIG": "{t}/a-dir"}),
    (["cache", "info"], {"PTXBACKEND_LOG": "loud"}),
    (["cache", "info"], {"PTXBACKEND_CACHE_MAX_SIZE": "-1"}),
    (["cache", "info"], {"PTXBACKEND_LOCK_TIMEOUT": "forever"}),
    (["warm"], {}),
    (["warm", "--driver-jit-bundle", "{t}/jit.tgz"], {}),
    (["cache", "import", "--from-fleet"], {}),
    (["cache", "import", "--from-fleet", "{t}/empty"], {}),
    (["cache", "push"], {}),
    (["warm", "{t}/missing.jsonl"], {}),
    (["warm", "{t}/binary.bin"], {}),
    (["warm", "{t}/bad-line.jsonl"], {}),
    (["warm", "{t}/not-a-tar.tgz"], {}),
    (["doctor", "--bogus"], {}),
    (["demo", "--device-cc", "x.y"], {}),
    (["no-such-command"], {}),
]


@pytest.mark.parametrize("argv,env", CASES, ids=[" ".join(a) + (" " + " ".join(e) if e else "")
                                                  for a, e in CASES])
def test_bad_input_gives_a_short_error_and_no_traceback(tmp_path, argv, env):
    _files(tmp_path)
    fill = lambda text: text.replace("{t}", str(tmp_path))  # noqa: E731
    full_env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"))
    full_env.update({k: fill(v) for k, v in env.items()})
    proc = subprocess.run([sys.executable, "-m", "ptxbackend"] + [fill(a) for a in argv], env=full_env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    assert proc.returncode in (1, 2), (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    if argv == ["doctor"]:  # a report, not an error: its problems are listed on stdout
        assert "PROBLEM: " in proc.stdout and "PTXBACKEND_CONFIG" in proc.stdout, proc.stdout
        return
    assert proc.stderr.strip(), "no message at all"
    # argparse's usage line plus its error, or our single line (a compile error carries its log).
    limit = 60 if "broken.cu" in " ".join(argv) and "--target" in argv and "compute_75" in argv else 6
    assert len(proc.stderr.strip().splitlines()) <= limit, proc.stderr

"""The command line, run as users run it: a separate process."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, SAXPY


def cli(*args, **kwargs):
    env = dict(os.environ, PYTHONPATH=REPO)
    env.update(kwargs.pop("env", {}))
    proc = subprocess.run([sys.executable, "-m", "ptxbackend"] + list(args), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    return proc.returncode, proc.stdout, proc.stderr


def test_compile_reports_target_kind_path_and_hit(nvcc13, tmp_path):
    source = tmp_path / "k.cu"
    source.write_text(SAXPY)
    out_file = tmp_path / "k.ptx"
    code, out, err = cli("compile", str(source), "--target", "compute_75", "-o", str(out_file), "--", "-DX=1")
    assert code == 0, err
    assert "compute_75" in out and "ptx" in out and "miss" in out
    assert out_file.read_bytes().startswith(b"//")
    code, out, _ = cli("compile", str(source), "--target", "compute_75", "--", "-DX=1")
    assert code == 0 and "hit" in out


def test_compile_error_is_one_clear_message(nvcc13, tmp_path):
    source = tmp_path / "bad.cu"
    source.write_text("__global__ void k() { nope }")
    code, out, err = cli("compile", str(source), "--device-cc", "7.5")
    assert code == 1
    assert "ptxbackend: error: nvcc" in err and "bad.cu" in err and "Traceback" not in err


def test_unknown_target_is_reported(tmp_path):
    source = tmp_path / "k.cu"
    source.write_text(SAXPY)
    code, _, err = cli("compile", str(source), "--target", "sm_9x")
    assert code == 1 and "unknown target" in err


def test_doctor_json_without_gpu(nvcc13):
    code, out, err = cli("doctor", "--json", env={"PTXBACKEND_DEVICE_CC": "9.0"})
    assert code == 0, err
    report = json.loads(out)
    assert report["compilers"]["nvcc"]["version"].startswith("13.")
    assert report["devices"][0]["auto"]["nvcc"]["target"] == "sm_90"
    assert report["settings"]["device_cc"]["from"] == "PTXBACKEND_DEVICE_CC"
    assert "driver_jit_cache" in report


def test_doctor_text_shows_old_compilers_choice(nvcc112, nvrtc117):
    code, out, err = cli("doctor", env={"PTXBACKEND_DEVICE_CC": "9.0", "PTXBACKEND_NVCC": nvcc112,
                                        "PTXBACKEND_NVRTC": nvrtc117})
    assert code == 0, err
    assert "nvcc -> compute_86 (ptx)" in out and "nvrtc -> compute_87 (ptx)" in out


def test_doctor_warns_about_disabled_jit_cache():
    code, out, _ = cli("doctor", env={"CUDA_CACHE_DISABLE": "1", "PTXBACKEND_DEVICE_CC": "7.5"})
    assert code == 0 and "CUDA_CACHE_DISABLE=1" in out and "WARNING" in out


def test_cache_commands(nvcc13, tmp_path):
    source = tmp_path / "k.cu"
    source.write_text(SAXPY)
    assert cli("compile", str(source), "--target", "compute_75")[0] == 0
    code, out, _ = cli("cache", "info")
    assert code == 0 and "entries:   1" in out and "nvcc-13." in out
    code, out, _ = cli("cache", "list")
    assert "compute_75" in out
    assert cli("cache", "verify")[1].strip().endswith("1 entry verified, 0 bad")
    entry_path = [line.split()[-1] for line in out.splitlines()][0]
    with open(os.path.join(os.environ["PTXBACKEND_CACHE_DIR"], entry_path), "ab") as handle:
        handle.write(b"junk")
    code, out, _ = cli("cache", "verify")
    assert code == 1 and "BAD" in out
    assert cli("cache", "verify", "--repair")[0] == 0
    assert cli("cache", "prune", "--max-size", "0")[0] == 0
    code, out, _ = cli("cache", "clear")
    assert code == 0 and "entries:   0" in cli("cache", "info")[1]


def test_demo_without_gpu_builds_for_turing(nvcc13):
    from conftest import gpu_available
    if gpu_available():
        pytest.skip("a GPU is here: the demo runs on it (tests/test_gpu.py checks that)")
    code, out, err = cli("demo")
    assert code == 0, err
    assert "compute capability 7.5" in out and "sm_75" in out


def test_demo_for_pascal_with_old_toolkit_says_what_runs_where(nvcc112):
    code, out, err = cli("demo", "--device-cc", "9.0", env={"PTXBACKEND_NVCC": nvcc112})
    assert code == 0, err
    assert "compute_86" in out and "JIT" in out


def test_cache_info_names_an_old_layout_and_prune_removes_it(tmp_path):
    cache = tmp_path / "cache"
    env = {"PTXBACKEND_CACHE_DIR": str(cache)}
    assert cli("cache", "info", env=env)[0] == 0  # creates the current layout
    old = cache / "v1" / "nvcc-11.2.152" / "compute_86" / "ab"
    old.mkdir(parents=True)
    (old / ("ab" * 32 + ".ptx")).write_bytes(b"PTXB\x01\x00 an entry of schema 1")  # its magic and schema
    code, out, _ = cli("cache", "info", env=env)
    assert code == 0 and "old:       v1, from an earlier ptxbackend" in out
    code, out, _ = cli("cache", "prune", env=env)
    assert code == 0 and "removed the old layout %s" % (cache / "v1") in out
    assert not (cache / "v1").exists() and "old:" not in cli("cache", "info", env=env)[1]


def test_a_bad_log_level_is_refused_like_other_bad_values(tmp_path):
    code, out, err = cli("cache", "info", env={"PTXBACKEND_LOG": "verbose",
                                               "PTXBACKEND_CACHE_DIR": str(tmp_path / "c")})
    assert code == 1 and "PTXBACKEND_LOG" in err and "verbose" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_closed_pipe_is_quiet(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp_path / "c"))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`head -1`) is gone before a line is written
    proc = subprocess.run([sys.executable, "-m", "ptxbackend", "cache", "info"], env=env, stdout=write_end,
                          stderr=subprocess.PIPE, universal_newlines=True)
    os.close(write_end)
    assert proc.stderr == "", proc.stderr
    assert proc.returncode == 0


def test_doctor_lists_every_problem_completes_the_report_and_exits_1(nvcc13, tmp_path):
    env = {"PTXBACKEND_DEVICE_CC": "9.0", "PTXBACKEND_TARGET": "bogus", "PTXBACKEND_CACHE_MAX_SIZE": "lots",
           "PTXBACKEND_COMPILER": "clang", "PTXBACKEND_CACHE_DIR": str(tmp_path / "c")}
    code, out, err = cli("doctor", "--json", env=env)
    assert code == 1, err
    report = json.loads(out)
    problems = "\n".join(report["problems"])
    assert len(report["problems"]) == 3, problems
    for word in ("PTXBACKEND_TARGET", "PTXBACKEND_CACHE_MAX_SIZE", "PTXBACKEND_COMPILER"):
        assert word in problems
    assert "cache" in report and "compilers" in report and "devices" in report  # the rest is complete
    code, out, err = cli("doctor", env=env)
    assert code == 1 and out.count("PROBLEM: ") == 3 and "no problems found" not in out


def test_doctor_reports_a_target_the_default_compiler_cannot_build(nvcc13, tmp_path):
    env = {"PTXBACKEND_DEVICE_CC": "9.0", "PTXBACKEND_TARGET": "sm_61", "PTXBACKEND_NVCC": nvcc13,
           "PTXBACKEND_CACHE_DIR": str(tmp_path / "c")}
    code, out, err = cli("doctor", env=env)
    assert code == 1 and "PROBLEM: nvcc cannot build" in out, out
    assert cli("doctor", env=dict(env, PTXBACKEND_TARGET="auto"))[0] == 0


@pytest.mark.parametrize("command", [("cache", "info"), ("cache", "verify"), ("cache", "import", "BUNDLE"),
                                     ("warm", "MANIFEST")])
def test_an_unusable_cache_dir_fails_every_admin_command(tmp_path, command):
    """A running program falls back to a temporary cache; an admin command must not pretend."""
    not_a_dir = tmp_path / "cache-is-a-file"
    not_a_dir.write_text("x")
    (tmp_path / "manifest.jsonl").write_text("")
    (tmp_path / "bundle.tgz").write_bytes(b"")
    args = [str(tmp_path / "bundle.tgz") if a == "BUNDLE" else str(tmp_path / "manifest.jsonl")
            if a == "MANIFEST" else a for a in command]
    code, out, err = cli(*args, env={"PTXBACKEND_CACHE_DIR": str(not_a_dir)})
    assert code == 1, (out, err)
    assert str(not_a_dir) in err and "Traceback" not in err and "temporary" not in err
    assert "imported" not in out and "verified" not in out


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to give the file away")
@pytest.mark.parametrize("how", ["writable by others", "owned by another user"])
def test_a_config_file_others_can_change_is_refused(tmp_path, how):
    config = tmp_path / "config.ini"
    config.write_text("[ptxbackend]\nnvrtc = %s\n" % (tmp_path / "evil.so"))
    if how == "writable by others":
        os.chmod(str(config), 0o666)
    else:
        os.chown(str(config), 65534, 65534)
        os.chmod(str(config), 0o644)
    code, out, err = cli("cache", "info", env={"PTXBACKEND_CONFIG": str(config),
                                               "PTXBACKEND_CACHE_DIR": str(tmp_path / "c")})
    assert code == 1 and str(config) in err and "refusing" in err and "Traceback" not in err, err
    os.chmod(str(config), 0o600)
    os.chown(str(config), os.getuid(), os.getgid())
    assert cli("cache", "info", env={"PTXBACKEND_CONFIG": str(config),
                                     "PTXBACKEND_CACHE_DIR": str(tmp_path / "c")})[0] == 0

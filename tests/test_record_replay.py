"""Records replay the exact request: what PTXBACKEND_RECORD writes holds everything in the key, so
``ptxbackend warm`` of it, from any directory, files the very entry the program asks for next."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, SAXPY, count_calls, run_python

HEADER_KERNEL = r'''
#include "scale.cuh"
#include <bias.cuh>
extern "C" __global__ void scaled(float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * SCALE + BIAS;
}
'''


def _cli(cwd, *args, **env):
    full = dict(os.environ, PYTHONPATH=REPO)
    full.update(env)
    return subprocess.run([sys.executable, "-m", "ptxbackend"] + list(args), env=full, cwd=str(cwd),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)


def _project(tmp_path):
    """A source directory with a header beside the kernel, and a relative -I directory in the
    program's working directory."""
    src = tmp_path / "project" / "src"
    src.mkdir(parents=True)
    (src / "scale.cuh").write_text("#define SCALE 2.0f\n")
    inc = tmp_path / "project" / "inc"
    inc.mkdir()
    (inc / "bias.cuh").write_text("#define BIAS 1.0f\n")
    (src / "k.cu").write_text(HEADER_KERNEL)
    return tmp_path / "project", src


def _records(manifest):
    with open(str(manifest)) as handle:
        return [json.loads(line) for line in handle]


def test_a_record_of_a_compile_with_source_dir_and_a_relative_include_warms_a_cache_the_program_hits(
        logging_nvcc, tmp_path):
    wrapper, log = logging_nvcc
    project, src = _project(tmp_path)
    manifest = tmp_path / "kernels.jsonl"
    program = ("import ptxbackend\n"
               "a = ptxbackend.compile(open('src/k.cu').read(), ['-I', 'inc'], target='compute_75', "
               "name='k.cu', source_dir='src')\n"
               "print(a.cache_hit)\n")
    recorded = run_python(program, {"PTXBACKEND_RECORD": str(manifest), "PTXBACKEND_NVCC": wrapper,
                                    "PTXBACKEND_CACHE_DIR": str(tmp_path / "build-cache")}, cwd=str(project))
    assert recorded.split() == ["False"]
    (record,) = _records(manifest)
    assert record["source_dir"] == str(src) and record["options"] == ["-I", str(project / "inc")]
    assert record["name"] == "k.cu" and record["compiler"] == "nvcc" and record["target"] == "compute_75"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fresh = str(tmp_path / "line-pc-cache")
    proc = _cli(elsewhere, "warm", str(manifest), PTXBACKEND_CACHE_DIR=fresh, PTXBACKEND_NVCC=wrapper)
    assert proc.returncode == 0 and "1 compiled, 0 already cached, 0 failed" in proc.stdout, (proc.stdout,
                                                                                             proc.stderr)
    calls = count_calls(log)
    again = run_python(program, {"PTXBACKEND_CACHE_DIR": fresh, "PTXBACKEND_NVCC": wrapper}, cwd=str(project))
    assert again.split() == ["True"] and count_calls(log) == calls, "warm filed another request"


def test_an_nvrtc_record_keeps_the_directory_nvrtc_looked_in_first(tmp_path, nvrtc_pch):
    """NVRTC looks for quoted includes beside the name, relative to the working directory: the record
    keeps that directory (``cwd``) and warm compiles there, so the program's next call hits."""
    project, src = _project(tmp_path)
    manifest = tmp_path / "kernels.jsonl"
    program = ("import ptxbackend\n"
               "a = ptxbackend.compile(open('src/k.cu').read(), ['-I', 'inc'], target='compute_75', "
               "compiler='nvrtc', name='src/k.cu')\n"
               "print(a.cache_hit)\n")
    env = {"PTXBACKEND_NVRTC": nvrtc_pch}
    assert run_python(program, dict(env, PTXBACKEND_RECORD=str(manifest), PTXBACKEND_CACHE_DIR=str(
        tmp_path / "build-cache")), cwd=str(project)).split() == ["False"]
    (record,) = _records(manifest)
    assert record["cwd"] == str(project) and record["compiler"] == "nvrtc" and "source_dir" not in record
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fresh = str(tmp_path / "line-pc-cache")
    proc = _cli(elsewhere, "warm", str(manifest), PTXBACKEND_CACHE_DIR=fresh, **env)
    assert proc.returncode == 0 and "1 compiled, 0 already cached, 0 failed" in proc.stdout, (proc.stdout,
                                                                                             proc.stderr)
    assert os.getcwd() != str(project)
    assert run_python(program, dict(env, PTXBACKEND_CACHE_DIR=fresh), cwd=str(project)).split() == ["True"]


def test_a_record_of_the_compile_command_warms_a_cache_the_same_command_hits(logging_nvcc, tmp_path):
    wrapper, log = logging_nvcc
    project, src = _project(tmp_path)
    manifest = tmp_path / "kernels.jsonl"
    build = str(tmp_path / "build-cache")
    proc = _cli(src, "compile", "k.cu", "--target", "compute_75", "--", "-I", "../inc",
                PTXBACKEND_RECORD=str(manifest), PTXBACKEND_NVCC=wrapper, PTXBACKEND_CACHE_DIR=build)
    assert proc.returncode == 0 and "miss" in proc.stdout, proc.stderr
    (record,) = _records(manifest)
    # `compile FILE` adds -I of the file's directory: the record keeps it as source_dir.
    assert record["source_dir"] == str(src) and record["options"] == ["-I", str(project / "inc")]

    fresh = str(tmp_path / "line-pc-cache")
    proc = _cli(tmp_path, "warm", str(manifest), PTXBACKEND_CACHE_DIR=fresh, PTXBACKEND_NVCC=wrapper)
    assert proc.returncode == 0 and "1 compiled" in proc.stdout, (proc.stdout, proc.stderr)
    calls = count_calls(log)
    proc = _cli(src, "compile", "k.cu", "--target", "compute_75", "--", "-I", "../inc",
                PTXBACKEND_CACHE_DIR=fresh, PTXBACKEND_NVCC=wrapper)
    assert proc.returncode == 0 and "result:   hit" in proc.stdout, (proc.stdout, proc.stderr)
    assert count_calls(log) == calls


def _manifest(tmp_path, **fields):
    record = {"key": "ab" * 32, "source": SAXPY, "options": [], "target": "compute_75", "compiler": "nvcc",
              "name": "k.cu"}
    record.update(fields)
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(record) + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.mark.parametrize("options", [["-I", "inc"], ["-Iinc"], ["-isystem", "inc"], ["--include-path=inc"]])
def test_warm_refuses_a_record_whose_options_name_a_relative_path(tmp_path, nvcc13, options):
    (tmp_path / "inc").mkdir()
    proc = _cli(tmp_path, "warm", _manifest(tmp_path, options=options), "--device-cc", "7.5")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "relative path" in proc.stderr and "record it again" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("field", ["source_dir", "cwd"])
@pytest.mark.parametrize("directory", ["relative/dir", "/tmp/$(touch x)", "/tmp/a`b`", 7])
def test_warm_refuses_a_source_dir_that_is_not_a_plain_absolute_directory(tmp_path, nvcc13, field, directory):
    proc = _cli(tmp_path, "warm", _manifest(tmp_path, **{field: directory}), "--device-cc", "7.5")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert field in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "x").exists()


def test_warm_replays_an_absolute_source_dir(tmp_path, nvcc13):
    proc = _cli(tmp_path, "warm", _manifest(tmp_path, source_dir=str(tmp_path)), "--device-cc", "7.5")
    assert proc.returncode == 0 and "1 compiled" in proc.stdout, (proc.stdout, proc.stderr)


# -- PTXBACKEND_RECORD and warm's manifest follow the cache's rules ----------------------------------

_RECORDING = ("import ptxbackend\n"
              "print(ptxbackend.compile(%r, target='compute_75').cache_hit)\n" % SAXPY)


def _record_into(tmp_path, target, umask=None):
    """Run a program that records into ``target``; its stderr."""
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_RECORD=str(target))
    code = ("import os; os.umask(%d)\n" % umask if umask is not None else "") + _RECORDING
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0 and proc.stdout.split() in (["False"], ["True"]), proc.stderr  # it goes on
    return proc.stderr


def test_a_new_record_file_is_made_private_whatever_the_umask(tmp_path, nvcc13):
    target = tmp_path / "kernels.jsonl"
    assert "cannot record" not in _record_into(tmp_path, target, umask=0)
    assert (os.stat(str(target)).st_mode & 0o777) == 0o600 and len(_records(target)) == 1


def test_a_record_path_that_is_a_link_is_never_followed(tmp_path, nvcc13):
    victim = tmp_path / "profile"
    victim.write_text("export PATH=/usr/bin\n")
    link = tmp_path / "kernels.jsonl"
    link.symlink_to(victim)
    err = _record_into(tmp_path, link)
    assert victim.read_text() == "export PATH=/usr/bin\n", "the record followed a planted link"
    assert "cannot record" in err and str(link) in err and "symbolic link" in err
    assert len(err.strip().splitlines()) == 1, err
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "made-through-the-link")
    assert "symbolic link" in _record_into(tmp_path, dangling)
    assert not (tmp_path / "made-through-the-link").exists()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
def test_a_record_file_another_user_owns_is_never_appended_to(tmp_path, nvcc13):
    target = tmp_path / "kernels.jsonl"
    target.write_text("")
    os.chmod(str(target), 0o600)
    os.chown(str(target), 65534, 65534)
    err = _record_into(tmp_path, target)
    assert target.read_text() == "", "our kernel sources went into another user's file"
    assert "cannot record" in err and "uid 65534" in err and "a file of your own" in err


@pytest.mark.parametrize("mode", [0o620, 0o602])
def test_a_record_file_others_can_write_is_never_appended_to(tmp_path, nvcc13, mode):
    target = tmp_path / "kernels.jsonl"
    target.write_text("")
    os.chmod(str(target), mode)
    err = _record_into(tmp_path, target)
    assert target.read_text() == "" and "writable by group or others" in err and "chmod go-w" in err


def _warm(tmp_path, manifest):
    return _cli(tmp_path, "warm", str(manifest), "--device-cc", "7.5",
                PTXBACKEND_CACHE_DIR=str(tmp_path / "warm-cache"))


def _one_line_refusal(proc, *words):
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr
    assert "compiled" not in proc.stdout


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
def test_warm_refuses_a_manifest_another_user_owns(tmp_path, nvcc13):
    manifest = _manifest(tmp_path)
    assert _warm(tmp_path, manifest).returncode == 0  # the same file, ours: replayed
    os.chown(manifest, 65534, 65534)
    _one_line_refusal(_warm(tmp_path, manifest), manifest, "uid 65534", "copy it to a file of your own")


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_warm_refuses_a_manifest_others_can_write(tmp_path, nvcc13, mode):
    manifest = _manifest(tmp_path)
    os.chmod(manifest, mode)
    _one_line_refusal(_warm(tmp_path, manifest), manifest, "writable by group or others", "chmod go-w")


def test_warm_refuses_a_manifest_that_is_a_link(tmp_path, nvcc13):
    manifest = _manifest(tmp_path)
    link = tmp_path / "link.jsonl"
    link.symlink_to(manifest)
    _one_line_refusal(_warm(tmp_path, link), str(link), "symbolic link", "name the file itself")


# -- generators: a record of any request warms what that request hits; no source_dir runs anything ------

FUZZ_EXAMPLES = int(os.environ.get("PTXBACKEND_RECORD_FUZZ_EXAMPLES", "16"))


def _request_strategy():
    from hypothesis import strategies as st
    include = st.sampled_from([["-I", "inc"], ["-Iinc"], ["--include-path=inc"], ["-isystem", "inc"],
                               ["-I", "../project/inc"], ["-I", "{project}/inc"], ["-I", "./inc/"]])
    other = st.sampled_from([[], ["-DN=3"], ["-lineinfo"], ["-DSCALE_BY=2"]])
    return st.fixed_dictionaries({
        "name": st.sampled_from(["k.cu", "src/k.cu", "-dash.cu", "stdin.cu", "a b.cu"]),
        "source_dir": st.sampled_from([None, "src", "./src/", "{project}/src"]),
        "options": st.tuples(st.lists(include, max_size=2), other).map(lambda p: sum(p[0], []) + p[1]),
    })


@pytest.fixture
def nvrtc_or_none(request):
    """NVRTC 13.5 where CI unpacked it (the generator then draws the compiler too), else nvcc alone."""
    try:
        return request.getfixturevalue("nvrtc_pch")
    except pytest.skip.Exception:
        return None


def test_any_recorded_request_warms_the_entry_that_request_then_hits(tmp_path, nvcc13, nvrtc_or_none,
                                                                    monkeypatch):
    """Differential: the program's own second call (in its directory, a fresh cache warmed from the
    record in another directory) must be a hit with no compile, for any mix of source_dir, relative
    -I spellings and names."""
    from hypothesis import HealthCheck, given, settings
    from ptxbackend.compiling import engine, record
    from ptxbackend.deploy import replay
    project, _src = _project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    counter = [0]

    from hypothesis import strategies as st
    compilers = ["nvcc"] + (["nvrtc"] if nvrtc_or_none else [])
    if nvrtc_or_none:
        monkeypatch.setenv("PTXBACKEND_NVRTC", nvrtc_or_none)

    # NVRTC takes no "-isystem DIR" (NVRTC_ERROR_INVALID_OPTION): the program could not have compiled it.
    nvrtc_can = lambda r: not any(o == "-isystem" for o in r["options"])  # noqa: E731

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(_request_strategy().flatmap(lambda r: st.sampled_from(
        [c for c in compilers if c == "nvcc" or nvrtc_can(r)]).map(lambda c: dict(r, compiler=c))))
    def check(request):
        counter[0] += 1
        run = tmp_path / ("run-%d" % counter[0])
        fill = lambda text: text.replace("{project}", str(project)) if text else text  # noqa: E731
        options = [fill(o) for o in request["options"]]
        source_dir = fill(request["source_dir"])
        with_headers = source_dir is not None and any("inc" in o for o in options)
        source = HEADER_KERNEL if with_headers else SAXPY
        manifest = run / "kernels.jsonl"
        run.mkdir()
        record._recorded.clear()  # one process, many programs: each records its own requests
        monkeypatch.chdir(str(project))
        monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(run / "build-cache"))
        monkeypatch.setenv("PTXBACKEND_RECORD", str(manifest))
        engine._reset_for_tests()
        first = engine.compile(source, options, target="compute_75", compiler=request["compiler"],
                               name=request["name"], source_dir=source_dir)
        monkeypatch.delenv("PTXBACKEND_RECORD")
        monkeypatch.chdir(str(elsewhere))
        monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(run / "line-pc-cache"))
        engine._reset_for_tests()
        compiled, hits, failures = replay.replay(str(manifest), device_cc="7.5", out=lambda *a: None)
        assert (compiled, hits, failures) == (1, 0, []), (request, failures)
        monkeypatch.chdir(str(project))
        engine._reset_for_tests()
        again = engine.compile(source, options, target="compute_75", compiler=request["compiler"],
                               name=request["name"], source_dir=source_dir)
        assert again.cache_hit and again.key == first.key, request

    check()


def test_no_source_dir_in_a_record_runs_the_canary_or_writes_outside_the_cache(tmp_path, nvcc13, monkeypatch):
    """The injection fuzzer's hostile values (tests/test_injection_fuzz.py) as a record's source_dir."""
    from hypothesis import HealthCheck, given, settings, strategies as st
    import test_injection_fuzz as injection
    from ptxbackend.deploy import replay
    from ptxbackend.errors import PtxBackendError
    world = str(tmp_path / "world")
    os.mkdir(world)
    injection.plant(world)
    os.mkdir(os.path.join(world, "sandbox"))
    monkeypatch.setenv("PTXBACKEND_FUZZ_CANARY", os.path.join(world, "ran"))
    monkeypatch.setenv("PTXBACKEND_CACHE_DIR", os.path.join(world, "sandbox", "cache"))
    before = injection.snapshot(world)

    @settings(max_examples=FUZZ_EXAMPLES * 4, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(injection.values(world), injection.values(world).map(lambda v: "/" + v)))
    def check(value):
        try:
            try:
                replay.replay(injection._manifest(world, source_dir=value), device_cc="7.5", out=lambda *a: None)
            except PtxBackendError as exc:
                assert "source_dir" in str(exc), str(exc)
            assert not os.path.exists(os.path.join(world, "ran")), "the canary ran (source_dir = %r)" % value
            assert injection.snapshot(world) == before, "something outside the cache changed (%r)" % value
        finally:
            injection.restore(world, before)

    check()


@pytest.mark.parametrize("name", ["-dash.cu", "-DVAL=7"])
def test_an_nvrtc_kernel_name_that_starts_with_a_dash_compiles_and_is_never_an_option(nvrtc_pch, monkeypatch,
                                                                                   name):
    """Found by the generator above: NVRTC read such a name as an option ("invalid option: -dash.cu")."""
    from ptxbackend.compiling import engine
    monkeypatch.setenv("PTXBACKEND_NVRTC", nvrtc_pch)
    source = ('#ifndef VAL\n#define VAL 1\n#endif\n'
              'extern "C" __global__ void k(int* x) { x[0] = VAL; }\n')
    image = engine.compile(source, target="compute_75", compiler="nvrtc", name=name).image.decode()
    assert "mov.u32" in image and any(line.strip().endswith(", 1;") for line in image.splitlines()
                                      if "mov.u32" in line), "the name defined VAL"

"""compile() end to end with real compilers: target choice, cache identity, no subprocess on a hit."""

import os
import subprocess
import sys

import pytest

import ptxbackend
from ptxbackend.errors import CompileError, CompilerNotFoundError, TargetError
from conftest import SAXPY, cache_files, count_calls, hide_nvrtc, hide_toolkit, run_python


def test_nvcc13_builds_native_cubin_for_h200(nvcc13):
    art = ptxbackend.compile(SAXPY, compiler="nvcc", device_cc="9.0")
    assert (art.kind, str(art.target)) == ("cubin", "sm_90")
    assert art.image[:4] == b"\x7fELF" and not art.cache_hit
    assert "/v4/nvcc-13." in art.path and "/sm_90/" in art.path and art.path.endswith(".cubin")
    again = ptxbackend.compile(SAXPY, compiler="nvcc", device_cc="9.0")
    assert again.cache_hit and again.image == art.image and again.path == art.path


def test_nvcc13_blackwell_gets_cubin_and_pascal_gets_clear_error(nvcc13):
    assert ptxbackend.compile(SAXPY, device_cc="12.0").kind == "cubin"
    with pytest.raises(TargetError) as info:
        ptxbackend.compile(SAXPY, device_cc="6.1")
    assert "6.1" in str(info.value) and "toolkit" in str(info.value)


@pytest.mark.toolkit
def test_nvcc112_on_h200_emits_compute_86_ptx(nvcc112, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_NVCC", nvcc112)
    art = ptxbackend.compile(SAXPY, device_cc="9.0")
    assert (art.kind, str(art.target), art.producer) == ("ptx", "compute_86", "nvcc-11.2.152")
    assert b".target sm_86" in art.image and b".entry saxpy" in art.image
    assert "/v4/nvcc-11.2.152/compute_86/" in art.path
    native = ptxbackend.compile(SAXPY, device_cc="8.6")
    assert (native.kind, str(native.target)) == ("cubin", "sm_86")


@pytest.mark.toolkit
def test_nvcc112_fatbin_for_a_mixed_fleet(nvcc112, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_NVCC", nvcc112)
    art = ptxbackend.compile(SAXPY, target="sm_61,compute_61")
    assert art.kind == "fatbin" and art.path.endswith(".fatbin")
    assert art.image[:4] == b"\x50\xed\x55\xba"  # fatbin magic


@pytest.mark.toolkit
def test_nvcc112_refuses_sm_90_with_the_users_message(nvcc112):
    from ptxbackend.compilers.nvcc import nvcc_compiler
    from ptxbackend.compiling.targets import parse_target
    with pytest.raises(CompileError) as info:
        nvcc_compiler(nvcc112).compile(SAXPY, (), parse_target("sm_90"))
    err = info.value
    assert "Value 'sm_90' is not defined for option 'gpu-architecture'" in err.log
    assert err.returncode != 0 and err.command[0].endswith("nvcc112")
    assert "PTXBACKEND_TARGET=auto" in err.hint and "compute_86" in err.hint


@pytest.mark.toolkit
def test_nvrtc117_on_h200_emits_compute_87_ptx(nvrtc117, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_NVRTC", nvrtc117)
    art = ptxbackend.compile(SAXPY, compiler="nvrtc", device_cc="9.0")
    assert (art.kind, str(art.target), art.producer) == ("ptx", "compute_87", "nvrtc-11.7.99")
    assert b".target sm_87" in art.image


@pytest.mark.toolkit
def test_each_producer_target_and_option_selects_its_own_entry(nvcc13, nvcc112, monkeypatch):
    paths = set()
    paths.add(ptxbackend.compile(SAXPY, target="compute_75").path)
    monkeypatch.setenv("PTXBACKEND_NVCC", nvcc112)
    paths.add(ptxbackend.compile(SAXPY, target="compute_75").path)
    paths.add(ptxbackend.compile(SAXPY, target="compute_80").path)
    paths.add(ptxbackend.compile(SAXPY, ["-DUNUSED=1"], target="compute_80").path)
    assert len(paths) == 4


def test_header_content_change_is_a_miss_in_a_fresh_process(nvcc13, tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "scale.cuh").write_text("#define SCALE 2.0f\n")
    src = '#include "scale.cuh"\nextern "C" __global__ void k(float* y){ y[0] = SCALE; }\n'
    code = ("import ptxbackend, sys; a = ptxbackend.compile(%r, ['-I%s'], target='compute_75');"
            "print(a.key, a.cache_hit)" % (src, inc))
    first = run_python(code).split()
    assert run_python(code).split() == [first[0], "True"]
    (inc / "scale.cuh").write_text("#define SCALE 3.0f\n")
    second = run_python(code).split()
    assert second == [first[0], "False"]  # the same request: its recorded header no longer matches


def test_warm_hit_runs_no_compiler_process(logging_nvcc):
    wrapper, log = logging_nvcc
    code = ("import ptxbackend; a = ptxbackend.compile(%r, target='compute_75');"
            "print(a.cache_hit)" % SAXPY)
    env = {"PTXBACKEND_NVCC": wrapper}
    assert run_python(code, env).strip() == "False"
    calls_after_cold = count_calls(log)
    assert count_calls(log, "--ptx") == 1 and calls_after_cold >= 2  # the probe, then the compile
    assert run_python(code, env).strip() == "True"
    assert count_calls(log) == calls_after_cold  # a fresh process: no nvcc at all


def test_eight_processes_missing_one_key_compile_it_once(logging_nvcc, tmp_path):
    wrapper, log = logging_nvcc
    env = dict(os.environ, PTXBACKEND_NVCC=wrapper,
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = ("import ptxbackend; a = ptxbackend.compile(%r, target='compute_80');"
            "print(len(a.image))" % SAXPY)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
             for _ in range(8)]
    outputs = [p.communicate()[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outputs)) == 1
    assert count_calls(log, "--ptx") == 1


def test_damaged_entry_is_rebuilt(logging_nvcc, monkeypatch):
    wrapper, log = logging_nvcc
    monkeypatch.setenv("PTXBACKEND_NVCC", wrapper)
    art = ptxbackend.compile(SAXPY, target="compute_75")
    for damage in ("truncate", "flip"):
        with open(art.path, "r+b") as handle:
            if damage == "truncate":
                handle.truncate(os.path.getsize(art.path) // 2)
            else:
                handle.seek(-10, os.SEEK_END)
                byte = handle.read(1)
                handle.seek(-10, os.SEEK_END)
                handle.write(bytes([byte[0] ^ 0x01]))
        again = ptxbackend.compile(SAXPY, target="compute_75")
        assert not again.cache_hit and again.image == art.image
    assert count_calls(log, "--ptx") == 3
    assert ptxbackend.compile(SAXPY, target="compute_75").cache_hit


def test_failed_compile_leaves_nothing_behind(nvcc13, tmp_path):
    with pytest.raises(CompileError) as info:
        ptxbackend.compile('extern "C" __global__ void k() { this is not cuda; }', target="compute_75")
    assert "error" in info.value.log and info.value.returncode != 0
    assert cache_files(tmp_path / "cache") == []
    assert ptxbackend.compile(SAXPY, target="compute_75").kind == "ptx"  # the next call works


def test_missing_compiler_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("PTXBACKEND_NVCC", str(tmp_path / "no-such-nvcc"))
    with pytest.raises(CompilerNotFoundError) as info:
        ptxbackend.compile(SAXPY, compiler="nvcc", target="compute_75")
    assert "no-such-nvcc" in str(info.value)


def _now_a_machine_without_compilers(monkeypatch, tmp_path):
    """From here on, no CUDA toolkit and no NVRTC wheel; a fresh engine."""
    hide_toolkit(monkeypatch, tmp_path)
    hide_nvrtc(monkeypatch)
    from ptxbackend.compiling import engine
    engine._reset_for_tests()
    return engine


def test_cache_alone_serves_a_machine_without_compiler(nvcc13, monkeypatch, tmp_path):
    built = ptxbackend.compile(SAXPY, device_cc="7.5")
    _now_a_machine_without_compilers(monkeypatch, tmp_path)
    hit = ptxbackend.compile(SAXPY, device_cc="7.5")
    assert hit.cache_hit and hit.image == built.image and "no compiler" in hit.reason
    with pytest.raises(CompilerNotFoundError) as info:
        ptxbackend.compile(SAXPY + "// another kernel", device_cc="7.5")
    assert "no entry for this kernel" in str(info.value)


def test_settings_follow_the_environment_and_the_config_file_between_calls(tmp_path, monkeypatch):
    """load_settings() is remembered for the hit path, but never past a change of what it reads."""
    from ptxbackend.config import load_settings
    config = tmp_path / "config-home" / "ptxbackend" / "config.ini"  # the default place (conftest)
    assert load_settings().target == "auto"
    config.parent.mkdir(parents=True)
    config.write_text("[ptxbackend]\ntarget = compute_75\n")
    assert (load_settings().target, load_settings().origins["target"]) == ("compute_75", str(config))
    config.write_text("[ptxbackend]\ntarget = compute_80,sm_90\n")
    assert load_settings().target == "compute_80,sm_90"
    monkeypatch.setenv("PTXBACKEND_TARGET", "compute_61")
    assert (load_settings().target, load_settings().origins["target"]) == ("compute_61", "PTXBACKEND_TARGET")
    assert load_settings(target="sm_86").target == "sm_86"
    monkeypatch.delenv("PTXBACKEND_TARGET")
    config.unlink()
    assert load_settings().target == "auto"


@pytest.mark.parametrize("reading", ["environ dict", "os.environ.get"])
def test_compile_settings_are_renewed_by_any_variable_they_depend_on(monkeypatch, reading):
    """The warm path's settings lookup: remembered, renewed by a knob, PATH or the record switch."""
    from ptxbackend import config
    if reading == "os.environ.get":
        monkeypatch.setattr(config, "_ENV_KEYS", None)  # as where os.environ has no plain dict
    monkeypatch.setenv("PTXBACKEND_TARGET", "compute_75")
    first = config.compile_settings()
    assert config.compile_settings() is first and first.target == "compute_75" and first.record is None
    assert config.compile_settings(target="sm_90").target == "sm_90"
    monkeypatch.setenv("PTXBACKEND_TARGET", "compute_80")
    assert config.compile_settings().target == "compute_80"
    second = config.compile_settings()
    monkeypatch.setenv("PATH", os.environ["PATH"] + os.pathsep + "/nonexistent")
    assert config.compile_settings() is not second  # the compiler found may differ
    monkeypatch.setenv("PTXBACKEND_RECORD", "/tmp/manifest.jsonl")
    assert config.compile_settings().record == "/tmp/manifest.jsonl"


def test_a_compiler_put_on_path_is_used_by_the_next_compile(logging_nvcc, nvcc13, monkeypatch):
    wrapper, calls = logging_nvcc
    for name in ("PTXBACKEND_NVCC", "CUDA_PATH", "CUDA_HOME"):  # these outrank PATH
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", os.environ["PATH"] + os.pathsep + os.path.dirname(nvcc13))
    ptxbackend.compile(SAXPY, target="compute_75", compiler="nvcc")
    assert count_calls(calls) == 0
    monkeypatch.setenv("PATH", os.path.dirname(wrapper) + os.pathsep + os.environ["PATH"])
    art = ptxbackend.compile(SAXPY + "// new", target="compute_75", compiler="nvcc")
    assert not art.cache_hit and count_calls(calls, "--ptx") == 1


class _StandInDriver(object):
    """Engine-logic check without a GPU: a device of cc 9.0 whose 'JIT' tags the PTX (the real
    driver's part of this path runs in tests/test_gpu.py on the GPU machine)."""

    def __init__(self, monkeypatch):
        from ptxbackend.gpu import driver
        self.links = 0
        for name, value in dict(available=lambda: True, current_device=lambda: 0,
                                compute_capability=lambda ordinal=0: 90, driver_build=lambda: "580.0-test",
                                link_ptx=self.link).items():
            monkeypatch.setattr(driver, name, value)

    def link(self, ptx, name="kernel.ptx"):
        self.links += 1
        return b"JIT:" + bytes(ptx)


def test_warm_hit_at_the_cubin_level_reads_the_ptx_only_when_asked(nvcc13, monkeypatch):
    from ptxbackend.compiling import engine
    stand_in = _StandInDriver(monkeypatch)
    first = ptxbackend.compile(SAXPY, target="compute_75")
    ptx = first.image
    assert engine.loadable_image(first) == (b"JIT:" + ptx, "cubin") and stand_in.links == 1

    engine._reset_for_tests()  # as a new process would start
    warm = ptxbackend.compile(SAXPY, target="compute_75")
    assert warm.cache_hit and warm.kind == "ptx" and "PTX not read" in repr(warm)
    assert engine.loadable_image(warm) == (b"JIT:" + ptx, "cubin") and stand_in.links == 1
    assert warm.image == ptx  # read on demand, from the PTX entry

    os.unlink(first.path)  # pruned while its JIT cubin stayed
    engine._reset_for_tests()
    orphan = ptxbackend.compile(SAXPY, target="compute_75")
    assert orphan.cache_hit and orphan.image == ptx and os.path.exists(first.path)  # rebuilt on demand

    engine.discard_jit(orphan, "test")
    assert orphan.jit is None
    assert engine.loadable_image(orphan) == (b"JIT:" + ptx, "cubin") and stand_in.links == 2


@pytest.mark.parametrize("variable,value", [("PTXBACKEND_NVCC", "/nope/nvcc"), ("PTXBACKEND_COMPILER", "clang"),
                                            ("PTXBACKEND_NVRTC", "/nope/libnvrtc.so")])
def test_a_named_compiler_that_is_not_usable_is_an_error_even_with_the_kernel_cached(
        nvcc13, monkeypatch, tmp_path, variable, value):
    built = ptxbackend.compile(SAXPY, device_cc="7.5")
    engine = _now_a_machine_without_compilers(monkeypatch, tmp_path)
    assert ptxbackend.compile(SAXPY, device_cc="7.5").image == built.image  # nothing named: cache hits
    monkeypatch.setenv(variable, value)
    engine._reset_for_tests()
    with pytest.raises(CompilerNotFoundError) as info:
        ptxbackend.compile(SAXPY, device_cc="7.5")
    assert value in str(info.value)


@pytest.mark.toolkit
def test_a_gpu_the_default_compiler_cannot_build_for_names_one_here_that_can(nvcc13, nvrtc117, monkeypatch):
    """nvcc 13 knows nothing for a Pascal card (6.1); NVRTC 11.7, found here too, does."""
    monkeypatch.setenv("PTXBACKEND_NVRTC", nvrtc117)
    with pytest.raises(TargetError) as info:
        ptxbackend.compile(SAXPY, device_cc="6.1")
    assert "PTXBACKEND_COMPILER=nvrtc" in str(info.value) and "11.7" in str(info.value)
    # A compiler the user chose is theirs: the message is about it alone.
    with pytest.raises(TargetError) as info:
        ptxbackend.compile(SAXPY, device_cc="6.1", compiler="nvcc")
    assert "PTXBACKEND_COMPILER=nvrtc" not in str(info.value)

"""Tests of the NVRTC backend against a real NVRTC 11.7 (the pip wheel), no mocks.

NVRTC 11.7 knows compute_35..compute_87 but not the H200's compute_90: the
situation ptxbackend exists for.
"""

import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

from ptxbackend.gpu import libraries as libsearch
from ptxbackend.compilers import nvrtc
from ptxbackend.compilers.base import CompilerIdentity
from ptxbackend.compilers.nvrtc import NVRTC_ENV, NvrtcCompiler, find_nvrtc, nvrtc_compiler, probe_nvrtc
from ptxbackend.errors import CompileError, CompilerNotFoundError
from ptxbackend.compiling.targets import parse_target

NVRTC_117_ARCHS = (35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87)

# Self-contained on purpose: NVRTC has no <cstdint> or <cstdio>.
SAXPY = r'''
#ifndef SCALE
#define SCALE 1
#endif
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] * SCALE + y[i];
    }
}
'''

BROKEN = r'''
extern "C" __global__ void broken(float* y)
{
    y[0] = undefined_variable;
}
'''

# The package's own directory root, for child interpreters.
_IMPORT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(nvrtc.__file__))))

_found = []


def _missing(reason):
    if os.environ.get("PTXBACKEND_REQUIRE_TOOLKITS") == "1":
        pytest.fail("NVRTC 11.7 is required (PTXBACKEND_REQUIRE_TOOLKITS=1): %s" % reason,
                    pytrace=False)
    pytest.skip("NVRTC 11.7 not available: %s" % reason)


def require_nvrtc():
    """Return the path of a real NVRTC 11.7, or skip the test.

    Looks at ``$PTXBACKEND_TEST_NVRTC`` (a file or directory), else the
    ``nvidia-cuda-nvrtc-cu11`` wheel on ``sys.path``, else :func:`find_nvrtc`.
    With ``PTXBACKEND_REQUIRE_TOOLKITS=1`` (CI) a missing library fails the
    test instead of skipping it.
    """
    if _found:
        return _found[0]
    explicit = os.environ.get("PTXBACKEND_TEST_NVRTC")
    try:
        if explicit:
            path = find_nvrtc(explicit)
        else:
            path = None
            # The wheel first: a toolkit found by find_nvrtc() may be another release.
            for entry in sys.path:
                wheel = os.path.join(os.path.abspath(entry or os.curdir), "nvidia", "cuda_nvrtc", "lib")
                if os.path.isdir(wheel):
                    try:
                        path = find_nvrtc(wheel)
                        break
                    except CompilerNotFoundError:
                        pass
            if path is None:
                path = find_nvrtc()
        identity = probe_nvrtc(path)
    except CompilerNotFoundError as exc:
        _missing("%s\nInstall it with: python3 -m pip install nvidia-cuda-nvrtc-cu11==11.7.99, "
                 "or set PTXBACKEND_TEST_NVRTC=/path/to/libnvrtc.so.11.2" % exc)
    if not identity.version.startswith("11.7."):
        _missing("found NVRTC %s at %s, these tests need 11.7 (set PTXBACKEND_TEST_NVRTC)"
                 % (identity.version, identity.path))
    _found.append(path)
    return path


@pytest.fixture(scope="module")
def compiler():
    return NvrtcCompiler(probe_nvrtc(require_nvrtc()))


def _run_child(code, tmp_path):
    """Run ``code`` in a fresh interpreter (a process that has not loaded NVRTC yet)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([_IMPORT_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    script = tmp_path / "child.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


_LOADED_NVRTC = '''
def loaded_nvrtc():
    with open("/proc/self/maps") as maps:
        return sorted(set(line.split()[-1] for line in maps if "libnvrtc" in line))
'''


# --- probing -----------------------------------------------------------------

@pytest.mark.toolkit
def test_probe_reports_version_and_archs_from_the_library():
    path = require_nvrtc()
    identity = probe_nvrtc(path)
    assert identity.kind == "nvrtc"
    assert identity.version == "11.7.99"  # the full release, from the library itself
    assert identity.path == path  # as discovery found it: the memo is checked against that
    assert os.path.realpath(path) in [f for f, _sig in identity.files]
    assert identity.virtual_archs == NVRTC_117_ARCHS
    assert identity.real_archs == NVRTC_117_ARCHS
    assert identity.archs_reliable is True
    assert 90 not in identity.virtual_archs
    assert identity.producer == "nvrtc-11.7.99"


@pytest.mark.toolkit
def test_probe_rejects_a_library_that_is_not_nvrtc():
    builtins = [name for name in os.listdir(os.path.dirname(require_nvrtc()))
                if name.startswith("libnvrtc-builtins")]
    if not builtins:
        pytest.skip("no libnvrtc-builtins next to NVRTC")
    path = os.path.join(os.path.dirname(require_nvrtc()), builtins[0])
    with pytest.raises(CompilerNotFoundError) as info:
        probe_nvrtc(path)
    assert "not an NVRTC library" in str(info.value)
    assert "nvrtcVersion" in str(info.value)


def test_probe_of_a_missing_file_raises_compiler_not_found(tmp_path):
    missing = str(tmp_path / "libnvrtc.so.99")
    with pytest.raises(CompilerNotFoundError) as info:
        probe_nvrtc(missing)
    assert missing in str(info.value)
    assert NVRTC_ENV in str(info.value)


# --- compiling ---------------------------------------------------------------

@pytest.mark.toolkit
def test_output_kinds(compiler):
    assert compiler.kind == "nvrtc"
    assert compiler.output_kinds == ("ptx", "cubin")


@pytest.mark.toolkit
@pytest.mark.parametrize("arch", [87, 61])
def test_ptx_for_a_known_architecture(compiler, arch):
    ptx = compiler.compile(SAXPY, (), parse_target("compute_%d" % arch))
    assert isinstance(ptx, bytes)
    assert b".target sm_%d" % arch in ptx
    assert b".version 7.7" in ptx
    assert b".entry saxpy(" in ptx
    assert not ptx.endswith(b"\0")
    assert b"\0" not in ptx


@pytest.mark.toolkit
def test_cubin_for_sm_86_is_an_elf_image(compiler):
    cubin = compiler.compile(SAXPY, (), parse_target("sm_86"))
    assert cubin.startswith(b"\x7fELF")
    assert b"saxpy" in cubin


@pytest.mark.toolkit
def test_source_and_name_may_be_bytes(compiler):
    ptx = compiler.compile(SAXPY.encode("utf-8"), [b"-DSCALE=2"], parse_target("compute_75"),
                           name=b"bytes.cu")
    assert b".entry saxpy(" in ptx


@pytest.mark.toolkit
@pytest.mark.parametrize("target", ["compute_90", "sm_90"])
def test_architecture_newer_than_nvrtc_gives_a_hint(compiler, target):
    with pytest.raises(CompileError) as info:
        compiler.compile(SAXPY, (), parse_target(target))
    error = info.value
    assert "invalid value for --gpu-architecture" in error.log
    assert "PTXBACKEND_TARGET" in error.hint
    assert "compute_87" in error.hint
    assert error.returncode == 5
    assert error.command == ["--gpu-architecture=%s" % target]
    message = str(error)
    assert "NVRTC_ERROR_INVALID_OPTION" in message
    assert compiler.identity.path in message
    assert "11.7" in message


@pytest.mark.toolkit
def test_broken_source_carries_the_log(compiler):
    with pytest.raises(CompileError) as info:
        compiler.compile(BROKEN, ["-DX=1"], parse_target("compute_61"), name="broken_kernel.cu")
    error = info.value
    assert error.returncode != 0
    assert error.returncode == 6
    assert 'broken_kernel.cu(4): error: identifier "undefined_variable" is undefined' in error.log
    assert error.command == ["--gpu-architecture=compute_61", "-DX=1"]
    assert "NVRTC_ERROR_COMPILATION" in str(error)
    assert "broken_kernel.cu" in str(error)


@pytest.mark.toolkit
def test_warnings_alone_do_not_fail(compiler):
    source = 'extern "C" __global__ void unused_var(float* y) { int x; y[0] = 1.0f; }'
    ptx = compiler.compile(source, (), parse_target("compute_61"))
    assert b".entry unused_var(" in ptx


@pytest.mark.toolkit
def test_options_are_passed_as_given(compiler):
    target = parse_target("compute_61")
    plain = compiler.compile(SAXPY, (), target)
    scaled = compiler.compile(SAXPY, ("-DSCALE=3",), target)
    assert plain != scaled
    assert b"0f40400000" in scaled  # 3.0f
    assert b"0f40400000" not in plain
    fast = compiler.compile(SAXPY, ["--use_fast_math", "-std=c++14"], target)
    assert b".entry saxpy(" in fast
    # A lone string is one option, not a sequence of one-letter options.
    assert compiler.compile(SAXPY, "-DSCALE=3", target) == scaled


@pytest.mark.toolkit
def test_an_architecture_in_the_options_conflicts_with_the_target(compiler):
    with pytest.raises(CompileError) as info:
        compiler.compile(SAXPY, ["-arch=compute_75"], parse_target("compute_61"))
    error = info.value
    assert "defined more than once" in error.log
    assert error.command == ["--gpu-architecture=compute_61", "-arch=compute_75"]
    assert "PTXBACKEND_TARGET" in error.hint


@pytest.mark.toolkit
def test_nvcc_only_option_is_rejected_with_a_hint(compiler):
    with pytest.raises(CompileError) as info:
        compiler.compile(SAXPY, ["-c"], parse_target("compute_61"))
    error = info.value
    assert error.returncode == 5
    assert "unrecognized option -c" in error.log
    assert "PTXBACKEND_COMPILER=nvcc" in error.hint


@pytest.mark.toolkit
def test_standard_headers_are_missing_with_a_hint(compiler):
    with pytest.raises(CompileError) as info:
        compiler.compile("#include <cstdint>\n" + SAXPY, (), parse_target("compute_61"))
    assert 'could not open source file "cstdint"' in info.value.log
    assert "self-contained" in info.value.hint


@pytest.mark.toolkit
def test_nul_in_source_is_refused(compiler):
    with pytest.raises(CompileError) as info:
        compiler.compile(SAXPY + "\0garbage", (), parse_target("compute_61"))
    assert "NUL" in str(info.value)


@pytest.mark.toolkit
def test_concurrent_compiles_from_one_instance(compiler):
    target = parse_target("compute_75")
    expected = compiler.compile(SAXPY, ("-DSCALE=%d" % 0,), target)
    results, errors = {}, []

    def work(index):
        try:
            results[index] = compiler.compile(SAXPY, ("-DSCALE=%d" % (index % 3),), target)
        except Exception as exc:  # collected: an exception in a thread is otherwise lost
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(results) == 12
    assert results[0] == results[3] == expected
    assert results[1] != results[2]


@pytest.mark.toolkit
def test_missing_builtins_library_gives_a_hint(tmp_path):
    # A copy of libnvrtc alone finds no libnvrtc-builtins through its $ORIGIN
    # RUNPATH; a child process, because this one has the builtins loaded already.
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(os.path.realpath(require_nvrtc()), str(lone))
    result = _run_child('''
import json
from ptxbackend.compilers.nvrtc import nvrtc_compiler
from ptxbackend.errors import CompileError
from ptxbackend.compiling.targets import parse_target
try:
    nvrtc_compiler(%r).compile('extern "C" __global__ void k() {}', (), parse_target("compute_61"))
    print(json.dumps(None))
except CompileError as exc:
    print(json.dumps([exc.returncode, exc.log, exc.hint]))
''' % str(lone), tmp_path)
    assert result is not None, "NVRTC compiled without its builtins library"
    returncode, log, hint = result
    assert returncode == 7
    assert "libnvrtc-builtins" in log
    assert "libnvrtc-builtins" in hint


# --- what needs no library --------------------------------------------------

def _paper_identity(real_archs=NVRTC_117_ARCHS):
    # Never loaded: these paths fail before the library is touched.
    return CompilerIdentity("nvrtc", "/nonexistent/libnvrtc.so.11.2", "11.7", NVRTC_117_ARCHS,
                            real_archs, True)


def test_fatbin_target_is_refused():
    compiler = NvrtcCompiler(_paper_identity())
    with pytest.raises(CompileError) as info:
        compiler.compile(SAXPY, (), parse_target("sm_61,compute_61"))
    assert "fatbin" in str(info.value)
    assert "PTXBACKEND_COMPILER=nvcc" in info.value.hint


def test_cubin_from_an_nvrtc_without_cubin_support_is_refused():
    compiler = NvrtcCompiler(_paper_identity(real_archs=()))
    assert compiler.output_kinds == ("ptx",)
    with pytest.raises(CompileError) as info:
        compiler.compile(SAXPY, (), parse_target("sm_61"))
    assert "cubin" in str(info.value)
    assert "compute_61" in info.value.hint


# --- finding the library -----------------------------------------------------

def _touch(directory, *names):
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"")
    return directory


def test_bad_explicit_path_names_that_path(tmp_path):
    bad = str(tmp_path / "no" / "libnvrtc.so.11.2")
    with pytest.raises(CompilerNotFoundError) as info:
        find_nvrtc(bad)
    assert bad in str(info.value)
    assert "does not exist" in str(info.value)
    assert "pip install nvidia-cuda-nvrtc-cu11" in str(info.value)


def test_explicit_directory_picks_the_highest_version_never_builtins(tmp_path):
    lib = _touch(tmp_path / "lib", "libnvrtc.so", "libnvrtc.so.11.2", "libnvrtc.so.12.4",
                 "libnvrtc.so.12.4.127", "libnvrtc-builtins.so.13.0", "libnvrtc.alt.so.13",
                 "libnvrtc_static.a")
    assert find_nvrtc(str(lib)) == str(lib / "libnvrtc.so.12.4.127")


def test_explicit_directory_without_nvrtc_is_an_error(tmp_path):
    lib = _touch(tmp_path / "lib", "libnvrtc-builtins.so.11.7", "libcudart.so.11.0")
    with pytest.raises(CompilerNotFoundError) as info:
        find_nvrtc(str(lib))
    assert str(lib) in str(info.value)


def test_explicit_builtins_file_is_refused(tmp_path):
    lib = _touch(tmp_path / "lib", "libnvrtc-builtins.so.11.7")
    with pytest.raises(CompilerNotFoundError) as info:
        find_nvrtc(str(lib / "libnvrtc-builtins.so.11.7"))
    assert "libnvrtc-builtins" in str(info.value)


def test_environment_variable_is_used_and_explicit_wins(tmp_path, monkeypatch):
    env_lib = _touch(tmp_path / "env", "libnvrtc.so.12")
    explicit_lib = _touch(tmp_path / "explicit", "libnvrtc.so.11.2")
    monkeypatch.setenv(NVRTC_ENV, str(env_lib))
    assert find_nvrtc() == str(env_lib / "libnvrtc.so.12")
    assert find_nvrtc(str(explicit_lib)) == str(explicit_lib / "libnvrtc.so.11.2")
    monkeypatch.setenv(NVRTC_ENV, str(env_lib / "libnvrtc.so.12"))
    assert find_nvrtc() == str(env_lib / "libnvrtc.so.12")


def test_bad_environment_variable_is_an_error_not_a_fallback(tmp_path, monkeypatch):
    bad = str(tmp_path / "nothing-here")
    monkeypatch.setenv(NVRTC_ENV, bad)
    with pytest.raises(CompilerNotFoundError) as info:
        find_nvrtc()
    assert NVRTC_ENV in str(info.value)
    assert bad in str(info.value)


def _isolate_search(tmp_path, monkeypatch):
    """Leave only directories under ``tmp_path`` (and the loader's cache) to search."""
    for var in (NVRTC_ENV, "CUDA_PATH", "CUDA_HOME"):
        monkeypatch.delenv(var, raising=False)
    empty_bin = _touch(tmp_path / "empty-bin")
    monkeypatch.setenv("PATH", str(empty_bin))
    if libsearch.best_in_dir("/usr/local/cuda/lib64", "nvrtc"):
        pytest.skip("/usr/local/cuda/lib64 holds an NVRTC, which is searched before wheels")


def test_search_order_toolkit_before_wheels(tmp_path, monkeypatch):
    _isolate_search(tmp_path, monkeypatch)
    site = tmp_path / "site"
    wheel = _touch(site / "nvidia" / "cuda_nvrtc" / "lib", "libnvrtc.so.11.2", "libnvrtc-builtins.so.11.7")
    cu13 = _touch(site / "nvidia" / "cu13" / "lib", "libnvrtc.so.13")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(site)])
    assert find_nvrtc() == str(wheel / "libnvrtc.so.11.2")

    (wheel / "libnvrtc.so.11.2").unlink()
    assert find_nvrtc() == str(cu13 / "libnvrtc.so.13")

    toolkit = tmp_path / "cuda"
    lib64 = _touch(toolkit / "targets" / "x86_64-linux" / "lib", "libnvrtc.so.12.0.76")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    assert find_nvrtc() == str(lib64 / "libnvrtc.so.12.0.76")

    lib = _touch(toolkit / "lib64", "libnvrtc.so.12.1")
    monkeypatch.setenv("CUDA_PATH", str(toolkit))
    assert find_nvrtc() == str(lib / "libnvrtc.so.12.1")


def test_nvcc_on_path_leads_to_its_lib64(tmp_path, monkeypatch):
    _isolate_search(tmp_path, monkeypatch)
    monkeypatch.setattr(sys, "path", [])
    toolkit = tmp_path / "cuda-11.7"
    nvcc = _touch(toolkit / "bin", "nvcc") / "nvcc"
    nvcc.chmod(0o755)
    lib64 = _touch(toolkit / "lib64", "libnvrtc.so.11.2")
    monkeypatch.setenv("PATH", str(toolkit / "bin"))
    assert find_nvrtc() == str(lib64 / "libnvrtc.so.11.2")


def test_not_found_lists_every_place_and_the_fix(tmp_path, monkeypatch):
    _isolate_search(tmp_path, monkeypatch)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda-home"))
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    try:
        found = find_nvrtc()
    except CompilerNotFoundError as exc:
        message = str(exc)
    else:
        pytest.skip("the dynamic loader knows an NVRTC (%s)" % found)
    for expected in (NVRTC_ENV, "$CUDA_PATH (not set)", str(tmp_path / "cuda-home" / "lib64"),
                     "nvcc on PATH (not found)", "/usr/local/cuda/lib64", "nvidia/cuda_nvrtc/lib",
                     "nvidia/cu13/lib", "find_library", "pip install nvidia-cuda-nvrtc-cu11",
                     "%s=/path/to/libnvrtc.so" % NVRTC_ENV):
        assert expected in message, expected


# --- loading only when needed, and the identity memo -------------------------

@pytest.mark.toolkit
def test_import_and_construction_load_nothing_compile_loads(tmp_path):
    identity = probe_nvrtc(require_nvrtc())
    result = _run_child(_LOADED_NVRTC + '''
import json
from ptxbackend.compilers.base import CompilerIdentity
from ptxbackend.compilers.nvrtc import NvrtcCompiler
from ptxbackend.compiling.targets import parse_target
after_import = loaded_nvrtc()
compiler = NvrtcCompiler(CompilerIdentity.from_json(json.loads(%r)))
after_init = loaded_nvrtc()
compiler.compile('extern "C" __global__ void k() {}', (), parse_target("compute_61"))
print(json.dumps([after_import, after_init, loaded_nvrtc()]))
''' % json.dumps(identity.to_json()), tmp_path)
    after_import, after_init, after_compile = result
    assert after_import == []
    assert after_init == []
    assert identity.path in after_compile


@pytest.mark.toolkit
def test_identity_memo_is_written_once_and_spares_the_load(tmp_path):
    path = require_nvrtc()
    memo = tmp_path / "memo"
    first = nvrtc_compiler(path, memo_dir=str(memo))
    files = os.listdir(str(memo))
    assert len(files) == 1 and files[0].endswith(".json")
    written = (memo / files[0]).stat().st_mtime_ns
    second = nvrtc_compiler(path, memo_dir=str(memo))
    assert second.identity.to_json() == first.identity.to_json()
    assert first.identity.to_json() == probe_nvrtc(path).to_json()
    assert os.listdir(str(memo)) == files
    assert (memo / files[0]).stat().st_mtime_ns == written

    # A fresh process with the memo in place gets the identity without loading NVRTC.
    result = _run_child(_LOADED_NVRTC + '''
import json
from ptxbackend.compilers.nvrtc import nvrtc_compiler
compiler = nvrtc_compiler(%r, memo_dir=%r)
print(json.dumps([compiler.identity.to_json(), loaded_nvrtc()]))
''' % (path, str(memo)), tmp_path)
    identity, loaded = result
    assert identity == json.loads(json.dumps(first.identity.to_json()))
    assert loaded == []


def test_compile_leaves_the_threads_text_encoding_alone():
    import locale
    compiler = nvrtc_compiler(require_nvrtc())
    before = locale.getpreferredencoding(False)
    compiler.compile(SAXPY, (), parse_target("compute_75"))
    assert locale.getpreferredencoding(False) == before

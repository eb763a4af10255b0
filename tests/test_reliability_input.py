"""Bad input: each mistake raises the documented exception with an actionable message, caches
nothing, and leaves the next valid call working.  Garbage in every PTXBACKEND_* knob gives a
PtxBackendError (or is harmless), never a traceback of another type.

Real compilers only: the real nvcc 13, a real non-NVRTC shared library, a real text file.
Figures go to lines starting with ``reliability:`` (run with ``-s``).
"""

import ctypes.util
import os

import pytest

from conftest import cache_files, figures

import ptxbackend
from ptxbackend import config
from ptxbackend.compiling import engine
from ptxbackend.errors import CompileError, CompilerNotFoundError, ConfigError, PtxBackendError, TargetError

pytestmark = pytest.mark.reliability

GOOD = 'extern "C" __global__ void good(float* y) { y[threadIdx.x] *= 2.0f; } // %d\n'
BAD_SOURCE = 'extern "C" __global__ void bad(float* y) { y[0] = undeclared_thing + ; }\n'


def _not_nvrtc_library():
    name = ctypes.util.find_library("z") or "libz.so.1"
    for directory in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib/x86_64-linux-gnu",
                      "/usr/lib64", "/lib64", "/usr/lib"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


# (case, compile arguments, environment, expected type, words the message must contain)
CASES = [
    ("invalid CUDA source", dict(source=BAD_SOURCE, target="compute_75"), {}, CompileError,
     ["undeclared_thing", "--ptx", "exit status"]),
    ("source with non-UTF-8 bytes", dict(source=b"\xff\xfe\x00 not cuda", target="compute_75"), {},
     CompileError, ["exit status"]),
    ("unknown target string", dict(target="sm_banana"), {}, TargetError, ["sm_banana", "compute_XY"]),
    ("target newer than the device", dict(target="compute_90", device_cc="7.5"), {}, TargetError,
     ["cannot run on the device", "7.5", "auto"]),
    ("target the toolkit does not know", dict(target="compute_35"), {}, TargetError,
     ["cannot build compute_35", "it knows"]),
    ("device_cc garbage", dict(target="auto", device_cc="seven"), {}, TargetError,
     ["'seven'", "PTXBACKEND_DEVICE_CC"]),
    ("option the compiler rejects", dict(options=("--no-such-option",), target="compute_75"), {},
     CompileError, ["--no-such-option", "exit status"]),
    ("option with a NUL character", dict(options=("-DX=1\0-DY=2",), target="compute_75"), {},
     CompileError, ["NUL"]),
    ("macro that breaks the kernel", dict(options=("-Dfloat=struct",), target="compute_75"), {},
     CompileError, ["error"]),
    ("unknown compiler name", dict(compiler="clang", target="compute_75"), {}, CompilerNotFoundError,
     ["unknown compiler 'clang'", "nvcc, nvrtc"]),
    ("missing nvcc", dict(target="compute_75"), {"PTXBACKEND_NVCC": "/nonexistent/bin/nvcc"},
     CompilerNotFoundError, ["/nonexistent/bin/nvcc", "Fix the path"]),
    ("missing NVRTC library", dict(compiler="nvrtc", target="compute_75"),
     {"PTXBACKEND_NVRTC": "/tmp/not-a-lib.so"}, CompilerNotFoundError,
     ["/tmp/not-a-lib.so", "does not exist", "pip install nvidia-cuda-nvrtc"]),
    ("NVRTC path is a text file", dict(compiler="nvrtc", target="compute_75"),
     {"PTXBACKEND_NVRTC": "TEXTFILE"}, CompilerNotFoundError, ["cannot load NVRTC", "PTXBACKEND_NVRTC"]),
    ("NVRTC path is another library", dict(compiler="nvrtc", target="compute_75"),
     {"PTXBACKEND_NVRTC": "OTHERLIB"}, CompilerNotFoundError, ["is not an NVRTC library", "nvrtcVersion"]),
]


@pytest.mark.parametrize("case,args,env,expected,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_the_documented_error_caches_nothing_and_the_next_call_works(
        nvcc13, tmp_path, monkeypatch, case, args, env, expected, words):
    cache = tmp_path / "cache"
    ptxbackend.compile(GOOD % 0, target="compute_75")  # the store exists and holds one entry
    before = cache_files(cache)
    for name, value in env.items():
        if value == "TEXTFILE":
            value = str(tmp_path / "libnvrtc.so.12")
            with open(value, "w") as handle:
                handle.write("this is not a shared library\n")
        elif value == "OTHERLIB":
            value = _not_nvrtc_library()
            if value is None:
                pytest.skip("no libz to stand in for a library that is not NVRTC")
        monkeypatch.setenv(name, value)
    args = dict(args)
    source = args.pop("source", GOOD % 1)
    with pytest.raises(expected) as info:
        ptxbackend.compile(source, **args)
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert missing == [], message
    assert isinstance(info.value, PtxBackendError)
    assert cache_files(cache) == before  # nothing cached, no temporary file left
    for name in env:
        monkeypatch.delenv(name)
    nxt = ptxbackend.compile(GOOD % 2, target="compute_75")
    assert not nxt.cache_hit and nxt.kind == "ptx" and nxt.image.startswith(b"//")
    assert ptxbackend.compile(GOOD % 2, target="compute_75").cache_hit
    figures("bad input: %s" % case, raised=type(info.value).__name__, cached=0, next_call="ok")


def test_a_path_in_the_kernel_name_never_writes_outside_the_private_directory(nvcc13, tmp_path):
    victim = tmp_path / "victim.cu"
    victim.write_text("// the user's own file\n")
    names = [str(victim), "../../" + str(victim).lstrip("/"), "..", "", "sub/dir/k.cu"]
    for name in names:
        art = ptxbackend.compile(GOOD % (10 + len(name)) + "// " + name, target="compute_75", name=name)
        assert art.kind == "ptx"
    assert victim.read_text() == "// the user's own file\n"
    figures("kernel name with a path", names=len(names), files_written_outside=0)


KNOB_VALUES = ["garbage", "-1", "nan", "1e999", "9" * 400, "\u00e9\u2603", "0x10", "../..", "\x01\x7f",
               "sm_75; rm -rf /"]


def test_garbage_in_every_knob_gives_a_ptxbackend_error_or_is_harmless(nvcc13, tmp_path, monkeypatch):
    work = tmp_path / "work" / "dir"
    work.mkdir(parents=True)
    monkeypatch.chdir(str(work))  # relative garbage cache dirs land here
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    variables = sorted(env for env, _default, _parse in config.KNOBS.values()) + ["PTXBACKEND_CONFIG"]
    outcomes = {"PtxBackendError": 0, "ok": 0}
    other = []
    for variable in variables:
        for value in KNOB_VALUES:
            engine._reset_for_tests()
            monkeypatch.setenv(variable, value)
            if variable != "PTXBACKEND_DEVICE_CC":
                monkeypatch.setenv("PTXBACKEND_DEVICE_CC", "7.5")
            try:
                ptxbackend.compile(GOOD % 3, target=None)
                outcomes["ok"] += 1
            except PtxBackendError as exc:
                assert str(exc).strip()
                outcomes["PtxBackendError"] += 1
            except Exception as exc:  # the failure this test is about
                other.append((variable, value, type(exc).__name__, str(exc)[:200]))
            monkeypatch.delenv(variable)
    figures("garbage knobs through compile()", variables=len(variables), values=len(KNOB_VALUES),
            cases=len(variables) * len(KNOB_VALUES), other_exceptions=len(other), **outcomes)
    assert other == []


@pytest.mark.parametrize("content", [b"\xff\xfe\x00\x01binary", b"[ptxbackend]\ntarget = 50%\n",
                                     b"no section header\n", b"[ptxbackend]\nlock_timeout = -5\n",
                                     b"[ptxbackend]\ntarget = a\ntarget = b\n"],
                         ids=["binary", "stray percent", "no section", "negative timeout", "duplicate key"])
def test_broken_config_file_gives_a_ptxbackend_error_naming_the_file(tmp_path, monkeypatch, content):
    path = tmp_path / "config.ini"
    path.write_bytes(content)
    monkeypatch.setenv("PTXBACKEND_CONFIG", str(path))
    with pytest.raises(PtxBackendError) as info:
        ptxbackend.compile(GOOD % 4, target="compute_75")
    assert str(path) in str(info.value) or "lock_timeout" in str(info.value)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e999", "soon"])
def test_lock_timeout_must_be_a_finite_number_of_seconds(monkeypatch, value):
    """A negative time-out makes filelock wait forever: the bounded wait must stay bounded."""
    monkeypatch.setenv("PTXBACKEND_LOCK_TIMEOUT", value)
    with pytest.raises(PtxBackendError) as info:
        config.load_settings()
    assert "PTXBACKEND_LOCK_TIMEOUT" in str(info.value) and "seconds" in str(info.value)


def test_a_missing_config_file_named_on_purpose_is_an_error(tmp_path, monkeypatch):
    """PTXBACKEND_CONFIG pointing nowhere (a typo) must not silently mean "no settings"."""
    monkeypatch.setenv("PTXBACKEND_CONFIG", str(tmp_path / "typo.ini"))
    with pytest.raises(ConfigError) as info:
        config.load_settings()
    assert "typo.ini" in str(info.value) and "does not exist" in str(info.value)
    (tmp_path / "typo.ini").write_text("[ptxbackend]\ntarget = compute_75\n")
    os.chmod(str(tmp_path / "typo.ini"), 0o600)
    assert config.load_settings().target == "compute_75"


def test_the_default_config_file_may_be_absent(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "nothing-here"))
    assert config.load_settings().target == "auto"


@pytest.mark.parametrize("text,size", [("4G", 4 << 30), ("512MiB", 512 << 20), ("1.5g", 3 << 29), ("10kb", 10240),
                                       (" 7 ", 7), ("2 T", 2 << 40), ("0", 0)])
def test_one_size_parser_for_the_hook_and_the_package(text, size):
    import _ptxbackend_pth
    assert config.parse_size is _ptxbackend_pth.parse_size
    assert config.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "-1", "1.", ".5G", "1e9", "4X", "1GG", "\u0663", "9" * 400 + ".5"])
def test_sizes_that_are_not_sizes_are_refused(text):
    with pytest.raises(ValueError):
        config.parse_size(text)

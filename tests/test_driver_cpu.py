"""ptxbackend.gpu.driver on a machine without an NVIDIA driver (developer and CI boxes).

These tests use the real loader: nothing is mocked.  Where a libcuda *is*
present, the tests that need its absence skip themselves.
"""

import ctypes
import os
import subprocess
import sys

import pytest

from ptxbackend.gpu import driver, launch, libcuda
from ptxbackend.errors import DriverError, PtxBackendError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _libcuda_present():
    """Whether the driver's own search (PTXBACKEND_LIBCUDA aside) would find a library."""
    for candidate in (libcuda._LIBCUDA_NAME,) + libcuda._LIBCUDA_FALLBACKS:
        try:
            ctypes.CDLL(candidate)
            return True
        except OSError:
            continue
    return False


# PTXBACKEND_LIBCUDA is removed for every test (here and in conftest), so only
# the default search decides whether the driver is really absent.
needs_no_libcuda = pytest.mark.skipif(
    _libcuda_present(), reason="a CUDA driver library is present here; these tests check its absence")


@pytest.fixture(autouse=True)
def fresh_driver_state(monkeypatch):
    """Each test starts as a new process would: nothing loaded, the env var read again."""
    monkeypatch.delenv("PTXBACKEND_LIBCUDA", raising=False)
    driver._reset_for_tests()
    yield
    driver._reset_for_tests()


def test_import_does_not_load_libcuda():
    # A fresh interpreter: another test may already have loaded (or tried) it here.
    code = (
        "import ptxbackend.gpu.driver, ptxbackend.gpu.libcuda as d\n"
        "assert d._api is None and d._load_failure is None, 'library state touched at import'\n"
        "maps = open('/proc/self/maps').read() if __import__('os').path.exists('/proc/self/maps') else ''\n"
        "assert 'libcuda' not in maps, 'libcuda mapped by import'\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.check_output([sys.executable, "-c", code], cwd=REPO, env=env)
    assert out.strip() == b"ok"


def test_state_is_empty_until_first_call():
    assert libcuda._api is None
    assert libcuda._load_failure is None


@needs_no_libcuda
def test_available_is_false_without_raising():
    assert driver.available() is False
    assert driver.available() is False  # the cached outcome answers the second time too


@needs_no_libcuda
def test_library_path_is_none_without_raising():
    assert driver.library_path() is None


def _public_calls():
    """Every public entry point, called with plausible arguments."""
    return [
        ("driver_version", lambda: driver.driver_version()),
        ("driver_build", lambda: driver.driver_build()),
        ("device_count", lambda: driver.device_count()),
        ("device_name", lambda: driver.device_name(0)),
        ("compute_capability", lambda: driver.compute_capability(0)),
        ("current_device", lambda: driver.current_device()),
        ("ensure_context", lambda: driver.ensure_context()),
        ("ensure_context(1)", lambda: driver.ensure_context(1)),
        ("load_module(ptx)", lambda: driver.load_module(b".version 6.0\n", "ptx")),
        ("load_module(cubin)", lambda: driver.load_module(b"\x7fELF", "cubin")),
        ("link_ptx", lambda: driver.link_ptx(b".version 6.0\n")),
        ("synchronize", lambda: driver.synchronize()),
        ("DeviceBuffer", lambda: driver.DeviceBuffer(16)),
    ]


@needs_no_libcuda
@pytest.mark.parametrize("label,call", _public_calls(), ids=[c[0] for c in _public_calls()])
def test_every_public_function_reports_the_missing_driver(label, call):
    with pytest.raises(DriverError) as info:
        call()
    message = str(info.value)
    assert "libcuda.so.1 not found" in message or "nvcuda.dll not found" in message
    assert "no NVIDIA driver on this machine" in message
    assert "PTXBACKEND_LIBCUDA" in message  # says how to point at a driver elsewhere
    assert info.value.code is None and info.value.name is None
    assert isinstance(info.value, PtxBackendError)


@needs_no_libcuda
def test_missing_driver_is_remembered_and_reported_the_same_way_again():
    with pytest.raises(DriverError) as first:
        driver.driver_version()
    assert libcuda._load_failure is not None
    with pytest.raises(DriverError) as second:
        driver.device_count()
    assert str(first.value) == str(second.value)
    assert first.value is not second.value


def test_explicit_library_path_that_does_not_exist_is_named(monkeypatch, tmp_path):
    missing = str(tmp_path / "nowhere" / "libcuda.so.1")
    monkeypatch.setenv("PTXBACKEND_LIBCUDA", missing)
    with pytest.raises(DriverError) as info:
        driver.device_count()
    message = str(info.value)
    assert "PTXBACKEND_LIBCUDA=%s" % missing in message
    assert "could not be loaded" in message
    assert driver.available() is False
    assert driver.library_path() is None


def test_explicit_library_path_is_not_replaced_by_a_search(monkeypatch, tmp_path):
    # Even where a real libcuda exists, a wrong explicit path must fail loudly.
    missing = str(tmp_path / "libcuda.so.1")
    monkeypatch.setenv("PTXBACKEND_LIBCUDA", missing)
    assert driver.available() is False
    with pytest.raises(DriverError) as info:
        driver.driver_build()
    assert missing in str(info.value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs glibc's libc.so.6")
def test_explicit_library_that_is_not_a_cuda_driver(monkeypatch):
    monkeypatch.setenv("PTXBACKEND_LIBCUDA", "libc.so.6")
    with pytest.raises(DriverError) as info:
        driver.driver_version()
    message = str(info.value)
    assert "libc" in message and "is not a CUDA driver library" in message
    assert "PTXBACKEND_LIBCUDA" in message
    assert driver.available() is False


def test_reset_makes_the_env_var_count_again(monkeypatch, tmp_path):
    first = str(tmp_path / "first.so")
    second = str(tmp_path / "second.so")
    monkeypatch.setenv("PTXBACKEND_LIBCUDA", first)
    with pytest.raises(DriverError) as info:
        driver.driver_version()
    assert first in str(info.value)
    monkeypatch.setenv("PTXBACKEND_LIBCUDA", second)
    with pytest.raises(DriverError) as info:
        driver.driver_version()
    assert first in str(info.value)  # read once per process...
    driver._reset_for_tests()
    with pytest.raises(DriverError) as info:
        driver.driver_version()
    assert second in str(info.value)  # ...until the state is reset


def test_bad_image_kind_is_rejected_before_touching_the_driver():
    with pytest.raises(ValueError) as info:
        driver.load_module(b"", "elf")
    assert "ptx, cubin, fatbin" in str(info.value)
    assert libcuda._api is None and libcuda._load_failure is None


def test_launch_dimensions():
    assert launch._dims(256, "block") == (256, 1, 1)
    assert launch._dims((4, 2), "grid") == (4, 2, 1)
    assert launch._dims([1, 2, 3], "grid") == (1, 2, 3)
    for bad in (0, (1, 2, 3, 4), (), (1, 0), (1.5,), -1):
        with pytest.raises(ValueError):
            launch._dims(bad, "grid")


def test_ptx_isa_version_is_read_from_the_image():
    assert driver._ptx_isa(b"//\n// comment\n.version 7.2\n.target sm_86\n") == "7.2"
    assert driver._ptx_isa(b"\x7fELF") is None


def test_jit_failure_hints_name_the_remedy():
    old_driver = driver._jit_failure_detail(
        driver.CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "ptx", b".version 9.1\n", "")
    assert "older than the toolkit" in old_driver and "9.1" in old_driver
    assert "Update the NVIDIA driver" in old_driver
    # Drivers before CUDA 11.1 report a too-new PTX ISA as plain INVALID_PTX.
    legacy = driver._jit_failure_detail(
        driver.CUDA_ERROR_INVALID_PTX, "ptx", b".version 7.2\n",
        "ptxas fatal   : Unsupported .version 7.2; current version is '6.0'")
    assert "older than the toolkit" in legacy
    invalid = driver._jit_failure_detail(driver.CUDA_ERROR_INVALID_PTX, "ptx", b"x" * 10, "log")
    assert "did not JIT-compile" in invalid and "10 bytes" in invalid


def test_module_is_python36_compatible_syntax():
    # The package must import on the old interpreters production boxes run.
    import ast
    with open(driver.__file__) as handle:
        tree = ast.parse(handle.read())
    for node in ast.walk(tree):
        assert not isinstance(node, getattr(ast, "NamedExpr", ())), "walrus operator"
        assert not isinstance(node, ast.JoinedStr), "f-string (use %-formatting)"

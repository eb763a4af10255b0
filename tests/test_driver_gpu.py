"""ptxbackend.gpu.driver against a real GPU.  Every test skips when no CUDA device is usable.

The kernel is hand-written PTX (ISA 6.0, sm_50), so no compiler is needed and
any driver since CUDA 9 can JIT-compile it for the GPU at hand.
"""

import array
import ctypes
import os
import re
import shutil
import subprocess
import threading

import pytest

from ptxbackend.gpu import driver
from ptxbackend.errors import DriverError

pytestmark = pytest.mark.gpu

SAXPY_PTX = b"""\
//
// saxpy: y[i] = a * x[i] + y[i] for i < n.
//
.version 6.0
.target sm_50
.address_size 64

.visible .entry saxpy(
\t.param .u32 saxpy_param_n,
\t.param .f32 saxpy_param_a,
\t.param .u64 saxpy_param_x,
\t.param .u64 saxpy_param_y
)
{
\t.reg .pred \t%p<2>;
\t.reg .f32 \t%f<5>;
\t.reg .b32 \t%r<6>;
\t.reg .b64 \t%rd<8>;

\tld.param.u32 \t%r1, [saxpy_param_n];
\tld.param.f32 \t%f1, [saxpy_param_a];
\tld.param.u64 \t%rd1, [saxpy_param_x];
\tld.param.u64 \t%rd2, [saxpy_param_y];
\tmov.u32 \t%r2, %ctaid.x;
\tmov.u32 \t%r3, %ntid.x;
\tmov.u32 \t%r4, %tid.x;
\tmad.lo.s32 \t%r5, %r2, %r3, %r4;
\tsetp.ge.u32 \t%p1, %r5, %r1;
\t@%p1 bra \tDONE;
\tcvta.to.global.u64 \t%rd3, %rd1;
\tcvta.to.global.u64 \t%rd4, %rd2;
\tmul.wide.u32 \t%rd5, %r5, 4;
\tadd.s64 \t%rd6, %rd3, %rd5;
\tadd.s64 \t%rd7, %rd4, %rd5;
\tld.global.f32 \t%f2, [%rd6];
\tld.global.f32 \t%f3, [%rd7];
\tfma.rn.f32 \t%f4, %f1, %f2, %f3;
\tst.global.f32 \t[%rd7], %f4;
DONE:
\tret;
}
"""

BROKEN_PTX = SAXPY_PTX.replace(b"fma.rn.f32", b"this_is_not_an_instruction")

N = 1 << 20
A = 2.5
BLOCK = 256


@pytest.fixture(autouse=True)
def gpu():
    if not driver.available():
        pytest.skip("no usable CUDA device here (driver.available() is False)")


def _inputs():
    # Small integers and halves: a*x+y is exact in float32, so the GPU's fused
    # multiply-add and Python's double arithmetic must agree bit for bit.
    x = array.array("f", (float(i % 1024) for i in range(N)))
    y = array.array("f", (float(i % 7) - 3.0 for i in range(N)))
    expected = array.array("f", (A * xi + yi for xi, yi in zip(x, y)))
    return x, y, expected


def _run_saxpy(module):
    x, y, expected = _inputs()
    kernel = module.get_function("saxpy")
    with driver.DeviceBuffer(N * 4) as dx, driver.DeviceBuffer(N * 4) as dy:
        dx.copy_from_host(x)
        dy.copy_from_host(y)
        grid = (N + BLOCK - 1) // BLOCK
        kernel.launch(grid, BLOCK, [ctypes.c_uint(N), ctypes.c_float(A),
                                    ctypes.c_void_p(dx.ptr), ctypes.c_void_p(dy.ptr)])
        driver.synchronize()
        result = array.array("f")
        result.frombytes(bytes(dy.copy_to_host()))
    assert len(result) == N
    mismatches = [i for i in range(N) if result[i] != expected[i]]
    assert not mismatches, "first mismatch at %d: %r != %r" % (
        mismatches[0], result[mismatches[0]], expected[mismatches[0]])


def test_device_queries():
    assert driver.device_count() >= 1
    name = driver.device_name(0)
    assert isinstance(name, str) and name.strip() and "\x00" not in name
    cc = driver.compute_capability(0)
    assert isinstance(cc, int) and 30 <= cc <= 200
    assert driver.driver_version() >= 8000
    build = driver.driver_build()
    assert re.match(r"^(\d{3,}\.\d+(\.\d+)?|cuda-\d+)$", build), build
    assert driver.driver_build() == build
    path = driver.library_path()
    assert path and os.path.exists(path)
    driver.ensure_context()
    assert 0 <= driver.current_device() < driver.device_count()


def test_bad_device_ordinal_is_explained():
    with pytest.raises(DriverError) as info:
        driver.device_name(driver.device_count() + 5)
    assert "does not exist" in str(info.value)


def test_ptx_saxpy():
    module = driver.load_module(SAXPY_PTX, "ptx")
    assert module.kind == "ptx" and module.handle
    _run_saxpy(module)
    module.unload()


def test_linked_cubin_saxpy():
    cubin = driver.link_ptx(SAXPY_PTX, name="saxpy.ptx")
    assert cubin.startswith(b"\x7fELF")
    module = driver.load_module(cubin, "cubin")
    assert module.kind == "cubin"
    _run_saxpy(module)


def test_fatbin_from_nvcc():
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        pytest.skip("nvcc not found: cannot build a fatbin")
    cc = driver.compute_capability(driver.current_device())
    import tempfile
    workdir = tempfile.mkdtemp()
    source = os.path.join(workdir, "saxpy.ptx")
    target = os.path.join(workdir, "saxpy.fatbin")
    with open(source, "wb") as handle:
        handle.write(SAXPY_PTX)
    done = subprocess.run([nvcc, "-fatbin", "-arch=sm_%d" % cc, source, "-o", target],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        pytest.skip("nvcc cannot build for sm_%d: %s" % (cc, done.stdout.decode()[-300:]))
    with open(target, "rb") as handle:
        module = driver.load_module(handle.read(), "fatbin")
    _run_saxpy(module)


def test_broken_ptx_reports_the_jit_log():
    with pytest.raises(DriverError) as info:
        driver.load_module(BROKEN_PTX, "ptx")
    assert info.value.name == "CUDA_ERROR_INVALID_PTX"
    assert info.value.code == 218
    assert info.value.log.strip()
    assert "did not JIT-compile" in str(info.value)
    assert info.value.log.strip() in str(info.value)


def test_broken_ptx_in_link_reports_the_jit_log():
    with pytest.raises(DriverError) as info:
        driver.link_ptx(BROKEN_PTX, name="broken.ptx")
    assert info.value.name == "CUDA_ERROR_INVALID_PTX"
    assert info.value.log.strip()


def test_missing_kernel_name():
    module = driver.load_module(SAXPY_PTX, "ptx")
    with pytest.raises(DriverError) as info:
        module.get_function("no_such_kernel")
    assert info.value.name == "CUDA_ERROR_NOT_FOUND"
    assert "no_such_kernel" in str(info.value)
    assert 'extern "C"' in str(info.value)


def test_unload_is_idempotent_and_final():
    module = driver.load_module(SAXPY_PTX, "ptx")
    module.unload()
    module.unload()
    assert module.handle == 0
    with pytest.raises(DriverError):
        module.get_function("saxpy")


def test_device_buffer_round_trip_and_free():
    payload = bytes(bytearray(range(256))) * 16
    with driver.DeviceBuffer(len(payload)) as buf:
        assert buf.ptr and buf.nbytes == len(payload)
        buf.copy_from_host(payload)
        assert bytes(buf.copy_to_host()) == payload
        buf.copy_from_host(bytearray(b"\xff" * 8))
        assert bytes(buf.copy_to_host()[:16]) == b"\xff" * 8 + payload[8:16]
        with pytest.raises(ValueError):
            buf.copy_from_host(b"\0" * (len(payload) + 1))
    assert buf.ptr == 0
    buf.free()


def test_new_thread_without_a_context_can_load_and_run():
    errors = []

    def worker():
        try:
            _run_saxpy(driver.load_module(SAXPY_PTX, "ptx"))
        except BaseException as exc:  # reported to the main thread below
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert not errors, errors


def test_kernel_launched_on_a_module_from_another_thread():
    module = driver.load_module(SAXPY_PTX, "ptx")
    errors = []

    def worker():
        try:
            _run_saxpy(module)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert not errors, errors


def test_cupy_context_is_used_not_replaced():
    cupy = pytest.importorskip("cupy")
    numpy = pytest.importorskip("numpy")
    cupy.cuda.Device(0).use()
    x_host, y_host, expected = _inputs()
    x = cupy.asarray(numpy.frombuffer(x_host, dtype=numpy.float32))
    y = cupy.asarray(numpy.frombuffer(y_host, dtype=numpy.float32))
    api = driver._driver()
    before = driver._current_context(api)
    assert before, "CuPy made no context current"
    driver.ensure_context()
    assert driver._current_context(api) == before
    kernel = driver.load_module(SAXPY_PTX, "ptx").get_function("saxpy")
    kernel.launch((N + BLOCK - 1) // BLOCK, BLOCK,
                  [ctypes.c_uint(N), ctypes.c_float(A),
                   ctypes.c_void_p(x.data.ptr), ctypes.c_void_p(y.data.ptr)])
    cupy.cuda.Device(0).synchronize()
    assert driver._current_context(api) == before
    result = array.array("f")
    result.frombytes(y.get().tobytes())
    assert result == expected

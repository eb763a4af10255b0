"""End to end on a real GPU: compile with old toolkits, load through the driver, check results.

Run on the H200: these are skipped on machines without an NVIDIA driver and GPU.
"""

import array
import ctypes
import json
import os
import random

import pytest

import ptxbackend
from ptxbackend.gpu import driver
from ptxbackend.cache import entry, layout
from ptxbackend.errors import DriverError
from conftest import SAXPY, run_python

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif("not __import__('conftest').gpu_available()",
                                 reason="needs an NVIDIA GPU and driver")]


def run_saxpy(module, n=1 << 20):
    rng = random.Random(1)
    xs = array.array("f", (rng.uniform(-1, 1) for _ in range(n)))
    ys = array.array("f", (rng.uniform(-1, 1) for _ in range(n)))
    with driver.DeviceBuffer(n * 4) as x_dev, driver.DeviceBuffer(n * 4) as y_dev:
        x_dev.copy_from_host(xs)
        y_dev.copy_from_host(ys)
        module.get_function("saxpy").launch(
            ((n + 255) // 256,), (256,),
            [ctypes.c_float(3.0), ctypes.c_void_p(x_dev.ptr), ctypes.c_void_p(y_dev.ptr), ctypes.c_int(n)])
        driver.synchronize()
        out = array.array("f")
        out.frombytes(bytes(y_dev.copy_to_host()))
    expected = array.array("f", (3.0 * x + y for x, y in zip(xs, ys)))
    return max(abs(a - b) for a, b in zip(out, expected))


def test_native_cubin_from_current_nvcc_runs(nvcc13):
    art = ptxbackend.compile(SAXPY, target="native")
    assert art.kind == "cubin"
    assert run_saxpy(ptxbackend.load(art)) < 1e-5


@pytest.mark.toolkit
def test_nvcc112_ptx_runs_on_a_gpu_it_does_not_know(nvcc112, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_NVCC", nvcc112)
    art = ptxbackend.compile(SAXPY)
    cc = driver.compute_capability(driver.current_device())
    if cc > 86:
        assert (art.kind, str(art.target)) == ("ptx", "compute_86")
    assert run_saxpy(ptxbackend.load(art)) < 1e-5


@pytest.mark.toolkit
def test_nvrtc117_ptx_runs(nvrtc117, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_NVRTC", nvrtc117)
    art = ptxbackend.compile(SAXPY, compiler="nvrtc")
    if driver.compute_capability(driver.current_device()) > 87:
        assert str(art.target) == "compute_87"
    assert run_saxpy(ptxbackend.load(art)) < 1e-5
    for old in ("compute_61", "compute_75"):
        assert run_saxpy(ptxbackend.load(ptxbackend.compile(SAXPY, compiler="nvrtc", target=old))) < 1e-5


def _plant(path, payload, meta, deps=b""):
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(entry.encode(payload, meta, deps))


@pytest.mark.reliability
def test_ptx_that_fails_to_jit_reports_the_driver_log(nvcc13, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_CUBIN_CACHE", "0")
    art = ptxbackend.compile(SAXPY, target="compute_75")
    broken = art.image.replace(b"ret;", b"ret_not_an_instruction;")
    _plant(art.path, broken, {"key": art.key, "kind": "ptx"}, art.deps)
    cached = ptxbackend.compile(SAXPY, target="compute_75")
    assert cached.cache_hit and cached.image == broken
    with pytest.raises(DriverError) as info:
        ptxbackend.load(cached)
    assert info.value.name == "CUDA_ERROR_INVALID_PTX"
    assert "ret_not_an_instruction" in info.value.log or "error" in info.value.log.lower()


@pytest.mark.reliability
def test_wrong_arch_cubin_planted_at_jit_level_is_rebuilt(nvcc13):
    art = ptxbackend.compile(SAXPY, target="compute_75")
    ptxbackend.load(art)  # creates the JIT level entry
    cc = driver.compute_capability(driver.current_device())
    jit_path = art.store.path_of(layout.jit_name(art.producer, art.target, art.key, cc, driver.driver_build()))
    assert os.path.exists(jit_path)
    other = "sm_80" if cc >= 90 else "sm_90"
    wrong = ptxbackend.compile(SAXPY, target=other, device_cc=other[3] + "." + other[4])
    # With the PTX entry's own dependency section: only the driver's rejection can catch it.
    _plant(jit_path, wrong.image, {"key": art.key, "kind": "cubin"}, art.deps)
    module = ptxbackend.load(art)
    assert run_saxpy(module) < 1e-5
    assert entry.decode(open(jit_path, "rb").read())[0] != wrong.image


@pytest.mark.toolkit
def test_second_process_loads_cached_cubin_without_jit(nvcc112):
    code = r'''
import json, os, time, ptxbackend
from ptxbackend.gpu import driver
from ptxbackend.cache import layout
art = ptxbackend.compile(%r)
cc = driver.compute_capability(driver.current_device())
jit = art.store.path_of(layout.jit_name(art.producer, art.target, art.key, cc, driver.driver_build()))
had = os.path.exists(jit)
driver.ensure_context()  # time the load alone, not the context creation
t = time.perf_counter(); ptxbackend.load(art); load_ms = (time.perf_counter() - t) * 1e3
print(json.dumps({"jit_entry_before": had, "load_ms": load_ms, "target": str(art.target)}))
''' % SAXPY
    env = {"PTXBACKEND_NVCC": nvcc112, "CUDA_CACHE_DISABLE": "1"}
    first = json.loads(run_python(code, env).strip().splitlines()[-1])
    second = json.loads(run_python(code, env).strip().splitlines()[-1])
    print("first process (JIT): %.2f ms, second process (cached cubin): %.2f ms, target %s"
          % (first["load_ms"], second["load_ms"], first["target"]))
    assert not first["jit_entry_before"] and second["jit_entry_before"]


def test_demo_runs_and_checks_against_cpu(nvcc13):
    from ptxbackend.cli import demo
    lines = []
    assert demo.run(out=lines.append) == 0
    assert any("OK" in line for line in lines)
    if any(line.startswith("image:    cubin") for line in lines):  # native first, then the PTX route, run too
        assert any("The PTX route" in line for line in lines) and sum("-> OK" in line for line in lines) == 2, lines

"""`ptxbackend demo`: the whole path on the bundled saxpy kernel, checked against the CPU."""

import array
import ctypes
import os
import random

from ..gpu import driver
from ..compiling.engine import compile as compile_kernel
from ..compiling.engine import load
from ..compiling.targets import format_cc
from ..errors import PtxBackendError

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "saxpy.cu")


def example_source():
    with open(EXAMPLE) as handle:
        return handle.read()


def run(device_cc=None, compiler=None, target=None, n=1 << 20, out=print):
    """Compile (and on a GPU, run) the example, by the route ``target`` picks and, when that is native
    SASS, by the PTX route too (PTX the driver JIT-compiles: what ptxbackend exists for, the route a GPU
    newer than the toolkit takes).  Returns 0 on success, 1 on a wrong result."""
    on_gpu = driver.available() and device_cc is None
    if not on_gpu and device_cc is None:
        device_cc = "7.5"
        out("No CUDA GPU here; building for a device of compute capability %s (--device-cc)." % device_cc)
    artifact = compile_kernel(example_source(), target=target, compiler=compiler, device_cc=device_cc)
    status = _show(artifact, on_gpu, n, out)
    if artifact.kind != "ptx" and target in (None, "auto") and artifact.device_cc:
        cc = artifact.device_cc
        out("")
        out("The PTX route (a GPU newer than the toolkit takes it): PTX for compute_%d, JIT-compiled by the "
            "driver at load." % cc)
        try:
            ptx = compile_kernel(example_source(), target="compute_%d" % cc, compiler=compiler,
                                 device_cc=None if on_gpu else device_cc)
        except PtxBackendError as exc:
            out("  not shown: %s" % str(exc).splitlines()[0])
        else:
            status = max(status, _show(ptx, on_gpu, n, out))
    return status


def _show(artifact, on_gpu, n, out):
    out("target:   %s (%s)" % (artifact.target, artifact.reason))
    out("image:    %s, %d bytes, by %s" % (artifact.kind, len(artifact.image), artifact.producer))
    out("cache:    %s (%s)" % (artifact.path, "hit" if artifact.cache_hit else "miss: compiled now"))
    if not on_gpu:
        cc = format_cc(artifact.device_cc) if artifact.device_cc else "?"
        part = artifact.target.part_for(artifact.device_cc) if artifact.device_cc else None
        how = ("the driver JIT-compiles %s at load" % part) if part and part.startswith("compute")\
            else "it runs %s natively" % part
        out("On a GPU of compute capability %s, %s. Run `ptxbackend demo` there to execute it." % (cc, how))
        return 0
    ordinal = driver.current_device()
    out("device:   %s (compute capability %s)" % (driver.device_name(ordinal),
                                                  format_cc(driver.compute_capability(ordinal))))
    module = load(artifact)
    saxpy = module.get_function("saxpy")
    rng = random.Random(0)
    a = 2.5
    xs = array.array("f", (rng.uniform(-1, 1) for _ in range(n)))
    ys = array.array("f", (rng.uniform(-1, 1) for _ in range(n)))
    x_dev = driver.DeviceBuffer(n * 4)
    y_dev = driver.DeviceBuffer(n * 4)
    try:
        x_dev.copy_from_host(xs)
        y_dev.copy_from_host(ys)
        saxpy.launch(((n + 255) // 256,), (256,),
                     [ctypes.c_float(a), ctypes.c_void_p(x_dev.ptr), ctypes.c_void_p(y_dev.ptr), ctypes.c_int(n)])
        driver.synchronize()
        result = array.array("f")
        result.frombytes(bytes(y_dev.copy_to_host()))
    finally:
        x_dev.free()
        y_dev.free()
    expected = array.array("f", (a * x + y for x, y in zip(xs, ys)))
    worst = max(abs(r - e) for r, e in zip(result, expected))
    ok = worst <= 1e-5
    out("result:   %d elements, max |GPU - CPU| = %.2e -> %s" % (n, worst, "OK" if ok else "WRONG"))
    return 0 if ok else 1

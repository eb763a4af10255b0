"""Pre-JIT CUDA libraries that carry no machine code for this GPU.

An old cuDNN, cuBLAS or cuRAND on a newer GPU only has PTX, which the driver
JIT-compiles when the library first initialises: tens of seconds, in every
process whose driver JIT cache misses.  ``ptxbackend warm --libs`` initialises
each library once in a child process with eager module loading (so *every*
kernel is JIT-compiled, not only the first one used) and the JIT cache sized,
then starts a second child to check that the result stuck.

Run as ``python -m ptxbackend.deploy.library_warmup KIND PATH`` it is that child: it prints
one JSON line with its timings.
"""

import ctypes
import hashlib
import json
import os
import subprocess
import sys
import time

from ..gpu.libraries import find_cuda_library
from .children import python_module

JIT_CACHE_MAX = str(4 << 30)
_PREFIX = {"curand": "libcurand.so", "cublas": "libcublas.so", "cudnn": "libcudnn.so"}


def library_kind(path):
    base = os.path.basename(path).lower()
    for kind, prefix in _PREFIX.items():
        if base.startswith(prefix) or base.startswith("lib" + kind):
            return kind
    return None


def find_library(name_or_path):
    """A library path from a path or a short name (cudnn, cublas, curand).

    A short name is looked for where :func:`ptxbackend.gpu.libraries.find_cuda_library`
    looks (the CUDA toolkit, the nvidia-* wheels, LD_LIBRARY_PATH, the loader cache), never in the
    working directory: a file named ``cudnn`` there is not a library anyone chose (``./cudnn`` is).
    """
    if os.path.sep in name_or_path or (os.path.altsep and os.path.altsep in name_or_path):
        if not os.path.isfile(name_or_path):
            raise OSError("library %s does not exist" % name_or_path)
        return os.path.abspath(name_or_path)
    stem = name_or_path.lower() if name_or_path.lower() in _PREFIX else name_or_path
    path, looked = find_cuda_library(stem)
    if path:
        return path
    raise OSError(not_found_message(stem, looked))


# What provides each library to a user who has none: NVIDIA's pip wheels, or (cuDNN) a CuPy wheel that
# bundles it in cupy/.data/lib, as cupy-cuda80 7.8.0 does with cuDNN 7.
_INSTALL = {"cudnn": "pip install nvidia-cudnn-cu12 or a CuPy wheel that bundles it (cupy-cuda80==7.8.0 does)",
            "cublas": "pip install nvidia-cublas-cu12", "curand": "pip install nvidia-curand-cu12"}


def not_found_message(stem, looked):
    """One line: that ``lib<stem>.so*`` is absent, what to install or set, and where it was looked for."""
    return ("no lib%s.so* found: %s, put the directory holding it on LD_LIBRARY_PATH, or name the file "
            "(--libs /path/to/lib%s.so.N). Looked in: %s"
            % (stem, _INSTALL.get(stem, "install the CUDA toolkit or NVIDIA's wheel of it"), stem, "; ".join(looked)))


def _check(status, call):
    if status != 0:
        raise RuntimeError("%s returned status %d" % (call, status))


# Creating a handle initialises the library's runtime, which loads (and so JIT-compiles) its modules.
_HANDLE_CALLS = {"cublas": ("cublasCreate_v2", "cublasDestroy_v2"), "cudnn": ("cudnnCreate", "cudnnDestroy")}


def _initialise(kind, lib):
    """Make the library run its kernels' module load (and so the JIT); return the first call's seconds."""
    from ..gpu import driver
    handle = ctypes.c_void_p()
    if kind == "curand":
        n = 1 << 20
        with driver.DeviceBuffer(n * 4) as out:
            # From creating the generator on: cuRAND loads its modules (the JIT) in the create
            # call, not in the first generate, and a user waits for both.
            started = time.perf_counter()
            _check(lib.curandCreateGenerator(ctypes.byref(handle), 100), "curandCreateGenerator")
            _check(lib.curandGenerateNormal(handle, ctypes.c_void_p(out.ptr), ctypes.c_size_t(n),
                                            ctypes.c_float(0.0), ctypes.c_float(1.0)), "curandGenerateNormal")
            driver.synchronize()
            elapsed = time.perf_counter() - started
            _initialise.digest = hashlib.sha256(bytes(out.copy_to_host())).hexdigest()  # the same numbers?
        lib.curandDestroyGenerator(handle)
        return elapsed
    if kind in _HANDLE_CALLS:
        create, destroy = _HANDLE_CALLS[kind]
        started = time.perf_counter()
        _check(getattr(lib, create)(ctypes.byref(handle)), create)
        elapsed = time.perf_counter() - started
        getattr(lib, destroy)(handle)
        return elapsed
    return 0.0


def child(kind, path):
    from ..gpu import driver
    started = time.perf_counter()
    driver.ensure_context()
    lib = ctypes.CDLL(path)
    first_call = _initialise(kind, lib)
    return {"kind": kind, "path": path, "first_call_s": first_call, "total_s": time.perf_counter() - started,
            "output_sha256": getattr(_initialise, "digest", None),
            "jit_cache": os.environ.get("CUDA_CACHE_PATH")}


def _jit_cache_dir():
    return os.environ.get("CUDA_CACHE_PATH") or os.path.join(os.path.expanduser("~"), ".nv", "ComputeCache")


def tree_size(path):
    """Bytes in the files below ``path`` (the driver JIT cache's size)."""
    total = 0
    for base, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                pass
    return total


def _run_child(kind, path, env):
    proc = subprocess.run(python_module("ptxbackend.deploy.library_warmup", kind or "", path), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if proc.returncode != 0:
        # The child's last line is its one-line reason (see __main__ below), never a traceback.
        lines = proc.stderr.strip().splitlines() or ["exit status %d" % proc.returncode]
        raise RuntimeError("initialising %s failed: %s" % (path, lines[-1][:500]))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cudnn_selftest(path, env):
    """Every convolution algorithm checked on this GPU (:mod:`.cudnn_selftest`, in a child), the verdicts
    filed in the cache's meta directory for the hook's steering; the result, with ``verdict_file``."""
    from ..config import load_settings
    from ..cache.stores import open_store
    from ..gpu import cudnn_algos
    from . import cudnn_selftest as selftest
    library = cudnn_algos.library_identity(path)  # before the run: a file replaced meanwhile is not matched
    env = dict(env)
    env["PTXBACKEND_CUDNN_STEERING"] = "0"  # the child tests cuDNN itself

    def child(direction, algos=None):
        proc = subprocess.run([sys.executable, "-m", "ptxbackend.deploy.cudnn_selftest", path, direction,
                               ",".join(str(a) for a in algos) if algos else ""], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or ["exit status %d" % proc.returncode]
            return None, lines[-1][:300]
        return json.loads(proc.stdout.strip().splitlines()[-1]), None

    # A process per direction; where one does not come back (an algorithm that crashes the process, or
    # breaks the CUDA context for the rest), a process per algorithm, and an algorithm whose own process
    # fails is "failed" in every type: never steered to.
    parts, first_error = [], None
    for direction in cudnn_algos.DIRECTIONS:
        result, error = child(direction)
        if result is not None:
            parts.append(result)
            continue
        first_error = first_error or error
        for algo in range(selftest.ALGO_COUNT[direction]):
            result, error = child(direction, [algo])
            if result is None:
                result = {"verdicts": {direction: selftest.died(direction, algo, error)}, "heuristic": [],
                          "seconds": 0.0}
            parts.append(result)
    complete = [p for p in parts if "device" in p]
    if not complete:
        raise RuntimeError("the cuDNN algorithm self-test on %s failed: %s" % (path, first_error))
    result = selftest.merge(complete[:1] + [p for p in parts if p is not complete[0]])
    result["verdict_file"] = cudnn_algos.save(open_store(load_settings()).meta_dir,
                                              selftest.entry_from(result, library))
    return result


def default_jobs():
    return os.cpu_count() or 1


def warm_library(name_or_path, jit_dir=None, jobs=1, say=None):
    """Initialise a library twice in fresh processes; return the timings and the JIT cache growth.

    ``jit_dir``: the driver JIT cache to warm (``CUDA_CACHE_PATH``), instead of the one in effect.
    ``jobs`` > 1: first JIT the library's fatbin images in that many processes
    (:mod:`ptxbackend.deploy.parallel_jit`), so the first child below only checks that the
    cache holds what the library looks up; 1: that child does the whole JIT.  ``say``: gets a line as
    the workers start (a long warm-up cut short still shows how far it came).
    """
    path = find_library(name_or_path)
    kind = library_kind(path)
    env = dict(os.environ)
    if jit_dir:
        env["CUDA_CACHE_PATH"] = jit_dir
    env.setdefault("CUDA_CACHE_MAXSIZE", JIT_CACHE_MAX)
    env.pop("CUDA_CACHE_DISABLE", None)
    env["CUDA_MODULE_LOADING"] = "EAGER"  # JIT every kernel now, not only those the first call touches
    cache_dir = env.get("CUDA_CACHE_PATH") or _jit_cache_dir()
    before = checked_from = tree_size(cache_dir)
    parallel = None
    if jobs > 1:
        from ..gpu import driver
        from . import parallel_jit
        from ..errors import DriverError
        from ..gpu.fatbin import read_images
        images = read_images(path)  # a malformed library is named before any CUDA call
        try:
            cc = driver.compute_capability(driver.current_device())
        except DriverError as exc:
            raise RuntimeError("JIT-compiling %s needs the GPU: %s" % (path, exc))
        parallel = parallel_jit.warm(path, images, env, jobs, cc, say)
        checked_from = tree_size(cache_dir)
        parallel["jit_cache_growth_bytes"] = max(checked_from - before, 0)
    first = _run_child(kind, path, env)
    after = tree_size(cache_dir)
    env.pop("CUDA_MODULE_LOADING")
    second = _run_child(kind, path, env)
    selftest = cudnn_selftest(path, env) if kind == "cudnn" else None
    return {"library": path, "kind": kind, "first": first, "second": second, "selftest": selftest,
            "jit_cache_growth_bytes": max(after - before, 0), "jit_cache_dir": cache_dir,
            "cuda_cache_maxsize": env["CUDA_CACHE_MAXSIZE"], "parallel": parallel,
            "first_growth_bytes": max(after - checked_from, 0)}


if __name__ == "__main__":
    try:
        print(json.dumps(child(sys.argv[1] or None, sys.argv[2])))
    except Exception as exc:  # the parent shows one line: what failed, not where in this file
        sys.stderr.write("%s\n" % (" ".join(str(exc).split()) or type(exc).__name__))
        sys.exit(1)

"""What ptxbackend asks of the CUDA driver: device and driver queries, loading and linking images.

The queries (is a GPU usable, which device is current, its compute capability,
the driver's version and exact build) feed target choice and cache keys.
:func:`load_module` and :func:`link_ptx` hand compiled images to the driver's
JIT and, when it refuses one, raise a DriverError carrying its log and saying
why in words.

The ctypes binding underneath (finding libcuda, the entry points, cuInit, the
context every call runs in, CUresult -> DriverError) is
:mod:`ptxbackend.gpu.libcuda`; launching kernels and device memory are
:mod:`ptxbackend.gpu.launch`.  The names of both that callers reach as
``driver.X`` (``ensure_context``, ``Module``, ``Function``, ``DeviceBuffer``)
are importable from here, so ``driver`` stays the one module callers import.

Importing this module does not load libcuda.
"""

import os

from . import libcuda
from ..errors import DriverError
from .launch import DeviceBuffer, Function, Module
from .libcuda import (CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_PTX, CUDA_ERROR_JIT_COMPILATION_DISABLED,
                      CUDA_ERROR_JIT_COMPILER_NOT_FOUND, CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_NO_DEVICE,
                      CUDA_ERROR_UNSUPPORTED_PTX_VERSION, CUDA_SUCCESS, _check, _current_context, _device, _driver,
                      _fail, _init_failure_code, _library, ensure_context)

# ctypes is imported inside the functions that use it: importing it costs about
# 1.5 ms, which the many processes that import this module and never call the
# driver should not pay.

__all__ = [
    "available", "driver_version", "driver_build", "library_path", "device_count",
    "device_name", "compute_capability", "current_device", "ensure_context",
    "context_device", "load_module", "jit_image", "link_ptx", "synchronize", "Module", "Function", "DeviceBuffer",
]

# CUjit_option values (cuda.h, enum CUjit_option_enum).
_CU_JIT_INFO_LOG_BUFFER = 3
_CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4
_CU_JIT_ERROR_LOG_BUFFER = 5
_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
_CU_JIT_INPUT_PTX = 1  # CUjitInputType

_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76

_JIT_LOG_BYTES = 64 * 1024
_IMAGE_KINDS = ("ptx", "cubin", "fatbin")

_build = None  # driver_build() result


# --------------------------------------------------------------------------- queries

def available():
    """Whether CUDA can be used here: libcuda loads, cuInit succeeds, and a device is visible.

    Never raises; the other functions raise DriverError saying what is missing.
    """
    try:
        return device_count() > 0
    except DriverError:
        return False


def library_path():
    """The file libcuda was loaded from (symlinks resolved), or None when it cannot be loaded.

    Loads the library if that has not been tried yet; never raises.
    """
    try:
        return _library().path
    except DriverError:
        return None


def driver_version():
    """The CUDA version the driver supports, as cuDriverGetVersion gives it (e.g. 13000 for 13.0)."""
    import ctypes
    api = _library()  # no cuInit needed: works even when no device is visible
    version = ctypes.c_int()
    _check(api, api.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    return version.value


def driver_build():
    """The exact driver build, e.g. ``'580.159.03'``, for cache keys of driver-compiled code.

    Taken from the loaded kernel module (/proc/driver/nvidia/version), else from
    libcuda's file name (libcuda.so.580.159.03), else ``'cuda-<driver_version()>'``.
    """
    global _build
    api = _library()
    if _build is not None:
        return _build
    import re
    build = None
    try:
        with open("/proc/driver/nvidia/version") as handle:
            text = handle.read(4096)
        match = re.search(r"NVRM version:[^\n]*?\b(\d+\.\d+(?:\.\d+)?)\b", text)
        if match:
            build = match.group(1)
    except (IOError, OSError):
        pass  # not Linux, or a container without /proc/driver: try the library name
    if build is None:
        match = re.match(r"^libcuda\.so\.(\d{3,}\.\d+(?:\.\d+)?)$", os.path.basename(api.path))
        if match:
            build = match.group(1)
    if build is None:
        build = "cuda-%d" % driver_version()
    _build = build
    return build


def device_count():
    """How many CUDA devices this process sees (0 when the driver finds none).

    Raises DriverError when libcuda is missing or broken; :func:`available` is the
    probe that never raises.
    """
    import ctypes
    api = _library()
    if _init_failure_code() == CUDA_ERROR_NO_DEVICE:
        return 0
    api = _driver()
    count = ctypes.c_int()
    _check(api, api.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    return count.value


def device_name(ordinal=0):
    """The device's marketing name, e.g. ``'NVIDIA H200'``."""
    import ctypes
    api = _driver()
    device = _device(api, ordinal)
    buf = ctypes.create_string_buffer(256)
    _check(api, api.cuDeviceGetName(buf, len(buf), device), "cuDeviceGetName")
    return buf.value.decode("utf-8", "replace")


def compute_capability(ordinal=0):
    """The device's compute capability as ``major * 10 + minor`` (90 for 9.0, 86 for 8.6)."""
    import ctypes
    api = _driver()
    device = _device(api, ordinal)
    major = ctypes.c_int()
    minor = ctypes.c_int()
    _check(api, api.cuDeviceGetAttribute(
        ctypes.byref(major), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
        "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)")
    _check(api, api.cuDeviceGetAttribute(
        ctypes.byref(minor), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
        "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)")
    return major.value * 10 + minor.value


def current_device():
    """The ordinal of the device of this thread's current context, or 0 when none is current."""
    found = context_device()
    return 0 if found is None else found


def context_device():
    """The ordinal of the device of this thread's current context, or ``None`` when none is current."""
    import ctypes
    api = _driver()
    if not _current_context(api):
        return None
    device = ctypes.c_int()
    _check(api, api.cuCtxGetDevice(ctypes.byref(device)), "cuCtxGetDevice")
    return device.value


# --------------------------------------------------------------------------- contexts
# ensure_context is libcuda's, because launch needs it too and cannot import this
# module (this module re-exports launch's classes); it is re-exported above.

def synchronize():
    """Wait until all work queued in the current context (made current if need be) has finished."""
    api = _driver()
    ensure_context()
    _check(api, api.cuCtxSynchronize(), "cuCtxSynchronize")


# --------------------------------------------------------------------------- images

def _jit_log_options():
    """Option arrays for error and info logs, and the buffers that must outlive the call."""
    import ctypes
    error_log = ctypes.create_string_buffer(_JIT_LOG_BYTES)
    info_log = ctypes.create_string_buffer(_JIT_LOG_BYTES)
    options = (ctypes.c_int * 4)(
        _CU_JIT_ERROR_LOG_BUFFER, _CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        _CU_JIT_INFO_LOG_BUFFER, _CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES)
    # Each value travels in a void* slot; the sizes are integers cast to pointers,
    # and the driver writes the number of log bytes used back into those slots.
    values = (ctypes.c_void_p * 4)(
        ctypes.addressof(error_log), _JIT_LOG_BYTES,
        ctypes.addressof(info_log), _JIT_LOG_BYTES)
    return options, values, error_log, info_log


def _log_text(buf):
    return buf.value.decode("utf-8", "replace")


def _ptx_isa(image):
    """The ``.version`` of a PTX image, e.g. ``'7.2'``, or None."""
    import re
    match = re.search(br"^\s*\.version\s+(\d+\.\d+)", image[:8192], re.MULTILINE)
    return match.group(1).decode("ascii") if match else None


def _describe_driver():
    try:
        version = driver_version()
        return "CUDA %d.%d driver %s" % (version // 1000, version % 1000 // 10, driver_build())
    except DriverError:
        return "the installed driver"


def _jit_failure_detail(code, kind, image, log):
    """What a failed load or link of ``image`` means and what to do about it."""
    what = "a %s image of %d bytes" % (kind, len(image))
    isa = _ptx_isa(image) if kind == "ptx" else None
    too_new = code == CUDA_ERROR_UNSUPPORTED_PTX_VERSION or (
        code == CUDA_ERROR_INVALID_PTX and "Unsupported .version" in log)
    if too_new:
        return ("%s: the driver (%s) is older than the toolkit that produced the PTX "
                "(PTX ISA %s). Update the NVIDIA driver, or compile with an older toolkit "
                "(PTXBACKEND_NVCC / PTXBACKEND_NVRTC)"
                % (what, _describe_driver(), isa or "version unknown"))
    if code == CUDA_ERROR_INVALID_PTX:
        return "%s: the PTX did not JIT-compile; the driver's log follows" % what
    if code == CUDA_ERROR_NO_BINARY_FOR_GPU:
        try:
            cc = compute_capability(current_device())
            device = "compute capability %d.%d" % (cc // 10, cc % 10)
        except DriverError:
            device = "compute capability unknown"
        return ("%s has no code for this GPU (%s): no SASS for it and no PTX the driver "
                "could JIT-compile. Rebuild it with target 'auto', or add a compute_XY part "
                "no newer than the device" % (what, device))
    if code == CUDA_ERROR_INVALID_IMAGE:
        return ("%s is not a valid %s (starts with %r): a truncated or corrupt cache entry, "
                "or the wrong kind; delete the entry and rebuild" % (what, kind, image[:8]))
    if code == CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
        return ("%s needs the driver's PTX JIT compiler (libnvidia-ptxjitcompiler), which "
                "is not installed: install the full NVIDIA driver, or build SASS for this "
                "device (target 'native')" % what)
    if code == CUDA_ERROR_JIT_COMPILATION_DISABLED:
        return ("%s needs a PTX JIT compilation, which is disabled in this process "
                "(CUDA_DISABLE_PTX_JIT?): build SASS for this device (target 'native')" % what)
    return what


def load_module(image, kind):
    """Load a compiled image into the current context and return its :class:`Module`.

    ``kind`` is ``'ptx'``, ``'cubin'`` or ``'fatbin'``.  PTX is JIT-compiled by
    the driver (and kept in the driver's compute cache).  A context is made
    current first if none is (see :func:`ensure_context`).  A failure raises
    DriverError whose ``log`` holds the driver's JIT error log.
    """
    import ctypes
    if kind not in _IMAGE_KINDS:
        raise ValueError("image kind must be one of %s, not %r" % (", ".join(_IMAGE_KINDS), kind))
    image = bytes(image)
    if kind == "ptx" and not image.endswith(b"\0"):
        image += b"\0"  # the driver reads PTX as a C string
    api = _driver()
    ensure_context()
    options, values, error_log, info_log = _jit_log_options()
    handle = ctypes.c_void_p()
    code = api.cuModuleLoadDataEx(ctypes.byref(handle), image, len(options), options, values)
    if code != CUDA_SUCCESS:
        log = _log_text(error_log) or _log_text(info_log)
        _fail(api, code, "cuModuleLoadDataEx", _jit_failure_detail(code, kind, image, log), log)
    return Module(handle.value, kind, _current_context(api), _log_text(info_log))


def jit_image(image):
    """Load ``image`` (a fatbin) with plain cuModuleLoadData and unload it again; return None.

    No JIT options, unlike :func:`load_module`: the driver's JIT cache is keyed by
    what it compiles and how, so only a load made the way a library's own CUDA
    runtime makes it fills the entries that runtime looks up.  A refusal raises
    DriverError naming the driver's error.
    """
    import ctypes
    image = bytes(image)
    api = _driver()
    ensure_context()
    handle = ctypes.c_void_p()
    code = api.cuModuleLoadData(ctypes.byref(handle), image)
    if code != CUDA_SUCCESS:
        _fail(api, code, "cuModuleLoadData", _jit_failure_detail(code, "fatbin", image, ""))
    api.cuModuleUnload(handle)


def link_ptx(ptx, name="kernel.ptx"):
    """JIT-compile PTX into a cubin for the current device and return the cubin's bytes.

    Unlike :func:`load_module` with PTX, this bypasses the driver's compute cache,
    so the result can be stored by ptxbackend's own cache.  ``name`` appears in
    the JIT log.  A failure raises DriverError carrying that log.
    """
    import ctypes
    ptx = bytes(ptx)
    if not ptx.endswith(b"\0"):
        ptx += b"\0"
    api = _driver()
    ensure_context()
    options, values, error_log, info_log = _jit_log_options()
    state = ctypes.c_void_p()
    code = api.cuLinkCreate_v2(len(options), options, values, ctypes.byref(state))
    if code != CUDA_SUCCESS:
        _fail(api, code, "cuLinkCreate_v2", log=_log_text(error_log))
    try:
        label = name.encode("utf-8") if not isinstance(name, bytes) else name
        call = "cuLinkAddData_v2(CU_JIT_INPUT_PTX)"
        code = api.cuLinkAddData_v2(state, _CU_JIT_INPUT_PTX, ptx, len(ptx), label, 0, None, None)
        if code == CUDA_SUCCESS:
            call = "cuLinkComplete"
            cubin = ctypes.c_void_p()
            size = ctypes.c_size_t()
            code = api.cuLinkComplete(state, ctypes.byref(cubin), ctypes.byref(size))
        if code != CUDA_SUCCESS:
            log = _log_text(error_log) or _log_text(info_log)
            _fail(api, code, call, _jit_failure_detail(code, "ptx", ptx, log), log)
        # The cubin lives inside the link state: copy it out before destroying that.
        return ctypes.string_at(cubin.value, size.value)
    finally:
        api.cuLinkDestroy(state)


def _reset_for_tests():
    """Forget the loaded library and every cached outcome, so PTXBACKEND_LIBCUDA is read again.

    The library stays mapped (ctypes cannot unload it) and retained primary
    contexts are not released: only for tests.
    """
    global _build
    libcuda._reset_for_tests()
    _build = None

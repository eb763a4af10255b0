"""The CUDA driver API, through ctypes: load images, link PTX, launch kernels.

Only ``libcuda`` is used (no CUDA runtime, no cuda-python, no NumPy), and only
entry points that CUDA 8 drivers already export, under their ``_v2`` names where
those exist, so the same code serves a 2016 driver and a current one.

Importing this module does not load libcuda: it is imported at start-up in
processes that never touch a GPU.  The library is loaded, and ``cuInit(0)``
called, on the first call that needs it; the outcome (including "not found") is
remembered for the life of the process.

Where libcuda comes from:

* ``PTXBACKEND_LIBCUDA``: the full path of the driver library to use.  When it
  is set, nothing else is tried, so a wrong path is reported rather than
  silently replaced by another driver.  It is read once, at the first load.
* otherwise ``libcuda.so.1`` through the dynamic loader (LD_LIBRARY_PATH,
  ld.so.cache), then a few places drivers live outside the default search path
  (WSL, the NVIDIA container toolkit); ``nvcuda.dll`` on Windows (best effort).
  The unversioned ``libcuda.so`` is never tried: it is usually the toolkit's
  link-time stub, which fails every call.

Contexts: ptxbackend never creates a context of its own.  When a context is
current (CuPy's, PyTorch's: both use the device's primary context through the
runtime API), every call acts on it; when none is, the device's primary context
is retained and made current, the same context the runtime would pick.
"""

import os
import sys
import threading

from .errors import DriverError

# ctypes is imported inside the functions that use it: importing it costs about
# 1.5 ms, which the many processes that import this module and never call the
# driver should not pay.

__all__ = [
    "available", "driver_version", "driver_build", "library_path", "device_count",
    "device_name", "compute_capability", "current_device", "ensure_context",
    "load_module", "link_ptx", "synchronize", "Module", "Function", "DeviceBuffer",
]

# CUresult values this module reacts to (cuda.h, enum cudaError_enum).
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_DEINITIALIZED = 4
CUDA_ERROR_STUB_LIBRARY = 34
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NO_BINARY_FOR_GPU = 209
CUDA_ERROR_INVALID_PTX = 218
CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221
CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222
CUDA_ERROR_JIT_COMPILATION_DISABLED = 223
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803
CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804

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
_LIBCUDA_ENV = "PTXBACKEND_LIBCUDA"

if sys.platform.startswith("win"):
    _LIBCUDA_NAME = "nvcuda.dll"
    _LIBCUDA_FALLBACKS = ()
else:
    _LIBCUDA_NAME = "libcuda.so.1"
    # Driver locations that are not on the default loader path in some setups:
    # WSL2, and containers whose LD_LIBRARY_PATH was reset.
    _LIBCUDA_FALLBACKS = (
        "/usr/lib/wsl/lib/libcuda.so.1",
        "/usr/local/nvidia/lib64/libcuda.so.1",
        "/usr/lib64/nvidia/libcuda.so.1",
    )

# Process-wide driver state.  Guarded by _lock while it changes; read without it
# afterwards, because once set it never changes again (until _reset_for_tests).
_lock = threading.Lock()
_api = None            # _Api once libcuda is loaded and its entry points bound
_load_failure = None   # message of a failed load: a missing driver costs one search per process
_init_failure = None   # (code, name, message) of a failed cuInit(0)
_init_pid = None       # CUDA state does not survive fork(); lets errors say so
_primary_contexts = {}  # ordinal -> retained primary CUcontext (int)
_build = None          # driver_build() result


class _Api(object):
    """libcuda's handle, its resolved path, and its entry points with declared signatures."""

    def __init__(self, lib, path):
        import ctypes
        from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint, c_void_p
        self.lib = lib
        self.path = path
        # CUdeviceptr is unsigned long long on 64-bit hosts, unsigned int on 32-bit ones.
        self.deviceptr = ctypes.c_uint64 if ctypes.sizeof(c_void_p) == 8 else ctypes.c_uint
        dptr = self.deviceptr
        p_void = POINTER(c_void_p)
        p_int = POINTER(c_int)
        signatures = (
            ("cuInit", (c_uint,)),
            ("cuDriverGetVersion", (p_int,)),
            ("cuGetErrorName", (c_int, POINTER(c_char_p))),
            ("cuGetErrorString", (c_int, POINTER(c_char_p))),
            ("cuDeviceGetCount", (p_int,)),
            ("cuDeviceGet", (p_int, c_int)),
            ("cuDeviceGetName", (c_char_p, c_int, c_int)),
            ("cuDeviceGetAttribute", (p_int, c_int, c_int)),
            ("cuDevicePrimaryCtxRetain", (p_void, c_int)),
            ("cuCtxGetCurrent", (p_void,)),
            ("cuCtxSetCurrent", (c_void_p,)),
            ("cuCtxGetDevice", (p_int,)),
            ("cuCtxSynchronize", ()),
            ("cuModuleLoadDataEx", (p_void, c_void_p, c_uint, p_int, p_void)),
            ("cuModuleGetFunction", (p_void, c_void_p, c_char_p)),
            ("cuModuleUnload", (c_void_p,)),
            ("cuLaunchKernel", (c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                                c_uint, c_void_p, p_void, p_void)),
            ("cuMemAlloc_v2", (POINTER(dptr), c_size_t)),
            ("cuMemFree_v2", (dptr,)),
            ("cuMemcpyHtoD_v2", (dptr, c_void_p, c_size_t)),
            ("cuMemcpyDtoH_v2", (c_void_p, dptr, c_size_t)),
            ("cuLinkCreate_v2", (c_uint, p_int, p_void, p_void)),
            ("cuLinkAddData_v2", (c_void_p, c_int, c_void_p, c_size_t, c_char_p,
                                  c_uint, p_int, p_void)),
            ("cuLinkComplete", (c_void_p, p_void, POINTER(c_size_t))),
            ("cuLinkDestroy", (c_void_p,)),
        )
        for name, argtypes in signatures:
            try:
                function = getattr(lib, name)
            except AttributeError:
                if name == "cuInit":
                    raise DriverError(
                        "%s is not a CUDA driver library (it has no cuInit). Point %s at the "
                        "NVIDIA driver's libcuda.so.1, or unset it." % (path, _LIBCUDA_ENV))
                raise DriverError(
                    "the CUDA driver library %s lacks %s: the driver is too old for "
                    "ptxbackend, which needs a driver of CUDA 8.0 or newer (R367+). "
                    "Update the NVIDIA driver." % (path, name))
            function.argtypes = argtypes
            function.restype = c_int
            setattr(self, name, function)


def _load_library():
    """dlopen libcuda; return ``(lib, path)`` or raise DriverError saying why not."""
    import ctypes
    loader = getattr(ctypes, "WinDLL", ctypes.CDLL)  # CUDAAPI is __stdcall on Windows
    explicit = os.environ.get(_LIBCUDA_ENV, "").strip()
    if explicit:
        try:
            lib = loader(explicit)
        except OSError as exc:
            raise DriverError(
                "%s=%s could not be loaded: %s. Set it to the full path of the NVIDIA "
                "driver's %s (e.g. /usr/lib/x86_64-linux-gnu/libcuda.so.1), or unset it to "
                "search the usual places." % (_LIBCUDA_ENV, explicit, exc, _LIBCUDA_NAME))
        return lib, explicit
    first_error = None
    for candidate in (_LIBCUDA_NAME,) + _LIBCUDA_FALLBACKS:
        if candidate != _LIBCUDA_NAME and not os.path.exists(candidate):
            continue
        try:
            return loader(candidate), candidate
        except OSError as exc:
            if first_error is None:
                first_error = exc
    raise DriverError(
        "%s not found: no NVIDIA driver on this machine, or its library directory is not on "
        "the loader's search path (loader said: %s). Install the NVIDIA driver (nvidia-smi "
        "must work), or set %s to the full path of %s. Without it, ptxbackend can still "
        "compile and cache kernels but cannot load or run them."
        % (_LIBCUDA_NAME, first_error, _LIBCUDA_ENV, _LIBCUDA_NAME))


def _resolved_path(lib, fallback):
    """The file libcuda was actually loaded from, symlinks resolved (best effort)."""
    import ctypes
    path = None
    try:
        if sys.platform.startswith("win"):
            buf = ctypes.create_unicode_buffer(1024)
            if ctypes.windll.kernel32.GetModuleFileNameW(ctypes.c_void_p(lib._handle), buf, 1024):
                path = buf.value
        else:
            # dladdr names the file that defines a symbol: exact even when the
            # loader found the library through LD_LIBRARY_PATH or ld.so.cache.
            class _DlInfo(ctypes.Structure):
                _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                            ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]
            dladdr = None
            for libname in (None, "libdl.so.2", "libc.so.6"):
                try:
                    dladdr = ctypes.CDLL(libname).dladdr
                    break
                except (OSError, AttributeError):
                    continue
            if dladdr is not None:
                dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(_DlInfo))
                dladdr.restype = ctypes.c_int
                info = _DlInfo()
                address = ctypes.cast(lib.cuInit, ctypes.c_void_p)
                if dladdr(address, ctypes.byref(info)) and info.dli_fname:
                    path = os.fsdecode(info.dli_fname)
    except Exception:
        path = None  # only cosmetic and a cache-key hint: never fail the load over it
    path = path or fallback
    if os.path.isabs(path):
        path = os.path.realpath(path)
    return path


def _library():
    """The bound libcuda entry points, loading the library on first use (cuInit may have failed)."""
    global _api, _load_failure
    api = _api
    if api is not None:
        return api
    if _load_failure is not None:
        raise DriverError(_load_failure)
    with _lock:
        if _api is None and _load_failure is None:
            try:
                lib, name = _load_library()
                candidate = _Api(lib, _resolved_path(lib, name))
                _initialize(candidate)
                _api = candidate
            except DriverError as exc:
                _load_failure = str(exc)
        if _api is not None:
            return _api
        raise DriverError(_load_failure)


def _initialize(api):
    """cuInit(0), once; remember a failure so every later call reports the same cause."""
    global _init_failure, _init_pid
    code = api.cuInit(0)
    _init_pid = os.getpid()
    if code == CUDA_SUCCESS:
        return
    name, text = _error_name(api, code)
    hints = {
        CUDA_ERROR_NO_DEVICE:
            "the driver is installed but no GPU is visible to this process "
            "(CUDA_VISIBLE_DEVICES=%r; in a container, start it with GPUs attached)"
            % os.environ.get("CUDA_VISIBLE_DEVICES"),
        CUDA_ERROR_STUB_LIBRARY:
            "%s is the CUDA toolkit's link-time stub (lib64/stubs), not the driver: remove "
            "that directory from LD_LIBRARY_PATH, or point %s at the driver's libcuda.so.1"
            % (api.path, _LIBCUDA_ENV),
        CUDA_ERROR_INSUFFICIENT_DRIVER:
            "the kernel driver is older than this libcuda: update the NVIDIA driver",
        CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
            "libcuda (%s) and the loaded NVIDIA kernel module are from different driver "
            "versions: reboot after a driver update, or remove a stray forward-compatibility "
            "libcuda from LD_LIBRARY_PATH" % api.path,
        CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
            "a CUDA forward-compatibility libcuda (%s) is in use on a GPU that does not "
            "support it: use the libcuda that came with the installed driver" % api.path,
    }
    hint = hints.get(code, "check that nvidia-smi works and that the NVIDIA kernel module "
                           "is loaded (dmesg may say why it is not)")
    _init_failure = (code, name, "cuInit(0) failed with %s (%s): %s." % (name, text, hint))


def _driver():
    """The bound entry points of an initialised driver, or DriverError."""
    api = _api if _api is not None else _library()
    if _init_failure is not None:
        code, name, message = _init_failure
        raise DriverError(message, code, name)
    return api


def _error_name(api, code):
    """``(name, description)`` of a CUresult, from the driver itself."""
    import ctypes
    name = "CUresult %d" % code
    text = "no description"
    try:
        value = ctypes.c_char_p()
        if api.cuGetErrorName(code, ctypes.byref(value)) == CUDA_SUCCESS and value.value:
            name = value.value.decode("ascii", "replace")
        value = ctypes.c_char_p()
        if api.cuGetErrorString(code, ctypes.byref(value)) == CUDA_SUCCESS and value.value:
            text = value.value.decode("ascii", "replace")
    except Exception:
        pass  # an error about an error must not hide the first one
    return name, text


def _fail(api, code, call, detail="", log=""):
    """Raise DriverError for a failed ``call``; ``detail`` says what it was doing and what to do."""
    name, text = _error_name(api, code)
    message = "%s failed with %s (%s)" % (call, name, text)
    if detail:
        message += ": " + detail
    if _init_pid is not None and os.getpid() != _init_pid:
        message += (". This process was forked after CUDA was initialised in its parent, and "
                    "CUDA cannot be used across fork(): start workers with multiprocessing's "
                    "'spawn' or 'forkserver' method")
    elif code == CUDA_ERROR_INVALID_CONTEXT:
        message += (". The context current in this thread is not the one the object belongs "
                    "to, or was destroyed (e.g. by a device reset)")
    raise DriverError(message, code, name, log=log)


def _check(api, code, call, detail=""):
    if code != CUDA_SUCCESS:
        _fail(api, code, call, detail)


def _device(api, ordinal):
    """The CUdevice for ``ordinal``, with a clear message when it is out of range."""
    import ctypes
    ordinal = int(ordinal)
    device = ctypes.c_int()
    code = api.cuDeviceGet(ctypes.byref(device), ordinal)
    if code != CUDA_SUCCESS:
        count = ctypes.c_int()
        api.cuDeviceGetCount(ctypes.byref(count))
        _fail(api, code, "cuDeviceGet(%d)" % ordinal,
              "device ordinal %d does not exist: %d device(s) are visible "
              "(CUDA_VISIBLE_DEVICES=%r)"
              % (ordinal, count.value, os.environ.get("CUDA_VISIBLE_DEVICES")))
    return device.value


def _current_context(api):
    """The context current in this thread as an int, or 0."""
    import ctypes
    ctx = ctypes.c_void_p()
    _check(api, api.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    return ctx.value or 0


def _make_current(api, context):
    """Make ``context`` current when no context is (e.g. a new thread); leave any other alone."""
    if context and not _current_context(api):
        _check(api, api.cuCtxSetCurrent(context), "cuCtxSetCurrent")


def _reset_for_tests():
    """Forget the loaded library and every cached outcome, so PTXBACKEND_LIBCUDA is read again.

    The library stays mapped (ctypes cannot unload it) and retained primary
    contexts are not released: only for tests.
    """
    global _api, _load_failure, _init_failure, _init_pid, _build
    with _lock:
        _api = None
        _load_failure = None
        _init_failure = None
        _init_pid = None
        _build = None
        _primary_contexts.clear()


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
    if _init_failure is not None and _init_failure[0] == CUDA_ERROR_NO_DEVICE:
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
    import ctypes
    api = _driver()
    if not _current_context(api):
        return 0
    device = ctypes.c_int()
    _check(api, api.cuCtxGetDevice(ctypes.byref(device)), "cuCtxGetDevice")
    return device.value


# --------------------------------------------------------------------------- contexts

def ensure_context(ordinal=None):
    """Make sure this thread has a current CUDA context.

    A context that is already current (CuPy's, PyTorch's) is used as it is, even
    when ``ordinal`` names another device: switching it would pull the ground
    from under the library that owns it.  Otherwise the primary context of
    device ``ordinal`` (default 0) is retained (once per process) and made
    current.  A context is never created: a second context on the same device
    would not share memory or modules with the application's.
    """
    import ctypes
    api = _driver()
    if _current_context(api):
        return
    ordinal = 0 if ordinal is None else int(ordinal)
    context = _primary_contexts.get(ordinal)
    if context is None:
        with _lock:
            context = _primary_contexts.get(ordinal)
            if context is None:
                device = _device(api, ordinal)
                handle = ctypes.c_void_p()
                _check(api, api.cuDevicePrimaryCtxRetain(ctypes.byref(handle), device),
                       "cuDevicePrimaryCtxRetain(device %d)" % ordinal)
                context = handle.value
                _primary_contexts[ordinal] = context
    _check(api, api.cuCtxSetCurrent(context), "cuCtxSetCurrent")


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


class Module(object):
    """A loaded CUmodule.  Unloaded by :meth:`unload` or when garbage-collected.

    Attributes:
        handle: the CUmodule as an int (0 once unloaded).
        kind: the image kind it was loaded from (``'ptx'``, ``'cubin'``, ``'fatbin'``).
        info_log: the driver's JIT info log for the load (often empty).
    """

    def __init__(self, handle, kind, context, info_log=""):
        self.handle = handle
        self.kind = kind
        self.info_log = info_log
        self._context = context
        self._pid = os.getpid()

    def get_function(self, name):
        """The kernel called ``name`` (its mangled name unless declared ``extern "C"``)."""
        import ctypes
        api = _driver()
        if not self.handle:
            raise DriverError("cannot look up kernel %r: the module was unloaded" % (name,))
        _make_current(api, self._context)
        raw = name.encode("utf-8") if not isinstance(name, bytes) else name
        function = ctypes.c_void_p()
        code = api.cuModuleGetFunction(ctypes.byref(function), self.handle, raw)
        if code == CUDA_ERROR_NOT_FOUND:
            _fail(api, code, "cuModuleGetFunction",
                  "no kernel named %r in this %s module. C++ kernel names are mangled "
                  "(e.g. _Z6kernelPf) unless declared extern \"C\": declare the kernel "
                  "extern \"C\" or ask for its mangled name" % (_text(name), self.kind))
        _check(api, code, "cuModuleGetFunction(%r)" % (_text(name),))
        return Function(function.value, _text(name), self)

    def unload(self):
        """Unload the module; later calls do nothing.  Its Functions become unusable."""
        handle, self.handle = self.handle, 0
        if handle and self._pid == os.getpid():
            api = _driver()
            _make_current(api, self._context)
            _check(api, api.cuModuleUnload(handle), "cuModuleUnload")

    def __del__(self):
        try:
            self.unload()
        except Exception:
            pass  # at interpreter exit the driver or this module may already be gone

    def __repr__(self):
        return "<ptxbackend.driver.Module %s handle=0x%x>" % (self.kind, self.handle)


def _text(name):
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


def _dims(value, what):
    """``n`` or a tuple of up to three ints -> ``(x, y, z)``."""
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3:
        raise ValueError("%s must be an int or a tuple of 1 to 3 ints, not %r" % (what, value))
    dims = dims + (1,) * (3 - len(dims))
    for d in dims:
        if not isinstance(d, int) or not 1 <= d <= 0xFFFFFFFF:
            raise ValueError("%s dimensions must be positive ints, not %r" % (what, value))
    return dims


class Function(object):
    """A kernel of a loaded :class:`Module` (it keeps the module loaded)."""

    def __init__(self, handle, name, module):
        self.handle = handle
        self.name = name
        self.module = module

    def launch(self, grid, block, args, shared_mem=0, stream=None):
        """Queue the kernel on ``stream`` (the default stream when None); does not wait.

        ``grid`` and ``block`` are ints or tuples of up to three ints.  ``args``
        holds one ctypes instance per kernel parameter, of the parameter's exact
        type: ``c_void_p(ptr)`` (or a :class:`DeviceBuffer`) for pointers,
        ``c_float``, ``c_int``, ``c_uint64``...  ``stream`` is a CUstream as an
        int, or an object with a ``ptr`` attribute (a CuPy stream).
        """
        import ctypes
        api = _driver()
        if not self.module.handle:
            raise DriverError("cannot launch %r: its module was unloaded" % self.name)
        gx, gy, gz = _dims(grid, "grid")
        bx, by, bz = _dims(block, "block")
        values = []
        for index, arg in enumerate(args):
            if isinstance(arg, DeviceBuffer):
                arg = ctypes.c_void_p(arg.ptr)
            try:
                ctypes.addressof(arg)
            except TypeError:
                raise TypeError(
                    "argument %d of kernel %r is %r, not a ctypes instance: wrap it in the "
                    "type of the kernel parameter, e.g. ctypes.c_int(n), ctypes.c_float(x), "
                    "ctypes.c_void_p(ptr)" % (index, self.name, arg))
            values.append(arg)
        # kernelParams is an array of pointers, one to each argument's value.
        params = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        stream_handle = getattr(stream, "ptr", stream) or None
        _make_current(api, self.module._context)
        code = api.cuLaunchKernel(self.handle, gx, gy, gz, bx, by, bz, int(shared_mem),
                                  stream_handle, params, None)
        _check(api, code, "cuLaunchKernel(%s, grid=%r, block=%r)"
               % (self.name, (gx, gy, gz), (bx, by, bz)))

    def __repr__(self):
        return "<ptxbackend.driver.Function %s>" % self.name


class DeviceBuffer(object):
    """A plain device allocation (cuMemAlloc), for tests and demos.

    Attributes:
        ptr: the device address as an int (0 once freed).
        nbytes: its size in bytes.
    """

    def __init__(self, nbytes):
        import ctypes
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError("a DeviceBuffer needs a positive size, not %d bytes" % nbytes)
        self.ptr = 0
        self.nbytes = nbytes
        api = _driver()
        ensure_context()
        self._context = _current_context(api)
        self._pid = os.getpid()
        pointer = api.deviceptr()
        _check(api, api.cuMemAlloc_v2(ctypes.byref(pointer), nbytes),
               "cuMemAlloc_v2(%d bytes)" % nbytes)
        self.ptr = pointer.value

    def _live(self, api, what):
        if not self.ptr:
            raise DriverError("cannot %s: the DeviceBuffer was freed" % what)
        _make_current(api, self._context)

    def copy_from_host(self, data):
        """Copy ``data`` (any buffer: bytes, bytearray, array.array, a ctypes array) to the start."""
        import ctypes
        api = _driver()
        self._live(api, "copy to the device")
        view = memoryview(data)
        size = view.nbytes
        if size > self.nbytes:
            raise ValueError("%d bytes do not fit in a DeviceBuffer of %d bytes"
                             % (size, self.nbytes))
        if size == 0:
            return
        if view.readonly or not view.c_contiguous:
            source = view.tobytes()
        else:
            source = (ctypes.c_char * size).from_buffer(view)
        code = api.cuMemcpyHtoD_v2(self.ptr, source, size)
        del source  # releases the export of ``data`` so a bytearray can be resized again
        view.release()
        _check(api, code, "cuMemcpyHtoD_v2(%d bytes)" % size)

    def copy_to_host(self):
        """The whole buffer's contents, as a new bytearray.

        Synchronous: it waits for work queued on the legacy default stream (the
        one :meth:`Function.launch` uses when ``stream`` is None), then copies.
        """
        import ctypes
        api = _driver()
        self._live(api, "copy from the device")
        out = bytearray(self.nbytes)
        target = (ctypes.c_char * self.nbytes).from_buffer(out)
        code = api.cuMemcpyDtoH_v2(target, self.ptr, self.nbytes)
        del target  # the bytearray stays exported while a ctypes view of it lives
        _check(api, code, "cuMemcpyDtoH_v2(%d bytes)" % self.nbytes)
        return out

    def free(self):
        """Release the allocation; later calls do nothing."""
        ptr, self.ptr = self.ptr, 0
        if ptr and self._pid == os.getpid():
            api = _driver()
            _make_current(api, self._context)
            _check(api, api.cuMemFree_v2(ptr), "cuMemFree_v2")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.free()
        return False

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass  # at interpreter exit the driver or this module may already be gone

    def __repr__(self):
        return "<ptxbackend.driver.DeviceBuffer 0x%x, %d bytes>" % (self.ptr, self.nbytes)

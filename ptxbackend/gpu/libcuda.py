"""ptxbackend's one binding to libcuda, through ctypes.

This module finds and loads the driver library, declares the signatures of the
entry points ptxbackend calls, runs ``cuInit(0)``, keeps the context those calls
run in, and turns a failed CUresult into a :class:`DriverError` that says what
to do.  What ptxbackend asks of the driver (queries, loading and linking
images) is in :mod:`ptxbackend.gpu.driver`; launching kernels and device memory are
in :mod:`ptxbackend.gpu.launch`.  Every piece of process-wide driver state lives
here, and only here.

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
is retained and made current, the same context the runtime would pick.  This
lives here rather than in :mod:`ptxbackend.gpu.driver` because both that module and
:mod:`ptxbackend.gpu.launch` need it, and ``driver`` re-exports ``launch``'s classes,
so ``launch`` cannot import ``driver`` without a cycle.
"""

import os
import sys
import threading

from ..errors import DriverError

# ctypes is imported inside the functions that use it: importing it costs about
# 1.5 ms, which the many processes that import this module and never call the
# driver should not pay.

# CUresult values ptxbackend reacts to (cuda.h, enum cudaError_enum).
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
            ("cuModuleLoadData", (p_void, c_void_p)),
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


def _init_failure_code():
    """The CUresult of a failed cuInit(0), or None (also before the library was loaded)."""
    return _init_failure[0] if _init_failure is not None else None


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


# --------------------------------------------------------------------------- devices and contexts

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


def _reset_for_tests():
    """Forget the loaded library and every cached outcome, so PTXBACKEND_LIBCUDA is read again.

    The library stays mapped (ctypes cannot unload it) and retained primary
    contexts are not released: only for tests.
    """
    global _api, _load_failure, _init_failure, _init_pid
    with _lock:
        _api = None
        _load_failure = None
        _init_failure = None
        _init_pid = None
        _primary_contexts.clear()

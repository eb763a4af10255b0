"""Running loaded kernels and moving bytes to and from the device, through libcuda.

:class:`Module` (what :func:`ptxbackend.gpu.driver.load_module` returns) finds a
kernel by name; :class:`Function` launches it; :class:`DeviceBuffer` is a plain
device allocation.  ptxbackend's compile-and-load path never launches anything
(CuPy launches its own kernels): these serve the tests, ``ptxbackend demo`` and
``ptxbackend warm --libs``, and callers that load a kernel with
:func:`ptxbackend.load` and run it without CuPy.

Each object remembers the context it was made in and makes that context
current when a thread has none (see :mod:`ptxbackend.gpu.libcuda`).  All three
classes are also importable from :mod:`ptxbackend.gpu.driver`, where they used to
live.
"""

import os

from ..errors import DriverError
from .libcuda import CUDA_ERROR_NOT_FOUND, _check, _current_context, _driver, _fail, _make_current, ensure_context

__all__ = ["Module", "Function", "DeviceBuffer"]

# ctypes is imported inside the methods, as in libcuda: this module is imported
# with ptxbackend.gpu.driver, in processes that may never launch anything.


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
        return "<ptxbackend.gpu.driver.Module %s handle=0x%x>" % (self.kind, self.handle)


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
        return "<ptxbackend.gpu.driver.Function %s>" % self.name


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
        return "<ptxbackend.gpu.driver.DeviceBuffer 0x%x, %d bytes>" % (self.ptr, self.nbytes)

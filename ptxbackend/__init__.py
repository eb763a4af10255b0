"""ptxbackend: compile CUDA kernels for GPUs newer than your toolkit, cache them, load them.

Public API::

    artifact = ptxbackend.compile(source, options=(), target='auto')
    module = ptxbackend.load(artifact)          # or ptxbackend.load(source)
    kernel = module.get_function('saxpy')

Configuration lives in ``PTXBACKEND_*`` variables (docs/configuration.md).
"""

from ._version import __version__
from .errors import (CacheError, CompileError, CompilerNotFoundError, ConfigError, DriverError, PtxBackendError,
                     TargetError)
from .compiling.engine import Artifact, compile, load


def cache_counters():
    """This process's cache counters per tier: local hits, remote hits, prefetched, misses, rejected,
    failures, round trips and seconds spent on the fleet store (a dict; docs/fleet.md)."""
    from .cache.counters import cache_counters as counters
    return counters()


def install():
    """Route CuPy's kernel compiles through ptxbackend in this process.

    The start-up hook does this for every interpreter; call it yourself when the
    hook is not installed (or in a process started with ``python -S``).  CuPy
    modules already imported are switched now, later imports when they load.
    Returns whether a CuPy compile function is now replaced.
    """
    import _ptxbackend_boot
    from .hook import cupy_integration
    _ptxbackend_boot.start()
    return cupy_integration.install()


def uninstall():
    """Give CuPy its original compile functions back (the exact objects)."""
    from .hook import cupy_integration
    cupy_integration.uninstall()


def installed():
    """Whether CuPy's compile functions are currently replaced by ptxbackend: ``False`` after
    :func:`install` until CuPy is imported, as there is nothing to replace before (docs/usage.md)."""
    from .hook import cupy_integration
    return cupy_integration.installed()


__all__ = [
    "__version__", "Artifact", "compile", "load", "install", "uninstall", "installed",
    "cache_counters",
    "PtxBackendError", "CompileError", "CompilerNotFoundError", "ConfigError", "TargetError", "CacheError",
    "DriverError",
]

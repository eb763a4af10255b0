"""ptxbackend: compile CUDA kernels for GPUs newer than your toolkit, cache them, load them.

Public API::

    artifact = ptxbackend.compile(source, options=(), target='auto')
    module = ptxbackend.load(artifact)          # or ptxbackend.load(source)
    kernel = module.get_function('saxpy')

Configuration lives in ``PTXBACKEND_*`` variables (docs/configuration.md).
"""

__version__ = "0.1.0"

from .errors import (CacheError, CompileError, CompilerNotFoundError, DriverError,  # noqa: E402
                     PtxBackendError, TargetError)
from .engine import Artifact, compile, load  # noqa: E402

__all__ = [
    "__version__", "Artifact", "compile", "load",
    "PtxBackendError", "CompileError", "CompilerNotFoundError", "TargetError", "CacheError", "DriverError",
]

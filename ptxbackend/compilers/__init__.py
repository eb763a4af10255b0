"""Compiler backends: nvcc (a subprocess) and NVRTC (a library through ctypes).

Owns: :mod:`.base` (a compiler's identity and its memo), :mod:`.nvcc`, :mod:`.nvrtc` and
:mod:`.options` (options that name files).  May import ``dependencies``, ``gpu.libraries``,
``files``, ``config`` and ``errors``; a compiler is handed its settings, it never resolves them.
"""

import os

from ..errors import CompilerNotFoundError
from .base import Compiler, CompilerIdentity
from .nvcc import NvccCompiler
from .nvrtc import NvrtcCompiler

#: kind -> backend class, in the order ``compiler=None`` tries them
COMPILERS = {"nvcc": NvccCompiler, "nvrtc": NvrtcCompiler}
KINDS = ("nvcc", "nvrtc")


def get_compiler(kind=None, nvcc_path=None, nvrtc_path=None, memo_dir=None):
    """Return a ready :class:`Compiler`.

    Args:
        kind: ``'nvcc'``, ``'nvrtc'`` or ``None`` (nvcc when it is found, else NVRTC).
        nvcc_path, nvrtc_path: explicit program / library paths (else each is searched for).
        memo_dir: where compiler identities are remembered between processes.
    """
    explicit = {"nvcc": nvcc_path, "nvrtc": nvrtc_path}
    if kind is not None:
        backend = COMPILERS.get(kind)
        if backend is None:
            raise CompilerNotFoundError("unknown compiler %r: use one of %s (PTXBACKEND_COMPILER)"
                                        % (kind, ", ".join(KINDS)))
        return backend.open(explicit[kind], memo_dir)
    failures = []
    for name in KINDS:
        try:
            return COMPILERS[name].open(explicit[name], memo_dir)
        except CompilerNotFoundError as missing:
            if explicit[name] or os.environ.get("PTXBACKEND_" + name.upper()):
                # The compiler the user named is broken: say so rather than build with another.
                raise
            failures.append(missing)
    raise CompilerNotFoundError("no CUDA compiler found.\n%s" % "\n".join("- %s" % f for f in failures))


__all__ = ["COMPILERS", "Compiler", "CompilerIdentity", "KINDS", "get_compiler"]

"""Compiler backends: nvcc (a subprocess) and NVRTC (a library through ctypes)."""

import os

from ..errors import CompilerNotFoundError
from .base import Compiler, CompilerIdentity

KINDS = ("nvcc", "nvrtc")


def get_compiler(kind=None, nvcc_path=None, nvrtc_path=None, memo_dir=None):
    """Return a ready :class:`Compiler`.

    Args:
        kind: ``'nvcc'``, ``'nvrtc'`` or ``None`` (nvcc when it is found, else NVRTC).
        nvcc_path, nvrtc_path: explicit program / library paths (else each is searched for).
        memo_dir: where compiler identities are remembered between processes.
    """
    from .nvcc import nvcc_compiler
    from .nvrtc import nvrtc_compiler
    if kind is None:
        try:
            return nvcc_compiler(nvcc_path, memo_dir)
        except CompilerNotFoundError as nvcc_error:
            if nvcc_path or os.environ.get("PTXBACKEND_NVCC"):
                # The nvcc the user named is broken: say so rather than build with NVRTC instead.
                raise
            try:
                return nvrtc_compiler(nvrtc_path, memo_dir)
            except CompilerNotFoundError as nvrtc_error:
                raise CompilerNotFoundError("no CUDA compiler found.\n- %s\n- %s" % (nvcc_error, nvrtc_error))
    if kind == "nvcc":
        return nvcc_compiler(nvcc_path, memo_dir)
    if kind == "nvrtc":
        return nvrtc_compiler(nvrtc_path, memo_dir)
    raise CompilerNotFoundError("unknown compiler %r: use one of %s (PTXBACKEND_COMPILER)" % (kind, ", ".join(KINDS)))


__all__ = ["Compiler", "CompilerIdentity", "KINDS", "get_compiler"]

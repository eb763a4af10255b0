"""nvcc, run as a subprocess: what Chainer 1.x's CuPy compiles with."""

import os
import re
import shutil
import subprocess
import tempfile

from ..errors import CompileError, CompilerNotFoundError
from .base import Compiler, CompilerIdentity, archs_from_table, remembered_identity, unknown_arch_hint

NVCC_ENV = "PTXBACKEND_NVCC"

_VERSION_RE = re.compile(r"release (\d+)\.(\d+), V(\d+\.\d+\.\d+)")
_ARCH_LINE_RE = re.compile(r"^(compute|sm)_(\d+)$")
_OUTPUT_FLAG = {"ptx": "--ptx", "cubin": "--cubin", "fatbin": "--fatbin"}


def find_nvcc(explicit=None):
    """Locate nvcc: ``explicit``, then ``PTXBACKEND_NVCC``, ``CUDA_PATH``, ``CUDA_HOME``, PATH.

    ``explicit`` and ``PTXBACKEND_NVCC`` may name the program or a toolkit
    directory.  Raises :class:`CompilerNotFoundError` saying where it looked.
    """
    looked = []
    for origin, value in (("argument", explicit), (NVCC_ENV, os.environ.get(NVCC_ENV))):
        if not value:
            continue
        for candidate in (value, os.path.join(value, "bin", "nvcc"), os.path.join(value, "nvcc")):
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
        # An explicit choice that does not exist is an error, not a reason to fall back silently.
        raise CompilerNotFoundError(
            "nvcc given by %s (%s) is not an executable file or a toolkit directory "
            "holding bin/nvcc. Fix the path, or unset it to search CUDA_PATH, CUDA_HOME "
            "and PATH." % (origin, value))
    for var in ("CUDA_PATH", "CUDA_HOME"):
        root = os.environ.get(var)
        if root:
            candidate = os.path.join(root, "bin", "nvcc")
            looked.append("%s=%s" % (var, candidate))
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    found = shutil.which("nvcc")
    looked.append("PATH")
    if found:
        return found
    raise CompilerNotFoundError(
        "nvcc not found (looked in: %s). Install a CUDA toolkit, or point "
        "PTXBACKEND_NVCC at its nvcc (or set CUDA_PATH), or use NVRTC "
        "(PTXBACKEND_COMPILER=nvrtc)." % ", ".join(looked))


def _run(cmd, cwd=None, timeout=None):
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc.returncode, out.decode("utf-8", "replace")


def _list_archs(path, flag, prefix):
    try:
        code, out = _run([path, flag], timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if code != 0:
        return None
    archs = []
    for line in out.split():
        match = _ARCH_LINE_RE.match(line.strip())
        if match and match.group(1) == prefix:
            archs.append(int(match.group(2)))
    return archs or None


def probe_nvcc(path):
    """Ask nvcc at ``path`` for its version and architectures (spawns nvcc)."""
    try:
        code, out = _run([path, "--version"], timeout=60)
    except OSError as exc:
        raise CompilerNotFoundError("cannot run nvcc at %s: %s" % (path, exc))
    match = _VERSION_RE.search(out)
    if code != 0 or not match:
        raise CompilerNotFoundError(
            "%s --version did not report a CUDA release (exit %s):\n%s" % (path, code, out.strip()))
    version = match.group(3)
    virtual = _list_archs(path, "--list-gpu-arch", "compute")
    real = _list_archs(path, "--list-gpu-code", "sm")
    reliable = virtual is not None and real is not None
    if not reliable:
        virtual = real = archs_from_table(version)
    return CompilerIdentity("nvcc", path, version, virtual, real, reliable)


def _arch_flags(target):
    if target.output_kind == "ptx":
        return ["-arch=compute_%d%s" % target.parts[0][1:]]
    if target.output_kind == "cubin":
        return ["-arch=sm_%d%s" % target.parts[0][1:]]
    flags = []
    for kind, arch, suffix in target.parts:
        # SASS needs a virtual arch to lower from: the same number is the natural one.
        flags.append("-gencode=arch=compute_%d%s,code=%s_%d%s" % (arch, suffix, kind, arch, suffix))
    return flags


class NvccCompiler(Compiler):
    """Compiles with an nvcc subprocess into a private temporary directory."""

    kind = "nvcc"
    output_kinds = ("ptx", "cubin", "fatbin")

    def command(self, target, options, source_name, output_name):
        """The argument list nvcc is run with (no shell is involved)."""
        return ([self.identity.path, _OUTPUT_FLAG[target.output_kind]] + _arch_flags(target)
                + list(options) + ["-o", output_name, source_name])

    def compile(self, source, options, target, name="kernel.cu"):
        # The name is only what nvcc reports errors against: a path in it ('../x.cu', '/abs/k.cu')
        # must not put the source file outside the private directory.
        name = os.path.basename(str(name))
        if name in ("", ".", ".."):
            name = "kernel.cu"
        if "\0" in name or any("\0" in str(option) for option in options):
            # execve() cannot pass it: Popen would raise a bare ValueError
            raise CompileError("the kernel name or an option contains a NUL character, which cannot "
                               "be passed to nvcc; remove it",
                               command=[str(o).replace("\0", "\\0") for o in options])
        workdir = tempfile.mkdtemp(prefix="ptxbackend-nvcc-")
        try:
            source_path = os.path.join(workdir, name)
            output_path = os.path.join(workdir, "out." + target.output_kind)
            with open(source_path, "wb") as handle:
                handle.write(source.encode("utf-8") if not isinstance(source, bytes) else source)
            cmd = self.command(target, options, name, output_path)
            try:
                code, log = _run(cmd, cwd=workdir)
            except OSError as exc:
                raise CompilerNotFoundError("cannot run %s: %s" % (self.identity.path, exc))
            if code != 0 or not os.path.isfile(output_path):
                raise CompileError(
                    "nvcc %s failed with exit status %s while building %s for %s"
                    % (self.identity.version, code, name, target),
                    command=cmd, returncode=code, log=log,
                    hint=unknown_arch_hint(log, self.identity))
            with open(output_path, "rb") as handle:
                return handle.read()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def nvcc_compiler(path=None, memo_dir=None):
    """An :class:`NvccCompiler` for the nvcc found by :func:`find_nvcc`.

    Its identity is remembered in ``memo_dir`` so later processes skip the probe.
    """
    found = find_nvcc(path)
    return NvccCompiler(remembered_identity("nvcc", found, probe_nvcc, memo_dir))

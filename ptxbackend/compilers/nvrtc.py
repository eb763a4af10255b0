"""The NVRTC backend: CUDA C++ to PTX (and, from NVRTC 11.1 on, cubin) in-process.

NVRTC needs no host compiler and no subprocess, which makes it the backend for
machines that have a GPU driver and a pip-installed NVRTC but no CUDA toolkit.
The library is reached through ``ctypes`` and loaded only when it is first
needed (a probe or a compile), never at import: a warm start that finds its
compiler identity in the memo and its kernels in the cache never loads it.
"""

import ctypes
import logging
import os
import re
import sys
import threading

from ..errors import CompileError, CompilerNotFoundError
from .base import Compiler, CompilerIdentity, archs_from_table, file_signature, unknown_arch_hint
from .options import read_path_options
from ..dependencies.reads import (UNKNOWN_READS, OpenedFiles, nvrtc_source_directory, scan_includes,
                                  unrecorded_reads)

__all__ = ["NVRTC_ENV", "find_nvrtc", "probe_nvrtc", "NvrtcCompiler", "nvrtc_compiler"]

# Finding the library is libsearch's job (it is not a compiler); these names
# stay importable from here for the code below and for this module's callers.
from ..gpu.libraries import NVRTC_ENV, NVRTC_HOW_TO_FIX as _FIX, find_nvrtc, is_nvrtc_builtins as _is_builtins

_WINDOWS = sys.platform.startswith("win")
log = logging.getLogger("ptxbackend")

# NVRTC 12.8+'s precompiled headers.  A compile that reuses one opens none of the headers in it (NVRTC
# 13.5, CuPy 14's headers: 64 files opened by the first compile, 0 by the next), and NVRTC reuses it in
# the process after those headers changed (an edited header, even with a new mtime, is not seen).  What
# such a compile read and what it returns cannot be trusted by the cache.
_PCH_OPTIONS = ("pch", "use-pch", "create-pch")
_PCH_REASON = ("NVRTC's precompiled headers (--pch, --use-pch, --create-pch) hide which headers a compile "
               "read, and NVRTC reuses them after a header changed")
_pch_warned = []

# nvrtcResult values this module reacts to (nvrtc.h).
_SUCCESS = 0
_INVALID_OPTION = 5
_BUILTIN_OPERATION_FAILURE = 7


class _Library(object):
    """A loaded NVRTC with argument types declared for the entry points we use."""

    def __init__(self, path):
        self.path = path
        try:
            self.dll = ctypes.CDLL(path)
        except OSError as exc:
            raise CompilerNotFoundError(
                "cannot load NVRTC from %s: %s. The file may be for another CPU or "
                "need a newer C library. %s" % (path, exc, _FIX))
        c_int_p = ctypes.POINTER(ctypes.c_int)
        size_p = ctypes.POINTER(ctypes.c_size_t)
        prog = ctypes.c_void_p
        char_pp = ctypes.POINTER(ctypes.c_char_p)
        required = (
            ("nvrtcVersion", [c_int_p, c_int_p]),
            ("nvrtcGetErrorString", [ctypes.c_int]),
            ("nvrtcCreateProgram", [ctypes.POINTER(prog), ctypes.c_char_p, ctypes.c_char_p,
                                    ctypes.c_int, char_pp, char_pp]),
            ("nvrtcCompileProgram", [prog, ctypes.c_int, char_pp]),
            ("nvrtcGetProgramLogSize", [prog, size_p]),
            ("nvrtcGetProgramLog", [prog, ctypes.c_char_p]),
            ("nvrtcGetPTXSize", [prog, size_p]),
            ("nvrtcGetPTX", [prog, ctypes.c_char_p]),
            ("nvrtcDestroyProgram", [ctypes.POINTER(prog)]),
        )
        optional = (
            ("nvrtcGetNumSupportedArchs", [c_int_p]),
            ("nvrtcGetSupportedArchs", [c_int_p]),
            ("nvrtcGetCUBINSize", [prog, size_p]),
            ("nvrtcGetCUBIN", [prog, ctypes.c_char_p]),
        )
        for name, argtypes in required:
            if not self._bind(name, argtypes):
                raise CompilerNotFoundError(
                    "%s is not an NVRTC library (it has no %s). %s" % (path, name, _FIX))
        for name, argtypes in optional:
            self._bind(name, argtypes)
        self.nvrtcGetErrorString.restype = ctypes.c_char_p

    def _bind(self, name, argtypes):
        try:
            function = getattr(self.dll, name)
        except AttributeError:
            setattr(self, name, None)
            return False
        function.argtypes = argtypes
        function.restype = ctypes.c_int
        setattr(self, name, function)
        return True

    def error_name(self, result):
        """NVRTC's name for ``result``, e.g. ``NVRTC_ERROR_INVALID_OPTION``."""
        try:
            text = self.nvrtcGetErrorString(result)
        except Exception:  # a broken library must not hide the original failure
            text = None
        return text.decode("ascii", "replace") if text else "nvrtcResult %d" % result


_LIBRARIES = {}
_LIBRARIES_LOCK = threading.Lock()


def _load(path):
    """The :class:`_Library` for ``path``, loaded once per process.

    A process cannot load a second library under a path it has loaded (the
    dynamic loader hands back the first one), so a library replaced on disk
    after the load is an error here, never a silent compile with the old code
    under the new version's name.
    """
    signature = file_signature(path)
    with _LIBRARIES_LOCK:
        found = _LIBRARIES.get(path)
        if found is None:
            found = _LIBRARIES[path] = (_Library(path), signature)
        elif found[1] != signature:
            raise CompilerNotFoundError(
                "NVRTC at %s was replaced after this process loaded it (an update while it ran); "
                "restart the program to compile with the new one." % path)
        return found[0]


_RELEASE_RE = re.compile(br"Cuda compilation tools, release (\d+)\.(\d+), V(\d+\.\d+\.\d+)")


def _release_in_file(path):
    """The full release (``'12.0.140'``) the library states about itself, or ``None``.

    NVRTC stamps it into every PTX it writes, so it is in the library's
    data; ``nvrtcVersion`` gives only major.minor, and two patch releases of
    one minor (12.0.76, 12.0.140) emit different code.
    """
    import mmap
    try:
        with open(path, "rb") as handle:
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                match = _RELEASE_RE.search(data)
                return match.group(3).decode("ascii") if match else None
    except (OSError, ValueError):
        return None


def _fingerprint(path):
    import hashlib
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def _work_files(path):
    """The library as found (the sentinel: a stat of it follows any link), the file behind it, and
    the builtins library it will load.

    NVRTC loads ``libnvrtc-builtins.so.X.Y`` by name, so the dynamic loader looks in
    ``LD_LIBRARY_PATH`` before the library's own directory (its RUNPATH): a builtins library there
    is the one that compiles.
    """
    real = os.path.realpath(path)
    files = [path] if real == path else [path, real]
    directory = os.path.dirname(real)
    try:
        names = sorted(n for n in os.listdir(directory) if _is_builtins(n))
    except OSError:
        names = []
    searched = [d for d in (os.environ.get("LD_LIBRARY_PATH") or "").split(os.pathsep) if d] + [directory]
    for name in names:
        for where in searched:
            if os.path.isfile(os.path.join(where, name)):
                files.append(os.path.join(where, name))
                break
    return [[f, file_signature(f)] for f in files]


def probe_nvrtc(path):
    """Load the NVRTC at ``path`` and return its :class:`CompilerIdentity`.

    ``version`` is the full release the library states (``'12.0.140'``),
    else ``nvrtcVersion``'s ``'MAJOR.MINOR'`` plus a content fingerprint, so
    that two patch levels never share a producer.  The architecture list
    comes from ``nvrtcGetSupportedArchs`` (NVRTC 11.2+,
    ``archs_reliable=True``), else from the release table.  ``real_archs``
    equals ``virtual_archs`` when the library can emit cubins (11.1+,
    ``nvrtcGetCUBIN``), else is empty.

    Raises:
        CompilerNotFoundError: ``path`` cannot be loaded or is not NVRTC.
    """
    real = os.path.realpath(path)
    library = _load(real)
    major, minor = ctypes.c_int(), ctypes.c_int()
    result = library.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    if result != _SUCCESS:
        raise CompilerNotFoundError(
            "nvrtcVersion failed in %s: %s. %s" % (real, library.error_name(result), _FIX))
    version = "%d.%d" % (major.value, minor.value)
    stated = _release_in_file(real)
    if stated and stated.startswith(version + "."):
        full = stated
    else:
        full = "%s+%s" % (version, _fingerprint(real))
    archs, reliable = None, False
    if library.nvrtcGetNumSupportedArchs and library.nvrtcGetSupportedArchs:
        count = ctypes.c_int()
        if library.nvrtcGetNumSupportedArchs(ctypes.byref(count)) == _SUCCESS and count.value > 0:
            listed = (ctypes.c_int * count.value)()
            if library.nvrtcGetSupportedArchs(listed) == _SUCCESS:
                archs, reliable = list(listed), True
    if archs is None:
        archs = archs_from_table(version)
    cubins = (major.value, minor.value) >= (11, 1) and library.nvrtcGetCUBIN is not None
    return CompilerIdentity("nvrtc", path, full, archs, archs if cubins else (), reliable,
                            files=_work_files(path), sentinels=1)


def _as_bytes(value, what):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")  # a path that is not UTF-8 keeps its bytes
    raise TypeError("%s must be str or bytes, not %s" % (what, type(value).__name__))


def _as_text(value):
    return value if isinstance(value, str) else value.decode("utf-8", "surrogateescape")


def _failure_hint(result, log, identity):
    hint = unknown_arch_hint(log, identity)
    if hint:
        return hint
    lowered = log.lower()
    if "defined more than once" in lowered and "gpu-architecture" in lowered:
        return ("Remove -arch / --gpu-architecture from the options: ptxbackend adds it from "
                "the target. Choose the architecture with PTXBACKEND_TARGET (e.g. "
                "PTXBACKEND_TARGET=compute_75) instead.")
    if result == _INVALID_OPTION:
        return ("NVRTC accepts only a subset of nvcc's options; nvcc-only ones such as -c, -o, "
                "--ptx, --cubin, -ccbin and -Xcompiler are rejected. Remove the option named "
                "in the log, or compile with nvcc (PTXBACKEND_COMPILER=nvcc).")
    if result == _BUILTIN_OPERATION_FAILURE:
        return ("NVRTC could not load its helper library libnvrtc-builtins, which must sit next "
                "to %s and come from the same release. Reinstall the NVRTC package "
                "(pip install --force-reinstall nvidia-cuda-nvrtc-cuXX) or point %s at a "
                "complete one." % (identity.path, NVRTC_ENV))
    if "could not open source file" in lowered or "cannot open source file" in lowered:
        return ("NVRTC has no C/C++ standard library headers (<cstdint>, <cstdio>, ...) on its "
                "include path: make the kernel self-contained, pass -I<directory> in the "
                "options, or compile with nvcc (PTXBACKEND_COMPILER=nvcc).")
    return ""


_uselocale = []


class _thread_locale_kept(object):
    """Give the calling thread its locale back after an NVRTC call.

    NVRTC 11.x switches the thread to the C locale with uselocale() and leaves it
    there, which turns Python's default text encoding into ASCII for the rest of
    the thread (open() then fails on UTF-8 files).
    """

    def __enter__(self):
        if not _uselocale:
            try:
                function = ctypes.CDLL(None).uselocale
                function.restype = ctypes.c_void_p
                function.argtypes = [ctypes.c_void_p]
            except (OSError, AttributeError):  # not glibc: nothing to guard
                function = None
            _uselocale.append(function)
        self._function = _uselocale[0]
        self._saved = self._function(None) if self._function else None
        return self

    def __exit__(self, *exc_info):
        if self._function:
            self._function(self._saved)
        return False


class NvrtcCompiler(Compiler):
    """Compiles with NVRTC: PTX for ``compute_XY``, cubin for ``sm_XY`` (NVRTC 11.1+).

    NVRTC cannot build fatbins.  The library is loaded on the first
    :meth:`compile`, not at construction.  One instance may be used from
    several threads at once: NVRTC calls on distinct programs are thread-safe,
    and each compile creates and destroys its own program.
    """

    kind = "nvrtc"

    def __init__(self, identity):
        super(NvrtcCompiler, self).__init__(identity)
        self._library = None

    @classmethod
    def locate(cls, explicit=None):
        return find_nvrtc(explicit)

    @classmethod
    def probe(cls, path):
        return probe_nvrtc(path)

    @classmethod
    def discovery_context(cls):
        # Which builtins library NVRTC loads depends on it (see _work_files).
        return os.environ.get("LD_LIBRARY_PATH") or ""

    def _lib(self):
        library = self._library
        if library is None:
            library = self._library = _load(self.identity.path)
        return library

    def _where(self):
        return "NVRTC %s at %s" % (self.identity.version, self.identity.path)

    def compile(self, source, options, target, name="kernel.cu", inputs=None, precompiled=None, timeout=None,
                scratch=None):
        """Compile ``source`` for ``target`` (a single-part Target) and return PTX or cubin bytes.

        The options are passed after ``--gpu-architecture=<target>`` exactly as
        given (str items are UTF-8 encoded); they must not set the
        architecture again.  PTX is returned without NVRTC's trailing NUL.

        Raises:
            CompileError: NVRTC failed (the error carries the option list, the
                ``nvrtcResult`` as ``returncode``, the program log and a hint),
                or the target is a fatbin, or a cubin from an NVRTC before 11.1.

        ``precompiled``: a generation number (precompiled.py) to compile with NVRTC's precompiled
        headers of that generation; ``inputs`` then gets only what this compile itself opened.
        ``timeout`` is not applied: NVRTC runs in this process, where nothing can stop it.
        """
        kind = target.output_kind
        arch = "%s_%d%s" % target.parts[0]
        if kind == "fatbin":
            raise CompileError(
                "NVRTC cannot build fatbins (target %s needs one image per architecture "
                "bundled by nvcc's fatbinary)." % target,
                hint="Use the nvcc compiler for fatbin targets (PTXBACKEND_COMPILER=nvcc), or "
                     "ask NVRTC for one architecture, e.g. PTXBACKEND_TARGET=compute_%d."
                     % min(target.virtual_archs or target.real_archs))
        if kind == "cubin" and not self.identity.real_archs:
            raise CompileError(
                "%s cannot emit cubins (nvrtcGetCUBIN arrived in NVRTC 11.1); target %s asked "
                "for one." % (self._where(), target),
                hint="Use a PTX target such as PTXBACKEND_TARGET=compute_%d (the driver "
                     "JIT-compiles it), a newer NVRTC, or nvcc (PTXBACKEND_COMPILER=nvcc)."
                     % target.parts[0][1])
        if isinstance(options, (str, bytes)):
            # A lone string is one option; iterating it would pass characters.
            options = [options]
        encoded = [_as_bytes("--gpu-architecture=" + arch, "option")]
        encoded += [_as_bytes(option, "each option") for option in options]
        command = [_as_text(option) for option in encoded]
        users_pch = uses_precompiled_headers(command[1:])
        if precompiled is not None:
            # Options choose the precompiled header NVRTC reuses: a generation of its own is a new one.
            own = ["--pch", "-D__ptxbackend_pch_generation=%d" % precompiled]
            encoded += [option.encode("ascii") for option in own]
            command += own
        source_bytes = _as_bytes(source, "source")
        name_bytes = _as_bytes(name, "name")
        if name_bytes.startswith(b"-"):
            # NVRTC hands the name to its front end's command line, where "-dash.cu" is an invalid
            # option: the same file spelt as a path (the key keeps the caller's spelling).
            name_bytes = b"./" + name_bytes
        # C strings end at the first NUL: NVRTC would silently compile a
        # truncated program or drop part of an option.
        if b"\0" in source_bytes or b"\0" in name_bytes or any(b"\0" in o for o in encoded):
            raise CompileError("the source, its name or an option contains a NUL character, which "
                               "NVRTC would treat as the end of the text", command=command)

        opened = None
        if inputs is not None:
            # NVRTC cannot list what it read: the kernel records what it opens (reads.py).  A FIFO on
            # the include path would block this process for ever: only where the trees hold one is
            # the whole include scan needed to tell whether the compile reaches it.
            paths = read_path_options(command[1:])
            pre_includes = paths.resolve_pre_includes()
            first = nvrtc_source_directory(_as_text(name_bytes), command)
            scan = (source_bytes, paths.include_dirs, pre_includes, first)
            direct = scan_includes(*scan, recursive=False)
            roots = ([first] if first else []) + paths.include_dirs
            opened = OpenedFiles(roots, direct + pre_includes)
            scanned = scan_includes(*scan) if opened.scan_first else None
        image = self._compile_program(source_bytes, name, name_bytes, encoded, command, arch, kind, opened)
        if inputs is not None:
            if users_pch:
                if not _pch_warned:
                    _pch_warned.append(True)
                    log.warning("ptxbackend: %s: kernels compiled with them are not cached (drop the "
                                "option to cache them)", _PCH_REASON)
                inputs.append(UNKNOWN_READS + _PCH_REASON)
            elif opened.paths is not None:
                # Opens through a link or outside the watched trees are not in the record: the
                # include scan adds them (and what they include), so no read goes unlisted.
                inputs.extend(opened.paths)
                inputs.extend(unrecorded_reads(source_bytes, paths.include_dirs, pre_includes, first,
                                               opened.paths, opened.watched))
            else:
                inputs.extend(scanned if scanned is not None else scan_includes(*scan))
        return image

    def source_directory(self, name, options):
        return nvrtc_source_directory(name, options)

    @property
    def has_precompiled_headers(self):
        """NVRTC 12.8 brought them (``--pch``)."""
        try:
            return tuple(int(part) for part in self.identity.version.split(".")[:2]) >= (12, 8)
        except ValueError:
            return False

    def _compile_program(self, source_bytes, name, name_bytes, encoded, command, arch, kind, opened):
        library = self._lib()
        program = ctypes.c_void_p()
        result = library.nvrtcCreateProgram(ctypes.byref(program), source_bytes, name_bytes,
                                            0, None, None)
        if result != _SUCCESS:
            raise CompileError("nvrtcCreateProgram failed for %s: %s (%s)"
                               % (name, library.error_name(result), self._where()),
                               command=command, returncode=result)
        try:
            array = (ctypes.c_char_p * len(encoded))(*encoded)
            with _thread_locale_kept(), (opened or OpenedFiles()):
                result = library.nvrtcCompileProgram(program, len(encoded), array)
            if result != _SUCCESS:
                log = self._log(library, program)
                raise CompileError(
                    "NVRTC failed to compile %s for %s: %s (%s)"
                    % (name, arch, library.error_name(result), self._where()),
                    command=command, returncode=result, log=log,
                    hint=_failure_hint(result, log, self.identity))
            if kind == "cubin":
                return self._fetch(library, program, library.nvrtcGetCUBINSize,
                                   library.nvrtcGetCUBIN, "cubin", name, arch, command)
            ptx = self._fetch(library, program, library.nvrtcGetPTXSize, library.nvrtcGetPTX,
                              "PTX", name, arch, command)
            return ptx.rstrip(b"\0")
        finally:
            library.nvrtcDestroyProgram(ctypes.byref(program))

    @staticmethod
    def _log(library, program):
        size = ctypes.c_size_t()
        if library.nvrtcGetProgramLogSize(program, ctypes.byref(size)) != _SUCCESS or size.value <= 1:
            return ""
        buffer = ctypes.create_string_buffer(size.value)
        if library.nvrtcGetProgramLog(program, buffer) != _SUCCESS:
            return ""
        return buffer.raw.rstrip(b"\0").decode("utf-8", "replace")

    def _fetch(self, library, program, get_size, get_data, what, name, arch, command):
        size = ctypes.c_size_t()
        result = get_size(program, ctypes.byref(size))
        # NVRTC reports success with size 0 when asked for a cubin of a
        # virtual architecture, so an empty image is a failure too.
        if result == _SUCCESS and size.value == 0:
            raise CompileError("%s returned an empty %s for %s (%s)"
                               % (self._where(), what, name, arch),
                               command=command, returncode=result,
                               log=self._log(library, program))
        if result == _SUCCESS:
            buffer = ctypes.create_string_buffer(size.value)
            result = get_data(program, buffer)
            if result == _SUCCESS:
                return buffer.raw[:size.value]
        raise CompileError("%s could not return the %s of %s (%s): %s"
                           % (self._where(), what, name, arch, library.error_name(result)),
                           command=command, returncode=result, log=self._log(library, program))


def uses_precompiled_headers(options):
    """Whether NVRTC ``options`` (text) make or use a precompiled header (``--pch``, ``-use-pch=f``...)."""
    return any(option.lstrip("-").split("=", 1)[0] in _PCH_OPTIONS for option in options)


def nvrtc_compiler(path=None, memo_dir=None):
    """Find NVRTC (see :func:`find_nvrtc`) and return an :class:`NvrtcCompiler` for it.

    With ``memo_dir``, the identity is remembered on disk, so later processes
    neither probe nor load the library until they actually compile.
    """
    return NvrtcCompiler.open(path, memo_dir)

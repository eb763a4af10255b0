"""The NVRTC backend: CUDA C++ to PTX (and, from NVRTC 11.1 on, cubin) in-process.

NVRTC needs no host compiler and no subprocess, which makes it the backend for
machines that have a GPU driver and a pip-installed NVRTC but no CUDA toolkit.
The library is reached through ``ctypes`` and loaded only when it is first
needed (a probe or a compile), never at import: a warm start that finds its
compiler identity in the memo and its kernels in the cache never loads it.
"""

import ctypes
import os
import re
import shutil
import sys
import threading

from ..errors import CompileError, CompilerNotFoundError
from .base import Compiler, CompilerIdentity, archs_from_table, remembered_identity, unknown_arch_hint

__all__ = ["NVRTC_ENV", "find_nvrtc", "probe_nvrtc", "NvrtcCompiler", "nvrtc_compiler"]

NVRTC_ENV = "PTXBACKEND_NVRTC"

_WINDOWS = sys.platform.startswith("win")

# libnvrtc.alt.so*, libnvrtc_static.a and libnvrtc-builtins.so* share the
# prefix but are not the library whose API we call; only exact
# libnvrtc.so[.N[.N...]] names qualify.
_SO_RE = re.compile(r"^libnvrtc\.so((?:\.\d+)*)$")
_DLL_RE = re.compile(r"^nvrtc64_(\d+)(?:_(\d+))?\.dll$", re.IGNORECASE)

# nvrtcResult values this module reacts to (nvrtc.h).
_SUCCESS = 0
_INVALID_OPTION = 5
_BUILTIN_OPERATION_FAILURE = 7

_FIX = ("How to fix: pip install nvidia-cuda-nvrtc-cu11 (or -cu12 / -cu13, matching "
        "the driver), or set %s=/path/to/libnvrtc.so (the file, or the directory "
        "holding it)." % NVRTC_ENV)


def _library_version(filename):
    """Sort key of an NVRTC library file name, or ``None`` for any other file."""
    match = _SO_RE.match(filename)
    if match:
        return tuple(int(p) for p in match.group(1).split(".") if p)
    if _WINDOWS:
        match = _DLL_RE.match(filename)
        if match:
            return tuple(int(p) for p in match.groups() if p is not None)
    return None


def _is_builtins(filename):
    return "nvrtc-builtins" in filename.lower()


def _best_in_dir(directory):
    """The highest-versioned NVRTC library in ``directory``, or ``None``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    found = []
    for name in names:
        version = _library_version(name)
        if version is None:
            continue
        path = os.path.join(directory, name)
        # isfile() follows links, so a dangling libnvrtc.so symlink (a
        # half-removed toolkit) is skipped rather than chosen and failing later.
        if os.path.isfile(path):
            found.append((version, name, path))
    if not found:
        return None
    return max(found)[2]


def _from_user_path(value, origin):
    """Resolve a path the user named (file or directory); raise if it is unusable.

    A path the user gave is never silently replaced by one found elsewhere:
    that would run a different NVRTC than the one they asked for.
    """
    path = os.path.abspath(os.path.expanduser(value))
    if os.path.isfile(path):
        if _is_builtins(os.path.basename(path)):
            raise CompilerNotFoundError(
                "%s names %s, which is NVRTC's helper library libnvrtc-builtins, not NVRTC "
                "itself. Point it at libnvrtc.so* in the same directory (or at the "
                "directory). %s" % (origin, path, _FIX))
        return path
    if os.path.isdir(path):
        best = _best_in_dir(path)
        if best:
            return best
        raise CompilerNotFoundError(
            "%s names the directory %s, which holds no %s. %s"
            % (origin, path, "nvrtc64_*.dll" if _WINDOWS else "libnvrtc.so*", _FIX))
    raise CompilerNotFoundError("%s names %s, which does not exist. %s" % (origin, path, _FIX))


def _toolkit_lib_dirs(root):
    if _WINDOWS:
        return [os.path.join(root, "bin"), os.path.join(root, "bin", "x64")]
    dirs = [os.path.join(root, "lib64"), os.path.join(root, "lib"),
            os.path.join(root, "targets", "x86_64-linux", "lib")]
    if os.uname()[4].lower() in ("aarch64", "arm64"):
        dirs.append(os.path.join(root, "targets", "sbsa-linux", "lib"))
    return dirs


def _search_places():
    """Yield ``(description, directory)`` in search order after the explicit path and env."""
    for var in ("CUDA_PATH", "CUDA_HOME"):
        root = os.environ.get(var)
        if root:
            for directory in _toolkit_lib_dirs(root):
                yield "$%s" % var, directory
        else:
            yield "$%s" % var, None
    nvcc = shutil.which("nvcc")
    if nvcc:
        # A wrapper script on PATH (e.g. /usr/local/bin/nvcc) and the real
        # binary it links to live in different trees; try both.
        bins = []
        for candidate in (os.path.abspath(nvcc), os.path.realpath(nvcc)):
            bindir = os.path.dirname(candidate)
            if bindir not in bins:
                bins.append(bindir)
        for bindir in bins:
            if _WINDOWS:
                yield "nvcc on PATH", bindir
            else:
                yield "nvcc on PATH", os.path.normpath(os.path.join(bindir, "..", "lib64"))
    else:
        yield "nvcc on PATH", None
    if not _WINDOWS:
        yield "default toolkit", "/usr/local/cuda/lib64"
    sub = "bin" if _WINDOWS else "lib"
    for entry in sys.path:
        if not isinstance(entry, str):
            continue
        base = os.path.abspath(entry or os.curdir)
        if not os.path.isdir(base):
            continue
        yield "pip wheel", os.path.join(base, "nvidia", "cuda_nvrtc", sub)
        yield "pip wheel", os.path.join(base, "nvidia", "cu13", sub)


def _resolve_soname(name):
    """Turn what ``ctypes.util.find_library`` returns (a bare soname) into a file path.

    The identity memo and the cache key need a real file to stat, and
    find_library only says the loader *could* find the name.
    """
    if os.path.isabs(name):
        return name if os.path.isfile(name) else None
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    for directory in dirs:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    import subprocess  # only on this last-resort path: it is a slow import
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        env = dict(os.environ, LC_ALL="C", LANG="C")
        listing = subprocess.check_output([ldconfig, "-p"], env=env, stderr=subprocess.DEVNULL,
                                          timeout=10).decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        listing = ""
    for line in listing.splitlines():
        fields = line.strip().split()
        if fields and fields[0] == name and "=>" in line:
            path = line.rsplit("=>", 1)[1].strip()
            if os.path.isfile(path):
                return path
    for directory in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                      "/usr/lib", "/lib64", "/lib", "/usr/local/lib"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def find_nvrtc(explicit=None):
    """Return the path of the NVRTC shared library to use.

    Search order, first hit wins:

    1. ``explicit``: a library file, or a directory holding ``libnvrtc.so*``;
    2. the environment variable ``PTXBACKEND_NVRTC`` (same forms);
    3. the CUDA toolkit: ``$CUDA_PATH`` and ``$CUDA_HOME`` (``lib64/``, ``lib/``,
       ``targets/x86_64-linux/lib/``), ``../lib64`` next to the ``nvcc`` found on
       ``PATH``, ``/usr/local/cuda/lib64``;
    4. pip wheels in every ``sys.path`` entry: ``nvidia/cuda_nvrtc/lib/``
       (nvidia-cuda-nvrtc-cu11/-cu12) and ``nvidia/cu13/lib/`` (CUDA 13 wheels);
    5. ``ctypes.util.find_library('nvrtc')`` (the dynamic loader's cache).

    ``libnvrtc-builtins*`` is never chosen.  When a directory holds several
    versions the highest wins.  A path given as ``explicit`` or in the
    environment that does not hold NVRTC is an error, not a reason to look
    elsewhere.  Nothing is loaded.

    Raises:
        CompilerNotFoundError: nothing found; the message lists every place
            searched and how to install or point at NVRTC.
    """
    if explicit:
        return _from_user_path(explicit, "the NVRTC path given (%r)" % (explicit,))
    env = os.environ.get(NVRTC_ENV)
    if env:
        return _from_user_path(env, "%s=%s" % (NVRTC_ENV, env))

    looked = ["the explicit path (none given)", "%s (unset)" % NVRTC_ENV]
    seen = set()
    for description, directory in _search_places():
        if directory is None:
            looked.append("%s (not set)" % description if description.startswith("$")
                          else "%s (not found)" % description)
            continue
        key = os.path.normcase(os.path.abspath(directory))
        if key in seen:
            continue
        seen.add(key)
        best = _best_in_dir(directory)
        if best:
            return best
        # Missing wheel directories in every sys.path entry would bury the
        # useful lines; list only the wheel directories that exist.
        if description != "pip wheel" or os.path.isdir(directory):
            looked.append("%s: %s" % (description, directory))
    if not any(line.startswith("pip wheel") for line in looked):
        looked.append("pip wheel: nvidia/cuda_nvrtc/lib and nvidia/cu13/lib in every sys.path "
                      "entry (none present)")

    # Imported here, not at the top: ctypes.util pulls in subprocess, which
    # costs every process that finds NVRTC by the cheaper means above.
    import ctypes.util
    soname = ctypes.util.find_library("nvrtc")
    if soname and not _is_builtins(soname):
        path = _resolve_soname(soname)
        if path:
            return path
        looked.append("ctypes.util.find_library('nvrtc') -> %s, but no such file found" % soname)
    else:
        looked.append("ctypes.util.find_library('nvrtc') (nothing)")
    raise CompilerNotFoundError(
        "NVRTC (%s) not found. Looked in:\n  - %s\n%s"
        % ("nvrtc64_*.dll" if _WINDOWS else "libnvrtc.so*", "\n  - ".join(looked), _FIX))


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
    """The :class:`_Library` for ``path``, loaded once per process."""
    with _LIBRARIES_LOCK:
        library = _LIBRARIES.get(path)
        if library is None:
            library = _LIBRARIES[path] = _Library(path)
        return library


def probe_nvrtc(path):
    """Load the NVRTC at ``path`` and return its :class:`CompilerIdentity`.

    ``version`` is ``'MAJOR.MINOR'`` from ``nvrtcVersion``.  The architecture
    list comes from ``nvrtcGetSupportedArchs`` (NVRTC 11.2+,
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
    return CompilerIdentity("nvrtc", real, version, archs, archs if cubins else (), reliable)


def _as_bytes(value, what):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError("%s must be str or bytes, not %s" % (what, type(value).__name__))


def _as_text(value):
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


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

    @property
    def output_kinds(self):
        """``('ptx', 'cubin')``, or ``('ptx',)`` for NVRTC before 11.1."""
        return ("ptx", "cubin") if self.identity.real_archs else ("ptx",)

    def _lib(self):
        library = self._library
        if library is None:
            library = self._library = _load(self.identity.path)
        return library

    def _where(self):
        return "NVRTC %s at %s" % (self.identity.version, self.identity.path)

    def compile(self, source, options, target, name="kernel.cu"):
        """Compile ``source`` for ``target`` (a single-part Target) and return PTX or cubin bytes.

        The options are passed after ``--gpu-architecture=<target>`` exactly as
        given (str items are UTF-8 encoded); they must not set the
        architecture again.  PTX is returned without NVRTC's trailing NUL.

        Raises:
            CompileError: NVRTC failed (the error carries the option list, the
                ``nvrtcResult`` as ``returncode``, the program log and a hint),
                or the target is a fatbin, or a cubin from an NVRTC before 11.1.
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
        source_bytes = _as_bytes(source, "source")
        name_bytes = _as_bytes(name, "name")
        # C strings end at the first NUL: NVRTC would silently compile a
        # truncated program or drop part of an option.
        if b"\0" in source_bytes or b"\0" in name_bytes or any(b"\0" in o for o in encoded):
            raise CompileError("the source, its name or an option contains a NUL character, which "
                               "NVRTC would treat as the end of the text", command=command)

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
            with _thread_locale_kept():
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


def nvrtc_compiler(path=None, memo_dir=None):
    """Find NVRTC (see :func:`find_nvrtc`) and return an :class:`NvrtcCompiler` for it.

    With ``memo_dir``, the identity is remembered on disk, so later processes
    neither probe nor load the library until they actually compile.
    """
    found = find_nvrtc(path)
    identity = remembered_identity("nvrtc", found, probe_nvrtc, memo_dir)
    return NvrtcCompiler(identity)

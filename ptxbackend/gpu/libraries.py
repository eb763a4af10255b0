"""Find CUDA shared libraries (NVRTC, cuDNN, cuBLAS, cuRAND, ...) on this machine.

They live in the same few places: a toolkit named by ``$CUDA_PATH`` or
``$CUDA_HOME`` or found through ``nvcc`` on ``PATH``, ``/usr/local/cuda``, the
``nvidia-*`` pip wheels on ``sys.path``, and wherever the dynamic loader looks
(``LD_LIBRARY_PATH``, its ``ldconfig`` cache).  Nothing here loads a library:
callers memoise and key caches on the path, so finding must stay cheap and
loading stays theirs to do, and only when needed.
"""

import itertools
import os
import re
import shutil
import sys

from ..errors import CompilerNotFoundError

__all__ = ["NVRTC_ENV", "NVRTC_HOW_TO_FIX", "find_nvrtc", "is_nvrtc_builtins", "find_cuda_library",
           "library_places", "cupy_bundled_places", "library_version", "best_in_dir", "resolve_soname"]

NVRTC_ENV = "PTXBACKEND_NVRTC"

NVRTC_HOW_TO_FIX = (
    "How to fix: pip install nvidia-cuda-nvrtc-cu11 (or -cu12 / -cu13, matching "
    "the driver), or set %s=/path/to/libnvrtc.so (the file, or the directory "
    "holding it)." % NVRTC_ENV)

# nvidia-cuda-nvrtc-cu11/-cu12 install into nvidia/cuda_nvrtc; the CUDA 13
# wheels share one nvidia/cu13 tree.
_NVRTC_WHEELS = ("cuda_nvrtc", "cu13")

_WINDOWS = sys.platform.startswith("win")

_name_patterns = {}


def _patterns(stem):
    patterns = _name_patterns.get(stem)
    if patterns is None:
        # Only exact names qualify: libnvrtc.alt.so*, libnvrtc_static.a,
        # libnvrtc-builtins.so* and libcublasLt.so* share a prefix with the
        # library whose API the caller means to call, but are other libraries.
        escaped = re.escape(stem)
        patterns = (re.compile(r"^lib%s\.so((?:\.\d+)*)$" % escaped),
                    re.compile(r"^%s64_(\d+)(?:_(\d+))?\.dll$" % escaped, re.IGNORECASE))
        _name_patterns[stem] = patterns
    return patterns


def library_version(filename, stem):
    """Sort key of ``lib<stem>.so[.N...]`` (or ``<stem>64_N[_N].dll`` on Windows), else ``None``."""
    so_pattern, dll_pattern = _patterns(stem)
    match = so_pattern.match(filename)
    if match:
        return tuple(int(p) for p in match.group(1).split(".") if p)
    if _WINDOWS:
        match = dll_pattern.match(filename)
        if match:
            return tuple(int(p) for p in match.groups() if p is not None)
    return None


def best_in_dir(directory, stem):
    """The highest-versioned ``lib<stem>`` library file in ``directory``, or ``None``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    found = []
    for name in names:
        version = library_version(name, stem)
        if version is None:
            continue
        path = os.path.join(directory, name)
        # isfile() follows links, so a dangling symlink (a half-removed
        # toolkit) is skipped rather than chosen and failing later.
        if os.path.isfile(path):
            found.append((version, name, path))
    if not found:
        return None
    return max(found)[2]


def _toolkit_lib_dirs(root):
    if _WINDOWS:
        return [os.path.join(root, "bin"), os.path.join(root, "bin", "x64")]
    dirs = [os.path.join(root, "lib64"), os.path.join(root, "lib"),
            os.path.join(root, "targets", "x86_64-linux", "lib")]
    if os.uname()[4].lower() in ("aarch64", "arm64"):
        dirs.append(os.path.join(root, "targets", "sbsa-linux", "lib"))
    return dirs


def _wheel_package_names(base, package):
    if package != "*":
        return [package]
    try:
        return sorted(os.listdir(os.path.join(base, "nvidia")))
    except OSError:
        return []


def library_places(wheel_packages=("*",)):
    """Yield ``(where, directory)`` in search order: the CUDA toolkit, then pip wheels.

    ``directory`` is ``None`` for a place that is absent (a variable unset, no
    nvcc on PATH), so an error message can say it was considered.
    ``wheel_packages`` names the ``nvidia/<package>/lib`` directories to look
    in under every ``sys.path`` entry; ``"*"`` stands for every package there.
    """
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
    for index, entry in enumerate(sys.path):
        if not isinstance(entry, str) or _is_working_directory(index, entry):
            continue
        base = os.path.abspath(entry or os.curdir)
        if not os.path.isdir(base):
            continue
        for package in wheel_packages:
            for name in _wheel_package_names(base, package):
                yield "pip wheel", os.path.join(base, "nvidia", name, sub)


def _is_working_directory(index, entry):
    """Whether ``sys.path[index]`` is the working directory that ``python -c``/``-m`` put first: whoever
    wrote files where the user stands did not choose a library (``nvidia/cudnn/lib`` there)."""
    if not entry:
        return True
    try:
        return index == 0 and os.path.abspath(entry) == os.getcwd()
    except OSError:  # the working directory was removed
        return index == 0


def cupy_bundled_places():
    """Yield ``("CuPy's bundled libraries", directory)`` for ``cupy/.data/lib`` under each ``sys.path`` entry.

    CuPy wheels up to v8 (cupy-cuda80 7.8.0: ``libcudnn.so.7``) ship cuDNN and NCCL there and load them
    through an RPATH, which outranks ``LD_LIBRARY_PATH``: that copy is the one a CuPy program starts, so
    the one worth warming.  Only directories that exist are yielded, and never the working directory
    that ``python -c``/``-m`` put first (see :func:`_is_working_directory`).  CuPy is not imported.
    """
    for index, entry in enumerate(sys.path):
        if not isinstance(entry, str) or _is_working_directory(index, entry):
            continue
        directory = os.path.join(os.path.abspath(entry), "cupy", ".data", "lib")
        if os.path.isdir(directory):
            yield "CuPy's bundled libraries", directory


def _ld_library_path():
    return [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]


def _ld_library_path_places():
    dirs = _ld_library_path()
    if not dirs:
        yield "$LD_LIBRARY_PATH", None
    for directory in dirs:
        yield "$LD_LIBRARY_PATH", directory


def _first_in(places, stem):
    """Return ``(path, looked)``: the first hit, and the places tried, worded for an error message."""
    looked = []
    seen = set()
    for description, directory in places:
        if directory is None:
            looked.append("%s (not set)" % description if description.startswith("$")
                          else "%s (not found)" % description)
            continue
        key = os.path.normcase(os.path.abspath(directory))
        if key in seen:
            continue
        seen.add(key)
        best = best_in_dir(directory, stem)
        if best:
            return best, looked
        # Missing wheel directories in every sys.path entry would bury the
        # useful lines; list only the wheel directories that exist.
        if description != "pip wheel" or os.path.isdir(directory):
            looked.append("%s: %s" % (description, directory))
    return None, looked


def resolve_soname(name):
    """Turn what ``ctypes.util.find_library`` returns (a bare soname) into a file path.

    Identity memos and cache keys need a real file to stat, and
    find_library only says the loader *could* find the name.
    """
    if os.path.isabs(name):
        return name if os.path.isfile(name) else None
    for directory in _ld_library_path():
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


def find_cuda_library(stem, wheel_packages=("*",)):
    """Look for the library ``lib<stem>.so*`` (``cudnn``, ``cublas``, ...).

    Search order, first hit wins: an installed CuPy's ``cupy/.data/lib``
    (:func:`cupy_bundled_places`), :func:`library_places` (the toolkit, then
    the pip wheels), each ``LD_LIBRARY_PATH`` directory, then the dynamic
    loader's cache (``ctypes.util.find_library``, resolved to a file).  When a
    directory holds several versions the highest wins.  Nothing is loaded.

    Returns:
        ``(path, looked)``: the path, or ``None`` when nothing was found, and
        the places searched, one line each, for the caller's error message.
    """
    places = itertools.chain(cupy_bundled_places(), library_places(wheel_packages), _ld_library_path_places())
    path, looked = _first_in(places, stem)
    if path:
        return path, looked
    if not any(line.startswith("CuPy's bundled") for line in looked):
        looked.insert(0, "CuPy's bundled libraries: cupy/.data/lib in every sys.path entry (none present)")
    if not any(line.startswith("pip wheel") for line in looked):
        sub = "bin" if _WINDOWS else "lib"
        looked.append("pip wheel: %s in every sys.path entry (none present)"
                      % " and ".join("nvidia/%s/%s" % (p, sub) for p in wheel_packages))
    import ctypes.util  # pulls in subprocess: only when the cheap places failed
    soname = ctypes.util.find_library(stem)
    path = resolve_soname(soname) if soname else None
    if path:
        return path, looked
    looked.append("the loader cache: ctypes.util.find_library(%r) -> %s"
                  % (stem, "%s, but no such file found" % soname if soname else "nothing"))
    return None, looked


def is_nvrtc_builtins(filename):
    """Whether ``filename`` is libnvrtc-builtins, the helper NVRTC loads beside itself."""
    return "nvrtc-builtins" in filename.lower()


def _from_user_path(value, origin):
    """Resolve an NVRTC path the user named (file or directory); raise if it is unusable.

    A path the user gave is never silently replaced by one found elsewhere:
    that would run a different NVRTC than the one they asked for.
    """
    path = os.path.abspath(os.path.expanduser(value))
    if os.path.isfile(path):
        if is_nvrtc_builtins(os.path.basename(path)):
            raise CompilerNotFoundError(
                "%s names %s, which is NVRTC's helper library libnvrtc-builtins, not NVRTC "
                "itself. Point it at libnvrtc.so* in the same directory (or at the "
                "directory). %s" % (origin, path, NVRTC_HOW_TO_FIX))
        return path
    if os.path.isdir(path):
        best = best_in_dir(path, "nvrtc")
        if best:
            return best
        raise CompilerNotFoundError(
            "%s names the directory %s, which holds no %s. %s"
            % (origin, path, "nvrtc64_*.dll" if _WINDOWS else "libnvrtc.so*", NVRTC_HOW_TO_FIX))
    raise CompilerNotFoundError("%s names %s, which does not exist. %s" % (origin, path, NVRTC_HOW_TO_FIX))


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

    # Unlike find_cuda_library, LD_LIBRARY_PATH is consulted only to resolve
    # the loader's answer below, never scanned as a directory list.
    path, tried = _first_in(library_places(_NVRTC_WHEELS), "nvrtc")
    if path:
        return path
    looked = ["the explicit path (none given)", "%s (unset)" % NVRTC_ENV] + tried
    if not any(line.startswith("pip wheel") for line in looked):
        looked.append("pip wheel: nvidia/cuda_nvrtc/lib and nvidia/cu13/lib in every sys.path "
                      "entry (none present)")

    # Imported here, not at the top: ctypes.util pulls in subprocess, which
    # costs every process that finds NVRTC by the cheaper means above.
    import ctypes.util
    soname = ctypes.util.find_library("nvrtc")
    if soname and not is_nvrtc_builtins(soname):
        path = resolve_soname(soname)
        if path:
            return path
        looked.append("ctypes.util.find_library('nvrtc') -> %s, but no such file found" % soname)
    else:
        looked.append("ctypes.util.find_library('nvrtc') (nothing)")
    raise CompilerNotFoundError(
        "NVRTC (%s) not found. Looked in:\n  - %s\n%s"
        % ("nvrtc64_*.dll" if _WINDOWS else "libnvrtc.so*", "\n  - ".join(looked), NVRTC_HOW_TO_FIX))

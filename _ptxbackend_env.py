"""What the start-up hook's two stages and the package share: a leaf that imports nothing of ptxbackend.

Both hook stages (:mod:`_ptxbackend_pth` at every interpreter start, :mod:`_ptxbackend_boot` when CuPy is
imported) and the package read ``PTXBACKEND_DISABLE``, parse sizes and judge whether a directory may
hold what ptxbackend loads through this one module, so they never disagree.  It is imported at every
interpreter start: stdlib only (``os``, ``stat`` and ``sys``, which the interpreter has loaded already),
nothing that could raise at import, and no import of the package or of the other two hook modules.
"""

import os
import stat as _stat  # imported by os already: free
import sys

# The driver's maximum: cuDNN's JIT output alone is hundreds of MB, and a cache too small for a
# library's JIT output makes every process JIT-compile it again (the user story's 30-60 s start).
JIT_CACHE_DEFAULT = 4 << 30
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_DIGITS = frozenset("0123456789")
_SIZE_MAX = 1 << 60
_reported = []
set_by_hook = {}  # variable -> the value the hook gave it: `doctor` tells these from the user's


def disabled():
    """Whether ``PTXBACKEND_DISABLE`` turns ptxbackend off: read here only, so hook and package agree.
    A value that is neither yes nor no is said once (``maybe`` must not pass for "off" unnoticed)."""
    value = os.environ.get("PTXBACKEND_DISABLE", "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value not in ("", "0", "false", "no", "off"):
        report("PTXBACKEND_DISABLE=%r is neither 1 nor 0; the hook stays on" % os.environ["PTXBACKEND_DISABLE"])
    return False


def parse_size(text):
    """``'4G'``, ``'512MiB'``, ``'1.5g'``, ``'1048576'`` -> bytes; ``ValueError`` for anything else.

    Units are binary (K = 1024) and case-insensitive, with an optional ``B`` or ``iB``.  ``0`` means
    "no limit" wherever a size is a limit (docs/configuration.md).  A size is a whole number of bytes:
    a fraction written in bytes (``0.5``) is refused, never taken as 0, and so is a size with a unit
    that comes to less than one byte; with a unit, the part below a byte is dropped (``1.3K`` is 1331).
    """
    value = str(text).strip().upper()
    if value.endswith("IB"):
        value = value[:-2]
    elif value.endswith("B"):
        value = value[:-1]
    unit = value[-1:] if value[-1:] in ("K", "M", "G", "T") else ""
    number = value[:len(value) - len(unit)].strip()
    whole, dot, fraction = number.partition(".")
    if not whole or not _DIGITS.issuperset(whole) or (dot and not (fraction and _DIGITS.issuperset(fraction))):
        raise ValueError("not a size: %r (write e.g. 4G, 512M or a number of bytes)" % (text,))
    if len(whole) > 30:  # more bytes than any disk: said without computing a number of 400 digits
        raise ValueError("not a size: %r is too large (write e.g. 4G)" % (text,))
    digits = fraction.rstrip("0")[:40]  # beyond 40 digits, less than a byte of even a terabyte
    exact_fraction = int(digits or "0") * _SIZE_UNITS[unit]
    size = int(whole) * _SIZE_UNITS[unit] + exact_fraction // 10 ** len(digits)
    if digits and not unit:
        raise ValueError("not a size: %r is a fraction of a byte; write a whole number of bytes, or 0 for "
                         "no limit" % (text,))
    if size == 0 and (int(whole) or digits):
        raise ValueError("not a size: %r is less than one byte; write a whole number of bytes, or 0 for "
                         "no limit" % (text,))
    if size > _SIZE_MAX:  # reports divide it as a float: a larger one overflows there
        raise ValueError("not a size: %r is too large (write e.g. 4G)" % (text,))
    return size


def report(problem):
    """One line on stderr, once per process: the hook must never be noisy."""
    if not _reported:
        _reported.append(problem)
        try:
            sys.stderr.write("ptxbackend: start-up hook: %s (PTXBACKEND_DISABLE=1 turns it off)\n" % problem)
        except Exception:
            pass


def size_jit_cache():
    """Set ``CUDA_CACHE_MAXSIZE`` unless the user did: to ``PTXBACKEND_JIT_CACHE_MAXSIZE`` (at most
    the driver's 4 GiB; 0 leaves the driver's own default) or to :data:`JIT_CACHE_DEFAULT`."""
    environ = os.environ
    if environ.get("CUDA_CACHE_MAXSIZE"):
        return
    raw = environ.get("PTXBACKEND_JIT_CACHE_MAXSIZE", "")
    size = JIT_CACHE_DEFAULT
    if raw.strip():
        try:
            size = min(parse_size(raw), JIT_CACHE_DEFAULT)
        except ValueError:
            report("PTXBACKEND_JIT_CACHE_MAXSIZE=%r is not a size (e.g. 4G); using 4G" % raw)
    if size > 0:
        environ["CUDA_CACHE_MAXSIZE"] = set_by_hook["CUDA_CACHE_MAXSIZE"] = str(size)


def private_dir_problem(path):
    """Why the directory at ``path`` must not hold what ptxbackend loads, or ``None``: it must be a
    directory of yours that group and others cannot write (else anyone could plant files in it).
    Follows a link at ``path`` (see :func:`parents_problem` for whose link it may be); raises
    ``OSError`` when there is nothing at ``path``."""
    st = os.stat(path)
    if not _stat.S_ISDIR(st.st_mode):
        return "cache path %s is not a directory" % path
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return ("cache directory %s belongs to uid %d, not to you (uid %d): refusing to load kernels from "
                "it. Set PTXBACKEND_CACHE_DIR to a directory of your own." % (path, st.st_uid, os.getuid()))
    if st.st_mode & (_stat.S_IWGRP | _stat.S_IWOTH):
        return ("cache directory %s is writable by group or others (mode %o): refusing to load kernels "
                "from it. Run: chmod 700 %s" % (path, st.st_mode & 0o777, path))
    return None


def parents_problem(path):
    """Why someone else could replace the directory at ``path``, or ``None``.

    No level of the path, ``path`` included, may be a symbolic link of another user's (anyone can plant
    one in a sticky ``/tmp``, and its owner chooses where it points); every directory above ``path`` must
    belong to you or root and, unless it is sticky, be writable by no one else: otherwise its owner or
    writers could swap the whole tree between two of our steps.  OpenSSH's StrictModes checks the same.
    """
    if not hasattr(os, "getuid"):
        return None
    me = os.getuid()
    current = os.path.abspath(path)
    while True:
        try:
            link = os.lstat(current)
        except OSError:
            link = None
        if link is not None and _stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
            return ("the cache at %s goes through the symbolic link %s, which belongs to uid %d (not you, "
                    "uid %d, nor root): its owner chooses where it points. Set PTXBACKEND_CACHE_DIR to a "
                    "directory of your own." % (path, current, link.st_uid, me))
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
        try:
            st = os.stat(current)
        except OSError:
            continue
        if st.st_uid not in (me, 0):
            return ("the cache at %s is inside %s, which belongs to uid %d (not you, uid %d, nor root): its "
                    "owner could replace the cache. Set PTXBACKEND_CACHE_DIR to a directory of your own."
                    % (path, current, st.st_uid, me))
        if st.st_mode & (_stat.S_IWGRP | _stat.S_IWOTH) and not st.st_mode & _stat.S_ISVTX:
            return ("the cache at %s is inside %s, which group or others can write (mode %o) and is not "
                    "sticky: they could replace the cache. Run: chmod go-w %s, or set PTXBACKEND_CACHE_DIR "
                    "elsewhere." % (path, current, st.st_mode & 0o7777, current))


def cache_root():
    """The cache directory the settings name: ``$PTXBACKEND_CACHE_DIR``, else ``cache_dir`` of the config
    file, else ``$XDG_CACHE_HOME/ptxbackend`` or ``~/.cache/ptxbackend``."""
    environ = os.environ
    root = environ.get("PTXBACKEND_CACHE_DIR") or _config_cache_dir()
    if not root:
        root = os.path.join(environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                            "ptxbackend")
    return os.path.expanduser(root)


def _config_cache_dir():
    """``cache_dir`` from the config file (``$PTXBACKEND_CONFIG``, else, on Linux, the XDG place
    platformdirs gives: ``$XDG_CONFIG_HOME`` or ``~/.config``, then ``ptxbackend/config.ini``), when that
    file exists and only you or root can change it; else ``None``.  One ``open`` that fails on a machine
    without one; the package reads the file in full and reports its problems."""
    path = os.environ.get("PTXBACKEND_CONFIG")
    if not path:
        if not sys.platform.startswith("linux"):
            return None
        path = os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"),
                            "ptxbackend", "config.ini")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode) or st.st_uid not in (os.getuid(), 0) or st.st_size > 1 << 16 \
                or st.st_mode & (_stat.S_IWGRP | _stat.S_IWOTH):
            return None
        text = os.read(fd, 1 << 16).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    section = None
    for line in text.lstrip("\ufeff").splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == "ptxbackend" and "=" in line and not line.startswith(("#", ";")):
            name, _, value = line.partition("=")
            if name.strip().lower() == "cache_dir" and value.strip():
                return value.strip()
    return None


def use_imported_jit_cache():
    """Point the driver at the JIT cache ``ptxbackend cache import`` installed, unless the user chose one.

    Only when that directory exists (one ``stat``): a machine without an imported set keeps the
    driver's own default cache.  The place is ``$PTXBACKEND_CACHE_DIR/driver-jit``, or the default
    cache directory's (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``ptxbackend/driver-jit``).
    """
    environ = os.environ
    if environ.get("CUDA_CACHE_PATH"):
        return
    root = cache_root()
    candidate = os.path.join(root, "driver-jit")
    if os.path.isdir(candidate):
        # The driver reads JIT output from there into every process: the rules ptxbackend applies to
        # its own cache (whose directory is it, who could swap it) come first, or another user's
        # directory would serve this user's GPU code.
        why = private_dir_problem(candidate) or parents_problem(candidate)  # the root is a parent
        if why:
            report("the driver JIT cache is left at the driver's default: %s" % why)
            return
        environ["CUDA_CACHE_PATH"] = set_by_hook["CUDA_CACHE_PATH"] = candidate


def active():
    """Whether a ptxbackend import hook (the placeholder or the CuPy watcher) is registered here."""
    return any(getattr(finder, "ptxbackend_watcher", False) for finder in sys.meta_path)

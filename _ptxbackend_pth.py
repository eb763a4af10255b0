"""The start-up hook's first stage, and the one home of what the hook and the package share.

``ptxbackend.pth`` imports this module and calls :func:`install` in every
Python process of the environment, pip's included, so it only sizes the
driver's JIT cache (``CUDA_CACHE_MAXSIZE``, read by libcuda when it
initialises) and registers a placeholder finder; :mod:`_ptxbackend_boot` is
imported only when CuPy is.  Imported from its ``.pyc`` (pip compiles it on
install), this costs a fraction of a millisecond.  Importing it does nothing
else, so the package can take :func:`disabled`, :func:`parse_size` and
:data:`JIT_CACHE_DEFAULT` from here; nothing here lets an error escape
:func:`install`: the interpreter must start whatever happens.
"""

import os
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

    Units are binary (K = 1024) and case-insensitive, with an optional ``B`` or ``iB``.
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
    try:
        size = int(whole) * _SIZE_UNITS[unit] if not dot else int(float(number) * _SIZE_UNITS[unit])
    except OverflowError:  # hundreds of digits: float() gives inf, int(inf) overflows
        size = _SIZE_MAX + 1
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


def use_imported_jit_cache():
    """Point the driver at the JIT cache ``ptxbackend cache import`` installed, unless the user chose one.

    Only when that directory exists (one ``stat``): a machine without an imported set keeps the
    driver's own default cache.  The place is ``$PTXBACKEND_CACHE_DIR/driver-jit``, or the default
    cache directory's (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``ptxbackend/driver-jit``).
    """
    environ = os.environ
    if environ.get("CUDA_CACHE_PATH"):
        return
    root = environ.get("PTXBACKEND_CACHE_DIR")
    if not root:
        root = os.path.join(environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                            "ptxbackend")
    candidate = os.path.join(os.path.expanduser(root), "driver-jit")
    if os.path.isdir(candidate):
        environ["CUDA_CACHE_PATH"] = set_by_hook["CUDA_CACHE_PATH"] = candidate


def _boot():
    try:
        import _ptxbackend_boot as boot
        boot.start, boot.CupyWatcher  # an empty or truncated module fails here, once
        return boot
    except ImportError:
        return None
    except Exception as exc:
        sys.modules["_ptxbackend_boot"] = None
        report("cannot load _ptxbackend_boot (%s: %s); reinstall ptxbackend"
               % (type(exc).__name__, str(exc).replace("\n", " ")))


class PtxbackendPlaceholder(object):
    """Stands in for _ptxbackend_boot's watcher until ``cupy.cuda`` is imported."""

    ptxbackend_watcher = True

    def find_spec(self, name, path=None, target=None):
        if name not in ("cupy.cuda", "cupy.cuda.compiler"):
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        boot = _boot()
        if boot is None:
            return None
        boot.start()
        return boot.CupyWatcher().find_spec(name, path, target)


def install():
    """What ptxbackend.pth and ptxbackend.start run at interpreter start.  Idempotent; never raises."""
    try:
        if disabled() or any(getattr(f, "ptxbackend_watcher", False) for f in sys.meta_path):
            return
        size_jit_cache()
        use_imported_jit_cache()
        sys.meta_path.insert(0, PtxbackendPlaceholder())
    except Exception as exc:
        report("%s: %s" % (type(exc).__name__, exc))

"""ptxbackend's start-up hook, run through ``ptxbackend.pth`` in every Python process.

It runs in every interpreter of the environment, pip's included, so it does
almost nothing: it sizes the driver's JIT cache (an environment variable libcuda
reads when it initialises) and registers an import hook that hands
``cupy.cuda`` and ``cupy.cuda.compiler`` to ptxbackend once they have finished
importing.  It never imports CuPy, and it never lets an error escape: the
interpreter must start whatever happens here.  At most one line goes to stderr
per process.

Importing this module at every start would cost about a millisecond, so the
``.pth`` line imports the much smaller :mod:`_ptxbackend_pth`, which sets the
cache size and registers a placeholder finder that imports this module only
when CuPy is imported.  :func:`pth_line` renders that line; ``ptxbackend.pth``
must equal it (a test checks).

This is a top-level module, not part of the ``ptxbackend`` package, so that
the hook never imports the package before CuPy is imported.
"""

import os
import sys

WATCHED = ("cupy.cuda.compiler", "cupy.cuda")

# The .pth line.  site prints a traceback for a line that raises: a missing _ptxbackend_pth
# (a half-removed install) stays silent, anything else is one line on stderr, once (site may
# read the same site-packages twice, through lib and lib64: the None makes the second silent).
_PTH_CODE = ("try:\n    import _ptxbackend_pth\nexcept ImportError:\n    pass\nexcept Exception as exc:\n"
             "    sys.modules['_ptxbackend_pth'] = None\n"
             "    sys.stderr.write('ptxbackend: start-up hook: cannot load _ptxbackend_pth (%s: %s); "
             "reinstall ptxbackend\\n' % (type(exc).__name__, exc))\n")


def pth_line():
    """The one line of ptxbackend.pth: site executes lines that start with ``import``."""
    return "import sys; exec(%r, {'sys': sys})\n" % _PTH_CODE


JIT_CACHE_DEFAULT = 4 << 30  # the driver's maximum: cuDNN's JIT output alone is hundreds of MB
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_reported = []


def _report(problem):
    """One line on stderr, once per process: the hook must never be noisy."""
    if not _reported:
        _reported.append(problem)
        try:
            sys.stderr.write("ptxbackend: start-up hook: %s (PTXBACKEND_DISABLE=1 turns it off)\n" % problem)
        except Exception:
            pass


def disabled():
    return os.environ.get("PTXBACKEND_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")


def _parse_size(text):
    text = text.strip().upper()
    for suffix in ("IB", "B"):
        if text.endswith(suffix):
            text = text[:-len(suffix)]
    unit = text[-1:] if text[-1:] in _UNITS else ""
    number = text[:-1] if unit else text
    if not number.isdigit():
        raise ValueError(text)
    return int(number) * _UNITS[unit]


def size_jit_cache():
    """Set CUDA_CACHE_MAXSIZE unless the user did: a cache too small for a library's JIT
    output makes every process JIT-compile it again (the user story's 30-60 s cuDNN start)."""
    if os.environ.get("CUDA_CACHE_MAXSIZE"):
        return
    raw = os.environ.get("PTXBACKEND_JIT_CACHE_MAXSIZE", "")
    size = JIT_CACHE_DEFAULT
    if raw.strip():
        try:
            size = min(_parse_size(raw), JIT_CACHE_DEFAULT)
        except ValueError:
            _report("PTXBACKEND_JIT_CACHE_MAXSIZE=%r is not a size (e.g. 4G); using 4G" % raw)
    if size > 0:
        os.environ["CUDA_CACHE_MAXSIZE"] = str(size)


def _hand_over(module):
    try:
        from ptxbackend import cupy_integration
        cupy_integration.on_import(module)
    except Exception as exc:
        _report("could not take over %s: %s: %s" % (module.__name__, type(exc).__name__, exc))


class _HandOverLoader(object):
    """Wraps CuPy's own loader: runs it, then hands the finished module to ptxbackend."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create else None

    def exec_module(self, module):
        self._loader.exec_module(module)
        _hand_over(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class CupyWatcher(object):
    """A meta-path finder that only ever answers for the modules in WATCHED."""

    ptxbackend_watcher = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in WATCHED:
            return None
        try:
            for finder in sys.meta_path:
                if getattr(finder, "ptxbackend_watcher", False):
                    continue
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if find else None
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _HandOverLoader(spec.loader)
                    return spec
        except Exception as exc:
            _report("import hook for %s failed: %s" % (fullname, exc))
        return None


def active():
    """Whether the import hook is registered in this interpreter."""
    return any(getattr(finder, "ptxbackend_watcher", False) for finder in sys.meta_path)


def start():
    """Entry point of ptxbackend.pth and ptxbackend.start.  Idempotent; never raises."""
    try:
        if disabled() or active():
            return
        size_jit_cache()
        sys.meta_path.insert(0, CupyWatcher())
    except Exception as exc:
        _report("%s: %s" % (type(exc).__name__, exc))

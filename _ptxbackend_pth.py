"""The start-up hook's first stage: what ``ptxbackend.pth`` (and ``ptxbackend.start``) run.

It runs in every Python process of the environment, pip's included, so it only sizes the driver's
JIT cache (``CUDA_CACHE_MAXSIZE``, read by libcuda when it initialises), points the driver at an
imported JIT cache, and registers a placeholder finder; :mod:`_ptxbackend_boot` is imported only
when CuPy is.  Imported from its ``.pyc`` (pip compiles it on install), with the leaf
:mod:`_ptxbackend_env` it shares with the second stage and the package, this costs a fraction of a
millisecond.  Nothing here lets an error escape :func:`install`: the interpreter must start
whatever happens.
"""

import sys

# parse_size stays reachable from here, where 0.4 kept it.
from _ptxbackend_env import active, disabled, parse_size, report, size_jit_cache, use_imported_jit_cache  # noqa: F401


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
        if disabled() or active():
            return
        size_jit_cache()
        use_imported_jit_cache()
        sys.meta_path.insert(0, PtxbackendPlaceholder())
    except Exception as exc:
        report("%s: %s" % (type(exc).__name__, exc))

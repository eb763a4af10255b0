"""What ``ptxbackend.pth`` runs at every interpreter start, kept as small as it can be.

It runs in every Python process of the environment, pip's included, so it only
sizes the driver's JIT cache (``CUDA_CACHE_MAXSIZE``, read by libcuda when it
initialises) and registers a placeholder finder; :mod:`_ptxbackend_boot` is
imported only when CuPy is.  Imported from its ``.pyc`` (pip compiles it on
install), this costs a fraction of a millisecond, where compiling the same code
from a string at each start cost about a millisecond.  It never lets an error
escape: the interpreter must start whatever happens here.
"""

import os
import sys


def _boot():
    try:
        import _ptxbackend_boot as boot
        boot.start, boot.CupyWatcher  # an empty or truncated module fails here, once
        return boot
    except ImportError:
        return None
    except Exception as exc:
        sys.modules["_ptxbackend_boot"] = None
        sys.stderr.write("ptxbackend: start-up hook: cannot load _ptxbackend_boot (%s: %s); reinstall "
                         "ptxbackend\n" % (type(exc).__name__, str(exc).replace("\n", " ")))


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
    """Entry point of ptxbackend.pth (by import) and ptxbackend.start.  Idempotent; never raises."""
    try:
        environ = os.environ
        if environ.get("PTXBACKEND_DISABLE", "").strip().lower() in ("1", "true", "yes", "on") \
                or any(getattr(f, "ptxbackend_watcher", False) for f in sys.meta_path):
            return
        if environ.get("PTXBACKEND_JIT_CACHE_MAXSIZE"):
            boot = _boot()  # a size to parse, and to report once if it is wrong
            if boot is not None:
                boot.start()
            return
        if not environ.get("CUDA_CACHE_MAXSIZE"):
            environ["CUDA_CACHE_MAXSIZE"] = "4294967296"  # the driver's maximum, as _ptxbackend_boot
        sys.meta_path.insert(0, PtxbackendPlaceholder())
    except Exception as exc:
        try:
            sys.stderr.write("ptxbackend: start-up hook: %s: %s (PTXBACKEND_DISABLE=1 turns it off)\n"
                             % (type(exc).__name__, exc))
        except Exception:
            pass


install()

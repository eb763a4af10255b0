"""The start-up hook's second stage: the import hook that hands CuPy to ptxbackend.

:class:`CupyWatcher` hands ``cupy.cuda`` and ``cupy.cuda.compiler`` to
ptxbackend once they have finished importing.  It never imports CuPy, and it
never lets an error escape: at most one line goes to stderr per process.

Importing this module at every interpreter start would cost about a
millisecond, so ``ptxbackend.pth`` runs the much smaller :mod:`_ptxbackend_pth`
(which sizes the driver's JIT cache and registers a placeholder finder), and
this module is imported only when CuPy is.  :func:`pth_line` renders the
``.pth`` line; ``ptxbackend.pth`` must equal it (a test checks).

This is a top-level module, not part of the ``ptxbackend`` package, so that
the hook never imports the package before CuPy is imported.  It imports the
leaf :mod:`_ptxbackend_env`, never the first stage (which imports this one).
"""

import sys

import _ptxbackend_env

# cupy.cuda.cudnn: Chainer 1.24's cuDNN module, whose convolution algorithm choice is steered
# (ptxbackend.hook.cudnn_steering); imported after cupy.cuda, so the watcher is in place by then.
WATCHED = ("cupy.cuda.compiler", "cupy.cuda", "cupy.cuda.cudnn")

# The .pth line.  site prints a traceback for a line that raises: a missing _ptxbackend_pth
# (a half-removed install) stays silent, anything else is one line on stderr, once (site may
# read the same site-packages twice, through lib and lib64: the None makes the second silent).
# install() never raises, but a truncated module may lack it: that is a damaged install too.
# Compiling this text is part of every interpreter's start: it is kept to one statement per line.
_PTH_CODE = ("try:import _ptxbackend_pth as m;m.install()\n"
             "except ImportError:pass\n"
             "except Exception as e:sys.modules['_ptxbackend_pth']=None;sys.stderr.write("
             "'ptxbackend: start-up hook: cannot load _ptxbackend_pth (%s: %s); reinstall ptxbackend\\n'"
             "%(type(e).__name__,e))\n")


def pth_line():
    """The one line of ptxbackend.pth: site executes lines that start with ``import``."""
    return "import sys; exec(%r, {'sys': sys})\n" % _PTH_CODE


report = _ptxbackend_env.report
disabled = _ptxbackend_env.disabled
active = _ptxbackend_env.active


def _hand_over(module):
    try:
        if module.__name__ == "cupy.cuda.cudnn":
            from ptxbackend.hook import cudnn_steering
            cudnn_steering.on_import(module)
            return
        from ptxbackend.hook import cupy_integration
        cupy_integration.on_import(module)
    except Exception as exc:
        report("could not take over %s: %s: %s" % (module.__name__, type(exc).__name__, exc))


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
            report("import hook for %s failed: %s" % (fullname, exc))
        return None


def start():
    """Register the import hook now (``ptxbackend.install()``; the placeholder that
    :mod:`_ptxbackend_pth` registers calls this when CuPy is imported).  Idempotent; never raises."""
    try:
        if disabled() or active():
            return
        _ptxbackend_env.size_jit_cache()
        _ptxbackend_env.use_imported_jit_cache()
        sys.meta_path.insert(0, CupyWatcher())
    except Exception as exc:
        report("%s: %s" % (type(exc).__name__, exc))

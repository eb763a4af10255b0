"""Chainer 1.24's cuDNN convolutions steered to algorithms verified good on this GPU.

Chainer 1.24 asks ``cupy.cuda.cudnn.getConvolution{Forward,BackwardData,BackwardFilter}Algorithm`` for
an algorithm (cuDNN's heuristic), or fixes one (``deterministic``), and hands it to
``convolutionForward`` / ``convolutionBackwardData_v3`` / ``convolutionBackwardFilter_v3``; all are
looked up on the module at call time.  When ``cupy.cuda.cudnn`` has been imported, these six are
wrapped: an algorithm that ``warm --libs cudnn``'s self-test did not find good for this library, GPU
and data type is replaced by one that it did (:mod:`ptxbackend.gpu.cudnn_algos`).  Without verdicts for
the library and GPU in use, nothing changes (``doctor`` says so).  ``PTXBACKEND_CUDNN_STEERING=0`` turns
it off.  Newer CuPy (whose cuDNN API has other names) is left alone.
"""

import functools
import logging
import os
import sys

from ..gpu import cudnn_algos

log = logging.getLogger("ptxbackend")

MODULE = "cupy.cuda.cudnn"
_MARK = "_ptxbackend_cudnn_original"
# name -> (direction, where the descriptors are: the one giving the data type, then the four
# cudnnGetConvolution*WorkspaceSize takes; the algorithm's index; the workspace limit's index)
_CHOOSERS = {
    "getConvolutionForwardAlgorithm": ("forward", 1, (1, 2, 3, 4), 6),
    "getConvolutionBackwardDataAlgorithm": ("backward_data", 2, (1, 2, 3, 4), 6),
    "getConvolutionBackwardFilterAlgorithm": ("backward_filter", 1, (1, 2, 3, 4), 6),
}
# name -> (direction, dtype descriptor index, workspace-size descriptor indexes, algo index, limit index)
_RUNNERS = {
    "convolutionForward": ("forward", 2, (2, 4, 6, 11), 7, 9),
    "convolutionBackwardData_v3": ("backward_data", 4, (2, 4, 6, 11), 7, 9),
    "convolutionBackwardFilter_v3": ("backward_filter", 2, (2, 4, 6, 11), 7, 9),
}

_state = {"steering": None, "why": None}


def enabled():
    return os.environ.get("PTXBACKEND_CUDNN_STEERING", "1").strip().lower() not in ("0", "off", "no", "false")


def loaded_library():
    """The libcudnn this process mapped (the one Chainer's module linked), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if os.path.basename(path).startswith("libcudnn.so"):
                    return path
    except OSError:
        return None
    return None


def _device_identity():
    return cudnn_algos.device_identity()


def _meta_dir():
    from ..config import load_settings
    from ..cache.stores import open_store
    return open_store(load_settings()).meta_dir


def steering():
    """This process's :class:`cudnn_algos.Steering`, made at the first convolution; None when there is
    nothing to steer by (``_state['why']`` says why)."""
    if _state["steering"] is not None or _state["why"] is not None:
        return _state["steering"]
    try:
        path = loaded_library()
        if path is None:
            _state["why"] = "libcudnn is not loaded"
            return None
        library = cudnn_algos.library_identity(path)
        device = _device_identity()
        entry = cudnn_algos.find_entry(cudnn_algos.load(_meta_dir()), library, device)
        if entry is None:
            _state["why"] = ("no self-test verdicts for %s on %s: run `ptxbackend warm --libs cudnn`"
                             % (library["path"], device["name"]))
            return None
        _state["steering"] = cudnn_algos.Steering(cudnn_algos.Library(path), cudnn_algos.good_algorithms(entry))
    except Exception as exc:  # never break the user's convolution for our bookkeeping
        _state["why"] = "%s: %s" % (type(exc).__name__, exc)
        log.warning("ptxbackend: cuDNN algorithm steering is off: %s", _state["why"])
    return _state["steering"]


def _wrap_chooser(original, spec):
    direction, dtype_at, ws_at, limit_at = spec

    @functools.wraps(original)
    def choose(*args, **kwargs):
        algo = original(*args, **kwargs)
        steer = steering() if not kwargs else None
        if steer is None:
            return algo
        return steer.choose(direction, algo, args[dtype_at], args[0], *[args[i] for i in ws_at],
                            workspace_limit=args[limit_at])
    setattr(choose, _MARK, original)
    return choose


def _wrap_runner(original, spec):
    direction, dtype_at, ws_at, algo_at, limit_at = spec

    @functools.wraps(original)
    def run(*args, **kwargs):
        steer = steering() if not kwargs and len(args) > algo_at else None
        if steer is not None:
            algo = steer.choose(direction, args[algo_at], args[dtype_at], args[0], *[args[i] for i in ws_at],
                                workspace_limit=args[limit_at])
            if algo != args[algo_at]:
                args = args[:algo_at] + (algo,) + args[algo_at + 1:]
        return original(*args, **kwargs)
    setattr(run, _MARK, original)
    return run


def on_import(module):
    """Wrap the module's algorithm choice and convolution calls (the start-up hook calls this once
    ``cupy.cuda.cudnn`` has executed).  Idempotent; a module without these names is left alone."""
    if not enabled() or not hasattr(module, "getConvolutionForwardAlgorithm"):
        return False
    for table, wrap in ((_CHOOSERS, _wrap_chooser), (_RUNNERS, _wrap_runner)):
        for name, spec in table.items():
            current = getattr(module, name, None)
            if current is not None and not hasattr(current, _MARK):
                setattr(module, name, wrap(current, spec))
    return True


def uninstall():
    module = sys.modules.get(MODULE)
    for name in list(_CHOOSERS) + list(_RUNNERS):
        current = getattr(module, name, None)
        if hasattr(current, _MARK):
            setattr(module, name, getattr(current, _MARK))


def reset():
    """Forget this process's verdicts (tests; after `warm --libs cudnn` in the same process)."""
    _state.update(steering=None, why=None)


def status():
    """For doctor, in a process that imported Chainer's cuDNN module: wrapped or not, and what was steered."""
    module = sys.modules.get(MODULE)
    wrapped = [n for n in list(_CHOOSERS) + list(_RUNNERS) if hasattr(getattr(module, n, None), _MARK)]
    steer = _state["steering"]
    return {"wrapped": wrapped, "why_not": _state["why"],
            "steered": sorted("%s %s %s->%s x%d" % (k[0], k[1], k[2], k[3], n)
                              for k, n in (steer.counts.items() if steer else ()))}

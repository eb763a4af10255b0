"""Which compiler a request uses, what it is, and which target it builds for this GPU.

Discovery and probing are remembered per process (and the identity on disk, by stat, in the
compiler module); each call re-checks the identity's sentinel files with a stat.  With
``PTXBACKEND_COMPILER_CHECK=command`` a process also runs the compiler's version probe once, which
sees a toolkit or host compiler swapped behind an unchanged wrapper script.
"""

import logging
import os

from . import image as image_step
from ..compilers import COMPILERS, get_compiler
from ..errors import CompilerNotFoundError, DriverError, TargetError
from ..state import state
from ..cache.stores import open_cache
from .targets import choose_target, parse_cc

log = logging.getLogger("ptxbackend")


def _compiler(settings, kind, store):
    kind = kind or settings.compiler
    marker = (kind, settings.nvcc, settings.nvrtc, os.environ.get("PATH"), os.environ.get("CUDA_PATH"),
              os.environ.get("CUDA_HOME"), store.meta_dir)
    with state.lock:
        found = state.compilers.get(marker)
    if found is None or not found.identity.unchanged():
        # First use, or a file that does the work changed (a toolkit swapped behind a wrapper,
        # an NVRTC updated in place): find and probe again.
        memo = os.path.join(store.meta_dir, "compilers")
        found = get_compiler(kind, settings.nvcc, settings.nvrtc, memo)
        if settings.compiler_check == "command" and not found.answers_as_probed():
            log.debug("ptxbackend: %s no longer answers as probed; probing it again", found.identity.path)
            found = get_compiler(kind, settings.nvcc, settings.nvrtc, None)
        with state.lock:
            state.compilers[marker] = found
    return found


def forget_compilers():
    with state.lock:
        state.compilers.clear()
        state.prepared.clear()
        state.choices.clear()
        state.settled.clear()


def _explicit_compiler(settings, compiler):
    """Whether the user named a compiler (argument, variable or config file): then it must work."""
    return bool(compiler or settings.compiler or settings.nvcc or settings.nvrtc)


def prepare(settings, compiler):
    """``(store, compiler, None)`` for these settings, or ``(store, None, CompilerNotFoundError)``.

    Remembered per Settings object, which config renews whenever a variable it
    depends on (PATH included) or the config file changes; the compiler's
    identity is re-checked on every call (a stat of each file that does the
    work).  A missing compiler is not remembered: one installed later is
    found on the next call.  A compiler the user named that cannot be used is
    an error, never a reason to serve whatever the cache holds.
    """
    marker = (settings, compiler)
    found = state.prepared.get(marker)
    if found is not None and found[1].identity.unchanged():
        return found
    store = open_cache(settings)
    try:
        found = (store, _compiler(settings, compiler, store), None)
    except CompilerNotFoundError as missing:
        if _explicit_compiler(settings, compiler):
            raise
        return store, None, missing
    _check_other_named(settings, found[1].kind)
    with state.lock:
        if len(state.prepared) >= 256:
            state.prepared.clear()
        state.prepared[marker] = found
    return found


def _check_other_named(settings, used):
    """A compiler named by PTXBACKEND_NVCC / PTXBACKEND_NVRTC must exist even when the other one is
    used (docs/configuration.md): a typo in it would otherwise be found only on another machine."""
    for kind, variable in (("nvcc", "PTXBACKEND_NVCC"), ("nvrtc", "PTXBACKEND_NVRTC")):
        named = getattr(settings, kind)
        if kind != used and named and not os.path.exists(os.path.expanduser(named)):
            raise CompilerNotFoundError(
                "%s names %s, which does not exist (%s is used here, but a named compiler that cannot be "
                "used is an error). Fix the path, or unset %s." % (
                    _where(settings, kind, variable), named, used, variable))


def _where(settings, kind, variable):
    origin = settings.origins.get(kind)
    return variable if origin in (variable, None) else "%s (from %s)" % (kind, origin)


def choose(spec, comp, cc):
    """choose_target(), remembered per (spec, compiler, device): the hit path asks every time."""
    marker = (str(spec), comp, cc)  # comp itself: the dict keeps it alive, so no id is reused
    chosen = state.choices.get(marker)
    if chosen is None:
        chosen = choose_target(spec, comp.identity, cc)
        with state.lock:
            state.choices[marker] = chosen
    return chosen


def other_compiler_hint(settings, compiler, comp, store, cc):
    """When the compiler chosen for the user cannot build for this GPU, name one here that can."""
    if compiler or settings.compiler:
        return ""  # the user chose it: say what is wrong with it, not what else there is
    for kind in COMPILERS:
        if kind == comp.kind:
            continue
        try:
            other = get_compiler(kind, settings.nvcc, settings.nvrtc, os.path.join(store.meta_dir, "compilers"))
            chosen, _reason = choose_target(settings.target, other.identity, cc)
        except (CompilerNotFoundError, TargetError):
            continue
        if chosen.output_kind in other.output_kinds:
            return ("\n%s %s at %s can build %s for it: set PTXBACKEND_COMPILER=%s." % (
                kind, other.identity.version, other.identity.path, chosen, kind))
    return ""


def device_compute_capability(settings):
    """The compute capability to build for: argument or PTXBACKEND_DEVICE_CC, else the current GPU's."""
    if settings.device_cc is not None:
        return parse_cc(settings.device_cc)
    try:
        return image_step.current_device_cc()
    except DriverError:  # no driver, no device: what driver.available() would say, one call cheaper
        return None

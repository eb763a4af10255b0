"""CuPy integration: CuPy's kernel compiles go through ptxbackend.

Each CuPy generation funnels every kernel through one function, looked up by
attribute at call time, so replacing that attribute is enough:

- Chainer 1.x's bundled CuPy (nvcc): ``cupy.cuda.compiler.compile_with_cache``
  and its re-export ``cupy.cuda.compile_with_cache`` (what ``cupy/core`` calls);
- CuPy v2-v9 (NVRTC): the same two names;
- CuPy v10+: ``cupy.cuda.compiler._compile_module_with_cache``.

The replacement builds for ptxbackend's target instead of the ``arch`` CuPy
passes and returns CuPy's own ``function.Module``.  Calls needing something
ptxbackend does not do (jitify, name expressions, relocatable device code, a
compiler log, LTO IR, HIP) go to CuPy's original function, and so does any call
ptxbackend fails to serve: a kernel stock CuPy would have run must still run.
A ptxbackend configuration error is one warning, and CuPy's own function then
serves every call of that process.  Where CuPy 9+ would build
such a kernel as SASS the GPU cannot run, it is switched to PTX first.

Importing this module never imports CuPy.
"""

import functools
import hashlib
import importlib
import inspect
import logging
import os
import sys

# The start-up hook's own reading of PTXBACKEND_DISABLE, so the two never disagree.
from _ptxbackend_env import disabled as _disabled

from ..gpu import driver
from ..compiling import engine
from ..compiling import image as image_step
from ..config import compile_settings, load_settings
from ..errors import ConfigError, PtxBackendError, TargetError

log = logging.getLogger("ptxbackend")

_COMPILER = "cupy.cuda.compiler"
_PACKAGE = "cupy.cuda"
_CANDIDATES = ((_COMPILER, "_compile_module_with_cache"), (_COMPILER, "compile_with_cache"),
               (_PACKAGE, "compile_with_cache"))
_MARK = "_ptxbackend_original"  # on a replacement: the function it replaced
_RDC_FLAGS = ("--device-c", "-dc", "-rdc=true", "--relocatable-device-code=true")
# Arguments the replacement knows how to honour (or may ignore: arch, cache_dir, extra_source).
_UNDERSTOOD = frozenset(("source", "options", "arch", "cache_dir", "extra_source", "backend",
                         "enable_cooperative_groups", "name_expressions", "log_stream", "jitify",
                         "to_ltoir"))
_warned = set()




def _is_ours(obj):
    return getattr(obj, _MARK, None) is not None


def generation(compiler_module):
    """``'v1'``, ``'v2-v9'``, ``'v10+'`` for a ``cupy.cuda.compiler`` module, else ``None``."""
    if compiler_module is None:
        return None
    if hasattr(compiler_module, "_compile_module_with_cache"):
        return "v10+"
    if not hasattr(compiler_module, "compile_with_cache"):
        return None
    return "v1" if callable(getattr(compiler_module, "nvcc", None)) else "v2-v9"


def _entry_point(gen):
    return "_compile_module_with_cache" if gen == "v10+" else "compile_with_cache"


# --------------------------------------------------------------------------- the replacement

def _unknown_parameters(signature):
    """``(name, default)`` of each parameter ptxbackend does not understand, worked out once."""
    unknown = []
    for name, param in signature.parameters.items():
        if name not in _UNDERSTOOD:
            unknown.append((name, {param.VAR_POSITIONAL: (), param.VAR_KEYWORD: {}}.get(param.kind,
                                                                                     param.default)))
    return tuple(unknown)


def _binder(signature):
    """A function ``(args, kwargs) -> {name: value}`` with every default applied.

    ``Signature.bind`` costs 6.8 microseconds per kernel on the CPU VM (the dict 0.7), a fifth of a
    warm hit's ``compile()``; a dict does the same job for the signatures CuPy has had (positional-or-keyword, then
    keyword-only in v9+, ``**kwargs`` in tests).  Anything else (positional-only, ``*args``) uses
    ``bind``.
    """
    params = list(signature.parameters.values())
    if any(p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL) for p in params):
        def bind(args, kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return bound.arguments
        return bind
    names = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
    keyword_only = frozenset(p.name for p in params if p.kind is p.KEYWORD_ONLY)
    rest = [p.name for p in params if p.kind is p.VAR_KEYWORD]
    rest = rest[0] if rest else None
    defaults = dict((p.name, p.default) for p in params
                    if p.default is not p.empty and p.kind is not p.VAR_KEYWORD)
    required = len(names) + len(keyword_only)

    def bind(args, kwargs):
        if len(args) > len(names):
            raise TypeError("too many positional arguments")
        call = dict(defaults)
        call.update(zip(names, args))
        extra = {}
        for name, value in kwargs.items():
            if name in keyword_only:
                call[name] = value
            elif name in names:
                if names.index(name) < len(args):
                    raise TypeError("multiple values for argument %r" % name)
                call[name] = value
            elif rest is not None:
                extra[name] = value
            else:
                raise TypeError("got an unexpected keyword argument %r" % name)
        if len(call) != required:
            raise TypeError("missing a required argument: %r"
                            % [n for n in names + tuple(sorted(keyword_only)) if n not in call][0])
        if rest is not None:
            call[rest] = extra
        return call
    return bind


def _needs_cupy(compiler_module, unknown, call):
    """Why this call must go to CuPy's own function, or ``None`` when ptxbackend can serve it."""
    options = tuple(call.get("options") or ())
    for name, default in unknown:
        value = call.get(name, default)
        if value is not default and value != default:
            return "argument %s=%r is unknown to ptxbackend" % (name, call[name])
    runtime = getattr(compiler_module, "runtime", None)
    reasons = (
        ("jitify", call.get("jitify") or "-DCUPY_USE_JITIFY" in options),
        ("name_expressions", call.get("name_expressions")),
        ("cooperative groups (relocatable device code and cudadevrt)", call.get("enable_cooperative_groups")),
        ("relocatable device code (cudadevrt)", any(o in _RDC_FLAGS for o in options)),
        ("a log_stream", call.get("log_stream") is not None),
        ("LTO IR output", call.get("to_ltoir")),
        ("backend=%r" % (call.get("backend"),), call.get("backend", "nvrtc") not in ("nvrtc", "nvcc")),
        ("HIP", getattr(runtime, "is_hip", False)),
    )
    for reason, applies in reasons:
        if applies:
            return reason
    return None


def _nvrtc_major(compiler_module):
    try:
        return compiler_module._get_nvrtc_version()[0]
    except Exception:
        return 12  # CuPy v14 runs only on CUDA >= 12, and v12/v13 decide by this very version


def _cupy_flag(name):
    """A boolean environment variable read the way CuPy reads it: on only when ``int(value) == 1``."""
    value = os.environ.get(name)
    if not value:
        return False
    try:
        return int(value) == 1
    except ValueError:
        return False


def _cupy_options(compiler_module, gen, kind):
    """The options CuPy adds inside the function replaced, except its architecture flag."""
    if gen == "v1":
        return ()  # Chainer 1.x adds only `--cubin -arch sm_XY` (and Windows-only host flags)
    added = ("-ftz=true",)
    if _cupy_flag("CUPY_CUDA_COMPILE_WITH_DEBUG"):
        added += ("--device-debug", "--generate-line-info")
    include_options = getattr(compiler_module, "_get_extra_include_dir_opts", None)
    if gen == "v10+" and include_options is not None:
        # CuPy 13 with CUDA >= 12.2 from conda or NVIDIA's wheels: no option CuPy passes down names the
        # CUDA headers its kernels include (cuda_fp16.h); without them every kernel would fail here.
        added += tuple(include_options())
    if gen == "v10+" and kind == "nvrtc" and _nvrtc_major(compiler_module) >= 12:
        # CuPy v12+ passes this to NVRTC >= 12 (every non-jitify compile in v14): its
        # kernels call functions that carry no __device__ annotation.
        added += ("--device-as-default-execution-space",)
    return added


def _use_cupy_context(compiler_module):
    """Make CuPy's context for its current device current, as CuPy itself does before a load.

    CuPy creates contexts lazily; ptxbackend reads the device from the current
    context and JIT-links in it, so without this it could pick device 0.  When
    a context of CuPy's current device is current already (every kernel after
    the first), nothing is called: ``cudaMemGetInfo`` asks the driver (13.7 us a
    kernel on the H200), the two questions here do not.
    """
    runtime = getattr(compiler_module, "runtime", None)  # v7+; older ones: the cupy.cuda.runtime module
    if runtime is None:
        runtime = importlib.import_module("cupy.cuda.runtime")
    try:
        if driver.context_device() == runtime.getDevice():
            return
    except Exception:  # no getDevice (a CuPy this was not written for), no driver: ask CuPy, as always
        pass
    runtime.memGetInfo()


def _load(compiler_module, artifact):
    """CuPy's own ``function.Module`` holding ``artifact`` (the JIT cubin for PTX)."""
    def load_image(image, kind):
        data = bytes(image)
        if kind == "ptx":
            data = data.rstrip(b"\0") + b"\0"  # CuPy hands the bytes to the driver as a C string
        module = compiler_module.function.Module()
        module.load(data)
        return module
    return image_step.load(artifact, load_image)


def _serve(compiler_module, gen, call):
    backend = "nvcc" if gen == "v1" else (call.get("backend") or "nvrtc")
    settings = compile_settings()
    kind = settings.compiler or backend  # PTXBACKEND_COMPILER (or the config file) wins
    options = tuple(call.get("options") or ()) + _cupy_options(compiler_module, gen, kind)
    _use_cupy_context(compiler_module)
    artifact = engine.compile_with(settings, call["source"], options, kind)
    log.debug("ptxbackend: CuPy kernel %s: %s %s", artifact.key[:12], artifact.kind, artifact.target)
    return _load(compiler_module, artifact)


def _source_digest(args, kwargs):
    """The sha256 of the kernel source a call names, so a debug log line can be matched to a file
    CuPy writes (``CUPY_CACHE_SAVE_CUDA_SOURCE=1`` saves each source beside CuPy's cached binary)."""
    source = args[0] if args else kwargs.get("source")
    if isinstance(source, str):
        source = source.encode("utf-8", "surrogateescape")
    return hashlib.sha256(source).hexdigest() if isinstance(source, bytes) else "?"


# The configuration error that turned ptxbackend off for this process (empty while none has).
_config_problem = []


def _is_configuration_error(exc):
    # A bad PTXBACKEND_* value or an impossible target: the user's to fix, reported once, never raised.
    return isinstance(exc, (TargetError, ConfigError))


def _sass_runs_on(built, device):
    """Whether SASS built for compute capability ``built`` ('86') runs on a ``device`` ('90') GPU:
    the same major version and not newer (the driver's rule for cubins)."""
    built, device = int(built), int(device)
    return built // 10 == device // 10 and built <= device


def _let_cupy_build_runnable_code(compiler_module):
    """Before a call goes to CuPy's own compiler: make what CuPy builds run on this GPU.

    CuPy 9+ asks NVRTC for SASS of min(GPU, the newest architecture its own table
    knows); on a GPU of a later generation (an H200 with NVRTC 11.x: an sm_86
    cubin) every kernel CuPy builds itself fails with CUDA_ERROR_NO_BINARY_FOR_GPU.
    CuPy's own way out is PTX (what CUPY_COMPILE_WITH_PTX=1 selects), which the
    driver JIT-compiles for the GPU.  It is turned on only where CuPy's SASS could
    not run; v2-v8 and Chainer's CuPy build PTX or link for the device anyway.
    """
    if getattr(compiler_module, "_use_ptx", None) is not False:
        return  # no such switch (v1-v8), or PTX already (the user's CUPY_COMPILE_WITH_PTX=1)
    try:
        built = compiler_module._get_arch()
        device = compiler_module.device.Device().compute_capability
        if _sass_runs_on(built, device):
            return
    except Exception as exc:  # whatever CuPy does next reports its own errors better
        log.debug("ptxbackend: could not compare CuPy's architecture with the GPU's: %s: %s",
                  type(exc).__name__, exc)
        return
    compiler_module._use_ptx = True
    log.debug("ptxbackend: CuPy's own compiler would build sm_%s code, which this compute capability %s GPU "
              "cannot run: it builds PTX instead (as CUPY_COMPILE_WITH_PTX=1 does)", built, device)


def _make_replacement(compiler_module, gen, original):
    signature = inspect.signature(original)
    bind = _binder(signature)
    unknown = _unknown_parameters(signature)

    @functools.wraps(original, assigned=("__name__", "__qualname__", "__doc__"))
    def replacement(*args, **kwargs):
        try:
            call = bind(args, kwargs)
            reason = _needs_cupy(compiler_module, unknown, call)
        except Exception as exc:  # e.g. a bad argument: CuPy words that error about its own signature
            reason = "arguments ptxbackend cannot read (%s: %s)" % (type(exc).__name__, exc)
        if reason:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("ptxbackend: CuPy compiles this kernel itself (%s; source sha256 %s)", reason,
                          _source_digest(args, kwargs))
            _let_cupy_build_runnable_code(compiler_module)
            return original(*args, **kwargs)
        if _config_problem:
            _let_cupy_build_runnable_code(compiler_module)
            return original(*args, **kwargs)
        try:
            return _serve(compiler_module, gen, call)
        except Exception as exc:
            if _is_configuration_error(exc):
                # A kernel launch is no place for a settings error: say it once on stderr and let
                # CuPy build every kernel of this process, as it would without ptxbackend.
                _config_problem.append(exc)
                log.warning("ptxbackend: configuration problem: %s; CuPy's own compiler builds every kernel "
                            "of this process (fix the setting and restart)",
                            (str(exc).strip().splitlines() or [""])[0])
                _let_cupy_build_runnable_code(compiler_module)
                return original(*args, **kwargs)
            first = (str(exc).strip().splitlines() or [""])[0]
            log.debug("ptxbackend: could not serve a CuPy kernel: %s: %s", type(exc).__name__, exc)
            if (type(exc).__name__, first) not in _warned:
                _warned.add((type(exc).__name__, first))
                log.warning("ptxbackend: %s: %s; CuPy's own compiler takes over for this kernel "
                            "(PTXBACKEND_LOG=debug names each one)", type(exc).__name__, first)
            # Inside the handler on purpose: if CuPy fails too, its error chains ours.
            _let_cupy_build_runnable_code(compiler_module)
            return original(*args, **kwargs)

    setattr(replacement, _MARK, original)
    return replacement


# --------------------------------------------------------------------------- install / uninstall

def _apply(compiler_module):
    gen = generation(compiler_module)
    if gen is None:
        return False
    name = _entry_point(gen)
    current = getattr(compiler_module, name)
    if not _is_ours(current):
        current = _make_replacement(compiler_module, gen, current)
        setattr(compiler_module, name, current)
    package = sys.modules.get(_PACKAGE)
    # The package re-exports the function (v1-v9); it may have been imported before or after us.
    if gen != "v10+" and package is not None \
            and getattr(package, "compile_with_cache", None) is getattr(current, _MARK):
        package.compile_with_cache = current
    return True


def on_import(module):
    """Called by the start-up hook once ``cupy.cuda`` or ``cupy.cuda.compiler`` has executed."""
    try:
        if _disabled():
            return
        name = getattr(module, "__name__", None)
        _apply(module if name == _COMPILER else sys.modules.get(_COMPILER))
    except Exception as exc:
        try:
            uninstall()
        except Exception:
            pass
        log.warning("ptxbackend: could not take over CuPy's compiler (%s: %s); CuPy compiles its kernels "
                    "itself", type(exc).__name__, (str(exc).strip().splitlines() or [""])[0])


def install():
    """Replace the compile function of every CuPy module already imported.  Idempotent.

    Returns whether ptxbackend now serves CuPy's compiles.  A CuPy imported
    later is handled by the start-up hook, not by this call.
    """
    _apply(sys.modules.get(_COMPILER))
    return installed()


def uninstall():
    """Put CuPy's original functions back (the very objects that were replaced)."""
    for module_name, attribute in _CANDIDATES:
        module = sys.modules.get(module_name)
        current = getattr(module, attribute, None)
        if _is_ours(current):
            setattr(module, attribute, getattr(current, _MARK))


def installed():
    return bool(_replaced())


def _replaced():
    return ["%s.%s" % (name, attribute) for name, attribute in _CANDIDATES
            if _is_ours(getattr(sys.modules.get(name), attribute, None))]


def status():
    """What ``ptxbackend doctor`` reports about CuPy; never imports CuPy."""
    cupy = sys.modules.get("cupy")
    version = getattr(cupy, "__version__", None)
    chainer = sys.modules.get("chainer")
    if cupy is not None and version is None and chainer is not None:
        version = "bundled with Chainer %s" % getattr(chainer, "__version__", "?")
    gen = generation(sys.modules.get(_COMPILER))
    try:
        compiler = load_settings().compiler
    except PtxBackendError:
        compiler = os.environ.get("PTXBACKEND_COMPILER") or None
    if compiler is None and gen is not None:
        compiler = "nvcc" if gen == "v1" else "nvrtc"
    return {"cupy_version": version, "generation": gen, "replaced": _replaced(), "compiler": compiler}

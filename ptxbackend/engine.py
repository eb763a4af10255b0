"""The compile-and-load path: source -> key -> cache hit or compile -> image -> load.

Everything a warm start repeats per kernel is here, so it is kept lean: one
hash of the request, one file read and checksum, no subprocess, no lock.
"""

import atexit
import logging
import os
import shutil
import tempfile
import threading
import time

from . import __version__, driver
from .cache import DirectoryStore, deps, request_key
from .compilers import COMPILERS, get_compiler
from .compilers.options import read_path_options
from .config import compile_settings, configure_logging
from .errors import CacheError, CompilerNotFoundError, DriverError, TargetError
from .targets import choose_target, parse_cc
from .warm import record_request

log = logging.getLogger("ptxbackend")

_lock = threading.Lock()
_stores = {}
_compilers = {}
_device_ccs = {}
_choices = {}
_prepared = {}
_requests = {}
_settled = {}
_warned = set()


class Artifact(object):
    """A compiled image and where it came from.

    Attributes:
        image: the bytes (PTX text, cubin or fatbin).  After a hit at the cubin
            level the PTX is read from the cache on first access only.
        kind: ``'ptx'``, ``'cubin'`` or ``'fatbin'``.
        target: the concrete :class:`~ptxbackend.targets.Target` built.
        producer: the compiler that made it, e.g. ``'nvcc-11.2.152'``.
        key: the request key (hex SHA-256).
        path: the cache entry's path.
        cache_hit: whether it came from the cache.
        reason: why this target was chosen.
        device_cc: the compute capability the choice was made for (or ``None``).
    """

    __slots__ = ("_image", "kind", "target", "producer", "key", "path", "cache_hit", "reason",
                 "device_cc", "store", "cubin_cache", "jit", "_refetch", "deps")

    def __init__(self, image, kind, target, producer, key, path, cache_hit, reason, device_cc, store):
        self._image = image
        self.kind = kind
        self.target = target
        self.producer = producer
        self.key = key
        self.path = path
        self.cache_hit = cache_hit
        self.reason = reason
        self.device_cc = device_cc
        self.store = store
        self.cubin_cache = True  # PTXBACKEND_CUBIN_CACHE as compile() saw it: spares load() a settings read
        self.jit = None  # (cc, driver build, cubin) found by compile() at the cubin level
        self._refetch = None
        self.deps = b""  # the entry's dependency section: a JIT cubin must carry the same one

    @property
    def image(self):
        if self._image is None:
            # A hit at the cubin level skipped reading the PTX; read it now that someone asks.
            self._image = self._refetch()
        return self._image

    def __repr__(self):
        return "<Artifact %s %s by %s, %s, %s>" % (
            self.kind, self.target, self.producer,
            "%d bytes" % len(self._image) if self._image is not None else "PTX not read",
            "hit" if self.cache_hit else "compiled")


def _warn_once(tag, message, *args):
    if tag not in _warned:
        _warned.add(tag)
        log.warning(message, *args)


#: Whether a cache that cannot be used falls back to a private temporary one.  A running program
#: must go on (its kernels are compiled again); the command line turns this off, so that an
#: administrator's `cache import` or `warm` never reports success on a throwaway cache.
temporary_cache_fallback = True


def open_store(settings):
    """The store for ``settings.cache_dir``; a private temporary one if that cannot be used
    (unless :data:`temporary_cache_fallback` is off: then :class:`CacheError`)."""
    root = os.path.expanduser(settings.cache_dir)
    with _lock:
        store = _stores.get(root)
        if store is None:
            try:
                store = DirectoryStore(root, settings.cache_max_size, settings.lock_timeout)
            except (CacheError, OSError) as exc:
                if not temporary_cache_fallback:
                    raise CacheError("cannot use the cache at %s: %s" % (root, exc) if not isinstance(
                        exc, CacheError) else str(exc))
                try:
                    temporary = tempfile.mkdtemp(prefix="ptxbackend-cache-")
                except OSError as tmp_exc:  # a read-only root file system: say what to set
                    raise CacheError("no usable cache: %s; and no temporary one either (%s). Set "
                                     "PTXBACKEND_CACHE_DIR or TMPDIR to a writable directory."
                                     % (exc, tmp_exc))
                _warn_once("store:" + root,
                           "ptxbackend: %s\nptxbackend: using a temporary cache for this process instead "
                           "(kernels will be compiled again next time).", exc)
                # Per process, as the warning says: a line restarted daily must not fill /tmp.
                atexit.register(_remove_temporary_cache, temporary, os.getpid())
                store = DirectoryStore(temporary, settings.cache_max_size, settings.lock_timeout)
            _stores[root] = store
        return store


def _remove_temporary_cache(path, creator_pid):
    if os.getpid() == creator_pid:  # not from a forked child that exits normally
        shutil.rmtree(path, ignore_errors=True)


def _compiler(settings, kind, store):
    kind = kind or settings.compiler
    marker = (kind, settings.nvcc, settings.nvrtc, os.environ.get("PATH"), os.environ.get("CUDA_PATH"),
              os.environ.get("CUDA_HOME"), store.meta_dir)
    with _lock:
        found = _compilers.get(marker)
    if found is None or not found.identity.unchanged():
        # First use, or a file that does the work changed (a toolkit swapped behind a wrapper,
        # an NVRTC updated in place): find and probe again.
        found = get_compiler(kind, settings.nvcc, settings.nvrtc, os.path.join(store.meta_dir, "compilers"))
        with _lock:
            _compilers[marker] = found
    return found


def _forget_compilers():
    with _lock:
        _compilers.clear()
        _prepared.clear()
        _choices.clear()
        _settled.clear()


def _explicit_compiler(settings, compiler):
    """Whether the user named a compiler (argument, variable or config file): then it must work."""
    return bool(compiler or settings.compiler or settings.nvcc or settings.nvrtc)


def _prepare(settings, compiler):
    """``(store, compiler, None)`` for these settings, or ``(store, None, CompilerNotFoundError)``.

    Remembered per Settings object, which config renews whenever a variable it
    depends on (PATH included) or the config file changes; the compiler's
    identity is re-checked on every call (a stat of each file that does the
    work).  A missing compiler is not remembered: one installed later is
    found on the next call.  A compiler the user named that cannot be used is
    an error, never a reason to serve whatever the cache holds.
    """
    marker = (settings, compiler)
    found = _prepared.get(marker)
    if found is not None and found[1].identity.unchanged():
        return found
    store = open_store(settings)
    try:
        found = (store, _compiler(settings, compiler, store), None)
    except CompilerNotFoundError as missing:
        if _explicit_compiler(settings, compiler):
            raise
        return store, None, missing
    with _lock:
        if len(_prepared) >= 256:
            _prepared.clear()
        _prepared[marker] = found
    return found


class _Request(object):
    """What a compile request is, besides its source and target, for one compiler."""

    __slots__ = ("options", "context", "path_options", "cwd_free")

    def __init__(self, options, context, path_options, cwd_free):
        self.options = options
        self.context = context
        self.path_options = path_options
        self.cwd_free = cwd_free  # no relative path: the same wherever the process is


def _request(options, name, source_dir, kind, host, environment):
    """The effective options (relative paths made absolute) and the key's context."""
    marker = (options, name, source_dir, kind, host, environment)
    try:
        found = _requests.get(marker)
    except TypeError:
        marker = found = None
    if found is not None:
        return found
    if source_dir:
        # Quoted includes beside the source file, as when the compiler reads it there.
        options = ("-I", os.path.abspath(source_dir)) + options
    parsed = read_path_options(options)
    backend = COMPILERS.get(kind)
    compiled_name = backend.compiled_name(name) if backend else str(name)
    context = (compiled_name, host) + environment
    # A relative path depends on the working directory, which can change: remember only the rest.
    found = _Request(parsed.options, context, parsed,
                     parsed.options == options and (not source_dir or os.path.isabs(source_dir)))
    _remember_request(_requests, marker, found)
    return found


def _remember_request(memo, marker, found):
    """Keep ``found`` under ``marker`` (a bounded memo), unless it depends on the working directory."""
    if marker is not None and found.cwd_free:
        with _lock:
            if len(memo) >= 1024:
                memo.clear()
            memo[marker] = found


def _settled_request(options, name, source_dir, comp, settings):
    """:func:`_request` for a compiler in use, remembered per (options, name, directory, compiler,
    settings): the warm path's one dictionary lookup for all of it."""
    marker = (options, name, source_dir, comp, settings)
    try:
        found = _settled.get(marker)
    except TypeError:
        marker = found = None
    if found is None:
        found = _request(options, name, source_dir, comp.kind, comp.identity.host,
                         _environment(settings, type(comp)))
        _remember_request(_settled, marker, found)
    return found


def _environment(settings, comp_class):
    """The compiler's variables that are set, as ``NAME=value`` (config reads nvcc's only)."""
    return settings.compiler_env if comp_class.environment else ()


def _choose_target(spec, comp, cc):
    """choose_target(), remembered per (spec, compiler, device): the hit path asks every time."""
    marker = (str(spec), comp, cc)  # comp itself: the dict keeps it alive, so no id is reused
    chosen = _choices.get(marker)
    if chosen is None:
        chosen = choose_target(spec, comp.identity, cc)
        with _lock:
            _choices[marker] = chosen
    return chosen


def _current_device_cc():
    ordinal = driver.current_device()
    if ordinal not in _device_ccs:
        _device_ccs[ordinal] = driver.compute_capability(ordinal)
    return _device_ccs[ordinal]


def _other_compiler_hint(settings, compiler, comp, store, cc):
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
        return _current_device_cc()
    except DriverError:  # no driver, no device: what driver.available() would say, one call cheaper
        return None


def _metadata(key, target, producer, options, level, **extra):
    meta = {"key": key, "kind": "cubin" if level == "jit" else target.output_kind,
            "target": str(target), "producer": producer, "options": [str(o) for o in options],
            "level": level, "created": time.time(), "ptxbackend": __version__}
    meta.update(extra)
    return meta


def compile(source, options=(), target=None, compiler=None, device_cc=None, cache_dir=None,
            name="kernel.cu", source_dir=None):
    """Compile ``source`` through the cache and return an :class:`Artifact`.

    Args:
        source: CUDA C++ source (str or bytes).  Kernels you look up by name
            should be ``extern "C"``.
        options: compiler options, kept as given except that relative paths
            (``-I inc``) are made absolute against the working directory.
            Every file the compile reads is recorded and re-checked on a hit.
        target: ``'auto'`` (default), ``'native'``, ``'compute_XY'``,
            ``'sm_XY'``, ``'X.Y'`` or a comma list; ``None`` reads
            ``PTXBACKEND_TARGET``.
        compiler: ``'nvcc'``, ``'nvrtc'`` or ``None`` (``PTXBACKEND_COMPILER``,
            else nvcc when found, else NVRTC).
        device_cc: the GPU to build for, e.g. ``'7.5'`` (default: the current
            device, or ``PTXBACKEND_DEVICE_CC``).
        cache_dir: overrides ``PTXBACKEND_CACHE_DIR``.
        name: the file name the compiler reports errors against (and that
            ``assert`` writes into the image); part of the key.
        source_dir: where the source file lives, if it is a file: its
            ``#include "..."`` lines find headers beside it, as a compiler
            run in that directory would.
    """
    settings = compile_settings(target, compiler, device_cc, cache_dir)
    options = tuple(str(o) for o in options) if options else ()
    artifact = _compile(settings, source, options, compiler, name, source_dir)
    artifact.cubin_cache = settings.cubin_cache
    if settings.record:
        record_request(artifact.key, source, options, str(settings.target), artifact.producer.split("-")[0],
                       name)
    return artifact


def _host(comp, path_options):
    """The host compiler nvcc preprocesses with, as the key names it ('' for NVRTC)."""
    ccbin = path_options.ccbin
    if ccbin and hasattr(comp, "host_compiler"):
        host = comp.host_compiler(ccbin)
        return host.host, host.system_dirs
    return comp.identity.host, ()


def _compile(settings, source, options, compiler, name, source_dir=None, jit_first=True, reprobed=False):
    configure_logging(settings.log)
    store, comp, missing = _prepare(settings, compiler)
    cc = device_compute_capability(settings)
    # On a warm start with the cubin level on, the JIT cubin is all load() needs: look for it first.
    jit_first = jit_first and settings.cubin_cache and settings.device_cc is None and cc is not None
    if comp is None:
        return _from_cache_only(store, settings, source, options, name, source_dir, cc, missing)
    try:
        chosen, reason = _choose_target(settings.target, comp, cc)
    except TargetError as exc:
        raise TargetError("%s%s" % (exc, _other_compiler_hint(settings, compiler, comp, store, cc)))
    if chosen.output_kind not in comp.output_kinds:
        raise TargetError("%s cannot produce a %s (target %s); use nvcc (PTXBACKEND_COMPILER=nvcc) "
                          "or a target it supports: %s" % (comp.identity.producer, chosen.output_kind,
                                                           chosen, ", ".join(comp.output_kinds)))
    request = _settled_request(options, name, source_dir, comp, settings)
    extra_system = ()
    if request.path_options.ccbin:
        host, extra_system = _host(comp, request.path_options)
        request = _request(options, name, source_dir, comp.kind, host, _environment(settings, type(comp)))
    key = request_key(source, request.options, chosen, request.context)
    producer = comp.identity.producer
    path = store.entry_path(producer, chosen, key, chosen.output_kind)
    if jit_first:
        artifact = _jit_hit(store, chosen, producer, key, path, reason, cc)
        if artifact is not None:
            # The PTX entry is read only if asked for (artifact.image), through the usual path.
            artifact._refetch = lambda: _compile(settings, source, options, compiler, name, source_dir,
                                                 False).image
            return artifact
    found = _valid(store.read(path, key, chosen.output_kind, False, True), path, store)
    if found is None:
        with store.lock(path):
            found = _valid(store.read(path, key, chosen.output_kind, False, True), path, store)
            changed = found is None and not comp.identity.all_unchanged()
            if found is None and not changed:
                inputs = list(request.path_options.option_files)
                started = time.time()
                image = comp.compile(source, request.options, chosen, name, inputs)
                section, system_list, digest = _dependency_section(inputs, started, comp, request,
                                                                   extra_system)
                try:
                    if system_list is not None:
                        store.save_system_deps(digest, system_list)  # before the entry that names it
                    store.write(path, image, _metadata(key, chosen, producer, request.options, "compile"),
                                section)
                    store.save_identity(comp.identity)
                except OSError as exc:
                    store.note_unwritable(exc)  # once per store, with the lock's own failure
                log.debug("ptxbackend: compiled %s for %s with %s", key[:12], chosen, producer)
                artifact = Artifact(image, chosen.output_kind, chosen, producer, key, path, False, reason,
                                    cc, store)
                artifact.deps = section
                return artifact
    if found is None:
        # A file behind the toolkit changed (cicc, ptxas, nvcc.profile ...): probe it again, with the
        # entry's lock released, before anything is built and filed under the old identity.
        _forget_compilers()
        if reprobed:
            raise CompilerNotFoundError(
                "the files of %s kept changing while ptxbackend probed them (an install or upgrade "
                "under way?); try again when it is done" % comp.identity.path)
        return _compile(settings, source, options, compiler, name, source_dir, jit_first, True)
    log.debug("ptxbackend: cache hit %s", path)
    artifact = Artifact(found[0], chosen.output_kind, chosen, producer, key, path, True, reason, cc, store)
    artifact.deps = found[2]
    return artifact


def _valid(found, path, store, system_too=True, missing_ok=False):
    """``found`` when the files its compile read still hold the same bytes, else ``None`` (a miss)."""
    if found is None or deps.still_valid(found[2], store.load_system_deps if system_too else None,
                                         missing_ok):
        return found
    log.debug("ptxbackend: %s: a file the compile read has changed; compiling again", path)
    return None


def _dependency_section(inputs, started, comp, request, extra_system):
    seen = set()
    unique = [p for p in inputs if not (p in seen or seen.add(p))]
    named = request.path_options.named_dirs + _environment_dirs()
    user, system = deps.split_system(unique, list(comp.identity.system_dirs) + list(extra_system), named)
    return deps.encode(deps.record(user, started), deps.record(system, started))


def _environment_dirs():
    """Include directories named by the environment: their headers are the user's."""
    dirs = []
    for name in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH"):
        dirs += [os.path.realpath(d) for d in (os.environ.get(name) or "").split(os.pathsep) if d]
    return dirs


def _jit_hit(store, target, producer, key, path, reason, cc):
    if target.output_kind != "ptx":
        return None
    build = driver.driver_build()
    found = _valid(store.read(store.jit_path(producer, target, key, cc, build), key, "cubin", False, True),
                   path, store)
    if found is None:
        return None
    log.debug("ptxbackend: cache hit %s (cubin level)", path)
    artifact = Artifact(None, "ptx", target, producer, key, path, True, reason, cc, store)
    artifact.jit = (cc, build, found[0])
    artifact.deps = found[2]
    return artifact


def _from_cache_only(store, settings, source, options, name, source_dir, cc, missing):
    """No compiler here: look for the request under every producer the cache knows.

    The toolkit's own headers are not on this machine, so only the caller's
    headers are checked: one that exists must be unchanged.
    """
    for identity in store.identities():
        try:
            chosen, reason = choose_target(settings.target, identity, cc)
        except TargetError:
            continue
        backend = COMPILERS.get(identity.kind)
        if backend is None:
            continue
        request = _request(options, name, source_dir, identity.kind, identity.host,
                           _environment(settings, backend))
        key = request_key(source, request.options, chosen, request.context)
        path = store.entry_path(identity.producer, chosen, key, chosen.output_kind)
        found = _valid(store.read(path, key, chosen.output_kind, True, True), path, store, False, True)
        if found is not None:
            log.debug("ptxbackend: no compiler; cache hit from %s", identity.producer)
            artifact = Artifact(found[0], chosen.output_kind, chosen, identity.producer, key, path, True,
                                reason + " (cached; no compiler on this machine)", cc, store)
            artifact.deps = found[2]
            return artifact
    raise CompilerNotFoundError(
        "%s\nThe cache at %s has no entry for this kernel either. Import a bundle made on a "
        "build box with the same kernels, or install a compiler." % (missing, store.root))


def loadable_image(artifact, cubin_cache=None):
    """The bytes to hand to ``cuModuleLoadData`` for the current device, and their kind.

    For PTX with the cubin level on, this is the driver's JIT output for this
    device and driver, from the cache or linked now and stored: the JIT is paid
    once per machine, not once per process.  ``cubin_cache`` defaults to the
    PTXBACKEND_CUBIN_CACHE setting in force when the artifact was compiled.
    """
    if cubin_cache is None:
        cubin_cache = artifact.cubin_cache
    if artifact.kind != "ptx" or not cubin_cache or artifact.store is None:
        return artifact.image, artifact.kind
    cc = _current_device_cc()
    if artifact.jit is not None and artifact.jit[0] == cc:
        return artifact.jit[2], "cubin"
    store = artifact.store
    path = _jit_path(artifact)
    found = store.read(path, artifact.key, "cubin", False, True)
    # Linked from the PTX of the same compile only: a recompile after a header changed keeps the key.
    if found is not None and found[2] == artifact.deps:
        return found[0], "cubin"
    cubin = driver.link_ptx(artifact.image)
    try:
        store.write(path, cubin, _metadata(artifact.key, artifact.target, artifact.producer, (), "jit",
                                           device_cc=cc, driver=driver.driver_build()), artifact.deps)
    except OSError as exc:
        store.note_unwritable(exc)
    return cubin, "cubin"


def _jit_path(artifact):
    return artifact.store.jit_path(artifact.producer, artifact.target, artifact.key, _current_device_cc(),
                                   driver.driver_build())


def discard_jit(artifact, why):
    """Remove the cached JIT cubin of a PTX ``artifact`` for the current device (the driver rejected it)."""
    artifact.jit = None
    if artifact.kind == "ptx" and artifact.store is not None:
        artifact.store._discard(_jit_path(artifact), why)


def load(artifact_or_source, options=(), **compile_args):
    """Load a kernel image into the current CUDA context and return a driver ``Module``.

    Accepts an :class:`Artifact` or kernel source (then compiled with
    :func:`compile` and ``compile_args``).  A cached JIT cubin that the driver
    rejects is discarded and rebuilt from the PTX once.
    """
    artifact = artifact_or_source
    if not isinstance(artifact, Artifact):
        artifact = compile(artifact_or_source, options, **compile_args)
    image, kind = loadable_image(artifact)
    try:
        module = driver.load_module(image, kind)
    except DriverError as exc:
        if kind == "cubin" and artifact.kind == "ptx":
            log.warning("ptxbackend: cached JIT cubin for %s rejected by the driver (%s); rebuilding",
                        artifact.key[:12], exc.name)
            discard_jit(artifact, "rejected by the driver")
            image, kind = loadable_image(artifact)
            module = driver.load_module(image, kind)
        else:
            raise
    module.artifact = artifact
    return module


def _reset_for_tests():
    global temporary_cache_fallback
    temporary_cache_fallback = True
    with _lock:
        _stores.clear()
        _compilers.clear()
        _device_ccs.clear()
        _choices.clear()
        _prepared.clear()
        _requests.clear()
        _settled.clear()
        _warned.clear()
    deps.forget()

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
from .cache import DirectoryStore, header_fingerprint, include_dirs, request_key
from .compilers import get_compiler
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
                 "device_cc", "store", "cubin_cache", "jit", "_refetch")

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


def open_store(settings):
    """The store for ``settings.cache_dir``; a private temporary one if that cannot be used."""
    root = os.path.expanduser(settings.cache_dir)
    with _lock:
        store = _stores.get(root)
        if store is None:
            try:
                store = DirectoryStore(root, settings.cache_max_size, settings.lock_timeout)
            except (CacheError, OSError) as exc:
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
    marker = (kind, settings.nvcc, settings.nvrtc, os.environ.get("PATH"), os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"),
              store.meta_dir)
    with _lock:
        found = _compilers.get(marker)
    if found is None:
        found = get_compiler(kind, settings.nvcc, settings.nvrtc, os.path.join(store.meta_dir, "compilers"))
        with _lock:
            _compilers[marker] = found
    return found


def _prepare(settings, compiler):
    """``(store, compiler, None)`` for these settings, or ``(store, None, CompilerNotFoundError)``.

    Remembered per Settings object, which config renews whenever a variable it
    depends on (PATH included) or the config file changes.  A missing compiler
    is not remembered: one installed later is found on the next call.
    """
    marker = (settings, compiler)
    found = _prepared.get(marker)
    if found is not None:
        return found
    store = open_store(settings)
    try:
        found = (store, _compiler(settings, compiler, store), None)
    except CompilerNotFoundError as missing:
        return store, None, missing
    with _lock:
        if len(_prepared) >= 256:
            _prepared.clear()
        _prepared[marker] = found
    return found


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
            name="kernel.cu"):
    """Compile ``source`` through the cache and return an :class:`Artifact`.

    Args:
        source: CUDA C++ source (str or bytes).  Kernels you look up by name
            should be ``extern "C"``.
        options: compiler options, kept as given (``-I`` directories are
            fingerprinted into the key).
        target: ``'auto'`` (default), ``'native'``, ``'compute_XY'``,
            ``'sm_XY'``, ``'X.Y'`` or a comma list; ``None`` reads
            ``PTXBACKEND_TARGET``.
        compiler: ``'nvcc'``, ``'nvrtc'`` or ``None`` (``PTXBACKEND_COMPILER``,
            else nvcc when found, else NVRTC).
        device_cc: the GPU to build for, e.g. ``'7.5'`` (default: the current
            device, or ``PTXBACKEND_DEVICE_CC``).
        cache_dir: overrides ``PTXBACKEND_CACHE_DIR``.
        name: the file name the compiler reports errors against.
    """
    settings = compile_settings(target, compiler, device_cc, cache_dir)
    options = tuple(str(o) for o in options) if options else ()
    artifact = _compile(settings, source, options, compiler, name)
    artifact.cubin_cache = settings.cubin_cache
    if settings.record:
        record_request(artifact.key, source, options, str(settings.target), artifact.producer.split("-")[0],
                       name)
    return artifact


def _compile(settings, source, options, compiler, name, jit_first=True):
    configure_logging(settings.log)
    store, comp, missing = _prepare(settings, compiler)
    cc = device_compute_capability(settings)
    # On a warm start with the cubin level on, the JIT cubin is all load() needs: look for it first.
    jit_first = jit_first and settings.cubin_cache and settings.device_cc is None and cc is not None
    dirs = include_dirs(options) if options else ()
    headers = header_fingerprint(dirs, os.path.join(store.meta_dir, "headers")) if dirs else ""
    if comp is None:
        return _from_cache_only(store, source, options, settings.target, cc, headers, missing)
    chosen, reason = _choose_target(settings.target, comp, cc)
    if chosen.output_kind not in comp.output_kinds:
        raise TargetError("%s cannot produce a %s (target %s); use nvcc (PTXBACKEND_COMPILER=nvcc) "
                          "or a target it supports: %s" % (comp.identity.producer, chosen.output_kind,
                                                           chosen, ", ".join(comp.output_kinds)))
    key = request_key(source, options, chosen, headers)
    producer = comp.identity.producer
    path = store.entry_path(producer, chosen, key, chosen.output_kind)
    if jit_first:
        artifact = _jit_hit(store, chosen, producer, key, path, reason, cc)
        if artifact is not None:
            # The PTX entry is read only if asked for (artifact.image), through the usual path.
            artifact._refetch = lambda: _compile(settings, source, options, compiler, name, False).image
            return artifact
    found = store.read(path, key, chosen.output_kind, False)
    if found is None:
        with store.lock(path):
            found = store.read(path, key, chosen.output_kind, False)
            if found is None:
                image = comp.compile(source, options, chosen, name)
                try:
                    store.write(path, image, _metadata(key, chosen, producer, options, "compile"))
                    store.save_identity(comp.identity)
                except OSError as exc:
                    store.note_unwritable(exc)  # once per store, with the lock's own failure
                log.debug("ptxbackend: compiled %s for %s with %s", key[:12], chosen, producer)
                return Artifact(image, chosen.output_kind, chosen, producer, key, path, False, reason,
                                cc, store)
    log.debug("ptxbackend: cache hit %s", path)
    return Artifact(found[0], chosen.output_kind, chosen, producer, key, path, True, reason, cc, store)


def _jit_hit(store, target, producer, key, path, reason, cc):
    if target.output_kind != "ptx":
        return None
    build = driver.driver_build()
    found = store.read(store.jit_path(producer, target, key, cc, build), key, "cubin", False)
    if found is None:
        return None
    log.debug("ptxbackend: cache hit %s (cubin level)", path)
    artifact = Artifact(None, "ptx", target, producer, key, path, True, reason, cc, store)
    artifact.jit = (cc, build, found[0])
    return artifact


def _from_cache_only(store, source, options, target_spec, cc, headers, missing):
    """No compiler here: look for the request under every producer the cache knows."""
    for identity in store.identities():
        try:
            chosen, reason = choose_target(target_spec, identity, cc)
        except TargetError:
            continue
        key = request_key(source, options, chosen, headers)
        path = store.entry_path(identity.producer, chosen, key, chosen.output_kind)
        found = store.read(path, key, chosen.output_kind)
        if found is not None:
            log.debug("ptxbackend: no compiler; cache hit from %s", identity.producer)
            return Artifact(found[0], chosen.output_kind, chosen, identity.producer, key, path, True,
                            reason + " (cached; no compiler on this machine)", cc, store)
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
    found = store.read(path, artifact.key, "cubin", False)
    if found is not None:
        return found[0], "cubin"
    cubin = driver.link_ptx(artifact.image)
    try:
        store.write(path, cubin, _metadata(artifact.key, artifact.target, artifact.producer, (), "jit",
                                           device_cc=cc, driver=driver.driver_build()))
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
    with _lock:
        _stores.clear()
        _compilers.clear()
        _device_ccs.clear()
        _choices.clear()
        _prepared.clear()
        _warned.clear()

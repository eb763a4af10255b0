"""The compile-and-load path: source -> key -> cache hit or compile -> image -> load.

Everything a warm start repeats per kernel is here, so it is kept lean: one
hash of the request, one file read and checksum, no subprocess, no lock.
"""

import atexit
import logging
import os
import shutil
import tempfile
import time

from . import driver
from . import image as image_step
from .cache import DirectoryStore, deps, layout, request_key
from .cache.entries import EntryCache
from .cache.entry import metadata as entry_metadata
from .compilers import COMPILERS, get_compiler
from .compilers.base import CompilerIdentity
from .compilers.options import read_path_options
from .config import compile_settings, configure_logging
from .errors import CacheError, CompilerNotFoundError, DriverError, TargetError
from .record import record_request
from .state import state
from .targets import choose_target, parse_cc

log = logging.getLogger("ptxbackend")


class Artifact(object):
    """A compiled image and where it came from.

    Attributes:
        image: the bytes (PTX text, cubin or fatbin).  After a hit at the cubin
            level the PTX is read from the cache on first access only.
        kind: ``'ptx'``, ``'cubin'`` or ``'fatbin'``.
        target: the concrete :class:`~ptxbackend.targets.Target` built.
        producer: the compiler that made it, e.g. ``'nvcc-11.2.152'``.
        key: the request key (hex SHA-256).
        name: the entry's name in every store (:mod:`ptxbackend.cache.layout`).
        path: the entry's file in the local cache.
        cache_hit: whether it came from the cache.
        reason: why this target was chosen.
        device_cc: the compute capability the choice was made for (or ``None``).
    """

    __slots__ = ("_image", "kind", "target", "producer", "key", "name", "path", "cache_hit", "reason",
                 "device_cc", "store", "cubin_cache", "jit", "_request", "deps")

    def __init__(self, image, kind, target, producer, key, name, cache_hit, reason, device_cc, store):
        self._image = image
        self.kind = kind
        self.target = target
        self.producer = producer
        self.key = key
        self.name = name
        self.path = store.path_of(name)
        self.cache_hit = cache_hit
        self.reason = reason
        self.device_cc = device_cc
        self.store = store
        self.cubin_cache = True  # PTXBACKEND_CUBIN_CACHE as compile() saw it: spares load() a settings read
        self.jit = None  # (cc, driver build, cubin) found by compile() at the cubin level
        self._request = None  # what compile() was asked, when it skipped reading the PTX
        self.deps = b""  # the entry's dependency section: a JIT cubin must carry the same one

    @property
    def image(self):
        if self._image is None:
            self._image = _skipped_ptx(self)
        return self._image

    def __repr__(self):
        return "<Artifact %s %s by %s, %s, %s>" % (
            self.kind, self.target, self.producer,
            "%d bytes" % len(self._image) if self._image is not None else "PTX not read",
            "hit" if self.cache_hit else "compiled")


def _skipped_ptx(artifact):
    """The PTX of a hit served at the cubin level, which compile() did not read: read it now."""
    found = artifact.store.read(artifact.name, artifact.key, "ptx", False, True)
    if found is not None and found[2] == artifact.deps:
        return found[0]
    # Gone (pruned) or rebuilt since: the request again, without the shortcut.
    return _compile(*artifact._request, jit_first=False).image


def _warn_once(tag, message, *args):
    if tag not in state.warned:
        state.warned.add(tag)
        log.warning(message, *args)


def open_cache(settings):
    """The :class:`~ptxbackend.cache.entries.EntryCache` for ``settings``: the local store for
    ``settings.cache_dir`` and, when configured and usable, the fleet store."""
    root = os.path.expanduser(settings.cache_dir)
    marker = (root, settings.remote, settings.remote_mode, settings.remote_namespace, settings.remote_key_file,
              settings.remote_password_file, settings.remote_timeout, settings.remote_ttl)
    cache = state.given.get(root) or state.caches.get(marker)
    if cache is None:
        local = open_store(settings)
        remote = _open_remote(settings, root)
        with state.lock:
            cache = state.caches.setdefault(marker, EntryCache(local, remote))
    return cache


def _open_remote(settings, root):
    if not settings.remote:
        return None
    from .cache.remote import open_remote
    remote, problem = open_remote(settings)
    if problem:
        state.remote_problems[root] = problem
        _warn_once("remote", "ptxbackend: the fleet store is not used: %s", problem)
    return remote


def remote_problem(settings):
    """Why the fleet store configured for ``settings`` is not used (``None`` when it is, or none is set)."""
    open_cache(settings)
    return state.remote_problems.get(os.path.expanduser(settings.cache_dir))


def open_store(settings):
    """The local store for ``settings.cache_dir``; a private temporary one if that cannot be used
    (unless ``state.temporary_cache_fallback`` is off: then :class:`CacheError`)."""
    root = os.path.expanduser(settings.cache_dir)
    with state.lock:
        given = state.given.get(root)
        store = given.local if given is not None else state.stores.get(root)
        if store is None:
            try:
                store = DirectoryStore(root, settings.cache_max_size, settings.lock_timeout)
            except (CacheError, OSError) as exc:
                if not state.temporary_cache_fallback:
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
            state.stores[root] = store
        return store


def _remove_temporary_cache(path, creator_pid):
    if os.getpid() == creator_pid:  # not from a forked child that exits normally
        shutil.rmtree(path, ignore_errors=True)


def _compiler(settings, kind, store):
    kind = kind or settings.compiler
    marker = (kind, settings.nvcc, settings.nvrtc, os.environ.get("PATH"), os.environ.get("CUDA_PATH"),
              os.environ.get("CUDA_HOME"), store.meta_dir)
    with state.lock:
        found = state.compilers.get(marker)
    if found is None or not found.identity.unchanged():
        # First use, or a file that does the work changed (a toolkit swapped behind a wrapper,
        # an NVRTC updated in place): find and probe again.
        found = get_compiler(kind, settings.nvcc, settings.nvrtc, os.path.join(store.meta_dir, "compilers"))
        with state.lock:
            state.compilers[marker] = found
    return found


def _forget_compilers():
    with state.lock:
        state.compilers.clear()
        state.prepared.clear()
        state.choices.clear()
        state.settled.clear()


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
    with state.lock:
        if len(state.prepared) >= 256:
            state.prepared.clear()
        state.prepared[marker] = found
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
        found = state.requests.get(marker)
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
    _remember_request(state.requests, marker, found)
    return found


def _remember_request(memo, marker, found):
    """Keep ``found`` under ``marker`` (a bounded memo), unless it depends on the working directory."""
    if marker is not None and found.cwd_free:
        with state.lock:
            if len(memo) >= 1024:
                memo.clear()
            memo[marker] = found


def _settled_request(options, name, source_dir, comp, settings):
    """:func:`_request` for a compiler in use, remembered per (options, name, directory, compiler,
    settings): the warm path's one dictionary lookup for all of it."""
    marker = (options, name, source_dir, comp, settings)
    try:
        found = state.settled.get(marker)
    except TypeError:
        marker = found = None
    if found is None:
        found = _request(options, name, source_dir, comp.kind, comp.identity.host,
                         _environment(settings, type(comp)))
        _remember_request(state.settled, marker, found)
    return found


def _environment(settings, comp_class):
    """The compiler's variables that are set, as ``NAME=value`` (config reads nvcc's only)."""
    return settings.compiler_env if comp_class.environment else ()


def _choose_target(spec, comp, cc):
    """choose_target(), remembered per (spec, compiler, device): the hit path asks every time."""
    marker = (str(spec), comp, cc)  # comp itself: the dict keeps it alive, so no id is reused
    chosen = state.choices.get(marker)
    if chosen is None:
        chosen = choose_target(spec, comp.identity, cc)
        with state.lock:
            state.choices[marker] = chosen
    return chosen


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
        return image_step.current_device_cc()
    except DriverError:  # no driver, no device: what driver.available() would say, one call cheaper
        return None


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
    entry = layout.entry_name(producer, chosen, key, chosen.output_kind)
    if jit_first:
        artifact = _jit_hit(store, chosen, producer, key, entry, reason, cc)
        if artifact is not None:
            # The PTX entry is read only if asked for (artifact.image).
            artifact._request = (settings, source, options, compiler, name, source_dir)
            return artifact
    found = _valid(store.read(entry, key, chosen.output_kind, False, True), entry, store)
    if found is None:
        with store.lock(entry):
            found = _valid(store.read(entry, key, chosen.output_kind, False, True), entry, store)
            changed = found is None and not comp.identity.all_unchanged()
            if found is None and not changed:
                return _build(store, comp, source, request, chosen, name, key, entry, reason, cc, extra_system)
    if found is None:
        # A file behind the toolkit changed (cicc, ptxas, nvcc.profile ...): probe it again, with the
        # entry's lock released, before anything is built and filed under the old identity.
        _forget_compilers()
        if reprobed:
            raise CompilerNotFoundError(
                "the files of %s kept changing while ptxbackend probed them (an install or upgrade "
                "under way?); try again when it is done" % comp.identity.path)
        return _compile(settings, source, options, compiler, name, source_dir, jit_first, True)
    log.debug("ptxbackend: cache hit %s", entry)
    artifact = Artifact(found[0], chosen.output_kind, chosen, producer, key, entry, True, reason, cc, store)
    artifact.deps = found[2]
    return artifact


def _build(store, comp, source, request, chosen, name, key, entry, reason, cc, extra_system):
    """Compile a miss (its lock held) and file it with the files the compile read."""
    inputs = list(request.path_options.option_files)
    started = time.time()
    image = comp.compile(source, request.options, chosen, name, inputs)
    section, system_list, digest = _dependency_section(inputs, started, comp, request, extra_system)
    producer = comp.identity.producer
    try:
        if system_list is not None:
            store.save_system_deps(digest, system_list)  # before the entry that names it
        store.write(entry, image, entry_metadata(key, chosen, producer, request.options, "compile"), section)
        store.save_producer(producer, comp.identity.producer_record())
    except OSError as exc:
        store.note_unwritable(exc)  # once per store, with the lock's own failure
    log.debug("ptxbackend: compiled %s for %s with %s", key[:12], chosen, producer)
    artifact = Artifact(image, chosen.output_kind, chosen, producer, key, entry, False, reason, cc, store)
    artifact.deps = section
    return artifact


def _valid(found, entry, store, system_too=True, missing_ok=False):
    """``found`` when the files its compile read still hold the same bytes, else ``None`` (a miss)."""
    if found is None or deps.still_valid(found[2], store.load_system_deps if system_too else None,
                                         missing_ok):
        return found
    log.debug("ptxbackend: %s: a file the compile read has changed; compiling again", entry)
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


def _jit_hit(store, target, producer, key, entry, reason, cc):
    if target.output_kind != "ptx":
        return None
    build = driver.driver_build()
    found = _valid(store.read(layout.jit_name(producer, target, key, cc, build), key, "cubin", False, True),
                   entry, store)
    if found is None:
        return None
    log.debug("ptxbackend: cache hit %s (cubin level)", entry)
    artifact = Artifact(None, "ptx", target, producer, key, entry, True, reason, cc, store)
    artifact.jit = (cc, build, found[0])
    artifact.deps = found[2]
    return artifact


def _from_cache_only(store, settings, source, options, name, source_dir, cc, missing):
    """No compiler here: look for the request under every producer the cache knows.

    The toolkit's own headers are not on this machine, so only the caller's
    headers are checked: one that exists must be unchanged.
    """
    for producer, record in store.producer_records():
        try:
            identity = CompilerIdentity.from_json(record)
            chosen, reason = choose_target(settings.target, identity, cc)
        except (TargetError, KeyError, TypeError, ValueError):
            continue
        backend = COMPILERS.get(identity.kind)
        if backend is None or identity.producer != producer:
            continue
        request = _request(options, name, source_dir, identity.kind, identity.host,
                           _environment(settings, backend))
        key = request_key(source, request.options, chosen, request.context)
        entry = layout.entry_name(producer, chosen, key, chosen.output_kind)
        found = _valid(store.read(entry, key, chosen.output_kind, True, True), entry, store, False, True)
        if found is not None:
            log.debug("ptxbackend: no compiler; cache hit from %s", producer)
            artifact = Artifact(found[0], chosen.output_kind, chosen, producer, key, entry, True,
                                reason + " (cached; no compiler on this machine)", cc, store)
            artifact.deps = found[2]
            return artifact
    raise CompilerNotFoundError(
        "%s\nThe cache at %s has no entry for this kernel either. Import a bundle made on a "
        "build box with the same kernels, or install a compiler." % (missing, store.root))


#: Kept for callers of 0.3: the image step lives in :mod:`ptxbackend.image`.
loadable_image = image_step.loadable_image
discard_jit = image_step.discard_jit


def load(artifact_or_source, options=(), **compile_args):
    """Load a kernel image into the current CUDA context and return a driver ``Module``.

    Accepts an :class:`Artifact` or kernel source (then compiled with
    :func:`compile` and ``compile_args``).  A cached JIT cubin that the driver
    rejects is discarded and rebuilt from the PTX once.
    """
    artifact = artifact_or_source
    if not isinstance(artifact, Artifact):
        artifact = compile(artifact_or_source, options, **compile_args)
    module = image_step.load(artifact, driver.load_module)
    module.artifact = artifact
    return module


def _reset_for_tests():
    state.reset()
    deps.forget()

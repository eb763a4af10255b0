"""The compile path: source -> key -> cache hit or compile -> artifact.

Everything a warm start repeats per kernel is here, so it is kept lean: one
hash of the request, one file read and checksum, one question to the
dependency sets (answered from memory after a set's first check in the
process), no subprocess, no lock.  Stores, compilers, requests and the load
step each live in their own module (stores, toolchain, request, image).
"""

import functools
import logging
import os
import time

from ..gpu import driver
from . import image as image_step
from . import precompiled
from . import request as requests
from . import toolchain
from .artifact import Artifact
from ..dependencies import depsets
from ..cache import layout, request_key
from ..cache.entry import metadata as entry_metadata
from ..compilers import COMPILERS
from ..compilers.base import CompilerIdentity
from ..dependencies.reads import environment_include_dirs
from ..config import compile_settings, configure_logging
from ..errors import CompileError, CompilerNotFoundError, TargetError
from .record import record_request
from ..state import state
from ..cache.stores import open_cache, open_store, remote_problem  # noqa: F401  (kept importable from here)
from .targets import choose_target
from .toolchain import device_compute_capability  # noqa: F401

log = logging.getLogger("ptxbackend")


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
    return compile_with(compile_settings(target, compiler, device_cc, cache_dir), source, options, compiler,
                        name, source_dir)


def compile_with(settings, source, options=(), compiler=None, name="kernel.cu", source_dir=None):
    """:func:`compile` with settings already resolved (``config.compile_settings``), e.g. by CuPy's
    hook, which reads them to choose the compiler: one resolve per kernel, not two."""
    # A path that is not UTF-8 may come as bytes (NVRTC takes it): as str with its bytes kept.
    options = tuple(os.fsdecode(o) if isinstance(o, bytes) else str(o) for o in options) if options else ()
    artifact = _compile(settings, source, options, compiler, name, source_dir)
    artifact.cubin_cache = settings.cubin_cache
    if settings.record:
        record_request(artifact.key, source, options, str(settings.target), artifact.producer.split("-")[0],
                       name, source_dir)
    return artifact


def _compile(settings, source, options, compiler, name, source_dir=None, jit_first=True, reprobed=False):
    configure_logging(settings.log)
    depsets.recheck_seconds = settings.deps_recheck
    store, comp, missing = toolchain.prepare(settings, compiler)
    cc = toolchain.device_compute_capability(settings)
    # On a warm start with the cubin level on, the JIT cubin is all load() needs: look for it first.
    jit_first = jit_first and settings.cubin_cache and settings.device_cc is None and cc is not None
    if comp is None:
        return _from_cache_only(store, settings, source, options, name, source_dir, cc, missing)
    try:
        chosen, reason = toolchain.choose(settings.target, comp, cc)
    except TargetError as exc:
        raise TargetError("%s%s" % (exc, toolchain.other_compiler_hint(settings, compiler, comp, store, cc)))
    if chosen.output_kind not in comp.output_kinds:
        raise TargetError("%s cannot produce a %s (target %s); use nvcc (PTXBACKEND_COMPILER=nvcc) "
                          "or a target it supports: %s" % (comp.identity.producer, chosen.output_kind,
                                                           chosen, ", ".join(comp.output_kinds)))
    request = requests.settled(options, name, source_dir, comp, settings)
    extra_system = ()
    if request.path_options.ccbin:
        host, extra_system = requests.host(comp, request.path_options)
        request = requests.build(options, name, source_dir, comp.kind, host,
                                 requests.environment(settings, type(comp)), comp.identity.content)
    if request.arch_options:
        request.check_target(chosen)
    key = request_key(source, request.options, chosen, request.context)
    producer = comp.identity.producer
    entry = layout.entry_name(producer, chosen, key, chosen.output_kind)
    if jit_first:
        artifact = _jit_hit(store, chosen, producer, key, entry, reason, cc)
        if artifact is not None:
            # The PTX entry is read only if asked for (artifact.image).
            artifact._again = functools.partial(_compile, settings, source, options, compiler, name,
                                                source_dir, False)
            return artifact
    found = _valid(store.read(entry, key, chosen.output_kind, False, True), entry, store)
    if found is None:
        with store.lock(entry):
            found = _valid(store.read(entry, key, chosen.output_kind, False, True), entry, store)
            changed = found is None and not comp.identity.all_unchanged()
            if found is None and not changed:
                return _build(store, comp, source, request, chosen, name, key, entry, reason, cc, extra_system,
                              settings)
    if found is None:
        # A file behind the toolkit changed (cicc, ptxas, nvcc.profile ...): probe it again, with the
        # entry's lock released, before anything is built and filed under the old identity.
        toolchain.forget_compilers()
        if reprobed:
            raise CompilerNotFoundError(
                "the files of %s kept changing while ptxbackend probed them (an install or upgrade "
                "under way?); try again when it is done" % comp.identity.path)
        return _compile(settings, source, options, compiler, name, source_dir, jit_first, True)
    log.debug("ptxbackend: cache hit %s", entry)
    artifact = Artifact(found[0], chosen.output_kind, chosen, producer, key, entry, True, reason, cc, store)
    artifact.deps = found[2]
    return artifact


def _build(store, comp, source, request, chosen, name, key, entry, reason, cc, extra_system, settings):
    """Compile a miss (its lock held) and file it with its dependency set."""
    inputs = list(request.path_options.option_files)
    started = time.time()  # before the precompiled headers' check: a change after it is too new
    generation = precompiled.current() if precompiled.applies(comp, request.options, settings.nvrtc_pch) else None
    counters = getattr(store, "counters", {})
    try:
        if generation is None:
            image = comp.compile(source, request.options, chosen, name, inputs, timeout=settings.compile_timeout,
                                 scratch=_scratch(store))
        else:
            ticket = precompiled.start(generation, request.options)
            try:
                image = comp.compile(source, request.options, chosen, name, inputs, generation.number,
                                     timeout=settings.compile_timeout)
            except BaseException:
                precompiled.failed(ticket)
                raise
            inputs = precompiled.finish(ticket, inputs)
    except CompileError:
        counters["compile_errors"] = counters.get("compile_errors", 0) + 1
        raise
    counters["compiles"] = counters.get("compiles", 0) + 1
    counters["compile_seconds"] = counters.get("compile_seconds", 0.0) + time.time() - started
    search = comp.search_path(request.path_options, name, request.options) + list(extra_system)
    built = depsets.build(inputs, search, list(comp.identity.system_dirs) + list(extra_system),
                          request.path_options.named_dirs + environment_include_dirs(), source, started,
                          comp.source_directory(name, request.options), comp.dates_from_epoch)
    if generation is not None:
        precompiled.built(generation, request.options, inputs, built)
    producer = comp.identity.producer
    artifact = Artifact(image, chosen.output_kind, chosen, producer, key, entry, False, reason, cc, store)
    artifact.deps = built.section
    if built.volatile:
        # __TIME__ or __TIMESTAMP__: the next compile's bytes differ, so none is ever served.
        log.debug("ptxbackend: %s not cached: it uses __TIME__ or __TIMESTAMP__, or what it read cannot be told", key[:12])
        return artifact
    try:
        if built.blob is not None:
            store.save_depset(built.digest, built.blob)  # before the entry that names it
        store.write(entry, image, entry_metadata(key, chosen, producer, request.options, "compile"),
                    built.section)
        store.save_producer(producer, comp.identity.producer_record())
    except OSError as exc:
        store.note_unwritable(exc)  # once per store, with the lock's own failure
    log.debug("ptxbackend: compiled %s for %s with %s (key context %s)", key[:12], chosen, producer,
              request.context)
    return artifact


def _scratch(store):
    """The cache's work directory: where a compiler's private directory goes (its working directory
    and temporary files), beside the entries and as private as they are."""
    meta = getattr(store, "meta_dir", None)
    return os.path.join(os.path.dirname(meta), "work") if meta else None


def _valid(found, entry, store, complete=True, missing_ok=False):
    """``found`` when its dependency set still holds, else ``None`` (a miss)."""
    if found is None or depsets.fresh(found[2], store.load_depset, complete, missing_ok):
        return found
    log.debug("ptxbackend: %s: a file the compile read or searched has changed; compiling again", entry)
    return None


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
    """No compiler here: look for the request under every producer and toolkit the cache knows.

    The toolkit's own headers are not on this machine, so only the caller's
    headers are checked: one that exists must be unchanged.
    """
    for record, identity in _recorded_identities(store):
        try:
            chosen, reason = choose_target(settings.target, identity, cc)
        except TargetError:
            continue
        backend = COMPILERS[identity.kind]
        producer = identity.producer
        for toolkit in record.get("toolkits") or [""]:
            request = requests.build(options, name, source_dir, identity.kind, identity.host,
                                     requests.environment(settings, backend), str(toolkit))
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


def _recorded_identities(store):
    """``(record, identity)`` of each producer the cache has a sound record of, for a compiler this
    version knows: what a machine without a compiler looks up under."""
    for producer, record in store.producer_records():
        try:
            identity = CompilerIdentity.from_json(dict(record, content=""))
        except (KeyError, TypeError, ValueError):
            continue
        if identity.kind in COMPILERS and identity.producer == producer:
            yield record, identity


def targets_wanted(settings, device_ccs):
    """What ``compile()`` here could look up for a GPU of each of ``device_ccs``: ``(compilers, wanted)``.

    ``compilers`` lists the producers of this machine's compilers (the one configured, else nvcc and
    NVRTC where found: a program may use either, and each looks only under its own producer); it is
    empty on a machine without one, which looks under every producer the cache has a record of.
    ``wanted`` maps each producer to the set of target names asked for.  An entry under any other
    producer or target is never used here, however sound its checksums.
    """
    identities = []
    for kind in [settings.compiler] if settings.compiler else ["nvcc", "nvrtc"]:
        try:
            store, comp, _missing = toolchain.prepare(settings, kind)
        except CompilerNotFoundError:
            continue
        identities.append(comp.identity)
    compilers = [identity.producer for identity in identities]
    wanted = {}
    if not identities:
        identities = [identity for _record, identity in _recorded_identities(open_cache(settings))]
    for identity in identities:
        for cc in device_ccs:
            try:
                chosen, _reason = choose_target(settings.target, identity, cc)
            except TargetError:
                continue
            wanted.setdefault(identity.producer, set()).add(str(chosen))
    return compilers, wanted


#: Kept for callers of 0.3: the image step lives in :mod:`ptxbackend.compiling.image`.
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
    depsets.forget()

"""Which stores a compile uses: the local cache for the settings, a private temporary one when that
cannot be used, and the fleet store when one is configured."""

import atexit
import logging
import os
import shutil
import tempfile

from . import DirectoryStore
from .entries import EntryCache
from ..errors import CacheError
from ..state import state

log = logging.getLogger("ptxbackend")


def warn_once(tag, message, *args):
    if tag not in state.warned:
        state.warned.add(tag)
        log.warning(message, *args)


def open_cache(settings):
    """The :class:`~ptxbackend.cache.entries.EntryCache` for ``settings``: the local store for
    ``settings.cache_dir`` and, when configured and usable, the fleet store."""
    root = os.path.expanduser(settings.cache_dir)
    marker = (root, settings.remote, settings.remote_mode, settings.remote_namespace, settings.remote_key_file,
              settings.remote_password_file, settings.remote_timeout, settings.remote_ttl, settings.remote_budget,
              settings.remote_retry)
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
    from .remote import open_remote
    remote, problem = open_remote(settings)
    if problem:
        state.remote_problems[root] = problem
        warn_once("remote", "ptxbackend: the fleet store is not used: %s", problem)
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
                warn_once("store:" + root,
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

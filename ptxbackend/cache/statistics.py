"""Statistics kept across runs, like ccache's: hits and misses per tier, compiles and their time.

A hit does no I/O for them: each process counts in memory (:class:`~.entries.EntryCache` ``counters``)
and, when it exits, adds what it counted to ``<cache>/v4/meta/statistics.json`` under the cache's lock,
by an atomic replace of a private file.  A cache that cannot be written (a read-only line-PC image)
keeps them in memory only.  ``ptxbackend cache stats`` reads the file; ``--zero`` starts it again.
"""

import atexit
import json
import os
import stat
import threading
import time

from ..files import private

FILE = "statistics.json"
#: What the file counts: hits of the local cache, of the fleet store (one fetch or its working set),
#: lookups neither answered, compiles and their seconds, compiles that failed.
FIELDS = ("local_hits", "fleet_hits", "misses", "compiles", "compile_seconds", "compile_errors")
_LOCK_NAME = "meta/" + FILE

_lock = threading.Lock()
_watched = []       # the EntryCaches of this process whose counts are added at exit
_registered = [None]  # the process that registered the exit hook


def follow(cache):
    """Add ``cache``'s counts to its file when this process exits."""
    with _lock:
        if _registered[0] != os.getpid():
            _registered[0] = os.getpid()
            del _watched[:]  # a forked child counts for itself
            atexit.register(save_all)
        if cache not in _watched:
            _watched.append(cache)


def _counted(cache):
    counts = cache.counters
    return {"local_hits": counts.get("local_hits", 0), "fleet_hits": counts.get("remote_hits", 0),
            # A miss is a lookup this process compiled for (its lookup is asked twice, before and
            # under the entry's lock, so the lookups themselves would count it twice).
            "misses": counts.get("compiles", 0) + counts.get("compile_errors", 0),
            "compiles": counts.get("compiles", 0),
            "compile_seconds": counts.get("compile_seconds", 0.0), "compile_errors": counts.get("compile_errors", 0)}


def save_all():
    """Add every followed cache's counts since the last save to its file (at exit; tests call it)."""
    with _lock:
        caches = list(_watched) if _registered[0] == os.getpid() else []
    for cache in caches:
        counted = _counted(cache)
        done = getattr(cache, "_statistics_saved", None) or dict((name, 0) for name in FIELDS)
        new = dict((name, counted[name] - done[name]) for name in FIELDS)
        if not any(new.values()):
            continue
        try:
            add(cache.local, new)
        except (OSError, ValueError, Exception):  # at exit nothing may raise: the counts are lost
            continue
        cache._statistics_saved = counted


def _path(store):
    return os.path.join(store.meta_dir, FILE)


def read(store):
    """The counts kept for ``store`` (a local store): FIELDS, ``since`` and ``saved`` (epoch seconds)."""
    found = dict((name, 0) for name in FIELDS)
    found["compile_seconds"] = 0.0
    found["since"] = found["saved"] = None
    try:
        body = json.loads(_read_own(_path(store)).decode("ascii"))
    except (OSError, ValueError):
        return found
    if isinstance(body, dict):
        for name in FIELDS + ("since", "saved"):
            value = body.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
                found[name] = value
    return found


def _read_own(path):
    """The bytes of ``path``: a small regular file of this user's, not reached through a link."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > 1 << 16:
            raise ValueError("not a statistics file of ours")
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def add(store, counts):
    """Add ``counts`` to ``store``'s file, under the cache's lock."""
    if getattr(store, "read_only", False):
        return
    with store.lock(_LOCK_NAME, timeout=5.0):
        found = read(store)
        now = time.time()
        for name in FIELDS:
            found[name] += counts.get(name, 0)
        found["since"] = found["since"] or now
        found["saved"] = now
        private.write_atomic(_path(store), json.dumps(found, sort_keys=True).encode("ascii"))


def zero(store):
    """Start the counts again from now."""
    with store.lock(_LOCK_NAME, timeout=5.0):
        found = dict((name, 0) for name in FIELDS)
        found["since"] = found["saved"] = time.time()
        private.write_atomic(_path(store), json.dumps(found, sort_keys=True).encode("ascii"))

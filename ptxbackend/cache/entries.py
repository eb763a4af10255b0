"""Entries over stores: the checks every store gets, and the tiers (local first, then the fleet).

A store hands back opaque bytes; here they are decoded and verified (header,
lengths, CRC-32, the key and kind the name claims) before anyone sees them, and
whatever fails is discarded with one warning and rebuilt.  With a fleet store,
a local miss asks the remote; a verified remote hit is written to the local
store, so the next start is a local hit; what is compiled here is uploaded
(best effort).  A remote can only ever cost a miss: its failures never reach
the caller.
"""

import contextlib
import json
import logging

from . import entry as entry_format
from . import layout
from . import provenance
from . import statistics
from .later import LaterWriter
from .base import UnusableValue

log = logging.getLogger("ptxbackend.cache")

#: The longest a miss waits for another machine compiling the same kernel before compiling it too.
REMOTE_LOCK_WAIT = 15.0


class EntryCache(object):
    """Verified entries over a local store and, optionally, a fleet store."""

    def __init__(self, local, remote=None):
        self.local = local
        self.remote = remote
        self.root = getattr(local, "root", None)
        self.meta_dir = getattr(local, "meta_dir", None)
        self.counters = {"local_hits": 0, "remote_hits": 0, "misses": 0, "uploads": 0, "discarded": 0,
                         "remote_discarded": 0, "compiles": 0, "compile_seconds": 0.0, "compile_errors": 0}
        if self.meta_dir is not None:
            statistics.follow(self)  # kept across runs: added to the cache's file at exit
        self._unwritable_reported = False
        self._remote_discard_reported = False
        self.push_withheld = 0  # entries the last push() kept here (arrived unsigned: provenance.py)
        self._later = None  # copies of fleet hits, written off the hit path

    def path_of(self, name):
        return self.local.path_of(name)

    # -- entries -------------------------------------------------------------------------------
    def read(self, name, key, kind, with_metadata=True, with_deps=False):
        """``(payload, metadata[, deps])`` of a valid entry, or ``None``.

        A corrupt, truncated, foreign or planted entry is discarded with a warning, so the
        caller rebuilds it.  ``with_metadata=False`` spares parsing the metadata (``None`` in
        its place); ``with_deps`` adds the dependency section.
        """
        found = self._decoded(self.local, name, key, kind, with_metadata)
        if found is None and self._later is not None:
            waiting = self._later.pending.get(name)  # fetched earlier, its file not written yet
            if waiting is not None:
                found = self._decoded(self.local, name, key, kind, with_metadata, waiting)
        if found is not None:
            self.counters["local_hits"] += 1
        elif self.remote is not None:
            found = self._remote_entry(name, key, kind, with_metadata)
        if found is None:
            self.counters["misses"] += 1
            return None
        return found if with_deps else found[:2]

    def _decoded(self, store, name, key, kind, with_metadata, blob=None):
        if blob is None:
            try:
                blob = store.get(name)
            except UnusableValue as exc:
                self._discard(store, name, str(exc))
                return None
            if blob is None:
                return None
        try:
            return entry_format.decode_all(blob, key, kind, with_metadata)
        except entry_format.CorruptEntry as exc:
            self._discard(store, name, str(exc))
            return None

    def _remote_entry(self, name, key, kind, with_metadata):
        try:
            blob = self.remote.get(name)
        except UnusableValue:
            blob = None
        if blob is None:
            return None
        found = self._decoded(self.remote, name, key, kind, with_metadata, blob)
        if found is None:
            return None
        self.counters["remote_hits"] += 1
        if self._later is None:
            self._later = LaterWriter(self._keep_locally)
        self._later.add(name, blob)
        return found

    def flush(self):
        """Wait until the local copies of fleet hits are written (``warm --from-fleet``, tests)."""
        if self._later is not None:
            self._later.flush()

    def _keep_locally(self, name, blob):
        try:
            self.local.put(name, blob)
        except OSError as exc:
            self.note_unwritable(exc)

    def write(self, name, payload, metadata, deps=b"", derived_from=None):
        """Store an entry locally (raises ``OSError``, e.g. ENOSPC), then upload it (best effort).

        ``derived_from``: the entry this one was made from (a JIT cubin's PTX); when that one may not
        be sent on (:mod:`.provenance`), neither may this one: it is marked and not uploaded.
        """
        blob = entry_format.encode(payload, metadata, deps)
        self.local.put(name, blob)
        if derived_from is not None:
            vouched = provenance.source_vouched(self.local, derived_from)
            provenance.remember(self.local, name, blob, vouched)
            if not vouched:
                return
        # Every entry's group lists the set it names: a JIT cubin's group is fetched without its
        # PTX's, and would otherwise cost a new machine a second round trip for the set.
        self._upload(name, blob, (layout.depset_name(bytes(deps).decode("ascii")),) if deps else ())

    def _upload(self, name, blob, companions=()):
        if self.remote is not None and self.remote.writable:
            if companions:
                self.remote.put(name, blob, companions)  # never raises: a fleet store fails open
            else:
                self.remote.put(name, blob)
            self.counters["uploads"] += 1

    def discard(self, name, why):
        """Remove ``name`` from the local store and a writable fleet store (the driver rejected it)."""
        self._discard(self.local, name, why)
        if self.remote is not None and self.remote.writable:
            self.remote.delete(name)

    def _discard(self, store, name, why):
        self.counters["discarded"] += 1
        if store is self.local:
            log.warning("ptxbackend: discarding cache entry %s: %s; it will be rebuilt", store.path_of(name), why)
        else:
            self.counters["remote_discarded"] += 1
            # A fleet store can hold many bad values (an old or broken uploader): say so once.
            report = log.debug if self._remote_discard_reported else log.warning
            self._remote_discard_reported = True
            report("ptxbackend: ignoring %s in %s: %s; it is compiled here instead (further ones are logged "
                   "at debug level)", name, store.description, why)
        if store is self.local or store.writable:
            store.delete(name)

    def note_unwritable(self, exc):
        """Warn once that the local cache cannot be written; the caller carries on without it."""
        if not self._unwritable_reported:
            self._unwritable_reported = True
            if getattr(self.local, "read_only", False):
                log.warning("ptxbackend: the cache at %s is read-only here: its kernels are served, and a "
                            "kernel it lacks is compiled in each process, not kept.", self.root)
            else:
                log.warning("ptxbackend: cannot write to the cache at %s: %s; kernels will be compiled "
                            "again next time.", self.root, exc)

    @contextlib.contextmanager
    def lock(self, name):
        """Hold ``name``'s local lock and, with a writable fleet store, its fleet-wide lock.

        The local wait is bounded by the store (an error when it runs out); the fleet wait by
        :data:`REMOTE_LOCK_WAIT`, after which this machine compiles anyway.  A local cache that
        cannot hold a lock file costs at most a duplicate compile: writes stay atomic.
        """
        try:
            local = self.local.lock(name)
            local.__enter__()
        except OSError as exc:
            self.note_unwritable(exc)
            local = None
        try:
            if self.remote is not None and self.remote.writable:
                wait = min(REMOTE_LOCK_WAIT, getattr(self.local, "lock_timeout", REMOTE_LOCK_WAIT))
                with self.remote.lock(name, wait):
                    yield
            else:
                yield
        finally:
            if local is not None:
                local.__exit__(None, None, None)

    # -- dependency sets, shared by the entries that name them ------------------------------------
    def save_depset(self, digest, blob):
        """Keep a dependency set under its digest (once: the same content has the same name)."""
        name = layout.depset_name(digest)
        try:
            if self.local.get(name) is not None:
                return
        except UnusableValue:
            pass
        self.local.put(name, blob)
        self._upload(name, blob)

    def load_depset(self, digest):
        """The dependency set named ``digest``, or ``None`` (the caller checks the digest)."""
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            return None
        name = layout.depset_name(digest)
        for store in (self.local, self.remote):
            if store is None:
                continue
            try:
                blob = store.get(name)
            except UnusableValue:
                continue
            if blob is not None:
                if store is self.remote:
                    self._keep_locally(name, blob)
                return blob
        return None

    # -- producers -----------------------------------------------------------------------------
    def save_producer(self, producer, record):
        """Record what ``producer`` can emit (a dict naming no path), so a machine without it can
        still resolve targets."""
        name = layout.producer_name(producer)
        try:
            known = json.loads(self.local.get(name).decode("utf-8"))
        except (UnusableValue, AttributeError, ValueError):
            known = {}
        # Two installs of one version (another toolkit content) share the producer: keep both.
        toolkits = list(known.get("toolkits") or []) if isinstance(known, dict) else []
        record = dict(record, toolkits=sorted(set(toolkits + list(record.get("toolkits") or []))))
        if known == record:
            return  # the usual case: written by an earlier miss
        blob = json.dumps(record, sort_keys=True).encode("utf-8")
        self.local.put(name, blob)
        self._upload(name, blob)

    def producer_records(self):
        """``(producer, record dict)`` of every producer the local store has entries of, newest first."""
        found = []
        for producer in self.local.producers():
            try:
                blob = self.local.get(layout.producer_name(producer))
                if blob is not None:
                    found.append((producer, json.loads(blob.decode("utf-8"))))
            except (UnusableValue, ValueError):
                continue
        return found

    def push(self, progress=None):
        """Upload every valid local entry, JIT cubin, dependency set and producer record to the fleet
        store (a build box seeding the fleet).  Returns ``(files, bytes)`` uploaded.  ``progress``: the
        caller's display, made with the number of local files and stepped per file."""
        # A seeding is meant to take long: the per-process budget is for programs that compile.
        with getattr(self.remote, "unbudgeted", contextlib.ExitStack)():
            return self._push(progress)

    def _push(self, progress=None):
        files = size = 0
        self.push_withheld = 0
        names = list(self.local.list(""))
        meter = progress(len(names)) if progress and names else None
        for name in names:
            if meter is not None:
                meter.step()
            try:
                blob = self.local.get(name)
            except UnusableValue:
                continue
            if blob is None:
                continue
            if layout.level_of(name) != "other":
                try:
                    entry_format.decode(blob)  # only what verifies leaves this machine
                except entry_format.CorruptEntry:
                    continue
                if not provenance.vouched(self.local, name, blob):
                    self.push_withheld += 1  # arrived unsigned: the fleet key must not seal it
                    continue
            self.remote.put(name, blob)
            files += 1
            size += len(blob)
        return files, size

    def stats(self):
        """Counters of this process: local and remote hits, misses, uploads, and the remote's own.

        A hit here is an entry found and verified as bytes; the engine then re-checks the files its
        compile read, and may still compile (a header that differs on this machine).
        """
        found = dict(self.counters)
        if self.remote is not None:
            found["remote"] = self.remote.stats()
        return found

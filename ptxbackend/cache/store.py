"""The local cache store: a directory, one file per name.

Under the root, ``v3/`` (:data:`~.layout.LAYOUT`) holds the names of :mod:`.layout`
as paths, plus what only a local store has::

    v3/locks/<kk>/<hash>.lock      one flock per name, taken by a miss, removed by its holder on release
    v3/meta/compilers/             this machine's compiler identities (never exported)

Reads take no lock: files are renamed into place whole, so a reader sees a
complete file or none.  Only a miss takes the name's lock, with a bounded
wait.  Maintenance (``entries``, ``verify``, ``prune``) is this store's own.
"""

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import stat as stat_module
import time

import _ptxbackend_env

from ..files import private
from ..errors import CacheError
from . import entry as entry_format
from .base import Store, UnusableValue
from .keys import SCHEMA_VERSION
from .layout import KINDS as KIND_SUFFIXES, LAYOUT, OLD_SCHEMAS, RESERVED, ROOT_NAMES, ROOT_PREFIXES
from .layout import depset_name as layout_depset_name, layout_schema, old_entry_head, old_layout_role

log = logging.getLogger("ptxbackend.cache")
_ENTRY_ENDINGS = tuple("." + kind for kind in KIND_SUFFIXES)
_TOUCH_AFTER = 3600.0  # refresh an entry's mtime (its LRU age) at most hourly
_PRUNE_EVERY = 300.0   # look at the total size at most every five minutes, on writes
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _check_private_dir(path):
    """Refuse a directory another user could write into: entries there could be planted."""
    why = _ptxbackend_env.private_dir_problem(path)
    if why:
        raise CacheError(why)


def _check_parents(path):
    """Refuse a cache another user could replace: a link of theirs on the way, or a directory above it
    that they own or can write (the rules the start-up hook applies too, so they live with it)."""
    why = _ptxbackend_env.parents_problem(path)
    if why:
        raise CacheError(why)


def _old_tree_is_ours(root_fd, name, schema):
    """Whether the tree ``name`` is one ptxbackend ``schema`` wrote, so it may be deleted.

    No version wrote a mark file, so the tree must be what they did write: a directory of ours
    holding no link and nothing another user owns, every file at a place that layout has
    (layout.old_layout_role), every entry beginning with that version's magic and schema number,
    and at least one entry, producer record or lock to show it.  Anything else (a user's folder
    named ``v2``, a tree with a file of theirs added) is left alone whole.
    """
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        top = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
        if not stat_module.S_ISDIR(top.st_mode) or (uid is not None and top.st_uid != uid):
            return False
        head = old_entry_head(schema)
        shown = False
        for relative, dirs, files, dir_fd in os.fwalk(name, dir_fd=root_fd, follow_symlinks=False):
            parts = relative.split(os.sep)[1:]
            for item in dirs + files:
                st = os.stat(item, dir_fd=dir_fd, follow_symlinks=False)
                if uid is not None and st.st_uid != uid:
                    return False
                if stat_module.S_ISDIR(st.st_mode):
                    continue
                role = old_layout_role(parts + [item]) if stat_module.S_ISREG(st.st_mode) else None
                if role is None:
                    return False
                if role == "entry":
                    fd = os.open(item, os.O_RDONLY | _NOFOLLOW | private.CLOEXEC | _NONBLOCK,
                                 dir_fd=dir_fd)
                    try:
                        if os.read(fd, len(head)) != head:
                            return False
                    finally:
                        os.close(fd)
                shown = shown or role in ("entry", "producer", "lock", "headers")
        return shown
    except OSError:
        return False


class DirectoryStore(Store):
    """Names as files under a local directory: atomic writes, per-name locks, LRU pruning."""

    def __init__(self, root, max_size=1 << 30, lock_timeout=600.0):
        self.root = os.path.abspath(root)
        self.base = os.path.join(self.root, LAYOUT)
        self.meta_dir = os.path.join(self.base, "meta")
        self.max_size = max_size
        self.lock_timeout = lock_timeout
        self._unwritable_reported = False
        self._dirs = {}
        _check_parents(self.root)  # first: creating v4/ through another user's link writes in its target
        try:
            private.make_private_dirs(self.base)
        except OSError as exc:
            raise CacheError("cannot create cache directory %s: %s. Set PTXBACKEND_CACHE_DIR "
                             "to a writable directory." % (self.base, exc))
        _check_private_dir(self.base)
        _check_private_dir(self.root)
        # A cache made elsewhere and mounted read-only (a line PC's image) serves its hits; what is
        # compiled here is not kept (each write fails, which the callers report once).
        self.read_only = not os.access(self.base, os.W_OK | os.X_OK)
        if self.read_only and not (os.access(self.base, os.R_OK | os.X_OK) and os.path.isdir(self.meta_dir)):
            raise CacheError("cache directory %s is not writable. Set PTXBACKEND_CACHE_DIR to a "
                             "writable directory." % self.base)

    @property
    def description(self):
        return self.root

    def path_of(self, name):
        """The file that holds ``name``."""
        return self.base + os.sep + name.replace("/", os.sep)

    def _lock_path(self, name):
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
        return os.path.join(self.base, "locks", digest[:2], digest + ".lock")

    # -- the Store interface -------------------------------------------------------------------
    def get(self, name):
        """The bytes of ``name``, or ``None`` when absent.

        Only a regular file of yours that nobody else can write is read, without following a
        symlink; anything else there raises :class:`UnusableValue` (the caller discards it).
        """
        path = self.path_of(name)
        try:
            blob, st = private.read_file_and_stat(path)
        except private.UnsafeFile as exc:
            raise UnusableValue(exc.strerror)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise UnusableValue("cannot be read (%s)" % (exc.strerror or exc))
        if time.time() - st.st_mtime > _TOUCH_AFTER and name.endswith(_ENTRY_ENDINGS):  # LRU age for prune
            try:
                os.utime(path, None)
            except OSError:
                pass
        return blob

    def put(self, name, blob):
        """Write ``name`` atomically; prune now and then.  Raises ``OSError`` (e.g. ENOSPC)."""
        path = self.path_of(name)
        private.make_private_dirs(os.path.dirname(path))
        private.write_atomic(path, blob)
        self._maybe_prune()

    def delete(self, name):
        path = self.path_of(name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)  # a directory planted where a file belongs
        else:
            private.remove_quietly(path)

    @contextlib.contextmanager
    def lock(self, name, timeout=None):
        """Hold the lock of ``name``, waiting at most ``timeout`` (default ``lock_timeout``) seconds.

        Raises :class:`CacheError` when the wait runs out (a stuck process must be named, not
        waited on forever) and ``OSError`` when the lock file cannot be created at all.
        """
        lock_path = self._lock_path(name)
        private.make_private_dirs(os.path.dirname(lock_path))
        if os.path.islink(lock_path):
            log.warning("ptxbackend: removing a symlink planted at lock path %s", lock_path)
            private.remove_quietly(lock_path)
        held = self._acquire(lock_path, self.lock_timeout if timeout is None else timeout)
        try:
            yield True
        finally:
            held.__exit__(None, None, None)

    def _acquire(self, lock_path, timeout):
        """An entered context manager holding ``lock_path``; CacheError after ``timeout``."""
        if private.fcntl is not None:
            # A bare flock: filelock's general machinery costs about 0.3 ms per miss.
            held, timeout_error = private.exclusive_lock(lock_path, timeout), private.LockTimeout
        else:
            import filelock
            held, timeout_error = filelock.FileLock(lock_path, timeout=timeout), filelock.Timeout
        try:
            held.__enter__()
        except timeout_error:
            raise CacheError(
                "waited %.0f s for the cache lock %s (another process is compiling the same "
                "kernel, or is stuck). Raise PTXBACKEND_LOCK_TIMEOUT, or stop the other process."
                % (timeout, lock_path))
        return held

    def list(self, prefix=""):
        """Names under ``prefix`` (files only, temporary files and this store's own trees left out)."""
        with self._base_fd() as base_fd:
            for _dir_fd, relative, name, st in self._files(base_fd, include_depsets=True):
                if stat_module.S_ISREG(st.st_mode) and not name.startswith(".tmp-"):
                    found = relative.replace(os.sep, "/")
                    if found.startswith(prefix):
                        yield found

    def producers(self, base_fd=None):
        """The producers this store has files of, newest first (by name)."""
        try:
            names = os.listdir(self.base if base_fd is None else base_fd)
        except OSError:
            return []
        return sorted((n for n in names if n not in RESERVED and "-" in n), reverse=True)

    # -- maintenance ---------------------------------------------------------------------------
    # Walked and changed through descriptors of this cache's own directories (private.walk_files):
    # a directory swapped for a symlink mid-run can never point a deletion outside the cache.

    @contextlib.contextmanager
    def _base_fd(self):
        try:
            fd = private.open_directory(self.base)
        except OSError as exc:
            raise CacheError("cannot open cache directory %s: %s" % (self.base, exc.strerror or exc))
        try:
            yield fd
        finally:
            os.close(fd)

    def _files(self, base_fd, include_depsets=False):
        """Yield ``(directory_fd, relative_path, name, stat)`` of every file below a producer."""
        for producer in self.producers(base_fd) + (["depsets"] if include_depsets else []):
            for dir_fd, relative_dir, name, st in private.walk_files(base_fd, producer):
                yield dir_fd, os.path.join(relative_dir, name), name, st

    @staticmethod
    def _is_entry(name, st):
        return stat_module.S_ISREG(st.st_mode) and name.rsplit(".", 1)[-1] in KIND_SUFFIXES

    def entries(self):
        """Yield ``(path, size, mtime)`` of every entry file."""
        with self._base_fd() as base_fd:
            for _dir_fd, relative, name, st in self._files(base_fd):
                if self._is_entry(name, st):
                    yield os.path.join(self.base, relative), st.st_size, st.st_mtime

    def verify(self, repair=False, progress=None):
        """Check every entry and what it depends on: its own bytes, the dependency set it names (there,
        ours, not writable by others, its digest, its shape) and its producer's record.  Returns
        ``(good, [(path, reason), ...])``; ``repair`` removes the bad entries (they are compiled again)
        and the damaged sets and records they named.  A file in an entry directory that ptxbackend does
        not write is reported and left alone: it may be someone's.  ``progress``: the caller's display,
        made with ``None`` (the number of entries is learnt by the walk) and stepped per entry."""
        meter = progress(None) if progress else None
        good = 0
        bad = []
        known = {}  # name of a set or record -> its problem, or None
        damaged = set()
        with self._base_fd() as base_fd:
            for dir_fd, relative, name, st in self._files(base_fd):
                if not self._is_entry(name, st):
                    if not (name.startswith(".tmp-") or relative.count(os.sep) == 1 and name == "identity.json"):
                        bad.append((os.path.join(self.base, relative), "not a file ptxbackend writes here (a "
                                    "file where a directory belongs?); left alone"))
                    continue
                try:
                    _payload, meta, deps = entry_format.decode_all(private.read_at(dir_fd, name))
                    why, culprit = self._dependency_problem(meta, deps, known)
                    if why:
                        damaged.add(culprit)
                        raise entry_format.CorruptEntry(why)
                    good += 1
                except (OSError, entry_format.CorruptEntry) as exc:
                    bad.append((os.path.join(self.base, relative), str(exc)))
                    if repair:
                        try:
                            os.unlink(name, dir_fd=dir_fd)  # the directory read, wherever it is now
                        except OSError:
                            pass
                finally:
                    if meter is not None:
                        meter.step()
        if meter is not None:
            meter.finish()
        if repair:
            for name in damaged:
                if known.get(name) and not known[name].startswith("missing"):
                    self.delete(name)
        return good, bad

    def _dependency_problem(self, meta, deps, known):
        """``(why, name)`` of the first thing the entry depends on that is not right, or ``(None, None)``."""
        from ..dependencies import depsets  # a leaf's shape check; the package's layers allow it
        needed = []
        if deps:
            digest = bytes(deps).decode("ascii", "replace")
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                return "its dependency section is not a set's digest", None
            needed.append(("set", layout_depset_name(digest), digest))
        producer = (meta or {}).get("producer")
        if isinstance(producer, str) and producer:
            needed.append(("record", producer + "/identity.json", None))
        for what, name, digest in needed:
            if name not in known:
                known[name] = self._file_problem(what, name, digest, depsets)
            if known[name]:
                return ("its %s %s is %s" % ("dependency set" if what == "set" else "producer record",
                                             self.path_of(name), known[name]), name)
        return None, None

    def _file_problem(self, what, name, digest, depsets):
        try:
            blob = self.get(name)
        except UnusableValue as exc:
            return "not usable (%s)" % exc
        if blob is None:
            return "missing"
        try:
            body = json.loads(bytes(blob).decode("utf-8"))
        except ValueError:
            return "damaged (not JSON)"
        if what == "set":
            if hashlib.sha256(bytes(blob)).hexdigest() != digest:
                return "damaged (its bytes do not match its digest)"
            if not depsets.well_formed(body):
                return "damaged (not the shape of a dependency set)"
        elif not isinstance(body, dict):
            return "damaged (not a producer record)"
        return None

    def total_size(self):
        return sum(size for _path, size, _mtime in self.entries())

    def prune(self, max_size=None, progress=None):
        """Remove least-recently-used entries until the total is at most 80% of ``max_size``
        (default: the store's; 0 means no limit, so nothing is removed).  ``progress``: the caller's
        display, made with the number of entries to remove and stepped per removal.

        Returns ``(files_removed, bytes_removed)``.
        """
        limit = self.max_size if max_size is None else max_size
        now = time.time()
        items = []
        with self._base_fd() as base_fd:
            for dir_fd, relative, name, st in self._files(base_fd):
                if self._is_entry(name, st):
                    items.append((st.st_mtime, st.st_size, relative))
                elif name.startswith(".tmp-") and now - st.st_mtime > _TOUCH_AFTER:
                    # A writer killed before its rename (SIGKILL, power loss) left this; it is never an
                    # entry, the size cap does not count it, and no live writer (seconds) is this slow.
                    try:
                        os.unlink(name, dir_fd=dir_fd)
                    except OSError:
                        pass
            items.sort()
            total = sum(item[1] for item in items)
            removed = freed = 0
            if not limit or total <= limit:  # 0 (or None) is no limit, as while compiling
                return 0, 0
            goal = int(limit * 0.8)
            meter = None
            if progress:
                left, count = total, 0
                for _mtime, size, _relative in items:
                    if left <= goal:
                        break
                    left -= size
                    count += 1
                meter = progress(count)
            for _mtime, size, relative in items:
                if total <= goal:
                    break
                if meter is not None:
                    meter.step()
                try:
                    private.unlink_beneath(base_fd, relative)
                except OSError:
                    continue  # gone already, or its directory was swapped for a link: not ours to touch
                total -= size
                removed += 1
                freed += size
        return removed, freed

    def _maybe_prune(self):
        if not self.max_size:
            return
        stamp = os.path.join(self.base, "meta", "last-prune")
        try:
            if time.time() - os.stat(stamp).st_mtime < _PRUNE_EVERY:
                return
        except OSError:
            pass
        try:
            private.make_private_dirs(os.path.dirname(stamp))
            private.write_atomic(stamp, b"")
            self.prune()
        except OSError as exc:
            log.debug("ptxbackend: pruning skipped: %s", exc)

    def clear(self):
        """Remove every entry, lock and memo of this schema version."""
        with self._root_fd() as root_fd:
            private.remove_tree_beneath(root_fd, LAYOUT)
        private.make_private_dirs(self.base)

    @contextlib.contextmanager
    def _root_fd(self):
        """A descriptor of the cache root, checked again as when the store was opened: what is deleted
        below it is found and removed through it, wherever a path would lead by then."""
        try:
            _check_parents(self.root)
            fd = os.open(self.root, os.O_RDONLY | private.DIRECTORY | private.CLOEXEC)
        except OSError as exc:
            raise CacheError("cannot open cache directory %s: %s" % (self.root, exc.strerror or exc))
        try:
            st = os.fstat(fd)
            if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
                raise CacheError("cache directory %s is no longer a private directory of yours" % self.root)
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _root_items_at(root_fd):
        """``(old, unknown)``: the trees an older ptxbackend left in the cache root (each proven so by
        :func:`_old_tree_is_ours`), and every name there that ptxbackend did not make."""
        old, unknown = [], []
        for name in sorted(os.listdir(root_fd)):
            schema = layout_schema(name)
            if name == LAYOUT or (schema is not None and schema > SCHEMA_VERSION):
                continue  # this version's, or a newer one's: never touched
            if name in ROOT_NAMES or name.startswith(ROOT_PREFIXES):
                continue
            if schema in OLD_SCHEMAS and _old_tree_is_ours(root_fd, name, schema):
                old.append(name)
            else:
                unknown.append(name)
        return old, unknown

    def root_items(self):
        """``(old layouts, unknown names)`` of the cache root, from one look at it."""
        try:
            with self._root_fd() as root_fd:
                return self._root_items_at(root_fd)
        except (CacheError, OSError):
            return [], []

    def old_layouts(self):
        """Names of the trees older schema versions left here (``v3`` when this is ``v4``)."""
        return self.root_items()[0]

    def unknown_items(self):
        """Names in the cache root that ptxbackend did not make: left alone, reported (doctor)."""
        return self.root_items()[1]

    def remove_old_layouts(self):
        """Remove the trees of older schema versions; return their names.

        An upgrade leaves the old tree behind, unread and uncounted by the size
        cap.  Not done automatically: an older ptxbackend in another environment
        may still share this cache directory.  Newer layouts are never touched, nor
        is anything ptxbackend did not write (a folder of the user's named ``v2``).
        """
        with self._root_fd() as root_fd:
            removed = self._root_items_at(root_fd)[0]
            for name in removed:
                private.remove_tree_beneath(root_fd, name)
        return removed

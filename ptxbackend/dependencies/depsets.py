"""Dependency sets: what a compile read and where it searched, kept once, checked once per process.

The contract, all the engine needs:

- :func:`build` (on a miss): the files the compiler read and the directories it
  searched become one set, JSON bytes named by their SHA-256 (its *digest*).
  Entries name their set by digest; kernels that read the same headers (every
  CuPy kernel) share one set, kept once in the cache, bundles and the fleet.
- :func:`fresh` (on a hit): whether a set still describes what the compiler
  would read today.  A set is checked at most once per process, then watched
  (inotify on its directories; see :mod:`ptxbackend.files.inotify`) and checked
  again only after something there changed.  Where nothing can watch it (no
  inotify, a network file system, a watch limit reached) it is checked again
  after ``recheck_seconds`` (``PTXBACKEND_DEPS_RECHECK``, default 0: every hit).

A set records:

- ``files``: ``[path, size, mtime_ns, ctime_ns, ino, dev, sha256, trusted, system]``
  per file read.  The stat is the fast path; the content hash decides whenever
  the stat differs or cannot be trusted (changed within ``RACY_SECONDS`` of the
  compile, or dated in the future), because ``cp -p``, ``tar -x`` and
  ``git checkout`` restore an old mtime.  ``system`` marks the toolkit's and
  host compiler's own headers, which a machine without the compiler skips.
- ``absent``: ``[directory, mtime_ns, ino, dev, trusted, [names]]``: names that
  must not appear in a directory, because the compiler looked for them there
  before finding the header elsewhere (or not at all): for each ``#include``
  and ``__has_include`` of every text read, each place earlier in its search
  order than where it was found; for each file read, the same name in every
  search directory before its own (which covers computed includes), and for an
  ``#include_next`` each directory after its includer's before where it was found.
  The name is the whole missing path below the deepest existing directory (what
  must stay absent is the file: an empty ``mkdir`` on the way is no change).  An
  unchanged directory stat answers at once; a changed one is answered by
  looking each name up, so unrelated files added there cost nothing.
- ``date``: present when a text read uses ``__DATE__``; valid on that day only.
  A compile whose texts use ``__TIME__`` or ``__TIMESTAMP__`` is never cached
  (``build`` says ``volatile``), as ccache does.
"""

import hashlib
import json
import os
import re
import threading
import time

from ..files import watching
from ..files.private import NotARegularFile, process_id, read_regular
from .reads import UNKNOWN_READS

RACY_SECONDS = 2.0
CHANGED_DURING_COMPILE = "changed-during-compile"
#: seconds between checks of a set nothing watches (``PTXBACKEND_DEPS_RECHECK``)
recheck_seconds = 0.0
_HAS_INCLUDE = re.compile(br'__has_include(?:_next)?\s*\(\s*([<"])([^>"\r\n]+)[>"]\s*\)')
_WATCHED = -1.0

_stat = os.stat  # one name for the check's stat, so a test can give it a coarse file system's times
_lock = threading.Lock()
_known_hashes = {}  # path -> (signature, sha256) this process hashed and could trust
_sets = {}          # digest -> _Parsed
_valid = {}         # (digest, complete) -> time checked, or _WATCHED
_built = {}         # what build() was given -> the Built it made, while the watcher hears nothing
_owner = [None, None]  # the process and watcher epoch of the checks _valid holds (a forked child starts afresh)
_LIMIT = 8192


class Built(object):
    """What :func:`build` made: the set's bytes and digest (``None`` when nothing was read), and
    whether the output may be cached at all."""

    __slots__ = ("blob", "digest", "volatile")

    def __init__(self, blob, digest, volatile):
        self.blob, self.digest, self.volatile = blob, digest, volatile

    @property
    def section(self):
        """What an entry stores to name this set."""
        return self.digest.encode("ascii") if self.digest else b""


# -- building ------------------------------------------------------------------------------------
def build(paths, search_dirs, system_dirs, user_dirs, source, started=None, source_dir=None,
          date_from_epoch=False):
    """The set for a compile that read ``paths`` looking in ``search_dirs`` (in order).

    ``system_dirs`` are the toolkit's and host compiler's own directories;
    ``user_dirs`` the ones the request named (a header under both is the
    user's).  ``source`` is the main text, whose quoted includes are looked
    for in ``source_dir`` first; ``started`` is when the compile began.
    Raises :class:`NotARegularFile` for a read path that is a FIFO or device.
    """
    now = time.time()
    started = now if started is None else started
    if any(path.startswith(UNKNOWN_READS) for path in paths):
        return Built(None, None, True)  # what the compiler read cannot be told: never served
    unique = []
    for path in paths:
        path = os.path.normpath(path)
        if path not in unique:
            unique.append(path)
    source_facts = _facts_of(source if isinstance(source, bytes) else source.encode("utf-8", "surrogateescape"))
    memo = None
    if not (source_facts.volatile or source_facts.dated):
        # Every CuPy kernel reads the same headers: while nothing changed in the directories the
        # set covers (they are watched), the same reads and include names give the same set.
        relative = [d for d in unique + list(search_dirs) + [source_dir or "/"] if not os.path.isabs(d)]
        memo = (tuple(unique), tuple(search_dirs), tuple(system_dirs), tuple(user_dirs), source_facts.includes,
                source_facts.include_nexts, source_facts.has_includes, source_dir, date_from_epoch,
                os.getcwd() if relative else None)
        _forget_what_changed()
        known = _built.get(memo)
        if known is not None:
            return known
    system = set(split_system(unique, system_dirs, user_dirs)[1])
    files, facts = [], [source_facts]
    for path in unique:
        record, found = _file_record(path, started, now)
        files.append(record + [path in system])
        facts.append(found)
    volatile = any(f.volatile for f in facts)
    absent, present = _absent_names(unique, [r[6] for r in files], search_dirs, facts, source_dir)
    body = {"files": sorted(files),
            "absent": [_dir_record(d, started) + [sorted(names)] for d, names in sorted(absent.items())]}
    if present:
        body["present"] = sorted(present)
    if any(f.dated for f in facts):
        body["date"] = today(date_from_epoch)
        if date_from_epoch:
            body["date_from_epoch"] = True
    if not files and not absent and not present and not body.get("date"):
        return Built(None, None, volatile)
    blob = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")
    built = Built(blob, hashlib.sha256(blob).hexdigest(), volatile)
    if memo is not None and not volatile and "date" not in body and all(r[7] for r in files) \
            and all(r[4] for r in body["absent"]):
        _remember_built(memo, built, body)
    return built


def _remember_built(memo, built, body):
    """Keep ``built`` for :func:`build` to return again, if its directories can be watched; it then
    counts as checked for hits too.  The watch comes first and the set is checked after it, so a
    change after the build's own look is heard or seen."""
    parsed = _Parsed(body)
    if not (parsed.absolute and watching.watch(_watch_dirs(parsed), parsed.watch_files)
            and _check(parsed, True, False)):
        return
    section = built.digest.encode("ascii")
    with _lock:
        for memory in (_built, _sets, _valid):
            if len(memory) >= _LIMIT:
                memory.clear()
        _built[memo] = built
        _sets[section] = parsed
        _valid[(section, True)] = _WATCHED


class _Facts(object):
    """What the set needs from a text: its ``#include`` and ``__has_include`` names, and whether it
    uses the clock.  Kept per content digest: every CuPy kernel reads the same headers."""

    __slots__ = ("includes", "include_nexts", "has_includes", "volatile", "dated")

    def __init__(self, text):
        found = _INCLUDES.findall(text)
        self.includes = tuple((quote == b'"', name.decode("utf-8", "surrogateescape").strip())
                              for nxt, quote, name in found if not nxt)
        self.include_nexts = tuple(name.decode("utf-8", "surrogateescape").strip()
                                   for nxt, quote, name in found if nxt)
        self.has_includes = tuple((quote == b'"', name.decode("utf-8", "surrogateescape").strip())
                                  for quote, name in _HAS_INCLUDE.findall(text))
        self.volatile = b"__TIME__" in text or b"__TIMESTAMP__" in text
        self.dated = b"__DATE__" in text


_facts_memo = {}


def _facts_of(text, digest=None):
    found = _facts_memo.get(digest) if digest else None
    if found is None:
        found = _Facts(text)
        if digest:
            with _lock:
                if len(_facts_memo) >= _LIMIT:
                    _facts_memo.clear()
                _facts_memo[digest] = found
    return found


def today(from_epoch=False):
    """``__DATE__`` as a compiler writes it now: nvcc takes ``SOURCE_DATE_EPOCH`` when it is set
    (``from_epoch``), NVRTC (11.7, 13) the clock's date."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH") if from_epoch else None
    try:
        moment = time.gmtime(int(epoch)) if epoch else time.localtime()
    except ValueError:
        moment = time.localtime()
    return time.strftime("%b %d %Y", moment)


def _file_record(path, started, now):
    """The record of a file the compile read, and its :class:`_Facts`.  A file this process hashed
    and could trust, and that still stats the same, is not read again."""
    st = _stat(path)
    known = _known_hashes.get(path)
    if known is not None and known[0] == _signature(st) and known[1] in _facts_memo:
        digest = known[1]
        found = _facts_memo[digest]
    else:
        data, st = read_regular(path)
        digest = hashlib.sha256(data).hexdigest()
        found = _facts_of(data, digest)
    started_ns, now_ns = int(started * 1e9), int(now * 1e9)
    for changed in (st.st_mtime_ns, st.st_ctime_ns):
        # A file system with whole-second times stamps a change made during the compile with a time
        # before its start: compare in whole seconds there.
        limit = (started_ns // 1000000000) * 1000000000 if changed % 1000000000 == 0 else started_ns
        if limit <= changed <= now_ns + 1000000000:
            # Changed while the compiler ran: the bytes here may not be the ones it read (ccache's
            # "include file too new"), so nothing will match and the next request compiles again.
            digest = CHANGED_DURING_COMPILE
    # A file changed shortly before, or dated in the future, is compared by content whenever checked.
    trusted = digest != CHANGED_DURING_COMPILE and _trustworthy(st, started)
    if trusted:
        _remember(path, _signature(st), digest)
    return [path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, digest, trusted], found


def _dir_record(path, started):
    st = _stat(path)
    return [path, st.st_mtime_ns, st.st_ino, st.st_dev, _trustworthy(st, started)]


_INCLUDES = re.compile(br'^[ \t]*#[ \t]*include(_next)?[ \t]*([<"])([^>"\r\n]+)[>"]', re.M)


_absent_memo = {}


def _absent_names(paths, digests, search_dirs, facts, source_dir=None):
    """``({directory: set of names} that must stay absent, {paths that must stay})`` (see the
    module's docstring).  Remembered for the same files and search path while every directory the
    answer depends on stats the same: kernels that share their headers share the work."""
    marker = (tuple(paths), tuple(digests), tuple(search_dirs), facts[0].includes, facts[0].include_nexts,
              facts[0].has_includes, source_dir)
    found = _absent_memo.get(marker)
    if found is not None and all(_dir_signature(d) == sig for d, sig in found[2]):
        return found[0], found[1]
    absent, present, looked = _look_up_names(paths, search_dirs, facts, source_dir)
    with _lock:
        if len(_absent_memo) >= 256:
            _absent_memo.clear()
        _absent_memo[marker] = (absent, present, [(d, _dir_signature(d)) for d in sorted(looked)])
    return absent, present


def _dir_signature(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_ino, st.st_dev)


def _look_up_names(paths, search_dirs, facts, source_dir):
    search = [os.path.normpath(d) for d in search_dirs]
    absent, present, looked = {}, set(), set()
    probed = set()

    def probe(name, order, answer=False):
        """Look ``name`` up along ``order`` as the compiler does; each miss before the hit is kept, and
        the hit itself where the compiler only asked whether it exists (``__has_include``)."""
        if (name, order, answer) in probed or os.path.isabs(name):
            return
        probed.add((name, order, answer))
        for directory in order:
            candidate = os.path.normpath(os.path.join(directory, name))
            if os.path.exists(candidate):
                looked.add(os.path.dirname(candidate) or os.curdir)
                if answer:
                    present.add(candidate)
                return
            holder, missing = _first_missing(candidate)
            if holder is not None:
                absent.setdefault(holder, set()).add(missing)
                looked.add(holder)
    whole = tuple(search)
    for path in paths:
        for index, directory in enumerate(search):
            if _under(path, directory):
                probe(os.path.relpath(path, directory), whole[:index])
                break
    for path, found in zip([None] + list(paths), facts):
        here = (os.path.dirname(path) or os.curdir,) if path else ((source_dir,) if source_dir else ())
        for quoted, name in found.includes:
            probe(name, (here if quoted else ()) + whole)
        for quoted, name in found.has_includes:
            probe(name, (here if quoted else ()) + whole, True)
        for name in found.include_nexts:
            # The search goes on after the directory the including file was found in: each one
            # before the file it finds must stay without it.
            after = whole
            for index, directory in enumerate(search):
                if path and _under(path, directory):
                    after = whole[index + 1:]
                    break
            probe(name, after)
    return absent, present, looked


def _first_missing(path):
    """``(deepest existing directory above path, the path below it)``; ``(None, None)`` when
    something in the way is not a directory (nothing can appear there without a change to a file the
    set already names, or the directory a file is in).  The whole rest of the path, not its first
    component: what must stay absent is the file, so an empty ``mkdir`` on the way is no change."""
    missing = os.path.basename(path)
    parent = os.path.dirname(path) or os.curdir
    while not os.path.isdir(parent):
        if os.path.lexists(parent) or parent in (os.sep, os.curdir, ""):
            return None, None
        missing = os.path.basename(parent) + "/" + missing
        parent = os.path.dirname(parent) or os.curdir
    return parent, missing


def well_formed(body):
    """Whether a decoded set has the shape :func:`build` writes (bundles and the fleet bring others')."""
    def ints(values):
        return all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    if not isinstance(body, dict) or not set(body) <= {"files", "absent", "present", "date", "date_from_epoch"}:
        return False
    present = body.get("present", [])
    if not isinstance(present, list) or not all(isinstance(p, str) for p in present):
        return False
    files, absent = body.get("files"), body.get("absent")
    if not isinstance(files, list) or not isinstance(absent, list):
        return False
    for item in files:
        if not (isinstance(item, list) and len(item) == 9 and isinstance(item[0], str) and ints(item[1:6])
                and isinstance(item[6], str) and isinstance(item[7], bool) and isinstance(item[8], bool)):
            return False
    for item in absent:
        if not (isinstance(item, list) and len(item) == 6 and isinstance(item[0], str) and ints(item[1:4])
                and isinstance(item[4], bool) and isinstance(item[5], list)
                and all(isinstance(n, str) and (n not in _NO_NAMES if "/" not in n else _relative_name(n))
                        for n in item[5])):
            return False
    return isinstance(body.get("date", ""), str) and isinstance(body.get("date_from_epoch", False), bool)


_NO_NAMES = ("", ".", "..")


def _relative_name(name):
    """A name below a directory (``later/deeper/val.cuh``): no part of it empty, ``.`` or ``..``."""
    return not set(name.split("/")) & set(_NO_NAMES)


# -- checking ------------------------------------------------------------------------------------
class _Parsed(object):
    __slots__ = ("files", "absent", "present", "date", "date_from_epoch", "watch_files", "absolute",
                 "_watch", "_watch_epoch")

    def __init__(self, body):
        self.files = [tuple(item) for item in body["files"]]
        self.absent = [tuple(item[:5]) + (tuple(item[5]),) for item in body["absent"]]
        self.present = body.get("present", ())
        self.date = body.get("date")
        self.date_from_epoch = bool(body.get("date_from_epoch"))
        self.watch_files = [item[0] for item in self.files if os.path.isabs(item[0])]
        # A relative path is looked up in whatever the working directory is at the time (NVRTC's
        # quoted includes): its check and watch hold for one working directory.
        self.absolute = (len(self.watch_files) == len(self.files) and all(os.path.isabs(p) for p in self.present)
                         and all(os.path.isabs(item[0]) for item in self.absent))
        self._watch, self._watch_epoch = None, None

    @property
    def watch(self):
        """The directories to watch, worked out again after any change: what a link on the way
        resolves to may be what changed."""
        epoch = _owner[1]
        if self._watch is None or self._watch_epoch != epoch:
            watch = set(item[0] for item in self.absent)
            watch.update(os.path.dirname(path) or os.curdir for path in self.present)
            # The file's directory, every link's on the way and the target's (an edit through the
            # link or a retarget is an event there), and the file itself: a write through a hard
            # link in a directory nobody watches is an event on the inode only.
            watch.update(os.path.dirname(item[0]) or os.curdir for item in self.files
                         if not os.path.isabs(item[0]))
            watch.update(watching.files_directories(self.watch_files))
            self._watch, self._watch_epoch = sorted(watch), epoch
        return self._watch


def _watch_dirs(parsed):
    """The directories to watch for ``parsed``: its own, and for a name that must stay absent several
    levels below its directory (``later/deeper/inc/val.cuh``), each of those levels that exists now:
    the file appearing there is an event in the deepest one."""
    deeper = []
    for directory, _, _, _, _, names in parsed.absent:
        for name in names:
            if "/" in name:
                current = directory
                for part in name.split("/")[:-1]:
                    current = os.path.join(current, part)
                    if not os.path.isdir(current):
                        break
                    deeper.append(current)
    watch = parsed.watch
    return watch + deeper if deeper else watch


def fresh(section, load, complete=True, missing_ok=False):
    """Whether the set an entry names (``section``: its digest as bytes) still holds.

    ``load(digest)`` returns the set's bytes (checked here against the digest)
    or ``None``.  ``complete=False`` is for a machine without the compiler:
    the toolkit's own files and the search directories are not checked, and
    with ``missing_ok`` a file the set names that does not exist here is
    accepted (a bundle from a build box); a file that exists must match.
    """
    if not section:
        return True
    _forget_what_changed()
    parsed = _parse(section, load)  # from memory after the first time
    if parsed is None:
        return False
    # Relative paths mean other files in another working directory.
    marker = (section, complete) if parsed.absolute else (section, complete, os.getcwd())
    when = _valid.get(marker)
    if when is not None and (when == _WATCHED or time.time() - when < recheck_seconds):
        return True
    # Watch before checking, so that a change between the two is heard.
    watched = complete and parsed.date is None and watching.watch(
        [os.path.abspath(d) for d in _watch_dirs(parsed)], [os.path.abspath(f) for f in parsed.watch_files])
    if not _check(parsed, complete, missing_ok):
        return False
    with _lock:
        if len(_valid) >= _LIMIT:
            _valid.clear()
        _valid[marker] = _WATCHED if watched else time.time()
    return True


def holds_now(blob):
    """Whether the set ``blob`` (what :func:`build` made) holds, checked in full now: no memory of an
    earlier check, no watcher (precompiled.py must know before NVRTC reuses what it made from it)."""
    try:
        body = json.loads(blob.decode("ascii"))
    except ValueError:
        return False
    return well_formed(body) and _check(_Parsed(body), True, False)


def _forget_what_changed():
    """Drop the sets checked and built, when the watcher heard a change or this is a forked child."""
    epoch = watching.poll()
    if _owner[0] != process_id() or _owner[1] != epoch:
        with _lock:
            _valid.clear()
            _built.clear()
            _owner[:] = [process_id(), epoch]


def _parse(section, load):
    parsed = _sets.get(section)
    if parsed is not None:
        return parsed
    digest = section.decode("ascii", "replace")
    blob = load(digest) if len(digest) == 64 else None
    if blob is None or hashlib.sha256(blob).hexdigest() != digest:
        return None
    try:
        body = json.loads(blob.decode("ascii"))
    except ValueError:
        return None
    if not well_formed(body):
        return None
    parsed = _Parsed(body)
    with _lock:
        if len(_sets) >= _LIMIT:
            _sets.clear()
        _sets[section] = parsed
    return parsed


def _check(parsed, complete, missing_ok):
    if parsed.date is not None and parsed.date != today(parsed.date_from_epoch):
        return False
    for item in parsed.files:
        if not complete and item[8]:
            continue
        if not _file_unchanged(item, missing_ok):
            return False
    if complete:
        for item in parsed.absent:
            if not _still_absent(item):
                return False
        for path in parsed.present:
            if not os.path.exists(path):
                return False
    return True


def _signature(st):
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def _trustworthy(st, now):
    return now - max(st.st_mtime, st.st_ctime) > RACY_SECONDS


def _remember(path, signature, digest):
    with _lock:
        if len(_known_hashes) >= _LIMIT:
            _known_hashes.clear()
        _known_hashes[path] = (signature, digest)


def _file_unchanged(item, missing_ok):
    path, size, mtime_ns, ctime_ns, ino, dev, digest, trusted = item[:8]
    try:
        st = _stat(path)
    except OSError:
        return missing_ok
    if trusted and st.st_mtime_ns == mtime_ns and st.st_ctime_ns == ctime_ns and st.st_ino == ino \
            and st.st_size == size and st.st_dev == dev:
        return True
    signature = _signature(st)
    known = _known_hashes.get(path)
    if known is not None and known[0] == signature:
        return known[1] == digest
    try:
        data, st = read_regular(path)
    except NotARegularFile:
        return False
    except OSError:
        return missing_ok
    now_digest = hashlib.sha256(data).hexdigest()
    if _trustworthy(st, time.time()):
        _remember(path, _signature(st), now_digest)
    return now_digest == digest


def _still_absent(item):
    directory, mtime_ns, ino, dev, trusted, names = item
    try:
        st = _stat(directory)
    except OSError:
        return False
    if trusted and st.st_mtime_ns == mtime_ns and st.st_ino == ino and st.st_dev == dev:
        return True  # no name in it was added, removed or renamed since
    for name in names:
        if os.path.lexists(os.path.join(directory, name)):
            return False
    return True


# -- watching (the watcher itself: ptxbackend/files/watching.py) --------------------------------------
def watch_mode(directory):
    """How a set with files in ``directory`` is kept checked here, in words (``ptxbackend doctor``)."""
    fstype = watching.mount_type(directory) or "unknown file system"
    if watching.on_network_fs(directory):
        how = ("checked at most every %g s (PTXBACKEND_DEPS_RECHECK)" % recheck_seconds if recheck_seconds
               else "checked on every hit (PTXBACKEND_DEPS_RECHECK=N: at most every N s)")
        return "%s: %s is a network or shared file system, where inotify does not hear other machines' " \
               "writes" % (how, fstype)
    from ..files import inotify as _inotify
    probe = _inotify.ChangeWatcher.open()
    if probe is None:
        return "checked on every hit: no inotify here"
    probe.close()
    return "checked once per process, then watched with inotify (%s)" % fstype


def forget():
    """Drop what this process remembers (tests; after a toolkit's headers changed in place)."""
    with _lock:
        _known_hashes.clear()
        _sets.clear()
        _valid.clear()
        _built.clear()
        watching.forget()
        _absent_memo.clear()
        _facts_memo.clear()
        _realpaths.clear()
        _classified.clear()


# -- whose headers -------------------------------------------------------------------------------
def split_system(paths, system_dirs, user_dirs):
    """``(user, system)`` lists: a path is the system's when it lies under a system directory
    and under none that the request named itself (``-I``, ``-isystem``, CPATH ...).

    Paths are compared as spelt and with links resolved, both sides: a toolkit reached through a
    link (``/usr/local/cuda``) or installed as a tree of links is still the toolkit.
    """
    marker = (tuple(system_dirs), tuple(user_dirs))
    known = _classified.get(marker)
    if known is None:
        with _lock:
            if len(_classified) >= 64:
                _classified.clear()
            known = _classified[marker] = {}
    system_dirs = user_dirs = None
    user, system = [], []
    for path in paths:
        is_system = known.get(path)
        if is_system is None:
            if system_dirs is None:
                system_dirs, user_dirs = _both_forms(marker[0]), _both_forms(marker[1])
            forms = (os.path.abspath(path), _realpath(path))
            is_system = known[path] = any(_under(f, d) for f in forms for d in system_dirs) \
                and not any(_under(f, d) for f in forms for d in user_dirs)
        (system if is_system else user).append(path)
    return user, system


_classified = {}  # (system dirs, user dirs) -> {path: whether it is the system's}


def _both_forms(dirs):
    found = []
    for directory in dirs:
        for form in (os.path.abspath(directory), _realpath(directory)):
            if form not in found:
                found.append(form)
    return found


_realpaths = {}


def _realpath(path):
    """``os.path.realpath``, once per process and path: it only sorts headers into the toolkit's and
    yours (which a machine without the compiler skips), and a compile resolves many the same."""
    found = _realpaths.get(path)
    if found is None:
        found = os.path.realpath(path)
        with _lock:
            if len(_realpaths) >= _LIMIT:
                _realpaths.clear()
            _realpaths[path] = found
    return found


def _under(path, directory):
    if directory == os.curdir:
        return not os.path.isabs(path)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)

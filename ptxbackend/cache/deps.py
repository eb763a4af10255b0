"""What a compile read, and whether it still says the same: ccache's "direct mode" for kernels.

On a miss the compiler tells us (nvcc's dependency output) or we work out
(NVRTC: the ``#include`` lines, resolved as NVRTC resolves them) every file
the compile read.  Each is recorded with its stat signature and content hash
in the entry's dependency section.  A hit re-checks them:

- *your* headers (anything outside the toolkit and the host compiler's own
  include directories) on every hit: one ``stat`` each, and a content hash
  only when the stat differs from the recorded one or was not trustworthy;
- the toolkit's and the host compiler's own headers (a hundred or more for
  any nvcc compile) once per process for each distinct set: they change only
  with the toolkit or the host compiler, whose identity is checked per call.

Why the content hash: a stat alone lies.  ``cp -p``, ``tar -x`` and
``git checkout`` of an old tree restore a file's mtime, and an edit within the
file system's timestamp granularity keeps it.  The signature therefore also
holds the ctime (which nobody can set back) and the inode, and a file changed
too recently to trust its stat ("racy", as git and ccache call it) is always
compared by content.

Section format (bytes, UTF-8)::

    <sha256 of the system list, or empty>\\n<JSON list of your files>

The system list (the same for most kernels of one toolkit, and a hundred or
more files long) is kept once, content-addressed, beside the entries; the
entry holds its digest.  Each file is
``[path, size, mtime_ns, ctime_ns, inode, sha256, trusted]``.
"""

import hashlib
import json
import os
import threading
import time

from .._fsutil import NotARegularFile, read_regular

# Within this many seconds of a file's last change its stat signature cannot be trusted: another
# write in the same timestamp tick would leave it unchanged (coarse file systems tick in seconds).
RACY_SECONDS = 2.0
EMPTY = b"\n[]"

_stat = os.stat  # one name for the check's stat, so a test can give it a coarse file system's times
_lock = threading.Lock()
_known_hashes = {}       # path -> (signature, sha256): what this process hashed and could trust
_valid_systems = set()   # digests of system-file sets found unchanged in this process
_parsed = {}             # a section's user list (bytes) -> its records: kernels sharing headers share it
_KNOWN_LIMIT = 8192


def _signature(st):
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _trustworthy(st, now):
    return now - max(st.st_mtime, st.st_ctime) > RACY_SECONDS


def _hash_file(path):
    data, st = read_regular(path)
    return hashlib.sha256(data).hexdigest(), st


CHANGED_DURING_COMPILE = "changed-during-compile"


def record(paths, started=None):
    """The records of ``paths`` as read now; ``started`` is when the compile began (epoch seconds).

    A file changed after the compile started may differ from what the compiler
    read, so its hash here would vouch for an output made from other bytes: it
    is recorded with a digest nothing matches, and the next request compiles
    again (ccache's "include file too new").  A file changed shortly before is
    recorded untrusted: every hit compares its content.
    """
    now = time.time()
    started = now if started is None else started
    started_ns = int(started * 1e9)
    records = []
    for path in paths:
        digest, st = _hash_file(path)
        changed = max(st.st_mtime_ns, st.st_ctime_ns)
        # A file system with whole-second times stamps a change made during the compile with a
        # time before its start: compare in whole seconds there.
        limit = (started_ns // 1000000000) * 1000000000 if changed % 1000000000 == 0 else started_ns
        if changed >= limit:
            digest = CHANGED_DURING_COMPILE
        trusted = digest != CHANGED_DURING_COMPILE and _trustworthy(st, started)
        records.append([path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, digest, trusted])
        if trusted:
            _remember(path, _signature(st), digest)
    return records


def encode(user_records, system_records):
    """``(section, system_list, digest)``: the entry's section, and the system list to keep by digest."""
    if not user_records and not system_records:
        return b"", None, None  # nothing read besides the source: a hit has nothing to check
    user = json.dumps(user_records, separators=(",", ":")).encode("utf-8")
    if not system_records:
        return b"\n" + user, None, None
    system = json.dumps(system_records, separators=(",", ":")).encode("utf-8")
    digest = hashlib.sha256(system).hexdigest()
    return digest.encode("ascii") + b"\n" + user, system, digest


def _remember(path, signature, digest):
    with _lock:
        if len(_known_hashes) >= _KNOWN_LIMIT:
            _known_hashes.clear()
        _known_hashes[path] = (signature, digest)


def _unchanged(item, missing_ok):
    path, size, mtime_ns, ctime_ns, ino, digest, trusted = item
    try:
        st = _stat(path)
    except OSError:
        return missing_ok
    # Every warm hit pays this for each of the caller's headers: compare fields, build nothing.
    if trusted and st.st_mtime_ns == mtime_ns and st.st_ctime_ns == ctime_ns and st.st_ino == ino \
            and st.st_size == size:
        return True
    signature = _signature(st)
    known = _known_hashes.get(path)
    if known is not None and known[0] == signature:
        return known[1] == digest
    try:
        now_digest, st = _hash_file(path)
    except NotARegularFile:
        return False
    except OSError:
        return missing_ok
    if _trustworthy(st, time.time()):
        _remember(path, _signature(st), now_digest)
    return now_digest == digest


def still_valid(section, load_system=None, missing_ok=False):
    """Whether every file in a dependency ``section`` still holds what the compile read.

    ``load_system(digest)`` returns the system list a section names (bytes
    whose SHA-256 is the digest, or ``None`` when it is not kept here: then
    the section is not valid).  ``load_system=None`` skips the toolkit's and
    host compiler's own files (a machine with no compiler has none of them).
    ``missing_ok`` accepts a recorded file that no longer exists (same
    reason, for a bundle from a build box); a file that exists must match.
    """
    if not section or section == EMPTY:
        return True
    first = section.index(b"\n")
    user = section[first + 1:]
    if user != b"[]":
        records = _parsed.get(user)
        if records is None:
            records = [tuple(item) for item in json.loads(user.decode("utf-8"))]
            with _lock:
                if len(_parsed) >= 4096:
                    _parsed.clear()
                _parsed[user] = records
        stat = _stat
        for item in records:
            # The common case inline (every warm hit, every header): a trusted, unchanged stat.
            try:
                st = stat(item[0])
            except OSError:
                st = None
            if st is not None and item[6] and st.st_mtime_ns == item[2] and st.st_ctime_ns == item[3] \
                    and st.st_ino == item[4] and st.st_size == item[1]:
                continue
            if not _unchanged(item, missing_ok):
                return False
    digest = section[:first]
    if load_system is not None and digest and digest not in _valid_systems:
        blob = load_system(digest.decode("ascii"))
        if blob is None or hashlib.sha256(blob).hexdigest().encode("ascii") != digest:
            return False
        for item in json.loads(blob.decode("utf-8")):
            if not _unchanged(item, missing_ok):
                return False
        with _lock:
            _valid_systems.add(digest)
    return True


def forget():
    """Drop what this process remembers (tests; after a toolkit's headers changed in place)."""
    with _lock:
        _known_hashes.clear()
        _valid_systems.clear()
        _parsed.clear()


def split_system(paths, system_dirs, user_dirs):
    """``(user, system)`` lists: a path is the system's when it lies under a system directory
    and under none that the request named itself (``-I``, ``-isystem``, CPATH ...).

    Paths are compared as spelt and with links resolved, both sides: a toolkit reached through a
    link (``/usr/local/cuda``) or installed as a tree of links is still the toolkit.
    """
    system_dirs = _both_forms(system_dirs)
    user_dirs = _both_forms(user_dirs)
    user, system = [], []
    for path in paths:
        forms = (os.path.abspath(path), os.path.realpath(path))
        if any(_under(f, d) for f in forms for d in system_dirs) \
                and not any(_under(f, d) for f in forms for d in user_dirs):
            system.append(path)
        else:
            user.append(path)
    return user, system


def _both_forms(dirs):
    found = []
    for directory in dirs:
        for form in (os.path.abspath(directory), os.path.realpath(directory)):
            if form not in found:
                found.append(form)
    return found


def _under(path, directory):
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)

"""Cache keys: what identifies a compile *request*.

The key covers everything that changes the compiler's output except the
compiler itself: schema version, target, output kind, options, source, and a
fingerprint of the headers reachable through ``-I`` directories.  The
compiler (the *producer*) is part of the entry's path and metadata instead,
so a machine with no compiler can still find an entry for the same request.
"""

import hashlib
import json
import os
import threading

from .. import _fsutil

SCHEMA_VERSION = 2

_INCLUDE_FLAGS = ("-I", "--include-path")
_fingerprints = {}
_fingerprints_lock = threading.Lock()


def include_dirs(options):
    """The ``-I`` directories named in ``options``, as absolute paths, in order."""
    dirs = []
    options = list(options)
    index = 0
    while index < len(options):
        opt = str(options[index])
        value = None
        for flag in _INCLUDE_FLAGS:
            if opt == flag and index + 1 < len(options):
                index += 1
                value = str(options[index])
            elif opt.startswith(flag + "="):
                value = opt[len(flag) + 1:]
            elif flag == "-I" and opt.startswith("-I") and len(opt) > 2:
                value = opt[2:]
        # CuPy v2-v9 pass '-I ' + path: the space is not part of the directory.
        value = value.strip() if value else value
        if value:
            dirs.append(os.path.abspath(value))
        index += 1
    return dirs


def _walk_files(directory):
    found = []
    for base, subdirs, files in os.walk(directory):
        subdirs.sort()
        for name in sorted(files):
            full = os.path.join(base, name)
            try:
                stat = os.stat(full)
            except OSError:
                continue
            found.append((os.path.relpath(full, directory), stat.st_size,
                          getattr(stat, "st_mtime_ns", int(stat.st_mtime * 1e9)), full))
    return found


def _content_digest(files):
    digest = hashlib.sha256()
    for rel, _size, _mtime, full in files:
        digest.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        try:
            with open(full, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
        except OSError:
            digest.update(b"unreadable")
    return digest.hexdigest()


def header_fingerprint(dirs, memo_dir=None):
    """A content fingerprint of every file under ``dirs``.

    Content, not timestamps, so that a build box and a line PC with the same
    headers agree on the key.  Hashing a large include tree costs time, so the
    content digest is remembered on disk under a digest of (name, size, mtime)
    of every file, and in memory for the rest of the process.
    """
    if not dirs:
        return ""
    marker = tuple(dirs)
    with _fingerprints_lock:
        known = _fingerprints.get(marker)
    if known is not None:
        return known
    listing = []
    stat_digest = hashlib.sha256()
    for directory in dirs:
        files = _walk_files(directory) if os.path.isdir(directory) else []
        listing.append(files)
        stat_digest.update(directory.encode("utf-8", "surrogateescape") + b"\0")
        for rel, size, mtime, _full in files:
            stat_digest.update(("%s\0%d\0%d\0" % (rel, size, mtime)).encode("utf-8", "surrogateescape"))
    memo = os.path.join(memo_dir, stat_digest.hexdigest()[:32] + ".txt") if memo_dir else None
    result = None
    if memo:
        try:
            result = _fsutil.read_file(memo).decode("ascii").strip() or None
        except (OSError, UnicodeDecodeError):
            result = None
    if result is None:
        outer = hashlib.sha256()
        for files in listing:
            outer.update(_content_digest(files).encode("ascii"))
        result = outer.hexdigest()
        if memo:
            try:
                _fsutil.make_private_dirs(memo_dir)
                _fsutil.write_atomic(memo, result.encode("ascii"))
            except OSError:
                pass
    with _fingerprints_lock:
        _fingerprints[marker] = result
    return result


_key_heads = {}
_KEY_HEADS_LIMIT = 4096


def request_key(source, options, target, header_digest):
    """The hex SHA-256 that names a compile request in the cache."""
    if not isinstance(source, bytes):
        source = source.encode("utf-8")
    marker = (target, tuple(options), header_digest)
    try:
        head = _key_heads.get(marker)
    except TypeError:  # an unhashable option: build the head every time
        marker, head = None, None
    if head is None:
        # Every warm kernel needs its key: the JSON of everything but the source is built once.
        head = json.dumps([SCHEMA_VERSION, str(target), target.output_kind,
                           [str(o) for o in options], header_digest], separators=(",", ":"))
        head = head.encode("utf-8") + b"\0"
        if marker is not None:
            if len(_key_heads) >= _KEY_HEADS_LIMIT:
                _key_heads.clear()
            _key_heads[marker] = head
    digest = hashlib.sha256(head)
    digest.update(source)
    return digest.hexdigest()


def forget_fingerprints():
    """Drop the in-process header fingerprints (after headers changed in a long-lived process)."""
    with _fingerprints_lock:
        _fingerprints.clear()

"""This process's one inotify watcher over the files a hit trusts from an earlier check.

Two kinds of checks share it: dependency sets (``cache/depsets.py``: the headers a compile read, the
places a header could newly appear) and the compiler's identity (``compilers/base.py``: the files that do
the work).  Each is made once in full, with the directories involved watched first, and trusted while
nothing there changes.

A caller asks :func:`poll` before it trusts an earlier check.  A poll reads the watcher's pending
events once and advances the *epoch* when any of them is a change, so a change one caller read is
still seen by the others: each compares the epoch with the one it recorded at its last full check.
Where nothing can be watched (no inotify, a watch refused, a network file system whose other
writers make no event) :func:`watch` says so and the caller checks every time.
"""

import os
import stat
import threading

from .private import process_id

NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "gpfs", "afs",
              "beegfs", "virtiofs", "fuse")

_lock = threading.Lock()
watcher = []        # [ChangeWatcher or None, pid]: this process's watcher, tried once
_epoch = [0]
_mounts = []        # [(mount point, fs type)] longest first, read once
_link_parent_memo = {}
_network_fs_memo = {}


def this_process_watcher():
    """The watcher of this process, made on first use (a forked child makes its own)."""
    pid = process_id()
    if not watcher or watcher[1] != pid:
        from . import inotify as _inotify  # ctypes: imported by the first check, not with the package
        with _lock:
            del watcher[:]
            watcher.extend([_inotify.ChangeWatcher.open(), pid])
    return watcher[0]


def poll():
    """The epoch, after reading the events pending: it advances whenever a watched directory changed
    (or events were lost).  Compare it with the epoch of your last full check."""
    current = watcher[0] if watcher and watcher[1] == process_id() else None
    if current is not None and current.changed():
        with _lock:
            _epoch[0] += 1
            # What a path resolves to may be what changed (a directory link retargeted).
            _real_directory_memo.clear()
            _link_parent_memo.clear()
    return _epoch[0]


def watch(directories, files=()):
    """Watch ``directories`` (and the parents of any link on their way), and ``files`` themselves;
    ``False`` where that cannot be relied on: no inotify, a watch refused, or a network file system
    (inotify does not hear other machines' writes)."""
    current = this_process_watcher()
    if current is None:
        return False
    directories = list(directories) + link_parents(directories)
    if any(on_network_fs(d) for d in directories):
        return False
    return current.watch(directories, files)


def file_directories(path):
    """The directories where a change can change what ``os.stat(path)`` sees: the file's own, that of
    each link on the way to it (retargeting one is a change there) and that of the file it resolves to."""
    found = []
    current = os.path.abspath(path)
    for _ in range(40):  # more links than that: the stat fails (ELOOP), which the check sees
        found.append(os.path.dirname(current))
        if not os.path.islink(current):
            break
        current = os.path.join(os.path.dirname(current), os.readlink(current))
    if len(found) == 1:
        # The file is no link: its real directory is its directory's, shared by every header there
        # (CuPy's headers: hundreds in a few directories), so resolved once per directory.
        real = _real_directory(found[0])
    else:
        real = os.path.dirname(os.path.realpath(path))
    if real not in found:
        found.append(real)
    return found


def files_directories(paths):
    """:func:`file_directories` of every one of ``paths`` (absolute), as one set: a file that is no link
    costs one ``lstat`` here, its directory's real path being resolved once for all its neighbours
    (a CuPy kernel's set names hundreds of headers in a few directories)."""
    found = set()
    plain = set()
    lstat, is_link, dirname = os.lstat, stat.S_ISLNK, os.path.dirname
    for path in paths:
        if "/." in path or "//" in path or path.endswith("/"):
            path = os.path.abspath(path)  # spelt with "..", "." or doubled slashes: the slow road
        try:
            link = is_link(lstat(path).st_mode)
        except OSError:
            link = False  # gone: its directory is where it would reappear
        if link:
            found.update(file_directories(path))
        else:
            plain.add(dirname(path))
    found.update(plain)
    found.update(_real_directory(directory) for directory in plain)
    return found


def _real_directory(directory):
    """``os.path.realpath(directory)`` (absolute, normalised), from its parent's when that is known and
    its own name is no link: one ``lstat`` per directory, where ``realpath`` walks every component."""
    found = _real_directory_memo.get(directory)
    if found is None:
        parent, name = os.path.split(directory)
        if parent == directory or name in ("", ".", ".."):
            found = os.path.realpath(directory)
        else:
            candidate = os.path.join(_real_directory(parent), name)
            found = os.path.realpath(candidate) if os.path.islink(candidate) else candidate
        if len(_real_directory_memo) >= 4096:
            _real_directory_memo.clear()
        _real_directory_memo[directory] = found
    return found


_real_directory_memo = {}


def link_parents(directories):
    """The directories holding a symbolic link on the way to any of ``directories``: retargeting the
    link is a change there."""
    found = []
    for directory in directories:
        current = os.path.abspath(directory)
        while True:
            parent = os.path.dirname(current)
            if parent == current:
                break
            is_link = _link_parent_memo.get(current)
            if is_link is None:
                is_link = _link_parent_memo[current] = os.path.islink(current)
            if is_link and parent not in found:
                found.append(parent)
            current = parent
    return found


def on_network_fs(path):
    found = _network_fs_memo.get(path)
    if found is None:
        found = _network_fs_memo[path] = mount_type(path).split(".")[0] in NETWORK_FS
    return found


def mount_type(path):
    if not _mounts:
        mounts = []
        try:
            with open("/proc/self/mountinfo", "rb") as handle:
                for line in handle:
                    fields = line.split()
                    if b"-" in fields:
                        point = fields[4].decode("utf-8", "surrogateescape").replace("\\040", " ")
                        mounts.append((point, fields[fields.index(b"-") + 1].decode("ascii", "replace")))
        except (OSError, IndexError):
            pass
        mounts.sort(key=lambda m: len(m[0]), reverse=True)
        _mounts.append(mounts)
    absolute = _real_directory(os.path.abspath(path))
    for point, fstype in _mounts[0]:
        if absolute == point or absolute.startswith(point.rstrip(os.sep) + os.sep):
            return fstype
    return ""


def forget():
    """Drop the remembered link and file system answers (tests; after mounts changed)."""
    _link_parent_memo.clear()
    _network_fs_memo.clear()
    _real_directory_memo.clear()

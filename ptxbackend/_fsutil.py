"""Small file-system helpers shared by the cache and the compiler-identity memo.

The rules they enforce: files are written whole or not at all (temp file in the
same directory, then ``os.replace``), created private (0600 files, 0700
directories), a symlink planted where we read or write is never followed, and
only a regular file of our own that nobody else can write is ever read back.
"""

import errno
import os
import stat as stat_module
import tempfile

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class UnsafeFile(OSError):
    """A path holds something we must not read: not a regular file, someone else's, or writable by others."""


def make_private_dirs(path):
    """Create ``path`` and its missing parents with mode 0700; return ``path``."""
    if os.path.isdir(path):
        return path
    parent = os.path.dirname(path)
    if parent and parent != path:
        # os.makedirs gives only the last level the mode from Python 3.7 on; the others
        # would get the umask's 0755, so every level is made here.
        make_private_dirs(parent)
    try:
        os.mkdir(path, 0o700)
    except OSError as exc:
        if exc.errno != errno.EEXIST or not os.path.isdir(path):
            raise
    return path


def _check_readable(fd, path):
    st = os.fstat(fd)
    if not stat_module.S_ISREG(st.st_mode):
        # A FIFO would block the reader forever, a device could be endless.
        raise UnsafeFile(errno.EISDIR if stat_module.S_ISDIR(st.st_mode) else errno.EINVAL,
                         "not a regular file (mode %o)" % st.st_mode, path)
    if not hasattr(os, "getuid"):
        return  # no POSIX owners and modes (Windows): the checksum is the only check there
    if st.st_uid != os.getuid():
        # Someone else's file in our cache was planted, whatever its checksum says.
        raise UnsafeFile(errno.EPERM, "owned by uid %d, not by you (uid %d)" % (st.st_uid, os.getuid()), path)
    if st.st_mode & (stat_module.S_IWGRP | stat_module.S_IWOTH):
        raise UnsafeFile(errno.EPERM, "writable by group or others (mode %o)" % (st.st_mode & 0o777), path)


def read_file(path):
    """Read a whole file without following a symlink at ``path``.

    Only a regular file owned by the current user and not writable by group or
    others is read: the fstat is of the descriptor read, so nothing can be
    swapped in between.  Raises ``OSError`` (ELOOP for a symlink, ENOENT when
    absent, :class:`UnsafeFile` for anything else we refuse).
    """
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
    try:
        _check_readable(fd, path)
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_atomic(path, data):
    """Write ``data`` to ``path`` so readers see the old file, the new one, or none.

    The temporary file lives in the target directory (a rename is only atomic
    within one file system) and is removed if anything fails, e.g. ENOSPC.
    """
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove_quietly(path):
    """Unlink ``path`` (never what a symlink points to); ignore a missing file."""
    try:
        os.unlink(path)
    except OSError:
        pass

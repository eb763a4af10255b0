"""Small file-system helpers shared by the cache and the compiler-identity memo.

The rules they enforce: files are written whole or not at all (temp file in the
same directory, then ``os.replace``), created private (0600 files, 0700
directories), and a symlink planted where we read or write is never followed.
"""

import errno
import os
import tempfile

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def make_private_dirs(path):
    """Create ``path`` and its missing parents with mode 0700; return ``path``."""
    try:
        os.makedirs(path, 0o700)
    except OSError as exc:
        if exc.errno != errno.EEXIST or not os.path.isdir(path):
            raise
    return path


def read_file(path):
    """Read a whole file without following a symlink at ``path``.

    Raises ``OSError`` (ELOOP for a symlink, ENOENT when absent).
    """
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    try:
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

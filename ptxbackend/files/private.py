"""Small file-system helpers shared by the cache and the compiler-identity memo.

The rules they enforce: files are written whole or not at all (temp file in the
same directory, then ``os.replace``), created private (0600 files, 0700
directories), a symlink planted where we read or write is never followed, and
only a regular file of our own that nobody else can write is ever read back.
"""

import contextlib
import errno
import os
import stat as stat_module
import tempfile
import time

from ..errors import CompileError

try:
    import fcntl
except ImportError:  # Windows: store.py falls back to filelock there
    fcntl = None

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


_ids = []  # [pid, uid] of this process, forgotten in a forked child


def _forget_ids():
    del _ids[:]


if hasattr(os, "register_at_fork"):  # 3.7+: a hit then makes no getpid/getuid call at all
    os.register_at_fork(after_in_child=_forget_ids)


def process_id():
    """``os.getpid()``, remembered until a fork (where the interpreter can say when one happens)."""
    if not hasattr(os, "register_at_fork"):
        return os.getpid()
    if not _ids:
        _ids.extend([os.getpid(), os.getuid() if hasattr(os, "getuid") else None])
    return _ids[0]


def user_id():
    """``os.getuid()``, remembered as :func:`process_id` is."""
    if not hasattr(os, "register_at_fork"):
        return os.getuid()
    process_id()
    return _ids[1]


class NotARegularFile(CompileError):
    """An input a compile would read is a FIFO, device or directory: reading it could hang."""


def read_regular(path):
    """The bytes and stat of the regular file at ``path``, following links (as a compiler does).

    Opened non-blocking, so a FIFO or device is never waited on: it raises
    :class:`NotARegularFile`; a missing file raises ``OSError``.
    """
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat_module.S_ISREG(st.st_mode):
            raise NotARegularFile(
                "%s is not a regular file (mode %o): a compile that includes it could block "
                "forever or read without end. Remove it from the include path, or include a "
                "regular file instead." % (path, st.st_mode))
        chunks = []
        while True:
            chunk = os.read(fd, max(st.st_size + 1, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


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
        return st  # no POSIX owners and modes (Windows): the checksum is the only check there
    if st.st_uid != user_id():
        # Someone else's file in our cache was planted, whatever its checksum says.
        raise UnsafeFile(errno.EPERM, "owned by uid %d, not by you (uid %d)" % (st.st_uid, os.getuid()), path)
    if st.st_mode & (stat_module.S_IWGRP | stat_module.S_IWOTH):
        raise UnsafeFile(errno.EPERM, "writable by group or others (mode %o)" % (st.st_mode & 0o777), path)
    return st


def read_file(path):
    """Read a whole file without following a symlink at ``path``.

    Only a regular file owned by the current user and not writable by group or
    others is read: the fstat is of the descriptor read, so nothing can be
    swapped in between.  Raises ``OSError`` (ELOOP for a symlink, ENOENT when
    absent, :class:`UnsafeFile` for anything else we refuse).
    """
    return read_file_and_stat(path)[0]


def read_file_and_stat(path, dir_fd=None):
    """:func:`read_file`, also returning the ``os.stat_result`` of what was read (``path`` relative
    to the directory ``dir_fd`` when given)."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK, dir_fd=dir_fd)
    try:
        st = _check_readable(fd, path)
        # One read of size + 1 bytes normally returns the whole file, and its shortness proves
        # the end (a short read of a regular file is its end): no second read for EOF.
        want = st.st_size + 1
        chunks = []
        while True:
            chunk = os.read(fd, want)
            chunks.append(chunk)
            if len(chunk) < want:
                break
            want = 1 << 20  # the file grew while we read: read on to its end
        return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), st
    finally:
        os.close(fd)


def write_atomic(path, data, durable=False):
    """Write ``data`` to ``path`` so readers see the old file, the new one, or none.

    The temporary file lives in the target directory (a rename is only atomic
    within one file system) and is removed if anything fails, e.g. ENOSPC.
    Without ``durable`` nothing is fsynced: a power cut can then leave an empty
    or torn file, which a checksummed cache entry detects and rebuilds, and
    a cold compile does not pay a disk flush (about 1 ms) for that.  Files
    that cannot be rebuilt here (an imported bundle) are written ``durable``.
    """
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@contextlib.contextmanager
def new_file_beside(destination, force=False):
    """Yield a binary file that becomes ``destination`` when the block ends without an error.

    It is a new file (``mkstemp``, ``O_EXCL``) in the destination's directory, renamed into place:
    nothing planted at a temporary name is written through, and a failure leaves no partial file.
    An existing ``destination`` is replaced only with ``force``.
    """
    from ..errors import CacheError
    destination = os.path.abspath(destination)
    if os.path.lexists(destination) and not force:
        raise CacheError("%s already exists; choose another name or pass --force to replace it" % destination)
    directory = os.path.dirname(destination)
    if not os.path.isdir(directory):
        raise CacheError("cannot write %s: the directory %s does not exist" % (destination, directory))
    fd, tmp = tempfile.mkstemp(prefix=".%s.tmp-" % os.path.basename(destination), dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
        os.replace(tmp, destination)
    except BaseException:
        remove_quietly(tmp)
        raise


def remove_quietly(path):
    """Unlink ``path`` (never what a symlink points to); ignore a missing file."""
    try:
        os.unlink(path)
    except OSError:
        pass


class LockTimeout(OSError):
    """The lock stayed held by someone else for the whole wait."""


@contextlib.contextmanager
def exclusive_lock(path, timeout):
    """Hold an exclusive ``flock`` on the file at ``path``, waiting at most ``timeout`` seconds.

    The kernel drops the lock when the holder exits or dies, so a crashed
    compiler never leaves a stale lock.  A symlink at ``path`` is not followed
    (ELOOP).  POSIX only (``fcntl``); raises :class:`LockTimeout`, or
    ``OSError`` when the lock file cannot be created or locked at all.
    """
    deadline = time.monotonic() + timeout
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o600)
        try:
            _flock(fd, path, deadline)
            if _same_file(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        # The holder before us removed the file as it let go: lock the one at the path now.
        os.close(fd)
    try:
        yield
    finally:
        # Removed while still held, so no lock file outlives its use (a failed compile left one
        # per kernel before); a waiter that locked the removed file sees that and opens again.
        remove_quietly(path)
        os.close(fd)  # releases the lock


def _flock(fd, path, deadline):
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
        left = deadline - time.monotonic()
        if left <= 0:
            raise LockTimeout(errno.ETIMEDOUT, "lock held by another process", path)
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)  # prompt when the holder is quick, cheap when it is not


def _same_file(fd, path):
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


# -- maintenance beneath one directory descriptor ----------------------------------------------------
# Pruning and repair delete files.  Walking by path would let anyone who swaps a directory of the tree
# for a symlink between two steps point a deletion elsewhere; every step here is taken relative to a
# descriptor of the cache's own directory, and no symlink is followed at any level.

DIRECTORY = _DIRECTORY = getattr(os, "O_DIRECTORY", 0)
CLOEXEC = _CLOEXEC


def open_directory(path, dir_fd=None):
    """A descriptor of the directory ``path`` (relative to ``dir_fd``); ELOOP if it is a symlink."""
    return os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)


def walk_files(root_fd, top):
    """Yield ``(directory_fd, relative_dir, name, stat)`` for every file below ``top`` (relative to
    ``root_fd``), without following symlinks.  ``directory_fd`` is valid only until the next item.
    A missing ``top`` has no files (``os.fwalk`` would raise: `cache push` of a cache with no
    dependency sets yet said "No such file or directory: 'depsets'")."""
    try:
        os.stat(top, dir_fd=root_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return
        raise
    for relative_dir, _dirs, names, dir_fd in os.fwalk(top, dir_fd=root_fd, follow_symlinks=False):
        for name in names:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            yield dir_fd, relative_dir, name, st


def read_at(dir_fd, name):
    """:func:`read_file` of ``name`` in the directory ``dir_fd``, with the same checks."""
    return read_file_and_stat(name, dir_fd)[0]


def unlink_beneath(root_fd, relative_path):
    """Unlink the file at ``relative_path`` below ``root_fd``, opening each directory on the way with
    O_NOFOLLOW: a directory replaced by a symlink stops it (``OSError``) instead of being followed."""
    parts = relative_path.split(os.sep)
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            if part in ("", ".", ".."):
                raise OSError(errno.EINVAL, "not a plain relative path", relative_path)
            next_fd = open_directory(part, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        os.unlink(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)


def remove_tree_beneath(root_fd, name):
    """Remove the directory ``name`` of ``root_fd`` and everything in it, through descriptors: a link at
    any level is unlinked, never followed (``shutil.rmtree`` takes a ``dir_fd`` only from Python 3.8)."""
    for _relative, dirs, files, dir_fd in os.fwalk(name, dir_fd=root_fd, topdown=False, follow_symlinks=False):
        for entry in files + dirs:  # fwalk lists a link to a directory among the directories
            try:
                if stat_module.S_ISDIR(os.stat(entry, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    os.rmdir(entry, dir_fd=dir_fd)
                else:
                    os.unlink(entry, dir_fd=dir_fd)
            except OSError:
                pass
    try:
        os.rmdir(name, dir_fd=root_fd)
    except OSError:
        pass

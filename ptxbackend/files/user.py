"""Files a user names on the command line or in a variable.

Inputs are read only from regular files (or ``-``, standard input, where a command takes it), opened
non-blocking so a FIFO is never waited on, and never beyond a size limit: ``/dev/zero`` or a FIFO
must give one clear line, not a hang or a MemoryError.  Outputs are written only as regular files
beside their destination and renamed into place: never through a device or FIFO, never over the
input they came from, never into the cache directory.
"""

import errno
import os
import stat as stat_module
import sys

from ..errors import PtxBackendError

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

# Generous for what each holds, small enough that a mistake fails at once instead of filling memory.
SOURCE_LIMIT = 64 << 20       # a CUDA source file (generated ones reach a few MB)
MANIFEST_LINE_LIMIT = 64 << 20  # one recorded request: a source and its options
CONFIG_LIMIT = 1 << 20        # an INI file of a dozen knobs


class UserFileError(PtxBackendError):
    """A file the user named cannot be used as asked."""


def _kind(mode):
    for test, name in ((stat_module.S_ISDIR, "a directory"), (stat_module.S_ISFIFO, "a FIFO"),
                       (stat_module.S_ISCHR, "a character device"), (stat_module.S_ISBLK, "a block device"),
                       (stat_module.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _why(exc):
    if exc.errno == errno.ENOENT:
        return "does not exist"
    return "cannot be opened (%s)" % (exc.strerror or exc)


def open_input(path, what, limit=None):
    """A binary file object of the regular file at ``path``; ``UserFileError`` for anything else.

    ``limit``: refuse a file larger than this many bytes (read by its stat: the caller still reads
    at most ``limit + 1`` bytes, as a file can grow).
    """
    if not path:
        raise UserFileError("%s: an empty file name; name a file" % what)
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC)
    except OSError as exc:
        raise UserFileError("%s %s %s" % (what, path, _why(exc)))
    try:
        st = os.fstat(fd)
        _check_kind_and_size(st, path, what, limit)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_kind_and_size(st, path, what, limit):
    if not stat_module.S_ISREG(st.st_mode):
        raise UserFileError("%s %s is %s: name a regular file" % (what, path, _kind(st.st_mode)))
    if limit is not None and st.st_size > limit:
        raise UserFileError("%s %s is %d bytes, more than the %d a %s may have" % (
            what, path, st.st_size, limit, what))

def open_trusted_input(path, what, limit, remedy_verb):
    """:func:`open_input` for a file whose content decides what runs or is filed (a ``warm``
    manifest): as the cache's own files, no link is followed and the file must be the user's (or
    root's) and writable by no one else, or another user could choose what it holds.  The checks are
    of the descriptor read, so nothing can be swapped in between.  ``remedy_verb``: what the user
    does with a file of their own ("warm").
    """
    if not path:
        raise UserFileError("%s: an empty file name; name a file" % what)
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise UserFileError("%s %s is a symbolic link: ptxbackend follows no link for a %s (another user "
                                "could point it elsewhere); name the file itself (%s)" % (
                                    what, path, what, os.path.realpath(path)))
        raise UserFileError("%s %s %s" % (what, path, _why(exc)))
    try:
        st = os.fstat(fd)
        _check_kind_and_size(st, path, what, None)
        if hasattr(os, "getuid") and st.st_uid not in (os.getuid(), 0):
            raise UserFileError("%s %s belongs to uid %d, not to you (uid %d) or root: another user could "
                                "choose what it makes ptxbackend %s; copy it to a file of your own and "
                                "%s that" % (what, path, st.st_uid, os.getuid(), remedy_verb, remedy_verb))
        if st.st_mode & (stat_module.S_IWGRP | stat_module.S_IWOTH):
            raise UserFileError("%s %s is writable by group or others (mode %o): another user could add to "
                                "it; run: chmod go-w %s" % (what, path, st.st_mode & 0o777, path))
        _check_kind_and_size(st, path, what, limit)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path, what, limit, stdin_ok=False):
    """The bytes of ``path`` (``-``: standard input when ``stdin_ok``), at most ``limit`` of them."""
    if path == "-":
        if not stdin_ok:
            raise UserFileError("%s: '-' (standard input) is not taken here; name a file" % what)
        data = sys.stdin.buffer.read(limit + 1)
    else:
        with open_input(path, what, limit) as handle:
            try:
                data = handle.read(limit + 1)
            except OSError as exc:
                raise UserFileError("%s %s cannot be read (%s)" % (what, path, exc.strerror or exc))
    if len(data) > limit:
        raise UserFileError("%s %s is more than %d bytes" % (what, path, limit))
    return data


def check_output(path, what, inputs=(), cache_root=None):
    """Refuse an output path that is not a place for a new regular file; return it absolute.

    Refused: an empty name, ``-`` (binary output is never written to a terminal or pipe), anything
    there that is not a regular file or a symlink (a device node, FIFO or directory would be
    replaced or written through), one of ``inputs`` itself, and anything inside ``cache_root``.
    """
    if not path:
        raise UserFileError("%s: an empty file name; name the file to write" % what)
    if path == "-":
        raise UserFileError("%s: '-' (standard output) is not supported; name a file to write" % what)
    absolute = os.path.abspath(path)
    try:
        st = os.lstat(absolute)
    except OSError:
        st = None
    if st is not None and not (stat_module.S_ISREG(st.st_mode) or stat_module.S_ISLNK(st.st_mode)):
        raise UserFileError("%s %s is %s: refusing to replace it; name a regular file" % (
            what, path, _kind(st.st_mode)))
    for source in inputs:
        try:
            if source and os.path.samefile(source, absolute):
                raise UserFileError("%s %s is the input %s itself: refusing to overwrite it; name "
                                    "another file" % (what, path, source))
        except OSError:
            pass
    if cache_root:
        root = os.path.realpath(cache_root)
        inside = os.path.realpath(os.path.dirname(absolute))
        if inside == root or inside.startswith(root.rstrip(os.sep) + os.sep):
            raise UserFileError("%s %s is inside the cache directory %s: write it elsewhere" % (
                what, path, cache_root))
    directory = os.path.dirname(absolute)
    if not os.path.isdir(directory):
        raise UserFileError("%s %s: the directory %s does not exist" % (what, path, directory))
    return absolute


def write_output(path, data, what):
    """Write ``data`` to the (checked) ``path`` as a new file renamed into place."""
    from . import private
    try:
        with private.new_file_beside(path, force=True) as handle:
            handle.write(data)
    except OSError as exc:
        # The new file is made beside the destination and renamed over it: say so, as the error
        # (ENOENT in /proc, EROFS, EACCES) is about that directory, not about the file named.
        raise UserFileError("cannot write %s %s: a new file cannot be made in %s (%s)" % (
            what, path, os.path.dirname(path), exc.strerror or exc))

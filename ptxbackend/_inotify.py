"""Linux inotify through ctypes: which files a compile opened, and whether a watched directory changed.

Two uses, one wrapper:

- :class:`OpenRecorder` watches directories for ``IN_OPEN`` while NVRTC compiles
  in this process.  NVRTC cannot list the headers it read; the kernel can.
- :class:`ChangeWatcher` watches the directories of validated dependency sets
  for anything that could change what a compile reads, so a set is re-checked
  only after such an event instead of on every hit.

Both report themselves unusable (``None`` from their constructors) where inotify
is missing (not Linux, no libc symbol, out of instances): callers fall back.
"""

import ctypes
import errno
import os
import struct

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_OPEN = 0x20
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
#: every event that can change what a compile would read in a watched directory
CHANGES = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
           | IN_DELETE_SELF | IN_MOVE_SELF)
_EVENT = struct.Struct("iIII")

_libc = []


def _functions():
    if not _libc:
        found = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)  # the C library the interpreter runs on
            init, add = libc.inotify_init1, libc.inotify_add_watch
            init.argtypes, init.restype = [ctypes.c_int], ctypes.c_int
            add.argtypes, add.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
            found = (init, add)
        except (OSError, AttributeError):
            pass
        _libc.append(found)
    return _libc[0]


class _Inotify(object):
    """One inotify instance: watches by directory, events read without blocking."""

    def __init__(self, fd, add):
        self.fd = fd
        self._add = add
        self.labels = {}  # watch descriptor -> the directory as the caller spelt it
        self.pid = os.getpid()

    @classmethod
    def open(cls):
        functions = _functions()
        if functions is None:
            return None
        fd = functions[0](_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None  # out of instances (fs.inotify.max_user_instances): the caller falls back
        return cls(fd, functions[1])

    def watch(self, directory, mask):
        """Watch ``directory`` (links followed); ``False`` when the kernel refused (limits, gone)."""
        wd = self._add(self.fd, os.fsencode(directory), mask | IN_ONLYDIR)
        if wd < 0:
            return False
        self.labels.setdefault(wd, directory)
        return True

    def events(self):
        """Yield ``(directory label or None, mask, name)`` of every queued event (never blocks)."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                    return
                raise
            if not data:
                return
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size:offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                yield self.labels.get(wd), mask, os.fsdecode(name)

    def close(self):
        if self.fd >= 0 and os.getpid() == self.pid:
            os.close(self.fd)
        self.fd = -1


class OpenRecorder(object):
    """The files opened in a set of directories while it is entered (``with`` block).

    ``paths`` lists them as ``label/name`` (a label is the directory as it was
    given, so a relative ``.`` stays relative); ``complete`` is false when a
    directory could not be watched or events were lost, and then the caller
    must not rely on the list alone.
    """

    def __init__(self, inotify, directories):
        self._inotify = inotify
        self.complete = True
        for directory in directories:
            if not inotify.watch(directory, IN_OPEN):
                self.complete = False
        self.paths = []

    @classmethod
    def start(cls, directories):
        inotify = _Inotify.open()
        return None if inotify is None else cls(inotify, directories)

    def stop(self):
        seen = set()
        try:
            for label, mask, name in self._inotify.events():
                if mask & IN_Q_OVERFLOW:
                    self.complete = False
                elif label is not None and name and not mask & IN_ISDIR:
                    path = os.path.normpath(os.path.join(label, name))
                    if path not in seen:
                        seen.add(path)
                        self.paths.append(path)
        finally:
            self._inotify.close()
        return self.paths


class ChangeWatcher(object):
    """Watches directories for changes; :meth:`changed` says whether any happened since the last ask."""

    def __init__(self, inotify):
        self._inotify = inotify
        self._watched = set()

    @classmethod
    def open(cls):
        inotify = _Inotify.open()
        return None if inotify is None else cls(inotify)

    @property
    def pid(self):
        return self._inotify.pid

    def watch(self, directories):
        """Watch each of ``directories``; ``False`` if any could not be watched."""
        ok = True
        for directory in directories:
            if directory in self._watched:
                continue
            if self._inotify.watch(directory, CHANGES):
                self._watched.add(directory)
            else:
                ok = False
        return ok

    def changed(self):
        """Whether any watched directory saw a change (or events were lost) since the last call."""
        seen = False
        for _label, mask, _name in self._inotify.events():
            if mask & IN_IGNORED:
                # The kernel dropped a watch (its directory was removed): watch it again next time.
                seen = True
                self._watched.clear()
            elif mask & (CHANGES | IN_Q_OVERFLOW):
                seen = True
        return seen

"""Linux inotify through ctypes: which files a compile opened, and whether a watched directory changed.

Two uses, one wrapper:

- :class:`OpenRecorder` watches directories for ``IN_OPEN`` while NVRTC compiles
  in this process.  NVRTC cannot list the headers it read; the kernel can.  Its
  watches outlive a compile, so each compile pays for none but new ones.
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
import threading

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

    def add(self, directory, mask, only_directory=True):
        """Watch ``directory`` (links followed; a file with ``only_directory=False``); its watch
        descriptor, negative when the kernel refused (limits, gone)."""
        wd = self._add(self.fd, os.fsencode(directory), mask | (IN_ONLYDIR if only_directory else 0))
        if wd >= 0:
            self.labels.setdefault(wd, directory)
        return wd

    def watch(self, directory, mask, only_directory=True):
        """Watch ``directory`` (or a file); ``False`` when the kernel refused."""
        return self.add(directory, mask, only_directory) >= 0

    def events(self):
        """Yield ``(directory label or None, mask, name)`` of every queued event (never blocks)."""
        for wd, mask, name in self.raw_events():
            yield self.labels.get(wd), mask, name

    def raw_events(self):
        """Yield ``(watch descriptor, mask, name)`` of every queued event (never blocks)."""
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
                yield wd, mask, os.fsdecode(name)

    def close(self):
        if self.fd >= 0 and os.getpid() == self.pid:
            os.close(self.fd)
        self.fd = -1


class OpenRecorder(object):
    """The files opened in watched directories while a compile runs; one per process.

    Watches stay in place between compiles: adding ~150 of them and closing the instance again cost
    a CuPy 14 kernel 10-30 ms per compile.  :meth:`begin` drains what queued since the last compile
    (other processes open these headers too), adds watches for directories not yet watched, and
    registers a :class:`Session`; :meth:`end` drains again into every session still open, so
    compiles that overlap in threads each get the union: more than they read, never less.

    ``generation`` counts structural changes in the watched directories (an entry created,
    deleted or moved, a watch dropped, events lost): a list of directories walked at one
    generation covers the tree only while it holds.
    """

    _STRUCTURE = (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF
                  | IN_IGNORED | IN_Q_OVERFLOW)
    _MASK = IN_OPEN | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF
    #: past this many watches the instance is replaced (a long-lived process in many directories)
    WATCH_CAP = 65536
    _shared = []  # [recorder] of this process; a forked child makes its own

    def __init__(self, inotify):
        self._inotify = inotify
        self._lock = threading.Lock()
        self._sessions = []
        self._absolute = {}  # absolute directory -> watch descriptor, until a structural change
        self.generation = 0

    @classmethod
    def shared(cls):
        """This process's recorder, or ``None`` where inotify cannot be used."""
        found = cls._shared[0] if cls._shared else None
        if found is not None and found._inotify.pid == os.getpid() and len(found._inotify.labels) < cls.WATCH_CAP:
            return found
        inotify = _Inotify.open()
        recorder = None if inotify is None else cls(inotify)
        if found is not None and not found._sessions:  # a compile in another thread may still drain it
            found._inotify.close()
        cls._shared[:] = [recorder]
        return recorder

    def refresh(self):
        """Drain the queue; the generation after it."""
        with self._lock:
            self._drain()
            return self.generation

    def begin(self, directories, generation=None):
        """Start recording opens in ``directories``; a session that is incomplete when a watch was
        refused or the tree changed since ``generation``."""
        session = Session()
        with self._lock:
            self._drain()
            if generation is not None and generation != self.generation:
                session.complete = False
            for directory in directories:
                absolute = os.path.isabs(directory)
                wd = self._absolute.get(directory) if absolute else None
                if wd is None:
                    wd = self._inotify.add(directory, self._MASK)
                    if wd < 0:
                        session.complete = False
                        continue
                    if absolute:
                        self._absolute[directory] = wd
                session.labels.setdefault(wd, directory)
            self._sessions.append(session)
        return session

    def end(self, session):
        with self._lock:
            try:
                self._drain()
            finally:
                self._sessions.remove(session)
        return session

    def _drain(self):
        for wd, mask, name in self._inotify.raw_events():
            if mask & self._STRUCTURE:
                self.generation += 1
                # Paths may now name other directories than the ones watched: resolve again.
                self._absolute.clear()
                # What a running compile may have read unseen: a directory that appeared (not
                # watched yet), a watched one gone or moved, lost events.  A new regular file is
                # no such case: opening it is an event like any other.
                lost = mask & (IN_Q_OVERFLOW | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF) or (
                    mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO))
                for session in self._sessions:
                    if mask & IN_Q_OVERFLOW or wd in session.labels:
                        session.moved = True
                        if lost:
                            session.complete = False
            if mask & IN_OPEN and name and not mask & IN_ISDIR:
                for session in self._sessions:
                    label = session.labels.get(wd)
                    if label is not None:
                        session.add(os.path.normpath(os.path.join(label, name)))


class Session(object):
    """One compile's record: ``paths`` opened (``label/name``; a label is the directory as the caller
    spelt it, so a relative ``.`` stays relative), whether it can be relied on (``complete``) and
    whether any of them may have gone since (``moved``)."""

    def __init__(self):
        self.labels = {}
        self.paths = []
        self._seen = set()
        self.complete = True
        self.moved = False  # an entry of a watched directory was created, deleted or renamed meanwhile

    def add(self, path):
        if path not in self._seen:
            self._seen.add(path)
            self.paths.append(path)


class ChangeWatcher(object):
    """Watches directories for changes; :meth:`changed` says whether any happened since the last ask."""

    def __init__(self, inotify):
        self._inotify = inotify
        self._watched = set()
        # By name, until the next change: a file replaced by a rename (a change in its watched
        # directory) is another inode, and a directory reached through a retargeted link another
        # directory, which the old watches do not cover, so after any change each is watched again
        # (the kernel gives an inode already watched its same watch back).
        self._watched_files = set()

    @classmethod
    def open(cls):
        inotify = _Inotify.open()
        return None if inotify is None else cls(inotify)

    @property
    def pid(self):
        return self._inotify.pid

    def close(self):
        self._inotify.close()

    def watch(self, directories, files=()):
        """Watch each of ``directories``, and each of ``files`` itself (its inode: a write through a
        hard link in another directory makes no event in this one's); ``False`` if any could not be
        watched."""
        ok = True
        for paths, only_directory, done in ((directories, True, self._watched), (files, False, self._watched_files)):
            for path in paths:
                if path not in done:
                    if self._inotify.watch(path, CHANGES, only_directory):
                        done.add(path)
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
        if seen:
            # Watched again at the next check, where each name now leads: a directory reached
            # through a link that was retargeted is another directory.
            self._watched.clear()
            self._watched_files.clear()
        return seen

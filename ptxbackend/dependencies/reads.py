"""Which files an NVRTC compile reads, and the include scan that keeps a compile from hanging.

NVRTC has no dependency output (checked up to 13.5).  A regex scan of
``#include`` lines both misses what the preprocessor computes (``#include
MACRO``, ``#include_next``, directives split by comments or line splices) and
over-reads (it follows includes in sections the preprocessor skips: about
1,000 of CuPy 14's CCCL headers where 65 are read).  So on Linux the compile
runs under an inotify watch of every directory it may read from, and the
files it *opened* are the list.  Where inotify is missing, or a directory
could not be watched, the scan's list is used instead, as before.
"""

import errno
import os
import re
import stat as stat_module
import threading

from ..files.private import read_regular

#: Starts an entry of a compile's input list that could not be told (the reason follows): such a
#: compile's image is returned but not cached.
UNKNOWN_READS = "\0unknown reads: "

#: The most directories one compile watches; beyond, the include scan's list is used.
WATCH_LIMIT = 8192

_INCLUDE_RE = re.compile(br'^[ \t]*#[ \t]*include(_next)?[ \t]*([<"])([^>"\r\n]+)[>"]', re.M)
_NEXT = b"next"
_lock = threading.Lock()
_includes_of = {}  # (path, size, mtime_ns, ctime_ns, ino, dev) -> the (quote, name) pairs it holds
_MEMO_LIMIT = 16384


def _directives(text):
    """The (kind, name) pairs of ``text``'s includes; kind is ``<``, ``"`` or, for ``#include_next``,
    :data:`_NEXT` (searched in the include directories after the includer's own)."""
    return [(_NEXT if following else quote, name) for following, quote, name in _INCLUDE_RE.findall(text)]


def _after(directory, include_dirs):
    """The include directories ``#include_next`` searches from a file in ``directory``: those after it,
    or all of them when it is none of them (as GCC does)."""
    wanted = os.path.normpath(os.path.abspath(directory)) if directory else None
    for index, candidate in enumerate(include_dirs):
        if wanted is not None and os.path.normpath(os.path.abspath(candidate)) == wanted:
            return list(include_dirs[index + 1:])
    return list(include_dirs)


def _names_in(path):
    """The ``#include`` names of the regular file at ``path``, read once per version of the file."""
    st = os.stat(path)
    if not stat_module.S_ISREG(st.st_mode):
        read_regular(path)  # raises NotARegularFile with the message users see
    marker = (path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    found = _includes_of.get(marker)
    if found is None:
        found = _directives(read_regular(path)[0])
        with _lock:
            if len(_includes_of) >= _MEMO_LIMIT:
                _includes_of.clear()
            _includes_of[marker] = found
    return found


def scan_includes(source, include_dirs, pre_includes=(), source_dir=None, recursive=True):
    """Every existing file that ``source`` may include, directly or through other headers.

    Quoted includes are looked up beside the including file first (the main
    source: ``source_dir``), then in ``include_dirs`` in order; angle includes
    in ``include_dirs`` only.  Conditional sections are not evaluated, so this
    lists more than the compiler reads.  Headers are parsed once per process
    and version, so a kernel after the first costs a ``stat`` per header.
    Raises :class:`NotARegularFile` for an include that resolves to a FIFO or
    device: that is its first job, keeping a compile from blocking on one.
    ``recursive=False`` resolves the source's own includes only.
    """
    if not isinstance(source, bytes):
        source = source.encode("utf-8", "surrogateescape")
    found, seen = [], set()
    pending = [(_directives(source), source_dir)]
    for path in pre_includes:
        if path not in seen and os.path.exists(path):
            seen.add(path)
            found.append(path)
            pending.append((_names_in(path), os.path.dirname(path)))
    while pending:
        names, where = pending.pop()
        for quote, name in names:
            name = name.decode("utf-8", "surrogateescape").strip()
            if os.path.isabs(name):
                candidates = [name]
            elif quote == _NEXT:
                candidates = _after(where, include_dirs)
            else:
                candidates = ([where] if quote == b'"' and where else []) + list(include_dirs)
            for directory in candidates:
                path = os.path.normpath(name if os.path.isabs(name) else os.path.join(directory, name))
                try:
                    st = os.stat(path)
                except OSError as exc:
                    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):
                        continue
                    raise
                if stat_module.S_ISDIR(st.st_mode):
                    continue
                if path not in seen:
                    seen.add(path)
                    found.append(path)
                    if recursive:
                        pending.append((_names_in(path), os.path.dirname(path) or os.curdir))
                    else:
                        _names_in(path)  # a FIFO or device raises here all the same
                break
    return found


def _identity(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def unrecorded_reads(source, include_dirs, pre_includes, source_dir, opened, watched):
    """The files an NVRTC compile may have read that its record of opens (``opened``, made by
    watching the directories ``watched``) cannot show: a header reached through a symbolic link (the
    open is reported in the target's directory, under another name, or nowhere), or one outside the
    watched trees (``#include "../common/b.cuh"``), and what those include in turn.

    Each ``#include`` of the source and of every file read is resolved as the include scan does.  A
    file the record shows, or that the record would have shown had it been opened (a plain entry in
    a watched directory), needs nothing more: the record is right about it.  Any other is added,
    spelt as the compiler reached it, and its own includes followed: an over-approximation (the scan
    does not evaluate ``#if``), which can only cost a needless miss, never a stale hit."""
    if not isinstance(source, bytes):
        source = source.encode("utf-8", "surrogateescape")
    watched_ids = set(filter(None, (_identity(d) for d in watched)))
    recorded = set(os.path.normpath(p) for p in opened)
    recorded_ids = set(filter(None, (_identity(p) for p in recorded)))
    extra, visited = [], set()

    def directories_of(path):
        here = os.path.dirname(path) or os.curdir
        real = os.path.dirname(os.path.realpath(path))
        return [here] if real == os.path.abspath(here) else [here, real]

    pending = [(_directives(source), [source_dir] if source_dir else [])]
    for path in list(pre_includes) + list(recorded):
        if os.path.isfile(path):
            visited.add(os.path.normpath(path))
            pending.append((_names_in(path), directories_of(path)))
    for path in pre_includes:
        if os.path.islink(path) or _identity(os.path.dirname(path) or os.curdir) not in watched_ids:
            extra.append(os.path.normpath(path))
    while pending:
        names, wheres = pending.pop()
        for quote, name in names:
            name = name.decode("utf-8", "surrogateescape").strip()
            if os.path.isabs(name):
                candidates = [name]
            elif quote == _NEXT:
                candidates = [os.path.join(d, name) for d in _after(wheres[0] if wheres else None, include_dirs)]
            else:
                candidates = [os.path.join(d, name) for d in ((wheres if quote == b'"' else []) + list(include_dirs))]
            for candidate in candidates:
                path = os.path.normpath(candidate)
                if not os.path.isfile(path):
                    continue
                if path in visited:
                    break
                visited.add(path)
                plain = not os.path.islink(path) \
                    and _identity(os.path.dirname(path) or os.curdir) in watched_ids
                if plain and path not in recorded and _identity(path) not in recorded_ids:
                    break  # it would have been seen had it been opened: not read (a skipped #if)
                if not plain or path not in recorded:
                    extra.append(path)
                pending.append((_names_in(path), directories_of(path)))
                break
    return extra


def environment_include_dirs():
    """Include directories the host preprocessor takes from the environment (nvcc only)."""
    dirs = []
    for name in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH"):
        dirs += [os.path.realpath(d) for d in (os.environ.get(name) or "").split(os.pathsep) if d]
    return dirs


def nvrtc_source_directory(name, options):
    """Where NVRTC looks first for the program's own quoted includes: the directory of its name,
    relative to the working directory (``None`` with ``--no-source-include``)."""
    if "--no-source-include" in options or "-no-source-include" in options:
        return None
    return os.path.dirname(os.path.normpath(str(name))) or os.curdir


def include_trees(roots, files):
    """``(directories, special)``: every directory under ``roots`` (a relative root, the working
    directory, on its own: it may be a home directory) and the directory of each of ``files``, or
    ``None`` past :data:`WATCH_LIMIT`; and whether any of them holds a FIFO, socket or device,
    which only then makes the include scan necessary before a compile."""
    found, seen, special = [], {}, False
    # A stack: the files' own directories are popped last, so that one that is also under a root
    # has been walked from there, subdirectories included.
    pending = [(os.path.dirname(path) or os.curdir, False) for path in files]
    pending += [(root, os.path.isabs(root)) for root in reversed(roots)]
    while pending:
        directory, recursive = pending.pop()
        try:
            st = os.stat(directory)
            entries = list(os.scandir(directory))
        except OSError:
            continue
        identity = (st.st_dev, st.st_ino)
        if identity in seen and (seen[identity] or not recursive):
            continue  # reached twice, through a link (or a link cycle)
        if identity not in seen:
            found.append(directory)
        seen[identity] = recursive
        if len(found) > WATCH_LIMIT:
            return None, special
        for entry in entries:
            try:
                if entry.is_dir():
                    if recursive:
                        pending.append((os.path.join(directory, entry.name), True))
                elif not entry.is_file() and os.path.exists(entry.path):
                    special = True
            except OSError:
                continue
    return found, special


_walks = {}  # (roots, file directories, cwd) -> (generation, root identities, (directories, special))


def _identities(roots):
    found = []
    for root in roots:
        try:
            st = os.stat(root)
            found.append((st.st_dev, st.st_ino))
        except OSError:
            found.append(None)
    return found


def _recorder():
    from ..files import inotify as _inotify  # ctypes: imported by the first compile, not with the package
    return _inotify.OpenRecorder.shared()


class OpenedFiles(object):
    """``with OpenedFiles(roots, files) as opened:`` records the files opened meanwhile under the
    include trees (see :func:`include_trees`); ``opened.paths`` is ``None`` when the record cannot be
    relied on (then use the scan), and ``opened.scan_first`` says that the scan must run *before*
    the compile: a tree holds a FIFO, socket or device, or could not be walked or watched at all.

    The tree walk is remembered per roots while the process's recorder sees no structural change in
    any directory it covers and each root still names the same directory; the watches stay.
    """

    def __init__(self, roots=(), files=()):
        self.paths = None
        self.scan_first = bool(roots or files)
        self._session = None
        self._recorder = _recorder() if roots or files else None
        if self._recorder is None:
            return  # no inotify: only the scan can find a FIFO before NVRTC blocks on it
        cwd = os.getcwd() if any(not os.path.isabs(r) for r in roots) or files else None
        key = (tuple(roots), tuple(sorted(set(os.path.dirname(f) or os.curdir for f in files))), cwd)
        generation = self._recorder.refresh()
        identities = _identities(roots)
        known = _walks.get(key)
        if known is not None and known[0] == generation and known[1] == identities:
            self._walk = known[2]
        else:
            self._walk = include_trees(roots, files)
            with _lock:
                if len(_walks) >= 256:
                    _walks.clear()
                _walks[key] = (generation, identities, self._walk)
        self._generation = generation
        self.scan_first = self._walk[1] or self._walk[0] is None

    @property
    def watched(self):
        """The directories the record covers."""
        return (self._walk[0] or []) if self._recorder is not None else []

    def __enter__(self):
        directories = self._walk[0] if self._recorder is not None else None
        if directories is not None:
            self._session = self._recorder.begin(directories, self._generation)
        return self

    def __exit__(self, *exc_info):
        if self._session is not None:
            session = self._recorder.end(self._session)
            self._session = None
            if session.complete:
                # Opened as files (directories are told apart by the event); only where an entry
                # moved meanwhile can one have gone.
                self.paths = [p for p in session.paths if not session.moved or os.path.isfile(p)]
        return False

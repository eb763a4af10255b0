"""Recording kernel requests: ``PTXBACKEND_RECORD=manifest.jsonl`` appends each distinct request.

``ptxbackend warm MANIFEST`` (:mod:`ptxbackend.deploy.replay`) replays the file at deployment.
"""

import errno
import json
import logging
import os
import stat
import threading

from ..compilers.options import read_path_options
from ..dependencies.reads import nvrtc_source_directory

try:
    import fcntl
except ImportError:  # Windows: O_APPEND alone
    fcntl = None

log = logging.getLogger("ptxbackend")

RECORD_ENV = "PTXBACKEND_RECORD"

_recorded = set()
_refused = set()
_record_lock = threading.Lock()


def record_request(key, source, options, target_spec, compiler, name, source_dir=None):
    """Append one request to the manifest named by PTXBACKEND_RECORD (once per key per process).

    The line holds everything the key is made of, so that ``warm`` from any directory files the
    entry the program asks for: the name, the source's directory (``compile(source_dir=)`` and
    ``ptxbackend compile FILE`` add ``-I`` of it) and the options with every relative path made
    absolute, as the key has them.  For NVRTC, whose search for quoted includes starts in the name's
    directory relative to the working directory, the working directory as well.
    """
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    with _record_lock:
        if key in _recorded:
            return
        _recorded.add(key)
    try:
        line = _line(key, source, options, target_spec, compiler, name, source_dir)
        _append(path, line.encode("utf-8"))
    except Exception as exc:  # recording is a side job: it must never break the program
        with _record_lock:
            if path in _refused:
                return
            _refused.add(path)  # one warning per file, not one per kernel
        log.warning("ptxbackend: cannot record to %s=%s: %s", RECORD_ENV, path, exc)


def _line(key, source, options, target_spec, compiler, name, source_dir):
    """The manifest line of one request (JSON, one object)."""
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    name = os.fsdecode(name) if isinstance(name, bytes) else str(name)
    record = {"key": key, "source": source, "options": absolute_options(options), "target": target_spec,
              "compiler": compiler, "name": name}
    if source_dir:
        record["source_dir"] = os.path.abspath(os.fsdecode(source_dir))
    if compiler == "nvrtc":
        # NVRTC looks for quoted includes beside the name first, relative to the working directory
        # (reads.nvrtc_source_directory): that compile reads what is there, so warm runs it there too.
        here = nvrtc_source_directory(name, options)
        if here is not None and not os.path.isabs(here):
            record["cwd"] = os.getcwd()
    return json.dumps(record, sort_keys=True) + "\n"


def absolute_options(options):
    """``options`` with each relative path made absolute against the working directory, as the key
    has them (compilers.options); everything else as given."""
    return [os.fsdecode(o) if isinstance(o, bytes) else str(o) for o in read_path_options(options).options]


def _append(path, data):
    """Append ``data`` to the regular file at ``path`` in one write, under an flock of that file.

    The manifest is replayed by ``warm`` and holds the program's kernel sources, so it follows the
    cache's rules: no link followed (one in /tmp could point at ~/.profile), made 0600, and only a
    file of our own that no one else can write is appended to (another user's file would read our
    sources and feed ``warm`` their lines).  Opened non-blocking and checked by descriptor: a FIFO
    or device there is refused, never waited on.  The lock is on the manifest itself, so no
    ``.lock`` file is left beside it.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise OSError("it is a symbolic link, which ptxbackend never follows for it; name a file of "
                          "your own (not a link)")
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file: name a file for the manifest")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise OSError("it belongs to uid %d, not to you (uid %d): name a file of your own" % (
                st.st_uid, os.getuid()))
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise OSError("it is writable by group or others (mode %o): run chmod go-w %s" % (
                st.st_mode & 0o777, path))
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one writer's line at a time, whole
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)

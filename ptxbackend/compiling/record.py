"""Recording kernel requests: ``PTXBACKEND_RECORD=manifest.jsonl`` appends each distinct request.

``ptxbackend warm MANIFEST`` (:mod:`ptxbackend.deploy.replay`) replays the file at deployment.
"""

import json
import logging
import os
import stat
import threading

from ..compilers.options import read_path_options

try:
    import fcntl
except ImportError:  # Windows: O_APPEND alone
    fcntl = None

log = logging.getLogger("ptxbackend")

RECORD_ENV = "PTXBACKEND_RECORD"

_recorded = set()
_record_lock = threading.Lock()


def record_request(key, source, options, target_spec, compiler, name, source_dir=None):
    """Append one request to the manifest named by PTXBACKEND_RECORD (once per key per process).

    The line holds everything the key is made of, so that ``warm`` from any directory files the
    entry the program asks for: the name, the source's directory (``compile(source_dir=)`` and
    ``ptxbackend compile FILE`` add ``-I`` of it) and the options with every relative path made
    absolute, as the key has them.
    """
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    with _record_lock:
        if key in _recorded:
            return
        _recorded.add(key)
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    record = {"key": key, "source": source, "options": absolute_options(options), "target": target_spec,
              "compiler": compiler, "name": name}
    if source_dir:
        record["source_dir"] = os.path.abspath(source_dir)
    line = json.dumps(record, sort_keys=True) + "\n"
    try:
        _append(path, line.encode("utf-8"))
    except Exception as exc:  # recording is a side job: it must never break the program
        log.warning("ptxbackend: cannot record to %s=%s: %s", RECORD_ENV, path, exc)


def absolute_options(options):
    """``options`` with each relative path made absolute against the working directory, as the key
    has them (compilers.options); everything else as given."""
    return [os.fsdecode(o) if isinstance(o, bytes) else str(o) for o in read_path_options(options).options]


def _append(path, data):
    """Append ``data`` to the regular file at ``path`` in one write, under an flock of that file.

    Opened non-blocking and checked by descriptor: a FIFO or device there is refused, never waited
    on.  The lock is on the manifest itself, so no ``.lock`` file is left beside it.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file: name a file for the manifest")
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one writer's line at a time, whole
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)

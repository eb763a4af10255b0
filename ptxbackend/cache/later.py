"""Local copies of fleet hits, written by one background thread so that the hit does not wait for them.

The thread writes once lookups have paused for :data:`QUIET` seconds, all that waits in one batch, and
is never woken by a lookup: a program's start-up, when first uses come one after another, does not share
the interpreter with file writes.  A value waits in :attr:`LaterWriter.pending` until its file is
written, so a lookup in between is still served from memory.  The process's exit waits for the batch
(at most :data:`EXIT_WAIT` seconds): a copy that was not written is only fetched again by the next
process.  A forked child, or an interpreter that cannot start a thread any more, writes at once.
"""

import atexit
import os
import threading
import time

EXIT_WAIT = 30.0
QUIET = 0.2


class LaterWriter(object):
    def __init__(self, write):
        self._write = write  # write(name, blob): handles its own OSError (an unwritable cache)
        #: name -> blob not written yet
        self.pending = {}
        self._last = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._pid = None
        self._registered = False

    def add(self, name, blob):
        self.pending[name] = blob
        self._last = time.monotonic()
        if not self._running():
            self._write_one(name)

    def _running(self):
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                return True
            thread = threading.Thread(target=self._run, name="ptxbackend-local-copies")
            thread.daemon = True
            self._stop = threading.Event()
            try:
                thread.start()
            except RuntimeError:  # the interpreter is shutting down
                return False
            self._thread, self._pid = thread, os.getpid()
            if not self._registered:
                self._registered = True
                atexit.register(self.flush)
            return True

    def _run(self):
        stop = self._stop
        while True:
            stop.wait(QUIET)
            if not stop.is_set() and time.monotonic() - self._last < QUIET:
                continue  # lookups are still coming: write later
            for name in list(self.pending):
                self._write_one(name)
            with self._lock:
                if not self.pending or stop.is_set():
                    self._thread = None  # the next add starts another
                    return

    def _write_one(self, name):
        blob = self.pending.get(name)
        try:
            if blob is not None:
                self._write(name, blob)
        finally:
            if self.pending.get(name) is blob:
                self.pending.pop(name, None)

    def flush(self, timeout=EXIT_WAIT):
        """Write everything waiting now (at most ``timeout`` seconds); a later :meth:`add` starts again."""
        with self._lock:
            thread = self._thread if self._pid == os.getpid() else None
            self._stop.set()
        if thread is not None:
            thread.join(timeout)
        elif self._pid != os.getpid():
            for name in list(self.pending):  # a forked child's copy of its parent's batch
                self._write_one(name)

"""Local copies of fleet hits, written by one background thread so that the hit does not wait for them.

The thread writes once lookups have paused for :data:`QUIET` seconds, in one batch: a program's start-up,
when first uses come one after another, does not share the interpreter with file writes.

A value waits in :attr:`LaterWriter.pending` until its file is written, so a lookup in between is still
served from memory.  The process's exit waits for the queue (at most :data:`EXIT_WAIT` seconds): a copy
that was not written is only fetched again by the next process.  A forked child, or an interpreter that
cannot start a thread any more, writes at once, as before.
"""

import atexit
import os
import threading

try:
    import queue
except ImportError:  # Python 2 is not supported, but the hook imports this module's package there
    queue = None

EXIT_WAIT = 30.0
QUIET = 0.2


class LaterWriter(object):
    def __init__(self, write):
        self._write = write  # write(name, blob): handles its own OSError (an unwritable cache)
        #: name -> blob not written yet
        self.pending = {}
        self._queue = queue.Queue()
        self._lock = threading.Lock()
        self._thread = None
        self._pid = None
        self._registered = False

    def add(self, name, blob):
        if not self._running():
            self._write(name, blob)
            return
        self.pending[name] = blob
        self._queue.put(name)

    def _running(self):
        with self._lock:
            if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
                return True
            self._queue = queue.Queue()  # a forked child's copy may hold its parent's names
            thread = threading.Thread(target=self._run, args=(self._queue,), name="ptxbackend-local-copies")
            thread.daemon = True
            try:
                thread.start()
            except RuntimeError:  # the interpreter is shutting down
                return False
            self._thread, self._pid = thread, os.getpid()
            if not self._registered:
                self._registered = True
                atexit.register(self.flush)
            return True

    def _run(self, names):
        batch = [names.get()]
        while True:
            try:
                batch.append(names.get(timeout=QUIET))
                continue
            except queue.Empty:
                pass
            for name in batch:
                if name is not None:
                    self._write_one(name)
            if None in batch:
                return
            batch = [names.get()]

    def _write_one(self, name):
        blob = self.pending.get(name)
        try:
            if blob is not None:
                self._write(name, blob)
        finally:
            if self.pending.get(name) is blob:
                self.pending.pop(name, None)

    def flush(self, timeout=EXIT_WAIT):
        """Write everything queued (waits at most ``timeout`` seconds); the next :meth:`add` starts again."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None or self._pid != os.getpid():
                return
            self._queue.put(None)
        thread.join(timeout)

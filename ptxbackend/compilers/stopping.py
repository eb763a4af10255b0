"""How a compile ends when its process is told to stop: SIGTERM and SIGHUP as Ctrl-C.

The compiler runs in its own process group (so a time-out or Ctrl-C can end
cicc, ptxas and the host compiler with it), which also means the terminal's or
``kill``'s signal to us never reaches it: if this process simply died, nvcc's
group would keep running and its private directory would stay.  So while a
compiler child runs, SIGTERM and SIGHUP raise :class:`Terminated`, which unwinds
like ``KeyboardInterrupt`` (the group is killed, the directory removed); then:

* where the process had its own handler (the CLI: ``cli/signals.py``), that
  handler raised it and the caller decides (the CLI exits 128 + signal);
* where the signal would have killed the process (no handler: a user's
  program), it is delivered again with the default action once the compile
  has cleaned up, so the process still ends by that signal.
"""

import contextlib
import os
import signal
import threading

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived (a ``BaseException``, like ``KeyboardInterrupt``: no ``except
    Exception`` swallows it, every ``finally`` runs)."""

    def __init__(self, signum):
        super(Terminated, self).__init__(signum)
        self.signum = signum

    def __str__(self):
        try:
            return "stopped by %s" % signal.Signals(self.signum).name
        except (ValueError, AttributeError):
            return "stopped by signal %d" % self.signum


def raise_terminated(signum, _frame):
    raise Terminated(signum)


@contextlib.contextmanager
def compile_stops_cleanly():
    """Around a compiler child: SIGTERM/SIGHUP with the default action raise :class:`Terminated`
    instead, and are delivered again (default action) once the child's group and files are gone."""
    taken = {}
    if SIGNALS and threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            try:
                if signal.getsignal(signum) == signal.SIG_DFL:
                    taken[signum] = signal.signal(signum, raise_terminated)
            except (ValueError, OSError):
                pass
    try:
        yield
    except Terminated as exc:
        if exc.signum not in taken:
            raise
        _restore(taken)
        os.kill(os.getpid(), exc.signum)  # the default action: the process ends as it would have
        raise
    finally:
        _restore(taken)


def _restore(taken):
    for signum, previous in list(taken.items()):
        try:
            signal.signal(signum, previous)
        except (ValueError, OSError):
            pass
        del taken[signum]

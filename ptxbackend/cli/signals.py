"""SIGTERM and SIGHUP in the command line: handled like Ctrl-C.

``timeout``, ``systemctl stop``, ``docker stop`` and a closed terminal stop a
command with these.  While a command runs they raise
:class:`~ptxbackend.compilers.stopping.Terminated`, which unwinds like
``KeyboardInterrupt``: a compiler's process group is ended and its private
directory removed (compilers/nvcc.py), a half-written ``cache export`` bundle
is removed (files/private.py), children of ``warm --libs`` are ended; the
command then prints one line and exits 128 + the signal's number
(docs/usage.md's exit codes).
"""

import contextlib
import signal

from ..compilers.stopping import SIGNALS, Terminated, raise_terminated

__all__ = ["Terminated", "stopping_like_ctrl_c", "exit_status"]


@contextlib.contextmanager
def stopping_like_ctrl_c():
    """While the command runs: SIGTERM and SIGHUP raise :class:`Terminated` (handlers restored after)."""
    saved = {}
    for signum in SIGNALS:
        try:
            saved[signum] = signal.signal(signum, raise_terminated)
        except (ValueError, OSError):  # not the main thread (a test calling main() from a thread)
            pass
    try:
        yield
    finally:
        for signum, previous in saved.items():
            try:
                signal.signal(signum, previous)
            except (ValueError, OSError):
                pass


def exit_status(exc):
    """The exit status of a command stopped by ``exc``: 128 + the signal's number, as a shell reports
    a process the signal ended."""
    return 128 + exc.signum

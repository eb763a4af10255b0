"""NVRTC's precompiled headers (12.8+) for ptxbackend's own compiles (on by default;
``PTXBACKEND_NVRTC_PCH=0`` turns them off).

NVRTC keeps a precompiled header in the process and reuses it for any later compile with the same
options: such a compile opens none of the headers in it, and NVRTC reuses it after one of them changed
(docs/design.md).  Used here only so that no compile is ever older than its headers:

- each compile carries a generation in its options, so NVRTC makes a precompiled header per generation
  (and a generation is never used again: an old header would serve again if its options came back);
- before each compile, the dependency set of the last compile of each option list in the current
  generation is checked in full (not from the watcher's memory); one that no longer holds starts a new
  generation;
- a compile's list of reads is what all compiles of its generation and option list read, itself included,
  since one that reused their precompiled header opened nothing;
- a generation counts only compiles whose reads are known: a failed compile (it may have made a
  precompiled header nobody recorded) or one whose reads are unknown ends it, and a compile that ran
  alongside such a one (it may have reused what that one made) is not filed.

A header changed during a compile is recorded as too new by :func:`depsets.build`: that entry is never
served, and the set fails the next check, which starts a new generation.
"""

import threading

from ..dependencies import depsets
from ..compilers.nvrtc import uses_precompiled_headers
from ..dependencies.reads import UNKNOWN_READS

# Option lists remembered in one generation; beyond, a new generation (NVRTC's heap holds the old ones).
_LIMIT = 256


class Generation(object):
    """The compiles that may share NVRTC's precompiled headers: their number, reads, last sets and the
    compiles of it still running."""

    __slots__ = ("number", "reads", "last", "running")

    def __init__(self, number):
        self.number = number
        self.reads = {}    # options -> (the paths read by this generation's compiles with them, as a set too)
        self.last = {}     # options -> (reads, the set) of the compile with the most reads (they only grow)
        self.running = {}  # a running compile's Ticket -> its options


class Ticket(object):
    """One compile in a generation, from :func:`start` to :func:`finish`."""

    __slots__ = ("generation", "options")

    def __init__(self, generation, options):
        self.generation, self.options = generation, options


_lock = threading.Lock()
_finished = threading.Condition(_lock)
_current = [Generation(0)]


def applies(comp, options, enabled):
    """Whether this compile uses precompiled headers: asked for, NVRTC 12.8+, none in the options already."""
    return (enabled and getattr(comp, "has_precompiled_headers", False)
            and not uses_precompiled_headers(options))


def current():
    """The generation to compile in: a new one when what the current one was made from changed."""
    with _lock:
        generation = _current[0]
        sets = [blob for _, blob in generation.last.values()]
    if all(depsets.holds_now(blob) for blob in sets):
        return generation
    with _lock:
        if _current[0] is generation:
            _end(generation)
        return _current[0]


def _end(generation):
    """Start the generation after ``generation`` (the lock held): its precompiled headers are not used again."""
    if _current[0] is generation:
        _current[0] = Generation(generation.number + 1)
    _finished.notify_all()


def start(generation, options):
    """A compile with ``options`` begins in ``generation``: the :class:`Ticket` to :func:`finish` it with."""
    ticket = Ticket(generation, tuple(options))
    with _lock:
        generation.running[ticket] = ticket.options
    return ticket


def failed(ticket):
    """The compile failed (an error, a timeout): NVRTC may have made a precompiled header from headers
    nobody recorded, so the generation ends and no later compile can reuse it."""
    with _lock:
        ticket.generation.running.pop(ticket, None)
        _end(ticket.generation)


def finish(ticket, own):
    """The list of reads for the dependency set of a compile that opened ``own``: what all compiles
    of its generation and options read, itself included, since one that reused their precompiled
    header opened nothing.  Compiles with the same options that ran alongside it are waited for (it
    may have reused what they made); when any of them, or this one, has unknown reads, or the
    generation ended meanwhile, the list says the reads are unknown and the generation ends."""
    generation, options = ticket.generation, ticket.options
    unknown = any(path.startswith(UNKNOWN_READS) for path in own)
    with _lock:
        generation.running.pop(ticket, None)
        if unknown:
            _end(generation)
            return own
        if _current[0] is generation:
            paths, seen = generation.reads.setdefault(options, ([], set()))
            for path in own:
                if path not in seen:
                    seen.add(path)
                    paths.append(path)
        _finished.notify_all()
        alongside = [t for t, o in generation.running.items() if o == options]
        while _current[0] is generation and any(t in generation.running for t in alongside):
            _finished.wait()
        if _current[0] is not generation:
            # A header changed while it ran, or a compile that ran alongside failed or had unknown
            # reads: what its precompiled header was made of is not known.
            return own + [UNKNOWN_READS + "a compile with a precompiled header it may have reused "
                                          "failed or had unknown reads, or a header changed meanwhile"]
        return list(generation.reads[options][0])


def built(generation, options, inputs, made):
    """Remember the set ``made`` (a :class:`depsets.Built`) of a compile that read ``inputs`` (what
    :func:`reads` said): the one of the most reads is a superset of the others, even when compiles in
    threads finish out of order."""
    with _lock:
        if _current[0] is not generation:
            return
        if made.blob is None and made.volatile or len(generation.last) >= _LIMIT:
            # What it read cannot be told (or too many option lists): its precompiled header is not trusted.
            _end(generation)
        elif made.blob is not None and len(inputs) >= generation.last.get(options, (0, None))[0]:
            generation.last[options] = (len(inputs), made.blob)

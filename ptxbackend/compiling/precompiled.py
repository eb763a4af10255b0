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
  since one that reused their precompiled header opened nothing.

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
    """The compiles that may share NVRTC's precompiled headers: their number, reads and last sets."""

    __slots__ = ("number", "reads", "last")

    def __init__(self, number):
        self.number = number
        self.reads = {}  # options -> (the paths read by this generation's compiles with them, as a set too)
        self.last = {}   # options -> (reads, the set) of the compile with the most reads (they only grow)


_lock = threading.Lock()
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
    _current[0] = Generation(generation.number + 1)


def reads(generation, options, own):
    """The list of reads for the dependency set of a compile in ``generation`` that opened ``own``."""
    if any(path.startswith(UNKNOWN_READS) for path in own):
        return own
    with _lock:
        if _current[0] is not generation:
            # A header changed while it ran: what its precompiled header was made of is not known.
            return own + [UNKNOWN_READS + "a header changed during a compile with a precompiled header"]
        paths, seen = generation.reads.setdefault(options, ([], set()))
        for path in own:
            if path not in seen:
                seen.add(path)
                paths.append(path)
        return list(paths)


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

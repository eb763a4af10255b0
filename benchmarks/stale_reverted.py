"""How long the stale-hit fuzzer takes to find each stale-hit class with its fix reverted.

A pytest plugin: ``STALE_REVERT=NAME`` puts 0.4.0's behaviour back for one class in the process under test
(the fuzzer's truth is compiled in a process of its own, from the tree as it is), then the fuzzer runs with
its usual budget.  A class found fails the test with the fuzzer's own line: compiler, mode, seconds and
sequences into the run, the seed and the minimal sequence.  A class not found passes, and the fuzzer's
summary line says how many sequences it tried::

    STALE_REVERT=union PTXBACKEND_FUZZ_SECONDS=120 PYTHONPATH=benchmarks:tests \\
        python -m pytest -q -s -p stale_reverted tests/test_stale_fuzzer.py

Names: union (NVRTC's record of opens not completed by the include scan: headers through links and ``..``),
file_watch (no watch on each header itself: an edit through a hard link elsewhere), link_dirs (only each
header's own directory watched, no per-file watch: an edit through a link), rewatch (watches not made again
after a change: a retargeted ``-I`` link), include_next (no directory after the includer recorded as one that
must stay empty), next_scan (the include scan does not follow ``#include_next``), pch (a failed compile does
not end the precompiled-header generation), mkdir (a missing ``-I`` directory's first missing component
recorded as what must stay absent, instead of the whole path to the file: an empty ``mkdir`` on the way is
a needless miss, which the fuzzer checks around the steps that change nothing the compiler reads).
"""

import os


def _revert(name):
    from ptxbackend.compilers import nvrtc
    from ptxbackend.compiling import precompiled
    from ptxbackend.dependencies import depsets, reads
    from ptxbackend.files import inotify, watching

    if name == "union":
        nvrtc.unrecorded_reads = lambda *args, **kwargs: []
    elif name in ("file_watch", "link_dirs"):
        watch = watching.watch
        watching.watch = lambda directories, files=(): watch(directories, ())
        if name == "link_dirs":
            watching.files_directories = lambda paths: set(os.path.dirname(p) for p in paths)
    elif name == "rewatch":
        changed = inotify.ChangeWatcher.changed

        def keep_watches(self):
            kept = set(self._watched), set(self._watched_files)
            seen = changed(self)
            self._watched.update(kept[0])
            self._watched_files.update(kept[1])
            return seen
        inotify.ChangeWatcher.changed = keep_watches
    elif name == "include_next":
        init = depsets._Facts.__init__

        def no_nexts(self, text):
            init(self, text)
            self.include_nexts = ()
        depsets._Facts.__init__ = no_nexts
    elif name == "next_scan":
        directives = reads._directives
        reads._directives = lambda text: [(kind, n) for kind, n in directives(text) if kind != reads._NEXT]
    elif name == "mkdir":
        first_missing = depsets._first_missing

        def first_component(path):
            parent, missing = first_missing(path)
            return parent, missing and missing.split("/")[0]
        depsets._first_missing = first_component
    elif name == "pch":
        def failed(ticket):
            with precompiled._lock:
                ticket.generation.running.pop(ticket, None)
        precompiled.failed = failed
    else:
        raise SystemExit("STALE_REVERT=%r: one of union, file_watch, link_dirs, rewatch, include_next, "
                         "next_scan, mkdir, pch" % name)


class _GenerateOnly(object):
    """Hypothesis's phases without shrinking: the fuzzer's first line is the find being timed, and the
    minutes a shrink takes would only delay the next class (replay its seed to shrink it)."""
    generate = shrink = __import__("hypothesis").Phase.generate


def pytest_configure(config):
    name = os.environ.get("STALE_REVERT")
    if name:
        _revert(name)


def pytest_collection_modifyitems(items):
    if os.environ.get("STALE_REVERT"):
        for item in items:
            if getattr(item.module, "Phase", None) is not None:
                item.module.Phase = _GenerateOnly

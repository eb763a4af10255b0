"""How long the injection fuzzer takes to find issue 38's rows 1 and 2 with their fixes reverted.

A pytest plugin: it puts 0.4.0's behaviour back in place for one row, counts the examples and seconds
until the first example breaks the fuzzer's invariants (the canary ran, or something outside the cache
changed), and prints that line at the end::

    FUZZ_REVERT=row1 PYTHONPATH=benchmarks:tests python -m pytest -q -p fuzz_reverted tests/test_injection_fuzz.py
    FUZZ_REVERT=row2 ...

row1: 0.4.0's kernel-name handling (the caller's spelling as nvcc's source argument, shell characters and
a leading '-' kept).  row2: 0.4.0's manifest check (a list of refused flags) instead of the grammar.
The test then fails, as it must; the printed line is the figure (docs/reliability.md).
"""

import os
import time

import test_injection_fuzz as fuzz

_started = []
_found = []
_examples = [0]


def _old_name(name):
    from ptxbackend.errors import CompileError
    if "\0" in str(name):
        raise CompileError("the kernel name contains a NUL character")  # 0.4.0's own check
    name = str(name).replace("\\", "/")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or os.path.isabs(name) or ".." in parts:
        base = os.path.basename(name)
        found = base if base not in ("", ".", "..") else "kernel.cu"
    else:
        found = os.path.join(*parts)
    return found if found.endswith(".cu") else found + ".cu"


_OLD_REFUSED = ("-ccbin", "--compiler-bindir", "-optf", "--options-file", "-Xcompiler", "--compiler-options",
                "-Xlinker", "--linker-options", "-Xnvlink", "--nvlink-options", "-Xarchive", "--archive-options",
                "-run", "--run", "--run-args", "-keep-dir", "--keep-dir", "-odir", "--output-directory", "-o",
                "--output-file", "-MF", "--dependency-output", "-use-local-env", "--use-local-env")


def _old_filter(options):
    for option in options:
        for flag in _OLD_REFUSED:
            if option == flag or option.startswith(flag + "=") or (len(flag) > 3 and option.startswith(flag)):
                return "its options hold %s" % flag
    return None


def pytest_configure(config):
    which = os.environ.get("FUZZ_REVERT")
    if which == "row1":
        from ptxbackend.compilers import nvcc
        nvcc._name_in_workdir = _old_name
    elif which == "row2":
        from ptxbackend.deploy import replay
        replay.option_problem = _old_filter
    else:
        raise SystemExit("FUZZ_REVERT must be row1 or row2")
    run, restore = fuzz.run_example, fuzz.restore

    def counted(*args):
        if not _started:
            _started.append(time.time())
        if not _found:
            _examples[0] += 1
        return run(*args)

    def checked(root, before):
        if not _found and (os.path.exists(os.path.join(root, "ran")) or fuzz.snapshot(root) != before):
            _found.append(time.time() - _started[0])
        restore(root, before)

    fuzz.run_example, fuzz.restore = counted, checked


def pytest_sessionfinish(session):
    which = os.environ.get("FUZZ_REVERT")
    if _found:
        print("\n%s reverted: found after %d examples, %.1f s" % (which, _examples[0], _found[0]))
    else:
        print("\n%s reverted: not found in %d examples" % (which, _examples[0]))

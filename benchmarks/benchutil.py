"""Shared helpers of the benchmark sections: statistics, child processes, kernel sources, formatting.

Not part of the ptxbackend package.  Kept importable without NumPy, CuPy or a GPU: child
processes import it first, and what a child imports before its clock starts must stay small.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
KERNEL_DIR = os.path.join(BENCH_DIR, "kernels")
HEADER_TREE = os.path.join(KERNEL_DIR, "include")
HEADER_ROOT = "bench/carray.cuh"
MARKER = "PTXBENCH-JSON:"
JIT_CACHE_4G = str(4 << 30)  # what ptxbackend's start-up hook sets CUDA_CACHE_MAXSIZE to


class ChildError(RuntimeError):
    """A benchmark child process failed; the message carries the end of its stderr."""


# --------------------------------------------------------------------------- kernels

def kernel_source(name, variant=None, include=None):
    """The text of benchmarks/kernels/<name>.cu; ``variant`` makes a distinct source (cache key);
    ``include`` names a header the source starts with (``#include <include>``)."""
    with open(os.path.join(KERNEL_DIR, name + ".cu")) as handle:
        text = handle.read()
    if variant is not None:
        text = "#define BENCH_VARIANT %d\n" % int(variant) + text
    if include:
        text = "#include <%s>\n" % include + text
    return text


def write_header_tree(directory):
    """Copy the synthetic header tree (kernels/include: bench/carray.cuh and the 8 headers it reads)
    into ``directory``, which becomes the kernels' -I directory; returns the headers' relative paths.

    A copy, not -I benchmarks/kernels/include: the directory must hold nothing but the tree, and
    ptxbackend's fingerprint of it must not depend on the checkout.
    """
    names = []
    for base, dirs, files in os.walk(HEADER_TREE):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(base, name), HEADER_TREE)
            os.makedirs(os.path.join(directory, os.path.dirname(rel)), exist_ok=True)
            shutil.copyfile(os.path.join(base, name), os.path.join(directory, rel))
            names.append(rel.replace(os.sep, "/"))
    return names


# --------------------------------------------------------------------------- statistics

def _quantile(ordered, q):
    """Linear-interpolated quantile of an already sorted list."""
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples, unit="ms"):
    """``{'unit', 'reps', 'samples', 'median', 'min', 'max', 'q1', 'q3'}`` of a list of numbers."""
    values = [float(v) for v in samples]
    if not values:
        return {"unit": unit, "reps": 0, "samples": [], "median": None, "min": None, "max": None,
                "q1": None, "q3": None}
    ordered = sorted(values)
    return {"unit": unit, "reps": len(values), "samples": values, "median": _quantile(ordered, 0.5),
            "min": ordered[0], "max": ordered[-1], "q1": _quantile(ordered, 0.25),
            "q3": _quantile(ordered, 0.75)}


def ratio(a, b):
    """a / b for two summaries (their medians) or numbers; None when either is missing."""
    a = a.get("median") if isinstance(a, dict) else a
    b = b.get("median") if isinstance(b, dict) else b
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt_num(value, digits=3):
    if value is None:
        return "-"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000:
        return "%.0f" % value
    places = max(0, digits - 1 - int(math.floor(math.log10(magnitude))))
    return "%.*f" % (min(places, 6), value)


def fmt_stat(stat, digits=3):
    """``'1.23 (1.20-1.31, n=5)'``: median (min-max, repetitions)."""
    if not stat or stat.get("median") is None:
        return "-"
    if stat.get("reps", 0) <= 1:
        return "%s (n=1)" % fmt_num(stat["median"], digits)
    return "%s (%s-%s, n=%d)" % (fmt_num(stat["median"], digits), fmt_num(stat["min"], digits),
                                 fmt_num(stat["max"], digits), stat["reps"])


def fmt_ratio(value):
    return "-" if value is None else "%.3fx" % value


# --------------------------------------------------------------------------- which ptxbackend

_ptxbackend_src = None  # a directory holding the ptxbackend/ package to measure instead of the checkout's


def set_ptxbackend_src(directory):
    """Children import ptxbackend from ``directory`` (it holds ptxbackend/); None: from the checkout.

    Only the children: the runner puts the directory on its own sys.path itself (run.py), before
    anything imports ptxbackend.
    """
    global _ptxbackend_src
    _ptxbackend_src = os.path.realpath(directory) if directory else None


def ptxbackend_src():
    """The directory whose ptxbackend/ the children import (real path, as imported_ptxbackend's)."""
    return _ptxbackend_src or os.path.realpath(REPO)


def child_path():
    """What a child puts first on sys.path: the ptxbackend to measure, the checkout, benchmarks/."""
    return ([_ptxbackend_src] if _ptxbackend_src else []) + [REPO, BENCH_DIR]


def ptxbackend_probe(args):
    """Child: the ptxbackend that a child imports, as ``{'version', 'dir'}`` (dir holds ptxbackend/)."""
    import ptxbackend  # noqa: F401
    return imported_ptxbackend()


def imported_ptxbackend():
    """Version and location of the ptxbackend this process has imported; None if it has none."""
    module = sys.modules.get("ptxbackend")
    if module is None or not getattr(module, "__file__", None):
        return None
    return {"version": getattr(module, "__version__", "?"),
            "dir": os.path.dirname(os.path.dirname(os.path.realpath(module.__file__)))}


def git_tree_id(path):
    """Git's tree id of the files under ``path`` (what ``git rev-parse COMMIT:ptxbackend`` prints for
    the same files), or None when there are none.  Compiled files (__pycache__, .pyc) are skipped.

    Computed from the files, so a directory made by ``git archive`` names its commit's tree too.
    """
    entries = []
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if name == "__pycache__" or name.endswith((".pyc", ".pyo")):
            continue
        if os.path.islink(full):
            mode, sha, sort = "120000", _git_object("blob", os.readlink(full).encode("utf-8", "surrogateescape")), name
        elif os.path.isdir(full):
            mode, sha, sort = "40000", git_tree_id(full), name + "/"
            if sha is None:  # git keeps no empty directories
                continue
        else:
            with open(full, "rb") as handle:
                data = handle.read()
            mode = "100755" if os.stat(full).st_mode & 0o100 else "100644"
            sha, sort = _git_object("blob", data), name
        entries.append((sort.encode("utf-8", "surrogateescape"), mode, name, sha))
    if not entries:
        return None
    body = b"".join(b"%s %s\0%s" % (mode.encode(), name.encode("utf-8", "surrogateescape"), bytes.fromhex(sha))
                    for _sort, mode, name, sha in sorted(entries))
    return _git_object("tree", body)


def _git_object(kind, data):
    import hashlib
    return hashlib.sha1(b"%s %d\0" % (kind.encode(), len(data)) + data).hexdigest()


def describe_ptxbackend_src(directory):
    """Which code ``directory``/ptxbackend is: its git tree id, and the commit when ``directory`` is
    the top of a git work tree (with whether ptxbackend/ differs from that commit)."""
    package = os.path.join(directory, "ptxbackend")
    out = {"dir": directory, "tree": git_tree_id(package) if os.path.isdir(package) else None,
           "commit": None, "modified": None}
    try:
        top = subprocess.run(["git", "-C", directory, "rev-parse", "--show-toplevel", "HEAD"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True, timeout=30)
        lines = top.stdout.split()
        # A directory inside some other work tree (an archive unpacked into the checkout) is not that commit.
        if top.returncode == 0 and len(lines) == 2 and os.path.realpath(lines[0]) == os.path.realpath(directory):
            out["commit"] = lines[1]
            out["modified"] = out["tree"] != _git_rev(directory, "HEAD:ptxbackend")
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def _git_rev(directory, rev):
    proc = subprocess.run(["git", "-C", directory, "rev-parse", rev], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, universal_newlines=True, timeout=30)
    return proc.stdout.strip() if proc.returncode == 0 else None


# --------------------------------------------------------------------------- environment and children

def clean_env(extra=None):
    """This process's environment without PTXBACKEND_* settings (test/bench locations kept),
    with child_path() first on PYTHONPATH; ``extra`` values of None delete."""
    env = {}
    for key, value in os.environ.items():
        if key.startswith("PTXBACKEND_") and not key.startswith(("PTXBACKEND_TEST_", "PTXBACKEND_BENCH_")):
            continue
        env[key] = value
    parts = child_path() + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


_CHILD = ("import sys, json\n"
          "sys.path[:0] = %r\n"
          "import %s as _m\n"
          "_r = _m.%s(json.loads(sys.argv[1]))\n"
          "sys.stdout.write('\\n' + %r + json.dumps(_r) + '\\n')\n")


def spawn(module, function, args, env, timeout=600):
    """Run ``module.function(args)`` in a fresh interpreter and return its JSON-able result.

    The child prints its result as the last marked line of stdout.  Raises ChildError.
    """
    code = _CHILD % (child_path(), module, function, MARKER)
    try:
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(args)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                              universal_newlines=True, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        raise ChildError("%s.%s timed out after %d s" % (module, function, timeout))
    lines = [l for l in proc.stdout.splitlines() if l.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        raise ChildError("%s.%s failed (exit %s): %s" % (module, function, proc.returncode,
                                                         tail(proc.stderr or proc.stdout, 2, 500)))
    return json.loads(lines[-1][len(MARKER):])


def tail(text, lines=6, width=600):
    text = (text or "").strip().splitlines()
    return " | ".join(text[-lines:])[-width:]


def first_line(exc):
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0] if text else "")


def time_command(argv, env, cwd=None, timeout=300):
    """Wall seconds of one run of ``argv`` (must exit 0)."""
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd or tempfile.gettempdir(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout, universal_newlines=True)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise ChildError("%s failed (exit %d): %s" % (" ".join(argv[:3]), proc.returncode, tail(proc.stderr)))
    return elapsed


class Workspace(object):
    """Temporary directories of one benchmark run, removed at the end unless kept."""

    def __init__(self, keep=False):
        self.root = tempfile.mkdtemp(prefix="ptxbench-")
        self.keep = keep

    def path(self, *parts):
        path = os.path.join(self.root, *parts)
        os.makedirs(path, exist_ok=True)
        return path

    def fresh(self, prefix):
        parent = self.path("dirs")
        return tempfile.mkdtemp(prefix=prefix + "-", dir=parent)

    def close(self):
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def log(message):
    sys.stderr.write("[bench %s] %s\n" % (time.strftime("%H:%M:%S"), message))
    sys.stderr.flush()


def logging_nvcc(ws, nvcc, folder):
    """An ``nvcc`` script (in a fresh workspace folder) that logs each call, then runs the real one.

    Returns ``(script path, log path)``; :func:`nvcc_compiles` counts the compiles in the log.
    """
    directory = ws.fresh(folder)
    log = os.path.join(directory, "nvcc-calls.log")
    path = os.path.join(directory, "nvcc")
    with open(path, "w") as handle:
        handle.write('#!/bin/sh\necho "$*" >> "%s"\nexec "%s" "$@"\n' % (log, nvcc))
    os.chmod(path, 0o755)
    return path, log


def nvcc_compiles(log):
    """The compiles in a :func:`logging_nvcc` log (a ``-dryrun``, ptxbackend's identity probe, compiles nothing)."""
    if not os.path.exists(log):
        return 0
    with open(log) as handle:
        return sum(1 for line in handle if any(flag in line.split() for flag in ("--ptx", "--cubin", "--fatbin"))
                   and "-dryrun" not in line.split())

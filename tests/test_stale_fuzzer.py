"""A differential stale-hit fuzzer: after every change to an include tree, the cached answer must be
the bytes a fresh compile in an empty cache gives.

Hypothesis draws an include tree (three ``-I`` directories, the last ``-isystem`` for nvcc, one of them
missing behind directories yet to be made, one a link to one of two directories beside it; ``val.cuh`` in each as a definition, an ``#include_next``,
an ``#include "../common/b.cuh"`` leaving the tree, a symbolic link to a file elsewhere, or
``#include "lib/a.cuh"`` through a directory link to one of two libraries whose ``a.cuh`` match and
whose quoted ``b.cuh`` differ; a
``__has_include`` of ``extra.cuh``; a forced ``-include``; hard links to ``common/b.cuh`` and to the forced
include in a directory nobody searches; an options file for nvcc) and a sequence of operations (edit in place, atomic rename
keeping mtime and size, no change at all (a hit), create or delete a shadowing header, edit a defining
header through its hard link in a directory nobody searches, retarget a link to a file or a directory or the ``-I`` link (alone, or after emptying it and before a
header is created where it now leads), ``mkdir`` on the way to
the missing directory, edit through either hard link, a failing compile in between, or a change, a failing compile, a change, then the fixed kernel).  Each sequence runs
with NVRTC 13.5's precompiled headers on or off, and either in one long-lived process or with the
process's memory dropped before each cached compile (what a new process sees); at the end of each
sequence a real new process asks the cache too.  Around a step that changes nothing the compiler reads
(``mkdir`` of empty directories, no change), a hit must stay a hit: a needless miss fails too.

Budget: ``PTXBACKEND_FUZZ_SECONDS`` (default 120) in all: half NVRTC 13.5, a third nvcc 13, a sixth
NVRTC 11.7 (the ``nvidia-cuda-nvrtc-cu11`` wheel of the test extra, or ``PTXBACKEND_TEST_NVRTC117``;
it has no precompiled headers and reads through another front end, and builds up to ``compute_87``);
``PTXBACKEND_FUZZ_SEED`` replays a run.  A difference fails with the seed, and Hypothesis shrinks it
to a minimal tree and sequence and prints them.  Longer runs: docs/reliability.md.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import ptxbackend
from ptxbackend.dependencies import depsets
from conftest import REPO, run_python

BUDGET = float(os.environ.get("PTXBACKEND_FUZZ_SECONDS", "120"))
SEED = int(os.environ.get("PTXBACKEND_FUZZ_SEED", "0")) or int(time.time()) % 100000

SOURCE = '''#if __has_include(<extra.cuh>)
#include <extra.cuh>
#endif
#ifndef EXTRA
#define EXTRA 0
#endif
#include <val.cuh>
extern "C" __global__ void k(float* y) { y[0] = VAL + EXTRA * 10.0f + FORCED * 100.0f; }
'''
BROKEN = SOURCE.replace("y[0] =", "y[0] = oops +")

DIRS = ("I0", "I1", "I2")
KINDS = ("define", "next", "dotdot", "link", "dirlink")

tree_strategy = st.fixed_dictionaries({
    # Half the trees chain an #include_next into each other kind: a header it reaches through a link,
    # a directory link or `..` is one NVRTC's record of opens cannot show, and only a scan that
    # follows #include_next adds it.
    "val": st.one_of(st.tuples(*[st.sampled_from(("none",) + KINDS)] * 3),
                     st.tuples(st.just("next"), st.sampled_from(KINDS), st.sampled_from(("define", "link"))),
                     st.tuples(st.sampled_from(("none", "next")), st.just("next"), st.sampled_from(KINDS)),
                     # An #include_next past an empty directory to the one that defines: the empty one
                     # must stay so, and a header created there later is a change (twice: only the
                     # create in that directory, below, shows it).
                     st.tuples(st.just("next"), st.just("none"), st.sampled_from(("define", "link"))),
                     st.tuples(st.just("next"), st.just("none"), st.sampled_from(("define", "link")))),
    "digits": st.tuples(*[st.integers(1, 9)] * 3),
    "extra": st.sampled_from((None,) + DIRS),
    "missing": st.sampled_from((None,) + DIRS),  # this -I directory is made only by a "mkdir" below
    # This -I directory is a link to one of two directories; the first is the one nothing shadows.
    "linked": st.sampled_from((None, "I0") + DIRS),
})

_EDIT = st.one_of(
    st.tuples(st.just("edit"), st.sampled_from(DIRS), st.integers(1, 9)),
    st.tuples(st.just("edit_common"), st.integers(1, 9)),
    st.tuples(st.just("edit_real"), st.just(0), st.integers(1, 9)),
    st.tuples(st.just("forced"), st.integers(1, 9)))

op_strategy = st.one_of(
    st.tuples(st.just("edit"), st.sampled_from(DIRS), st.integers(1, 9)),
    st.tuples(st.just("atomic"), st.sampled_from(DIRS), st.integers(1, 9)),
    st.tuples(st.just("create"), st.sampled_from(DIRS), st.sampled_from(KINDS), st.integers(1, 9)),
    st.tuples(st.just("delete"), st.sampled_from(DIRS)),
    st.tuples(st.just("retarget"), st.sampled_from(DIRS), st.integers(1, 3)),
    # Twice: the needless miss an empty mkdir can cause shows only when the -I directory is missing.
    st.tuples(st.just("mkdir"), st.integers(1, 3)),
    st.tuples(st.just("mkdir"), st.integers(1, 3)),
    st.tuples(st.just("retarget_dir"), st.sampled_from(DIRS), st.integers(1, 2)),
    # Twice: what a retarget hides shows only with a later create or edit in the new directory.
    st.tuples(st.just("retarget_include"), st.integers(1, 2)),
    # The -I link's header deleted, the link retargeted (to an empty directory: a hit), then a header
    # created where it now leads (three steps, each asked first): what a watch left on the old
    # directory misses.  Four times, and a header that includes another: the finds of this class were
    # all such (where the link comes first in the search order).
    st.tuples(st.just("retarget_then_create"), st.sampled_from(KINDS), st.integers(1, 9)),
    st.tuples(st.just("retarget_then_create"), st.sampled_from(KINDS), st.integers(1, 9)),
    st.tuples(st.just("retarget_then_create"), st.sampled_from(KINDS), st.integers(1, 9)),
    st.tuples(st.just("retarget_then_create"), st.sampled_from(KINDS), st.integers(1, 9)),
    st.tuples(st.just("edit_common"), st.integers(1, 9)),
    st.tuples(st.just("atomic_common"), st.integers(1, 9)),
    st.tuples(st.just("edit_hard_link"), st.integers(1, 9)),
    st.tuples(st.just("edit_forced_hard_link"), st.integers(1, 9)),
    # Twice: a header that defines, edited through its hard link in a directory nobody searches (no
    # event in any directory the compile read; only a watch on the file itself sees it).
    st.tuples(st.just("edit_val_hard_link"), st.sampled_from(DIRS), st.integers(1, 9)),
    st.tuples(st.just("edit_val_hard_link"), st.sampled_from(DIRS), st.integers(1, 9)),
    st.tuples(st.just("edit_real"), st.integers(0, 3), st.integers(1, 9)),  # 0: all three
    st.tuples(st.just("edit_real"), st.just(0), st.integers(1, 9)),
    st.tuples(st.just("extra"), st.sampled_from((None,) + DIRS), st.integers(1, 9)),
    st.tuples(st.just("forced"), st.integers(1, 9)),
    st.tuples(st.just("fail"),),
    # A change (the next compile starts a new precompiled-header generation), a failing compile (the
    # first of it: its header may be the one NVRTC keeps), another change, then the fixed kernel.
    st.tuples(st.just("fail_then"), _EDIT, _EDIT),
    st.tuples(st.just("fail_then"), _EDIT, _EDIT),
    # The same with the forced include as the second change: it is in every precompiled header.
    st.tuples(st.just("fail_then"), _EDIT, st.tuples(st.just("forced"), st.integers(1, 9))),
    # A header created in the middle -I directory, the one an #include_next passes over.
    st.tuples(st.just("create"), st.just("I1"), st.sampled_from(("define", "link")), st.integers(1, 9)),
    st.tuples(st.just("create"), st.just("I1"), st.sampled_from(("define", "link")), st.integers(1, 9)),
    st.tuples(st.just("create"), st.just("I1"), st.sampled_from(("define", "link")), st.integers(1, 9)),
    # Nothing changes: the next call is a hit, where a miss would have checked the files afresh.
    st.tuples(st.just("again"),),
)


# Ops after which the compiler reads the same files: a hit before must stay a hit (an empty directory on
# the way to a missing -I directory is not a change).
UNCHANGING = ("mkdir", "again")
# Ops the process asks once more before: a hit puts a set under watch, and an edit through a link or a hard
# link elsewhere is what that watch must see.
ASK_FIRST = UNCHANGING + ("edit_hard_link", "edit_forced_hard_link", "edit_val_hard_link", "edit_real", "create_linked",
                           "retarget_include")


def _define(digit):
    return "#define VAL %d.0f\n" % digit  # one digit: every edit keeps the size


def _steps(ops):
    """``ops`` with each compound op made the steps it stands for."""
    steps = []
    for op in ops:
        if op[0] == "retarget_then_create":
            steps += [("delete_linked",), ("retarget_include", "toggle"), ("create_linked",) + tuple(op[1:])]
        else:
            steps.append(op)
    return steps


class Tree(object):
    """The files on disk, and the operations on them."""

    def __init__(self, root, spec, compiler):
        self.root = root
        self.missing = spec["missing"]
        for name in ("real", "common", "elsewhere"):
            os.makedirs(self.path(name))
        for index in (1, 2, 3):
            self.write(self.path("real", "v%d.cuh" % index), _define(index))
        self.write(self.path("common", "b.cuh"), _define(5))
        # Two libraries with the same a.cuh and different quoted neighbours, reached through a
        # directory link: only re-resolving the link tells which b.cuh the compiler reads.
        for name, digit in (("one", 6), ("two", 7)):
            os.makedirs(self.path("libs", name))
            self.write(self.path("libs", name, "a.cuh"), '#include "b.cuh"\n')
            self.write(self.path("libs", name, "b.cuh"), _define(digit))
        os.link(self.path("common", "b.cuh"), self.path("elsewhere", "b.cuh"))
        self.write(self.path("forced.cuh"), "#define FORCED 1\n")
        # Every compile reads the forced include: an edit through its hard link tests the per-file watch
        # whatever the tree.
        os.link(self.path("forced.cuh"), self.path("elsewhere", "forced.cuh"))
        self.linked = spec["linked"] if spec["linked"] != self.missing else None
        for directory, kind, digit in zip(DIRS, spec["val"], spec["digits"]):
            if directory == self.linked:
                # The -I name is a link to one of two directories beside it (the other starts
                # empty): what it leads to changes by a retarget, with no change in either.
                for which in (1, 2):
                    os.makedirs(self.path("%s-%d" % (directory, which)))
                self.link_include(1)
                if kind != "none":
                    self.create(directory, kind, digit)
            elif directory != self.missing:
                os.makedirs(self.dir(directory))
                if kind != "none":
                    self.create(directory, kind, digit)
        if spec["extra"] and spec["extra"] != self.missing:
            self.write(os.path.join(self.dir(spec["extra"]), "extra.cuh"), "#define EXTRA 1\n")
        self.options = ["-I", self.dir("I0"), "-I", self.dir("I1")]
        self.options += ["-isystem" if compiler == "nvcc" else "-I", self.dir("I2")]
        self.options += ["-include", self.path("forced.cuh")]
        if compiler == "nvcc":
            self.write(self.path("options.txt"), "-DFROM_OPTIONS_FILE=1\n")
            self.options += ["--options-file", self.path("options.txt")]

    def snapshot(self):
        """Everything in the tree a compile could read: each name, its kind, a file's text, a link's
        target (an inode is not read: two trees alike in this compile alike)."""
        found = []
        for top, directories, files in os.walk(self.root):
            for name in sorted(directories + files):
                path = os.path.join(top, name)
                if os.path.islink(path):
                    found.append((path, "link", os.readlink(path)))
                elif os.path.isdir(path):
                    found.append((path, "dir", None))
                else:
                    with open(path, "rb") as handle:
                        found.append((path, "file", handle.read()))
        return tuple(found)

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def dir(self, name):
        # The missing one lies below two directories that do not exist yet either.
        return self.path("m", "n", name) if name == self.missing else self.path(name)

    @staticmethod
    def write(path, text):
        with open(path, "w") as handle:
            handle.write(text)

    @staticmethod
    def edit_in_place(path, text):
        with open(path, "r+") as handle:
            handle.seek(0)
            handle.truncate()
            handle.write(text)

    @staticmethod
    def atomic(path, text):
        """Replace by rename, with the old file's size and times: only the inode tells."""
        real = os.path.realpath(path)
        old = os.stat(real)
        temporary = real + ".tmp"
        Tree.write(temporary, text)
        os.utime(temporary, ns=(old.st_atime_ns, old.st_mtime_ns))
        os.rename(temporary, real)

    def create(self, directory, kind, digit):
        path = os.path.join(self.dir(directory), "val.cuh")
        if kind == "define":
            self.write(path, _define(digit))
            hard = self.path("elsewhere", "val-%s.cuh" % directory)
            if os.path.lexists(hard):
                os.unlink(hard)
            os.link(path, hard)
        elif kind == "next":
            self.write(path, "#include_next <val.cuh>\n")
        elif kind == "dotdot":
            self.write(path, '#include "../common/b.cuh"\n' if directory != self.missing
                       else '#include "../../../common/b.cuh"\n')
        elif kind == "dirlink":
            self.write(path, '#include "lib/a.cuh"\n')
            if not os.path.lexists(os.path.join(self.dir(directory), "lib")):
                self.link_dir(directory, 1 + digit % 2)
        else:
            os.symlink(os.path.join(os.path.relpath(self.path("real"), self.dir(directory)),
                                    "v%d.cuh" % (digit % 3 + 1)), path)

    def link_dir(self, directory, which):
        os.symlink(os.path.relpath(self.path("libs", ("one", "two")[which - 1]), self.dir(directory)),
                   os.path.join(self.dir(directory), "lib"))

    def link_include(self, which):
        if which == "toggle":
            which = 1 if os.readlink(self.dir(self.linked)).endswith("-2") else 2
        temporary = self.dir(self.linked) + ".new"
        os.symlink("%s-%d" % (self.linked, which), temporary)
        os.rename(temporary, self.dir(self.linked))

    def apply(self, op):
        """Do ``op``; ``True`` when it was a failing compile (the caller runs it)."""
        name, args = op[0], op[1:]
        if name in ("edit", "atomic", "create", "delete", "retarget", "retarget_dir", "extra") and args[0] \
                and not os.path.isdir(self.dir(args[0])):
            return False  # the directory is still missing: nothing to do
        if name == "edit" or name == "atomic":
            path = os.path.join(self.dir(args[0]), "val.cuh")
            if os.path.exists(path) and "include" not in open(path).read():
                (self.edit_in_place if name == "edit" else self.atomic)(os.path.realpath(path), _define(args[1]))
        elif name == "create":
            if not os.path.lexists(os.path.join(self.dir(args[0]), "val.cuh")):
                self.create(args[0], args[1], args[2])
        elif name == "delete":
            path = os.path.join(self.dir(args[0]), "val.cuh")
            if os.path.lexists(path):
                os.unlink(path)
        elif name == "retarget":
            path = os.path.join(self.dir(args[0]), "val.cuh")
            if os.path.lexists(path):
                os.unlink(path)
            self.create(args[0], "link", args[1] - 1)
        elif name == "retarget_dir":
            path = os.path.join(self.dir(args[0]), "lib")
            if os.path.lexists(path):
                os.unlink(path)
                self.link_dir(args[0], args[1])
        elif name == "delete_linked":
            if self.linked and os.path.lexists(os.path.join(self.dir(self.linked), "val.cuh")):
                os.unlink(os.path.join(self.dir(self.linked), "val.cuh"))
        elif name == "create_linked":
            if self.linked and not os.path.lexists(os.path.join(self.dir(self.linked), "val.cuh")):
                self.create(self.linked, args[0], args[1])
        elif name == "retarget_include":
            if self.linked:
                self.link_include(args[0])
        elif name == "mkdir":
            if self.missing:
                target = [self.path("m"), self.path("m", "n"), self.dir(self.missing)][args[0] - 1]
                if not os.path.isdir(target):
                    os.makedirs(target)
        elif name == "edit_common":
            self.edit_in_place(self.path("common", "b.cuh"), _define(args[0]))
        elif name == "atomic_common":
            # The hard link in elsewhere/ keeps the old inode: from now on it is another file.
            self.atomic(self.path("common", "b.cuh"), _define(args[0]))
        elif name == "edit_hard_link":
            self.edit_in_place(self.path("elsewhere", "b.cuh"), _define(args[0]))
        elif name == "edit_real":
            for which in ([args[0]] if args[0] else (1, 2, 3)):
                self.edit_in_place(self.path("real", "v%d.cuh" % which), _define(args[1]))
        elif name == "extra":
            for directory in DIRS:
                path = os.path.join(self.dir(directory), "extra.cuh")
                if os.path.exists(path):
                    os.unlink(path)
            if args[0]:
                self.write(os.path.join(self.dir(args[0]), "extra.cuh"), "#define EXTRA %d\n" % args[1])
        elif name == "edit_val_hard_link":
            hard = self.path("elsewhere", "val-%s.cuh" % args[0])
            path = os.path.join(self.dir(args[0]), "val.cuh")
            if os.path.exists(hard) and os.path.exists(path) and os.path.samefile(hard, path):
                self.edit_in_place(hard, _define(args[1]))
        elif name == "edit_forced_hard_link":
            self.edit_in_place(self.path("elsewhere", "forced.cuh"), "#define FORCED %d\n" % args[0])
        elif name == "forced":
            self.edit_in_place(self.path("forced.cuh"), "#define FORCED %d\n" % args[0])
        return name == "fail"


def _answer(compiler, source, options, cache_dir, pch, target):
    """The image (or ``"error"``) ptxbackend returns from ``cache_dir``, with precompiled headers on or off."""
    return _answer_and_hit(compiler, source, options, cache_dir, pch, target)[0]


def _answer_and_hit(compiler, source, options, cache_dir, pch, target):
    os.environ["PTXBACKEND_NVRTC_PCH"] = "1" if pch else "0"
    try:
        artifact = ptxbackend.compile(source, options, target=target, compiler=compiler, cache_dir=cache_dir)
        return bytes(artifact.image), artifact.cache_hit
    except ptxbackend.CompileError:
        return "error", False


CHILD = r'''
import json, sys, ptxbackend
compiler, options, cache_dir, target = %r, %s, %r, %r
try:
    image = bytes(ptxbackend.compile(%r, options, target=target, compiler=compiler, cache_dir=cache_dir).image)
    print(json.dumps(image.decode("latin-1")))
except ptxbackend.CompileError:
    print(json.dumps("error"))
'''


TRUTH = r'''
import json, sys, ptxbackend
for line in sys.stdin:
    compiler, source, options, cache_dir, target = json.loads(line)
    try:
        image = bytes(ptxbackend.compile(source, options, target=target, compiler=compiler,
                                         cache_dir=cache_dir).image)
        answer = image.decode("latin-1")
    except ptxbackend.CompileError:
        answer = "error"
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
'''


class Truth(object):
    """Fresh compiles, each in an empty cache, in a process of their own: a truth compiled in the
    process under test would add its own watches there, and hide a change that process missed."""

    def __init__(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
        env["PTXBACKEND_NVRTC_PCH"] = "0"
        self.proc = subprocess.Popen([sys.executable, "-c", TRUTH], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, universal_newlines=True)

    def __call__(self, compiler, source, options, cache_dir, target):
        self.proc.stdin.write(json.dumps([compiler, source, options, cache_dir, target]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("the truth process ended (exit %s)" % self.proc.wait())
        found = json.loads(line)
        return found if found == "error" else found.encode("latin-1")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def _new_process(compiler, options, cache_dir, target):
    out = run_python(CHILD % (compiler, json.dumps(options), cache_dir, target, SOURCE),
                     env={"PTXBACKEND_NVRTC_PCH": "0"})
    found = json.loads(out.strip().splitlines()[-1])
    return found if found == "error" else found.encode("latin-1")


class Run(object):
    """One fuzzer run: its budget and what it found, for the report."""

    def __init__(self, compiler, seconds, target="compute_90", label=None):
        self.compiler, self.deadline, self.started = compiler, time.time() + seconds, time.time()
        self.target, self.label = target, label or compiler
        self.sequences = self.truths = 0
        self.seed = SEED
        self.truth = Truth()

    def sequence(self, spec, ops, pch, new_process_view):
        self.sequences += 1
        root = tempfile.mkdtemp(prefix="ptxfuzz-")
        try:
            tree = Tree(os.path.join(root, "t"), spec, self.compiler)
            cache = os.path.join(root, "cache")
            done = []
            known = {}
            for step, op in enumerate([("start",)] + _steps(ops)):
                # An op that changes nothing the compiler reads must not turn a hit into a miss.
                was_hit = op[0] in ASK_FIRST and self.hit(SOURCE, tree.options, cache, pch, new_process_view)
                if op[0] == "fail_then":
                    tree.apply(op[1])
                    _answer(self.compiler, BROKEN, tree.options, cache, pch, self.target)
                    tree.apply(op[2])
                broken = tree.apply(op) if step else False
                done.append(op)
                if broken:
                    _answer(self.compiler, BROKEN, tree.options, cache, pch, self.target)
                if new_process_view:
                    depsets.forget()
                cached, hit = _answer_and_hit(self.compiler, SOURCE, tree.options, cache, pch, self.target)
                # The truth depends only on what the tree holds: a step that left it as it was before
                # (an op with nothing to act on, mkdir of what exists, a failing compile, an edit back)
                # reuses that state's truth.
                now = tree.snapshot()
                truth = known.get(now)
                if truth is None:
                    truth = known[now] = self.truth(self.compiler, SOURCE, tree.options,
                                                    os.path.join(root, "fresh%d" % step), self.target)
                    self.truths += 1
                if cached != truth:
                    self.fail("after %r" % (done,), spec, pch, new_process_view, cached, truth)
                if was_hit and not hit and op[0] in UNCHANGING:
                    self.fail("after %r" % (done,), spec, pch, new_process_view, "(a miss)", truth,
                              what="needless miss")
            if _new_process(self.compiler, tree.options, cache, self.target) != truth:
                self.fail("in a new process after %r" % (done,), spec, pch, new_process_view, "", truth)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def hit(self, source, options, cache, pch, new_process_view):
        if new_process_view:
            depsets.forget()
        return _answer_and_hit(self.compiler, source, options, cache, pch, self.target)[1]

    def fail(self, where, spec, pch, new_process_view, cached, truth, what="stale hit"):
        def value(image):
            return image if isinstance(image, str) else image.decode("latin-1")[-300:]
        message = ("%s with %s (precompiled headers %s, %s) %s, %.1f s and %d sequences into the run; "
                   "seed %d (PTXBACKEND_FUZZ_SEED=%d replays it)\ntree %r\ncached ...%s\nfresh  ...%s"
                   % (what, self.label, "on" if pch else "off",
                      "memory dropped before each hit" if new_process_view else "one long-lived process",
                      where, time.time() - self.started, self.sequences, self.seed, self.seed, spec, value(cached),
                      value(truth)))
        sys.stderr.write(message + "\n")
        raise AssertionError(message)


@pytest.mark.parametrize("label, share", [("nvrtc", 1.0 / 2), ("nvcc", 1.0 / 3), ("nvrtc117", 1.0 / 6)])
def test_no_sequence_of_changes_gives_a_stale_hit(label, share, request, monkeypatch):
    compiler, target = ("nvcc" if label == "nvcc" else "nvrtc"), "compute_90"
    if label == "nvcc":
        request.getfixturevalue("nvcc13")
    elif label == "nvrtc":
        monkeypatch.setenv("PTXBACKEND_NVRTC", request.getfixturevalue("nvrtc_pch"))
    else:
        monkeypatch.setenv("PTXBACKEND_NVRTC", request.getfixturevalue("nvrtc117"))
        target = "compute_80"  # 11.7 knows sm_35..sm_87
    monkeypatch.setenv("PTXBACKEND_NVRTC_PCH", "1")
    run = Run(compiler, BUDGET * share, target, label)
    # Batches of a few examples, each with its own seed, until the budget is spent: Hypothesis has no
    # time limit of its own, and a failing batch shrinks to a minimal tree and sequence.
    batch = 0
    while time.time() < run.deadline:
        run.seed = SEED + batch
        batch += 1

        @seed(run.seed)
        @settings(max_examples=4, deadline=None, database=None, phases=(Phase.generate, Phase.shrink),
                  suppress_health_check=list(HealthCheck))
        @given(tree_strategy, st.lists(op_strategy, min_size=1, max_size=8), st.booleans(), st.booleans())
        def sequences(spec, ops, pch, new_process_view):
            run.sequence(spec, ops, pch or compiler == "nvcc", new_process_view)

        try:
            sequences()
        except BaseException:
            run.truth.close()
            raise
    run.truth.close()
    print("stale-hit fuzzer: %s, %d sequences in %.0f s (%d fresh compiles for the truth), seeds %d-%d"
          % (label, run.sequences, time.time() - run.started, run.truths, SEED, run.seed))
    assert run.sequences > 0

"""The injection fuzzer: every field a user, a file or the fleet can set, with hostile values, against the
real nvcc (and NVRTC).

Each example sets one field (a kernel name, a manifest's options or another of its fields, a setting, a
part of the fleet store's URL) to a value built from option-like, shell-like, path-like and odd pieces,
then compiles or replays.  A canary program (``evil.sh``, which touches ``ran``) and a canary file
outside the cache (``victim.txt``) are planted, and options files that name the canary wait to be read.
After every example: the canary never ran, and nothing outside the cache and the named output changed.
A refusal must be ptxbackend's own error (one clear line), never another exception.

The budget is fixed (``PTXBACKEND_FUZZ_EXAMPLES``, default 600 examples, 30-45 s on a loaded
2-core box) and the examples are derandomized, so CI runs the same cases every time; a longer local
run: ``PTXBACKEND_FUZZ_EXAMPLES=2000 pytest tests/test_injection_fuzz.py``.
"""

import contextlib
import hashlib
import io
import json
import os
import shutil
import stat

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ptxbackend.compiling import engine
from ptxbackend.deploy import replay
from ptxbackend.errors import PtxBackendError

KERNEL = 'extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n'
EXAMPLES = int(os.environ.get("PTXBACKEND_FUZZ_EXAMPLES", "600"))

# The fleet store's URL, with each part open to the fuzzer; port 1 refuses at once.
URL = "redis://{user}:{password}@127.0.0.1:1/{path}"
SETTINGS = ("PTXBACKEND_TARGET", "PTXBACKEND_DEVICE_CC", "PTXBACKEND_COMPILER", "PTXBACKEND_CACHE_DIR",
            "PTXBACKEND_LOG", "PTXBACKEND_COMPILE_TIMEOUT", "PTXBACKEND_CUBIN_CACHE", "PTXBACKEND_CACHE_MAX_SIZE",
            "PTXBACKEND_REMOTE_NAMESPACE", "PTXBACKEND_RECORD", "PTXBACKEND_COMPILER_CHECK", "TMPDIR")
MANIFEST_FIELDS = ("name", "target", "compiler", "key", "source")
# The config file's keys (those that name a program or library to use are the user's own choice, as in
# the environment, and are left out).
CONFIG_KEYS = ("target", "compiler", "device_cc", "cache_dir", "cache_max_size", "cubin_cache", "log",
               "compile_timeout", "remote_namespace", "compiler_check", "lock_timeout")
# Flags a hostile value may follow in a manifest (each one the grammar knows, and some it refuses).
FLAGS = ("-I", "-D", "-isystem", "-include", "-arch", "-std", "--include-path", "-ccbin", "-Xcompiler",
         "--options-file", "-o", "-optf", "--keep-dir", "--pre-include", "-U")
WORLD = ("sandbox",)  # where settings that name a path point (the cache they name, the record they write)


def pieces(t):
    """Hostile pieces, for a world rooted at the path ``t``."""
    cmd = "touch %s/ran" % t
    quiet = "touch $PTXBACKEND_FUZZ_CANARY"  # no '/': a name's directories cannot split it
    return [
        # option-like: what would make nvcc read the canary's options file or run the canary
        "--options-file=%s/opts.cu" % t, "-optf=%s/opts.cu" % t, "-ccbin=%s/evil.sh" % t,
        "--compiler-bindir=%s/evil.sh" % t, "-Xcompiler=-fplugin=%s/evil.so" % t, "-o", "%s/victim.txt" % t,
        "--keep-dir=%s" % t, "-run", "--", "-", "-DX=1", "-I", "=", ",",
        # shell-like
        "$(%s)" % quiet, "`%s`" % quiet, "$(%s)" % cmd, "`%s`" % cmd, ";%s;" % cmd, "|%s" % cmd, "&&%s" % cmd,
        "\n%s\n" % cmd, "'$(%s)'" % quiet, '"$(%s)"' % quiet, "-DX=$(%s)" % quiet, "-I$(%s)" % quiet, "$HOME",
        "${IFS}", "*", "?",
        # path-like
        "../../victim.txt", "%s/victim.txt" % t, "/etc/passwd", "/dev/zero", "~", "./-x.cu", ".", "..", "/",
        "%s/opts.cu" % t, "a/b/../../../c",
        # odd
        "\0", "\\", "\u00e9\u6838", " ", "", "x" * 300, "\t", "\r", "%s", "{}", "k.cu", "compute_75", "sm_75",
        "nvcc", "nvrtc", "7.5", "1",
    ]


def values(t):
    """A hostile piece as it is (half the time), or a few pieces and some text joined."""
    piece = st.sampled_from(pieces(t))
    return st.one_of(piece, st.lists(st.one_of(piece, st.text(max_size=4)), min_size=1, max_size=3).map("".join))


def option_lists(t):
    one = st.one_of(values(t), st.tuples(st.sampled_from(FLAGS), values(t)).map(list))
    return st.lists(one, min_size=1, max_size=3).map(
        lambda items: [o for item in items for o in (item if isinstance(item, list) else [item])])


def examples(t, nvrtc):
    """(kind, value): each kind of field about equally often."""
    by_kind = {
        "name": values(t),
        "options": option_lists(t),
        "manifest": st.tuples(st.sampled_from(MANIFEST_FIELDS), values(t)),
        "setting": st.tuples(st.sampled_from(SETTINGS), values(t)),
        "url": st.fixed_dictionaries({"user": values(t), "password": values(t), "path": values(t)}),
        "namespace": values(t),
        "config": st.tuples(st.sampled_from(CONFIG_KEYS), values(t)),
        "cli-file": values(t),
    }
    if nvrtc:
        by_kind.update({"nvrtc-name": values(t), "nvrtc-options": option_lists(t)})
    return st.sampled_from(sorted(by_kind)).flatmap(lambda kind: st.tuples(st.just(kind), by_kind[kind]))


def snapshot(root):
    """Every file under ``root`` outside the cache and the sandbox: kind, size, mode, digest."""
    found = {}
    for base, dirs, names in os.walk(root):
        if os.path.abspath(base) == root:
            dirs[:] = [d for d in dirs if d not in ("cache", "config-home") + WORLD]
        for name in names + dirs:
            path = os.path.join(base, name)
            st_ = os.lstat(path)
            digest = None
            if stat.S_ISREG(st_.st_mode):
                with open(path, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
            found[path] = (stat.S_IFMT(st_.st_mode), st_.st_size, stat.S_IMODE(st_.st_mode), digest)
    return found


def restore(root, before):
    """Undo what an example changed outside the cache, so that the next one (and Hypothesis' shrinking)
    starts from the same world."""
    for path in sorted(snapshot(root), key=len, reverse=True):
        if path not in before:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
    plant(root)
    shutil.rmtree(os.path.join(root, "sandbox"), ignore_errors=True)
    os.mkdir(os.path.join(root, "sandbox"))


@contextlib.contextmanager
def environment(**values_):
    saved = {name: os.environ.get(name) for name in values_}
    for name, value in values_.items():
        os.environ[name] = value
    engine._reset_for_tests()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        engine._reset_for_tests()


def _manifest(t, **fields):
    record = {"key": "ab" * 32, "source": KERNEL, "options": [], "target": "compute_75", "compiler": "nvcc",
              "name": "k.cu"}
    record.update(fields)
    path = os.path.join(t, "sandbox", "m.jsonl")
    with open(path, "w") as handle:
        handle.write(json.dumps(record) + "\n")
    os.chmod(path, 0o600)
    return path


def _no_nul(value):
    # The environment cannot hold a NUL (the OS refuses it before ptxbackend sees it).
    return value.replace("\0", "")


def run_example(t, kind, value, nvrtc):
    """Set one field to ``value`` and compile or replay; ptxbackend's own errors are the refusals."""
    quiet = lambda *a: None  # noqa: E731
    try:
        if kind == "name":
            engine.compile(KERNEL, name=value, target="compute_75", compiler="nvcc")
        elif kind == "options":
            replay.replay(_manifest(t, options=value), device_cc="7.5", out=quiet)
        elif kind == "manifest":
            field, value = value
            replay.replay(_manifest(t, **{field: value}), device_cc="7.5", out=quiet)
        elif kind == "setting":
            kind, value = value[0], _no_nul(value[1])
            if kind in ("PTXBACKEND_CACHE_DIR", "PTXBACKEND_RECORD", "TMPDIR"):
                # A path the user chose is where they want the cache or the record: kept in the sandbox.
                value = os.path.join(t, "sandbox", value.replace("..", "__").lstrip("/"))
            with environment(**{kind: value}):
                engine.compile(KERNEL, target="compute_75", compiler="nvcc")
        elif kind == "url":
            url = URL.format(**dict((k, _no_nul(v)) for k, v in value.items()))
            with environment(PTXBACKEND_REMOTE=url, PTXBACKEND_REMOTE_TIMEOUT="0.05",
                             PTXBACKEND_REMOTE_KEY_FILE=os.path.join(t, "fleet.key")):
                engine.compile(KERNEL, target="compute_75", compiler="nvcc")
        elif kind == "namespace":
            with environment(PTXBACKEND_REMOTE="redis://127.0.0.1:1", PTXBACKEND_REMOTE_TIMEOUT="0.05",
                             PTXBACKEND_REMOTE_KEY_FILE=os.path.join(t, "fleet.key"),
                             PTXBACKEND_REMOTE_NAMESPACE=_no_nul(value)):
                engine.compile(KERNEL, target="compute_75", compiler="nvcc")
        elif kind == "config":
            key, value = value
            # One line: a value with a newline would be the user writing another key into their own file.
            value = " ".join(_no_nul(value).splitlines()) or "x"
            if key == "cache_dir":
                value = os.path.join(t, "sandbox", value.replace("..", "__").lstrip("/"))
            config = os.path.join(t, "sandbox", "config.ini")
            with open(config, "w") as handle:
                handle.write("[ptxbackend]\n%s = %s\n" % (key, value.replace("%", "%%")))
            os.chmod(config, 0o600)
            with environment(PTXBACKEND_CONFIG=config):
                engine.compile(KERNEL, target="compute_75", compiler="nvcc")
        elif kind == "cli-file":
            # `ptxbackend compile FILE` of a file named so, in the sandbox (a name has no '/' or NUL).
            name = _no_nul(value).replace("/", "_")[:200]
            name = "_" + name if name in ("", ".", "..") else name
            path = os.path.join(t, "sandbox", name)
            with open(path, "w") as handle:
                handle.write(KERNEL)
            from ptxbackend.cli.commands import main
            with environment(), contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()) as err:
                status = main(["compile", path, "--target", "compute_75", "--compiler", "nvcc"])
            assert status in (0, 1) and "Traceback" not in err.getvalue(), err.getvalue()
            return "done" if status == 0 else "refused"
        elif kind == "nvrtc-name":
            with environment(PTXBACKEND_NVRTC=nvrtc):
                engine.compile(KERNEL, name=value, target="compute_75", compiler="nvrtc")
        elif kind == "nvrtc-options":
            with environment(PTXBACKEND_NVRTC=nvrtc):
                engine.compile(KERNEL, value, target="compute_75", compiler="nvrtc")
    except PtxBackendError as exc:
        assert str(exc).strip(), "an empty error message"
        return "refused"
    return "done"


def plant(t):
    """The canary program, the canary file and an options file that names the canary."""
    files = {"evil.sh": ("#!/bin/sh\ntouch %s/ran\nexit 1\n" % t, 0o755), "opts.cu": ("-ccbin=%s/evil.sh\n" % t, 0o644),
             "victim.txt": ("the user's own file\n", 0o644), "fleet.key": ("k" * 32, 0o600)}
    for name, (text, mode) in files.items():
        with open(os.path.join(t, name), "w") as handle:
            handle.write(text)
        os.chmod(os.path.join(t, name), mode)


@pytest.fixture
def world(tmp_path):
    """The planted files and the sandbox."""
    t = str(tmp_path)
    plant(t)
    os.mkdir(os.path.join(t, "sandbox"))
    return t


@pytest.fixture
def nvrtc_or_none(request):
    """NVRTC 13.5 where CI unpacked it; elsewhere the fuzzer runs nvcc's fields alone (with
    PTXBACKEND_REQUIRE_TOOLKITS=1 a missing NVRTC fails, as everywhere)."""
    try:
        return request.getfixturevalue("nvrtc_pch")
    except pytest.skip.Exception:
        return None


def test_no_field_runs_the_canary_or_writes_outside_the_cache(world, nvcc13, nvrtc_or_none, monkeypatch):
    nvrtc_pch = nvrtc_or_none
    monkeypatch.setenv("PTXBACKEND_FUZZ_CANARY", os.path.join(world, "ran"))
    before = snapshot(world)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(examples(world, nvrtc_pch))
    def check(example):
        kind, value = example
        try:
            run_example(world, kind, value, nvrtc_pch)
            assert not os.path.exists(os.path.join(world, "ran")), "the canary ran (%s = %r)" % (kind, value)
            after = snapshot(world)
            assert after == before, "something outside the cache changed (%s = %r): %s" % (
                kind, value, sorted(set(after.items()) ^ set(before.items()))[:3])
        finally:
            restore(world, before)

    check()

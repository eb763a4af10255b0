"""Hostile or broken cache directories: read-only, full, planted links, other owners, odd paths.

Real file systems only: read-only is a read-only bind mount (as root) or chmod (as a user), a full
disk is a small tmpfs (or RLIMIT_FSIZE where mounting is not allowed), other owners are chown'ed
files.  Every test prints its figures on a line starting with ``reliability:``; run with ``-s``.
"""

import contextlib
import errno
import json
import logging
import os
import resource
import select
import signal
import stat
import subprocess
import sys

import pytest

import ptxbackend
from ptxbackend import config
from ptxbackend.compiling import engine
from ptxbackend.cache import entry, layout
from conftest import Captured, REPO, cache_files, count_calls, figures, store_name

pytestmark = pytest.mark.reliability

NOBODY = 65534
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def kernel(tag):
    """A tiny distinct kernel: a new request key for each tag."""
    return 'extern "C" __global__ void k(float* y) { y[threadIdx.x] += %d.0f; } // %s\n' % (
        len(tag), tag)


@contextlib.contextmanager
def captured(name="ptxbackend"):
    """Every record of ``name`` and its children (ptxbackend's own handler stops propagation)."""
    handler = Captured()
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _mount(*args):
    return subprocess.call(["mount"] + list(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0


@contextlib.contextmanager
def read_only(path):
    """Make the directory tree at ``path`` read-only for this process, root or not.

    As root, permission bits do not stop writes, so a read-only bind mount does (EROFS);
    as a user, removing the write bits does (EACCES).
    """
    path = str(path)
    if not IS_ROOT:
        changed = []
        for base, dirs, _files in os.walk(path):
            for name in [base] + [os.path.join(base, d) for d in dirs]:
                mode = stat.S_IMODE(os.lstat(name).st_mode)
                os.chmod(name, mode & ~0o222)
                changed.append((name, mode))
        try:
            yield "chmod a-w"
        finally:
            for name, mode in reversed(changed):
                os.chmod(name, mode)
        return
    if not (_mount("--bind", path, path) and _mount("-o", "remount,ro,bind", path)):
        subprocess.call(["umount", path], stderr=subprocess.DEVNULL)
        pytest.skip("running as root without the right to mount: cannot make a directory read-only")
    try:
        yield "read-only bind mount"
    finally:
        subprocess.check_call(["umount", path])


def temporaries(root):
    return [p for p in cache_files(root) if os.path.basename(p).startswith(".tmp-")]


# -- read-only -----------------------------------------------------------------------------------

def test_a_read_only_cache_serves_its_hits_and_compiles_the_rest_with_one_warning(nvcc13, tmp_path, monkeypatch):
    # A line PC's image on a read-only mount: what it holds is served; what it lacks is compiled, not kept.
    cache = tmp_path / "ro-cache"
    monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(cache))
    first = ptxbackend.compile(kernel("cached before"), target="compute_75")
    engine._reset_for_tests()  # a new process finds the directory read-only
    before = cache_files(cache)
    with read_only(cache) as how, captured() as log:
        hit = ptxbackend.compile(kernel("cached before"), target="compute_75")
        fresh = [ptxbackend.compile(kernel("new %d" % i), target="compute_75") for i in range(3)]
        again = ptxbackend.compile(kernel("new 0"), target="compute_75")
    warnings = log.warnings()
    assert len(warnings) == 1 and "read-only" in warnings[0] and str(cache) in warnings[0]
    assert hit.cache_hit and hit.image == first.image and hit.path.startswith(str(cache))
    assert all(a.kind == "ptx" and not a.cache_hit for a in fresh)
    assert not again.cache_hit and again.image == fresh[0].image  # compiled again: nothing could be kept
    assert cache_files(cache) == before
    figures("read-only cache dir at start", method=how, compiles=4, hits=1, warnings=len(warnings), exceptions=0)


def test_cache_info_and_verify_read_a_read_only_cache(nvcc13, tmp_path, monkeypatch, capsys):
    from ptxbackend.cli.commands import main
    cache = tmp_path / "ro-cache"
    monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(cache))
    ptxbackend.compile(kernel("cached before"), target="compute_75")
    engine._reset_for_tests()
    before = cache_files(cache)
    capsys.readouterr()
    with read_only(cache):
        assert main(["cache", "info"]) == 0
        info = capsys.readouterr().out
        assert main(["cache", "verify"]) == 0
        verify = capsys.readouterr().out
    assert "entries:   1" in info and "1 entry verified, 0 bad" in verify
    assert cache_files(cache) == before


def test_temporary_cache_is_removed_when_the_process_exits(nvcc13, tmp_path):
    cache, tmp = tmp_path / "ro-cache", tmp_path / "tmp"
    cache.mkdir(mode=0o700)
    tmp.mkdir()
    code = ("import ptxbackend; a = ptxbackend.compile(%r, target='compute_75'); "
            "print(a.cache_hit, a.path)" % kernel("temporary"))
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(cache), TMPDIR=str(tmp))
    with read_only(cache):
        proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0, proc.stderr
    hit, path = proc.stdout.split()
    assert hit == "False" and path.startswith(str(tmp)) and len(proc.stderr.strip().splitlines()) == 2
    assert [n for n in os.listdir(str(tmp)) if n.startswith("ptxbackend-cache-")] == []
    figures("temporary cache removed at exit", processes=1, left_in_tmpdir=0)


def test_no_writable_cache_and_no_temporary_dir_is_a_clear_cache_error(nvcc13, tmp_path):
    cache, tmp = tmp_path / "ro-cache", tmp_path / "ro-tmp"
    cache.mkdir(mode=0o700)
    tmp.mkdir()
    code = ("import tempfile, ptxbackend\ntempfile.tempdir = %r\n"
            "try:\n    ptxbackend.compile(%r, target='compute_75')\n"
            "except ptxbackend.CacheError as exc:\n    print('CacheError:', exc)\n"
            % (str(tmp), kernel("nowhere")))
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(cache))
    with read_only(cache), read_only(tmp):
        proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("CacheError: no usable cache") and "TMPDIR" in proc.stdout


def test_cache_turning_read_only_after_open_degrades_with_one_warning(nvcc13, tmp_path, monkeypatch):
    """The lock file cannot be created either: compile unlocked rather than raise."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(cache))
    first = ptxbackend.compile(kernel("before"), target="compute_75")  # the store is open now
    before = cache_files(cache)
    with read_only(cache) as how, captured() as log:
        hit = ptxbackend.compile(kernel("before"), target="compute_75")
        fresh = [ptxbackend.compile(kernel("after %d" % i), target="compute_75") for i in range(3)]
        again = ptxbackend.compile(kernel("after 0"), target="compute_75")
    warnings = log.warnings()
    assert hit.cache_hit and hit.image == first.image
    assert all(not a.cache_hit and a.kind == "ptx" for a in fresh + [again])  # nothing could be stored
    assert len(warnings) == 1 and "cannot write to the cache" in warnings[0], warnings
    assert cache_files(cache) == before
    after = ptxbackend.compile(kernel("after 0"), target="compute_75")  # writable again: stored
    assert not after.cache_hit and ptxbackend.compile(kernel("after 0"), target="compute_75").cache_hit
    figures("cache read-only after open", method=how, compiles=6, warnings=len(warnings), exceptions=0)


def test_read_only_entry_directory_degrades_with_one_warning(nvcc13, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(cache))
    first = ptxbackend.compile(kernel("one"), target="compute_75")
    target_dir = os.path.dirname(os.path.dirname(first.path))  # v1/<producer>/compute_75
    with read_only(target_dir) as how, captured() as log:
        fresh = [ptxbackend.compile(kernel("two %d" % i), target="compute_75") for i in range(3)]
    assert all(not a.cache_hit for a in fresh)
    assert len(log.warnings()) == 1 and "cannot write to the cache" in log.warnings()[0]
    assert temporaries(cache) == []
    figures("read-only entry directory", method=how, compiles=3, warnings=len(log.warnings()), exceptions=0)


# -- disk full ------------------------------------------------------------------------------------

def _fill(directory):
    """Write a file until the file system is full; return its size."""
    path = os.path.join(directory, "filler")
    written = 0
    with open(path, "wb", buffering=0) as handle:
        try:
            while True:
                written += handle.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return path, written


def test_disk_full_on_a_small_tmpfs_leaves_no_partial_entry(nvcc13, tmp_path, monkeypatch):
    if not IS_ROOT:
        pytest.skip("mounting a tmpfs needs root; test_write_past_file_size_limit covers EFBIG")
    small = tmp_path / "small"
    small.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(small)):
        pytest.skip("not allowed to mount a tmpfs here; test_write_past_file_size_limit covers EFBIG")
    try:
        cache = small / "cache"
        monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(cache))
        ptxbackend.compile(kernel("fits"), target="compute_75")
        filler, size = _fill(str(small))
        with captured() as log:
            full = [ptxbackend.compile(kernel("full %d" % i), target="compute_75") for i in range(4)]
        assert all(not a.cache_hit and a.image.startswith(b"//") for a in full)
        warnings = log.warnings()
        assert len(warnings) == 1 and "No space left on device" in warnings[0], warnings
        assert temporaries(cache) == [] and not any(os.path.exists(a.path) for a in full)
        os.unlink(filler)
        stored = ptxbackend.compile(kernel("full 0"), target="compute_75")
        assert not stored.cache_hit and ptxbackend.compile(kernel("full 0"), target="compute_75").cache_hit
        figures("disk full (tmpfs 512k)", filler_bytes=size, failed_writes=4, warnings=len(warnings),
                partial_entries=0, temp_files_left=0)
    finally:
        subprocess.check_call(["umount", str(small)])


def test_write_past_file_size_limit_leaves_no_partial_entry(nvcc13, tmp_path):
    """RLIMIT_FSIZE makes the write fail (EFBIG) on any machine, root or not, mount or not."""
    art = ptxbackend.compile(kernel("big"), target="sm_75", device_cc="7.5")  # whatever GPU is here
    store = art.store
    targets = [store.path_of(layout.entry_name("nvcc-test", art.target, "%02x" % i + art.key[2:], "cubin"))
               for i in range(20)]
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: limited, so only it fails
        os.close(read_fd)
        errors = []
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (len(art.image) // 2, resource.RLIM_INFINITY))
            for path in targets:
                try:
                    store.write(store_name(store, path), art.image, {"key": os.path.basename(path)[:64], "kind": "cubin"})
                    errors.append("written")
                except OSError as exc:
                    errors.append(errno.errorcode.get(exc.errno, str(exc.errno)))
        finally:
            os.write(write_fd, json.dumps(errors).encode())
            os._exit(0)
    os.close(write_fd)
    ready, _w, _x = select.select([read_fd], [], [], 120)
    if not ready:  # never hang the suite on a stuck child
        os.kill(pid, signal.SIGKILL)
    with os.fdopen(read_fd) as pipe:
        errors = json.loads(pipe.read() or "null")
    os.waitpid(pid, 0)
    assert errors == ["EFBIG"] * len(targets)
    assert temporaries(store.root) == [] and not any(os.path.exists(p) for p in targets)
    figures("file size limit (EFBIG)", failed_writes=len(errors), partial_entries=0, temp_files_left=0)


# -- planted symlinks -----------------------------------------------------------------------------

def test_symlink_planted_at_an_entry_is_never_followed(nvcc13, tmp_path):
    art = ptxbackend.compile(kernel("link"), target="compute_75")
    victim = tmp_path / "victim"
    victim.write_bytes(entry.encode(b"// attacker's PTX", {"key": art.key, "kind": "ptx"}))
    victim.chmod(0o600)
    original = victim.read_bytes()
    os.unlink(art.path)
    os.symlink(str(victim), art.path)
    with captured() as log:
        again = ptxbackend.compile(kernel("link"), target="compute_75")
    assert not again.cache_hit and again.image == art.image
    assert not os.path.islink(art.path) and victim.read_bytes() == original
    assert len(log.warnings()) == 1 and "Too many levels of symbolic links" in log.warnings()[0]
    # A write over a planted link replaces the link, never what it points to.
    os.unlink(art.path)
    os.symlink(str(victim), art.path)
    art.store.write(art.name, art.image, {"key": art.key, "kind": "ptx"})
    assert not os.path.islink(art.path) and victim.read_bytes() == original
    assert art.store.read(art.name, art.key, "ptx")[0] == art.image
    figures("symlink at entry path", reads_followed=0, writes_through=0, warnings=len(log.warnings()))


def test_symlink_planted_at_a_lock_path_is_never_written_through(logging_nvcc, tmp_path, monkeypatch):
    wrapper, calls = logging_nvcc
    monkeypatch.setenv("PTXBACKEND_NVCC", wrapper)
    art = ptxbackend.compile(kernel("lock"), target="compute_75")
    os.unlink(art.path)  # the next compile misses and takes the lock
    lock_path = art.store.local._lock_path(art.name)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    if os.path.lexists(lock_path):
        os.unlink(lock_path)
    os.symlink(str(victim), lock_path)
    with captured() as log:
        again = ptxbackend.compile(kernel("lock"), target="compute_75")
    assert not again.cache_hit and again.image == art.image and count_calls(calls, "--ptx") == 2
    assert victim.read_bytes() == b"precious" and not os.path.islink(lock_path)
    assert len(log.warnings()) == 1 and "symlink planted at lock path" in log.warnings()[0]
    figures("symlink at lock path", writes_through=0, warnings=len(log.warnings()))


def test_fifo_or_directory_planted_at_an_entry_does_not_hang(nvcc13):
    art = ptxbackend.compile(kernel("fifo"), target="compute_75")
    planted = 0
    previous = signal.signal(signal.SIGALRM, lambda *a: pytest.fail("reading the cache hung"))
    try:
        for plant in ("fifo", "directory"):
            os.unlink(art.path)
            if plant == "fifo":
                os.mkfifo(art.path, 0o600)
            else:
                os.makedirs(os.path.join(art.path, "inside"))
            signal.alarm(30)
            with captured() as log:
                again = ptxbackend.compile(kernel("fifo"), target="compute_75")
            signal.alarm(0)
            assert not again.cache_hit and again.image == art.image and os.path.isfile(art.path)
            assert len(log.warnings()) == 1 and "not a regular file" in log.warnings()[0]
            planted += 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    figures("fifo or directory at entry path", cases=planted, hangs=0)


# -- other owners, loose modes ----------------------------------------------------------------------

def _forged(art, payload=b"// forged kernel"):
    """A *valid* entry for ``art``'s key with someone else's payload: only its owner or mode betrays it."""
    return entry.encode(payload, {"key": art.key, "kind": art.kind})


@pytest.mark.parametrize("how", ["other owner", "group-writable", "world-writable", "world-writable dir"])
def test_entry_of_another_user_or_writable_by_others_is_refused(nvcc13, how):
    if how == "other owner" and not IS_ROOT:
        pytest.skip("only root can give a file to another user")
    art = ptxbackend.compile(kernel("owner"), target="compute_75")
    with open(art.path, "wb") as handle:
        handle.write(_forged(art))
    if how == "other owner":
        os.chmod(art.path, 0o600)
        os.chown(art.path, NOBODY, NOBODY)
    elif how == "group-writable":
        os.chmod(art.path, 0o620)
    elif how == "world-writable":
        os.chmod(art.path, 0o602)
    else:  # someone else could have replaced the file: ours only if we own it
        os.chmod(os.path.dirname(art.path), 0o777)
        os.chmod(art.path, 0o600)
        if IS_ROOT:
            os.chown(art.path, NOBODY, NOBODY)
        else:
            os.chmod(art.path, 0o666)
    with captured() as log:
        again = ptxbackend.compile(kernel("owner"), target="compute_75")
    assert not again.cache_hit and again.image == art.image  # the forged payload never came back
    st = os.stat(art.path)
    assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o600
    assert len(log.warnings()) == 1 and ("owned by uid" in log.warnings()[0]
                                         or "writable by group or others" in log.warnings()[0])
    assert ptxbackend.compile(kernel("owner"), target="compute_75").cache_hit
    figures("entry: %s" % how, forged_loads=0, warnings=len(log.warnings()))


@pytest.mark.parametrize("how", ["other owner", "group-writable", "world-writable"])
def test_cache_dir_of_another_user_or_writable_by_others_is_refused(nvcc13, tmp_path, monkeypatch, how):
    if how == "other owner" and not IS_ROOT:
        pytest.skip("only root can give a directory to another user")
    cache = tmp_path / "shared"
    monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(cache))
    art = ptxbackend.compile(kernel("shared"), target="compute_75")
    with open(art.path, "wb") as handle:
        handle.write(_forged(art))
    base = art.store.local.base
    if how == "other owner":
        for where, _dirs, files in os.walk(base):
            for name in [where] + [os.path.join(where, f) for f in files]:
                os.chown(name, NOBODY, NOBODY)
    else:
        os.chmod(base, 0o770 if how == "group-writable" else 0o707)
    engine._reset_for_tests()
    with captured() as log:
        again = ptxbackend.compile(kernel("shared"), target="compute_75")
        ptxbackend.compile(kernel("shared 2"), target="compute_75")
    warnings = log.warnings()
    assert not again.cache_hit and again.image == art.image and not again.path.startswith(str(cache))
    assert len(warnings) == 1 and "temporary cache" in warnings[0]
    assert ("belongs to uid %d" % NOBODY if how == "other owner" else "chmod 700") in warnings[0]
    figures("cache dir: %s" % how, forged_loads=0, warnings=len(warnings))


def test_every_directory_and_file_the_cache_creates_is_private(nvcc13, tmp_path, monkeypatch):
    cache = tmp_path / "fresh" / "cache"
    monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(cache))
    (tmp_path / "inc").mkdir()
    old_umask = os.umask(0o022)  # a common umask: the cache must not rely on a strict one
    try:
        ptxbackend.compile(kernel("modes"), ["-I" + str(tmp_path / "inc")], target="compute_75")
    finally:
        os.umask(old_umask)
    loose = []
    count = 0
    for base, dirs, files in os.walk(str(tmp_path / "fresh")):
        names = [os.path.join(base, d) for d in dirs] + [os.path.join(base, f) for f in files]
        for name in names + ([base] if base == str(tmp_path / "fresh") else []):
            count += 1
            mode = stat.S_IMODE(os.lstat(name).st_mode)
            if name.endswith(".lock"):
                continue  # holds no data; filelock chooses its mode
            if mode & 0o077:
                loose.append((name, oct(mode)))
    assert loose == []
    figures("private modes", paths_checked=count, loose=0)


# -- odd paths ------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["spaces and non-ASCII", "non-UTF-8 bytes"])
def test_cache_dir_with_spaces_and_non_ascii_characters(logging_nvcc, tmp_path, where):
    wrapper, calls = logging_nvcc
    if where == "non-UTF-8 bytes":
        base = os.fsencode(str(tmp_path)) + b"/caf\xe9 cache/\xff\xfe"
    else:
        base = os.fsencode(os.path.join(str(tmp_path), "my cache", "\u00f1and\u00fa \u7f13\u5b58 \u00fc"))
    include = os.path.join(base, b"inc dir \xc3\xa9")
    os.makedirs(include)
    with open(os.path.join(include, b"scale.cuh"), "w") as handle:
        handle.write("#define SCALE 2.0f\n")
    source = '#include "scale.cuh"\nextern "C" __global__ void k(float* y) { y[0] = SCALE; }\n'
    code = ("import os, ptxbackend; a = ptxbackend.compile(%r, ['-I' + os.fsdecode(%r)], "
            "target='compute_75'); print(a.cache_hit, a.path.startswith(os.fsdecode(%r)))"
            % (source, include, base))
    env = dict(os.environb)
    env.update({b"PYTHONPATH": os.fsencode(REPO), b"PTXBACKEND_NVCC": os.fsencode(wrapper),
                b"PTXBACKEND_CACHE_DIR": os.path.join(base, b"cache")})
    outputs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
        assert proc.returncode == 0 and proc.stderr == b"", proc.stderr
        outputs.append(proc.stdout.split())
    assert outputs == [[b"False", b"True"], [b"True", b"True"]]
    with open(str(calls), "rb") as handle:  # the logged -I path is not UTF-8 in one case
        assert sum(1 for line in handle if b"--ptx" in line and b"-dryrun" not in line) == 1
    figures("cache dir with %s" % where, processes=2, compiles=1, hits=1)


def _swap_for_link(directory, outside):
    """Move a cache directory away and leave a symlink to ``outside`` in its place (the attack)."""
    os.rename(directory, directory + ".moved")
    os.symlink(outside, directory)


def _damaged_entry_and_decoy(tmp_path):
    """A cache with one damaged entry, and an outside file of the same name that must survive."""
    art = ptxbackend.compile(kernel("maintenance"), target="compute_75", compiler="nvcc")
    with open(art.path, "r+b") as handle:
        handle.seek(-4, os.SEEK_END)
        handle.write(b"XXXX")  # a checksum failure: verify --repair removes this entry
    outside = tmp_path / "outside"
    outside.mkdir()
    decoy = outside / os.path.basename(art.path)
    decoy.write_bytes(b"a file of the user's, outside the cache")
    return art, str(outside), decoy


def test_verify_repair_never_deletes_outside_the_cache_when_the_tree_is_swapped(nvcc13, tmp_path, monkeypatch):
    art, outside, decoy = _damaged_entry_and_decoy(tmp_path)
    store = engine.open_store(config.load_settings())
    decode = entry.decode

    def decode_then_swap(data):  # between the read and the repair's unlink, the directory is swapped
        if not os.path.islink(os.path.dirname(art.path)):
            _swap_for_link(os.path.dirname(art.path), outside)
        return decode(data)
    monkeypatch.setattr(entry, "decode", decode_then_swap)
    good, bad = store.verify(repair=True)
    assert len(bad) == 1 and decoy.exists()
    assert not os.path.exists(os.path.dirname(art.path) + ".moved/" + os.path.basename(art.path))


def test_prune_never_deletes_outside_the_cache_when_the_tree_is_swapped(nvcc13, tmp_path, monkeypatch):
    art, outside, decoy = _damaged_entry_and_decoy(tmp_path)
    store = engine.open_store(config.load_settings())
    walk = store._files

    def walk_then_swap(base_fd):  # after the walk, before the deletions, the directory is swapped
        for item in walk(base_fd):
            yield item
        if not os.path.islink(os.path.dirname(art.path)):
            _swap_for_link(os.path.dirname(art.path), outside)
    monkeypatch.setattr(store, "_files", walk_then_swap)
    removed, _freed = store.prune(max_size=1)
    assert decoy.exists() and removed == 0
    assert os.path.exists(os.path.dirname(art.path) + ".moved/" + os.path.basename(art.path))

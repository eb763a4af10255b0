"""A hit only when the compiler would produce the same bytes today (issue 12's table, one case a row).

Each case compiles, changes one input the compiler reads, compiles again in the same process, and
asserts a miss whose image equals a direct compiler run on the changed input (nvcc in a directory
holding the source under the same name; NVRTC through its own API, no cache).  The files' stat
signatures are trusted at once (``deps.RACY_SECONDS = 0``) so that the stat path is what is
tested, not the always-hash path that protects files changed just before a compile.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

import ptxbackend
from ptxbackend.dependencies import depsets as deps
from ptxbackend.compilers.nvcc import NvccCompiler
from ptxbackend.compilers.nvrtc import NvrtcCompiler, probe_nvrtc
from ptxbackend.compiling.targets import parse_target
from conftest import REPO, count_calls

KERNEL = 'extern "C" __global__ void k(float* y) { y[0] = VAL; }\n'


def _comparable(ptx):
    """PTX without NVRTC's call-sequence comments, which count calls across one process's compiles."""
    return re.sub(br"// callseq \d+", b"// callseq", ptx)


def _direct(compiler, path, source, options, name, cwd, env=None):
    """The image the compiler gives when run by hand (no ptxbackend cache)."""
    if compiler == "nvrtc":
        comp = NvrtcCompiler(probe_nvrtc(path))
        return _comparable(comp.compile(source, options, parse_target("compute_75"), name))
    with open(os.path.join(cwd, name), "w") as handle:
        handle.write(source)
    out = os.path.join(cwd, "direct.ptx")
    subprocess.check_call([path, "--ptx", "-arch=compute_75"] + list(options) + ["-o", out, name],
                          cwd=cwd, env=env)
    with open(out, "rb") as handle:
        return _comparable(handle.read())


def _write(path, text):
    d = os.path.dirname(str(path))
    if not os.path.isdir(d):
        os.makedirs(d)
    with open(str(path), "w") as handle:
        handle.write(text)


# Each row: (id, compilers it applies to, setup).  setup(tmp) returns
# (source, options, name, env, change) where change() edits the input between the two compiles.
def _isystem(tmp):
    _write(tmp / "sys" / "val.cuh", "#define VAL 1.0f\n")
    return ("#include <val.cuh>\n" + KERNEL, ["-isystem", str(tmp / "sys")], "k.cu", {},
            lambda: _write(tmp / "sys" / "val.cuh", "#define VAL 2.0f\n"))


def _pre_include(tmp):
    _write(tmp / "pre.h", "#define VAL 1.0f\n")
    return (KERNEL, ["-include", str(tmp / "pre.h")], "k.cu", {},
            lambda: _write(tmp / "pre.h", "#define VAL 2.0f\n"))


def _absolute_include(tmp):
    _write(tmp / "abs" / "val.h", "#define VAL 1.0f\n")
    return ('#include "%s"\n' % (tmp / "abs" / "val.h") + KERNEL, [], "k.cu", {},
            lambda: _write(tmp / "abs" / "val.h", "#define VAL 2.0f\n"))


def _cpath(tmp):
    _write(tmp / "cpath" / "val.cuh", "#define VAL 1.0f\n")
    return ("#include <val.cuh>\n" + KERNEL, [], "k.cu", {"CPATH": str(tmp / "cpath")},
            lambda: _write(tmp / "cpath" / "val.cuh", "#define VAL 2.0f\n"))


def _append_flags(tmp, name="NVCC_APPEND_FLAGS"):
    env = {name: "-DVAL=1.0f"}
    return (KERNEL, [], "k.cu", env, lambda: env.update({name: "-DVAL=2.0f"}))


def _prepend_flags(tmp):
    return _append_flags(tmp, "NVCC_PREPEND_FLAGS")


def _symlinked_subdir(tmp):
    _write(tmp / "real" / "val.cuh", "#define VAL 1.0f\n")
    (tmp / "inc").mkdir()
    os.symlink(str(tmp / "real"), str(tmp / "inc" / "sub"))
    return ("#include <sub/val.cuh>\n" + KERNEL, ["-I", str(tmp / "inc")], "k.cu", {},
            lambda: _write(tmp / "real" / "val.cuh", "#define VAL 2.0f\n"))


def _same_size_old_mtime(tmp):
    header = tmp / "inc" / "val.cuh"
    _write(header, "#define VAL 1.0f\n")
    os.utime(str(header), (1500000000, 1500000000))  # as `cp -p` or `tar -x` leave it

    def change():
        _write(header, "#define VAL 2.0f\n")  # same size
        os.utime(str(header), (1500000000, 1500000000))
    return "#include <val.cuh>\n" + KERNEL, ["-I", str(tmp / "inc")], "k.cu", {}, change


def _long_lived_edit(tmp):
    _write(tmp / "inc" / "val.cuh", "#define VAL 1.0f\n")
    return ("#include <val.cuh>\n" + KERNEL, ["-I", str(tmp / "inc")], "k.cu", {},
            lambda: _write(tmp / "inc" / "val.cuh", "#define VAL (1.0f + 1.0f)\n"))


_ASSERT_KERNEL = ('#include <assert.h>\n#define VAL 1.0f\n'
                  'extern "C" __global__ void k(float* y) { assert(y[0] > 0.0f); y[0] = VAL; }\n')


ROWS = [
    ("isystem-header", ("nvcc13", "nvcc112"), _isystem),
    ("pre-include", ("nvcc13", "nvcc112", "nvrtc117"), _pre_include),
    ("absolute-include", ("nvcc13", "nvcc112", "nvrtc117"), _absolute_include),
    ("cpath-header", ("nvcc13", "nvcc112"), _cpath),
    ("nvcc-append-flags", ("nvcc13", "nvcc112"), _append_flags),
    ("nvcc-prepend-flags", ("nvcc13", "nvcc112"), _prepend_flags),
    ("symlinked-subdir", ("nvcc13", "nvcc112", "nvrtc117"), _symlinked_subdir),
    ("same-size-mtime-restored", ("nvcc13", "nvcc112", "nvrtc117"), _same_size_old_mtime),
    ("edited-in-long-lived-process", ("nvcc13", "nvcc112", "nvrtc117"), _long_lived_edit),
]
CASES = [pytest.param(row, comp, id="%s-%s" % (row[0], comp)) for row in ROWS for comp in row[1]]


@pytest.fixture
def compiler_path(request):
    return request.getfixturevalue(request.param)


def _use(monkeypatch, compiler, path):
    if compiler == "nvrtc117":
        monkeypatch.setenv("PTXBACKEND_NVRTC", path)
        return "nvrtc"
    monkeypatch.setenv("PTXBACKEND_NVCC", path)
    return "nvcc"


@pytest.mark.toolkit
@pytest.mark.parametrize("row,compiler", CASES)
def test_changed_input_is_a_miss_with_the_bytes_of_a_direct_run(row, compiler, request, tmp_path, monkeypatch):
    run_row(row, compiler, request, tmp_path, monkeypatch)


def run_row(row, compiler, request, tmp_path, monkeypatch):
    """Compile, change the row's input, compile again: a miss with a direct run's bytes, then a hit."""
    path = request.getfixturevalue(compiler)
    kind = _use(monkeypatch, compiler, path)
    monkeypatch.setattr(deps, "RACY_SECONDS", 0.0)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(str(work))  # NVRTC's quoted includes start from the working directory
    source, options, name, env, change = row[2](work)

    def build():
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        return ptxbackend.compile(source, options, target="compute_75", compiler=kind, name=name)

    first = build()
    assert build().cache_hit  # unchanged inputs: a hit
    change()
    second = build()
    assert not second.cache_hit, "a changed input was served from the cache"
    direct = _direct(kind, path, source, options, name, str(work), dict(os.environ, **env))
    assert _comparable(second.image) == direct
    assert second.image != first.image
    assert build().cache_hit  # and the new result is kept


@pytest.mark.toolkit
@pytest.mark.parametrize("compiler", ["nvcc13", "nvcc112", "nvrtc117"])
def test_racy_header_is_compared_by_content(compiler, request, tmp_path, monkeypatch):
    """A header written just before the compile is never trusted by its stat alone."""
    path = request.getfixturevalue(compiler)
    kind = _use(monkeypatch, compiler, path)
    source, options, name, _env, change = _same_size_old_mtime(tmp_path)
    first = ptxbackend.compile(source, options, target="compute_75", compiler=kind)
    change()
    second = ptxbackend.compile(source, options, target="compute_75", compiler=kind)
    assert not second.cache_hit and second.image != first.image


def _names(ptx, name):
    """Whether the PTX holds ``name`` as a string constant (written as a list of byte values)."""
    return ", ".join(str(b) for b in name.encode()).encode() in ptx or name.encode() in ptx


@pytest.mark.toolkit
@pytest.mark.parametrize("compiler", ["nvcc13", "nvcc112", "nvrtc117"])
def test_kernel_file_name_is_part_of_the_request(compiler, request, tmp_path, monkeypatch):
    """assert() writes the file name into the image: another name is another request."""
    path = request.getfixturevalue(compiler)
    kind = _use(monkeypatch, compiler, path)
    source = _ASSERT_KERNEL if kind == "nvcc" else _ASSERT_KERNEL.replace("#include <assert.h>\n", "")
    first = ptxbackend.compile(source, target="compute_75", compiler=kind, name="first.cu")
    second = ptxbackend.compile(source, target="compute_75", compiler=kind, name="second.cu")
    assert not second.cache_hit and _names(second.image, "second.cu") and not _names(second.image, "first.cu")
    assert first.key != second.key
    assert _comparable(second.image) == _direct(kind, path, source, [], "second.cu", str(tmp_path))


@pytest.mark.toolkit
@pytest.mark.parametrize("compiler", ["nvcc13", "nvcc112", "nvrtc117"])
def test_relative_include_dir_and_header_beside_the_source(compiler, request, tmp_path, monkeypatch):
    """`-I inc` and `#include "beside.h"` work as a compiler run in the caller's directory."""
    path = request.getfixturevalue(compiler)
    kind = _use(monkeypatch, compiler, path)
    project = tmp_path / "project"
    _write(project / "inc" / "val.cuh", "#define VAL 1.0f\n")
    _write(project / "beside.h", "#define TWICE(x) (2.0f * (x))\n")
    source = '#include <val.cuh>\n#include "beside.h"\n' \
             'extern "C" __global__ void k(float* y) { y[0] = TWICE(VAL); }\n'
    monkeypatch.chdir(str(project))
    art = ptxbackend.compile(source, ["-I", "inc"], target="compute_75", compiler=kind, name="k.cu",
                             source_dir=str(project))
    assert _comparable(art.image) == _direct(kind, path, source, ["-I", "inc"], "k.cu", str(project))
    # The same relative option from another directory names other headers: not the same request.
    other = tmp_path / "other"
    _write(other / "inc" / "val.cuh", "#define VAL 3.0f\n")
    _write(other / "beside.h", "#define TWICE(x) (2.0f * (x))\n")
    monkeypatch.chdir(str(other))
    again = ptxbackend.compile(source, ["-I", "inc"], target="compute_75", compiler=kind, name="k.cu",
                               source_dir=str(other))
    assert not again.cache_hit and again.image != art.image


def _hang_guarded(code, env):
    """Run ``code`` in a child; a hang becomes a failure after a generous limit, not a stuck CI."""
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=REPO, **env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


@pytest.mark.toolkit
@pytest.mark.parametrize("compiler", ["nvcc13", "nvrtc117"])
@pytest.mark.parametrize("special", ["fifo", "device"])
def test_fifo_or_device_in_the_include_tree_never_hangs(compiler, special, request, tmp_path):
    path = request.getfixturevalue(compiler)
    inc = tmp_path / "inc"
    _write(inc / "val.cuh", "#define VAL 1.0f\n")
    if special == "fifo":
        os.mkfifo(str(inc / "pipe.cuh"))
    else:
        os.symlink("/dev/zero", str(inc / "pipe.cuh"))
    env = {"PTXBACKEND_CACHE_DIR": str(tmp_path / "cache"),
           ("PTXBACKEND_NVRTC" if compiler == "nvrtc117" else "PTXBACKEND_NVCC"): path}
    kind = "nvrtc" if compiler == "nvrtc117" else "nvcc"
    unrelated = ("import ptxbackend; a = ptxbackend.compile(%r, ['-I', %r], target='compute_75', "
                 "compiler=%r); print('built', a.kind)" % ("#include <val.cuh>\n" + KERNEL, str(inc), kind))
    code, out = _hang_guarded(unrelated, env)
    assert code == 0 and "built ptx" in out, out  # an unrelated FIFO is never opened
    included = unrelated.replace("<val.cuh>", "<pipe.cuh>")
    code, out = _hang_guarded(included, env)
    assert code != 0 and "not a regular file" in out and "pipe.cuh" in out, out


# -------------------------------------------------------------------------- compiler identity

def _farm(source_root, farm):
    """A tree of links to ``source_root``'s files, as a toolkit installed elsewhere would look."""
    subprocess.check_call(["cp", "-as", source_root, farm])


@pytest.mark.toolkit
def test_toolkit_swapped_behind_an_unchanged_wrapper_is_seen_at_the_next_call(nvcc13, nvcc112, tmp_path,
                                                                              monkeypatch, logging_nvcc):
    """`/opt/cuda` (a link) moves from 11.2 to 13.0; the wrapper that runs it stays byte for byte."""
    bundle11 = os.path.dirname(os.path.dirname(nvcc112))       # .../nvcc112: bin/nvcc112 finds its tree
    real_nvcc13 = NvccCompiler.probe(nvcc13).files[1][0]  # _HERE_/nvcc behind any wrapper
    cuda13 = os.path.dirname(os.path.dirname(os.path.realpath(real_nvcc13)))
    _farm(bundle11, str(tmp_path / "tk11"))
    _farm(cuda13, str(tmp_path / "tk13"))
    os.symlink(os.path.join(str(tmp_path / "tk13"), "bin", "nvcc"), str(tmp_path / "tk13" / "bin" / "nvcc112"))
    link = tmp_path / "cuda"
    os.symlink(str(tmp_path / "tk11"), str(link))
    wrapper = tmp_path / "bin" / "nvcc"
    _write(wrapper, '#!/bin/sh\nexec "%s/bin/nvcc112" "$@"\n' % link)
    os.chmod(str(wrapper), 0o755)
    monkeypatch.setenv("PTXBACKEND_NVCC", str(wrapper))
    import logging
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("ptxbackend").addHandler(handler)
    monkeypatch.setenv("PTXBACKEND_LOG", "debug")
    before = ptxbackend.compile(KERNEL.replace("VAL", "1.0f"), device_cc="9.0")
    assert before.producer == "nvcc-11.2.152" and str(before.target) == "compute_86"
    # A hit first: this process has now checked the toolkit's headers and trusts them, so only the
    # per-call check of the compiler's own files can see the swap.
    assert ptxbackend.compile(KERNEL.replace("VAL", "1.0f"), device_cc="9.0").cache_hit
    wrapper_stat = os.stat(str(wrapper))
    os.unlink(str(link))
    os.symlink(str(tmp_path / "tk13"), str(link))
    assert os.stat(str(wrapper)) == wrapper_stat
    after = ptxbackend.compile(KERNEL.replace("VAL", "1.0f"), device_cc="9.0")
    assert after.producer == "nvcc-13.0.88" and str(after.target) == "sm_90" and after.kind == "cubin"
    assert "/nvcc-13.0.88/" in after.path and not after.cache_hit
    # The other way round as well, in a fresh process (the identity memo on disk is checked too).
    os.unlink(str(link))
    os.symlink(str(tmp_path / "tk11"), str(link))
    proc = subprocess.run(
        [sys.executable, "-c", "import ptxbackend; a = ptxbackend.compile(%r, device_cc='9.0'); "
                               "print(a.producer, a.target, a.cache_hit)" % KERNEL.replace("VAL", "1.0f")],
        env=dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_LOG="debug"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, universal_newlines=True)
    logging.getLogger("ptxbackend").removeHandler(handler)
    assert proc.stdout.split() == ["nvcc-11.2.152", "compute_86", "True"], (proc.stderr, records)



@pytest.mark.toolkit
def test_a_hit_trusts_the_compilers_files_while_their_directories_are_watched(nvcc13, tmp_path, monkeypatch):
    """Checked in full once; then a hit reads the watcher once and stats none of the compiler's files,
    until something changes where they are: the wrapper edited in place is seen at the next call."""
    from ptxbackend.files import watching
    if watching.this_process_watcher() is None:
        pytest.skip("no inotify here: every hit stats the compiler's files")
    wrapper = tmp_path / "bin" / "nvcc"
    _write(wrapper, '#!/bin/sh\nexec "%s" "$@"\n' % nvcc13)
    os.chmod(str(wrapper), 0o755)
    monkeypatch.setenv("PTXBACKEND_NVCC", str(wrapper))
    source = KERNEL.replace("VAL", "1.0f")
    ptxbackend.compile(source, target="compute_75")
    assert ptxbackend.compile(source, target="compute_75").cache_hit
    stats, real_stat = [], os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **kw: stats.append(str(path)) or real_stat(path, *a, **kw))
    for _ in range(5):
        assert ptxbackend.compile(source, target="compute_75").cache_hit
    assert str(wrapper) not in stats and nvcc13 not in stats, stats
    _write(wrapper, '#!/bin/sh\n# the same compiler, another wrapper\nexec "%s" "$@"\n' % nvcc13)
    os.chmod(str(wrapper), 0o755)
    assert not ptxbackend.compile(source, target="compute_75").cache_hit  # the wrapper is part of the key
    assert str(wrapper) in stats


@pytest.mark.toolkit
def test_a_compiler_file_edited_through_a_hard_link_elsewhere_is_seen_at_the_next_call(nvcc13, tmp_path,
                                                                                       monkeypatch):
    """The wrapper is a hard link of a file in another directory (a package cache, say); an edit made in
    place through that other name touches no directory ptxbackend watches, only the file itself."""
    from ptxbackend.files import watching
    if watching.this_process_watcher() is None:
        pytest.skip("no inotify here: every hit stats the compiler's files")
    original = tmp_path / "pkgs" / "nvcc"
    _write(original, '#!/bin/sh\nexec "%s" "$@"\n' % nvcc13)
    os.chmod(str(original), 0o755)
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    os.link(str(original), str(wrapper))
    monkeypatch.setenv("PTXBACKEND_NVCC", str(wrapper))
    source = KERNEL.replace("VAL", "1.0f")
    ptxbackend.compile(source, target="compute_75")
    assert ptxbackend.compile(source, target="compute_75").cache_hit
    with open(str(original), "r+") as handle:  # in place: the same inode, so both names see it
        handle.write('#!/bin/sh\n# edited in place in the package cache\nexec "%s" "$@"\n' % nvcc13)
    assert os.stat(str(wrapper)).st_ino == os.stat(str(original)).st_ino
    assert not ptxbackend.compile(source, target="compute_75").cache_hit

def _install_nvrtc(lib_dir, into):
    if os.path.isdir(into):
        shutil.rmtree(into)
    shutil.copytree(lib_dir, into)  # a wheel updated in place: the same path, other bytes


@pytest.mark.toolkit
def test_nvrtc_updated_at_patch_level_is_another_producer(nvrtc12_pair, tmp_path):
    old, new = nvrtc12_pair
    lib = str(tmp_path / "site" / "nvrtc")
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_NVRTC=lib, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"))
    code = ("import ptxbackend, hashlib; a = ptxbackend.compile(%r, target='compute_75', compiler='nvrtc'); "
            "print(a.producer, a.cache_hit, hashlib.sha256(a.image).hexdigest())" % KERNEL.replace("VAL", "1.0f"))

    def run():
        return subprocess.check_output([sys.executable, "-c", code], env=env).decode().split()
    _install_nvrtc(old, lib)
    first = run()
    assert first[:2] == ["nvrtc-12.0.76", "False"] and run()[1] == "True"
    _install_nvrtc(new, lib)
    second = run()
    assert second[:2] == ["nvrtc-12.0.140", "False"]
    direct = NvrtcCompiler(probe_nvrtc(os.path.join(new, "libnvrtc.so.12"))).compile(
        KERNEL.replace("VAL", "1.0f"), [], parse_target("compute_75"))
    import hashlib
    assert second[2] == hashlib.sha256(direct).hexdigest() != first[2]


# -------------------------------------------------------------------------- the hit stays cheap

@pytest.mark.toolkit
def test_warm_hit_with_headers_spawns_no_compiler(logging_nvcc, tmp_path):
    wrapper, log = logging_nvcc
    _write(tmp_path / "inc" / "val.cuh", "#define VAL 1.0f\n")
    code = ("import ptxbackend; a = ptxbackend.compile(%r, ['-I', %r], target='compute_75'); print(a.cache_hit)"
            % ("#include <val.cuh>\n" + KERNEL, str(tmp_path / "inc")))
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_NVCC=wrapper, PTXBACKEND_CACHE_DIR=str(tmp_path / "c"))
    assert subprocess.check_output([sys.executable, "-c", code], env=env).decode().strip() == "False"
    calls = count_calls(log)
    assert subprocess.check_output([sys.executable, "-c", code], env=env).decode().strip() == "True"
    assert count_calls(log) == calls  # a fresh process's hit: not one nvcc process, not even a probe


class _CoarseStat(object):
    """A stat result as a file system with whole-second times reports it (ext3, FAT, some NFS)."""

    def __init__(self, st):
        for name in ("st_mode", "st_ino", "st_dev", "st_size"):
            setattr(self, name, getattr(st, name))
        self.st_mtime = self.st_ctime = float(int(st.st_ctime))
        self.st_mtime_ns = self.st_ctime_ns = int(st.st_ctime) * 10 ** 9


def test_a_header_changed_in_the_same_timestamp_tick_is_compared_by_content(tmp_path, monkeypatch):
    """An edit right after the compile read a file, within the file system's timestamp resolution,
    leaves size, mtime and ctime all equal.  Such a file is recorded untrusted and compared by
    content on every hit; trusting its stat would serve the old output."""
    real_stat, real_read = os.stat, deps.read_regular
    monkeypatch.setattr(deps, "_stat", lambda path: _CoarseStat(real_stat(path)))
    monkeypatch.setattr(deps, "read_regular", lambda path: (lambda r: (r[0], _CoarseStat(r[1])))(real_read(path)))
    header = tmp_path / "val.cuh"
    for _attempt in range(20):
        header.write_bytes(b"#define VAL 1.0f\n")
        # Written shortly before the compile started (a second later, so not *during* it).
        built = deps.build([str(header)], [str(tmp_path)], [], [], b"", started=time.time() + 1.0)
        header.write_bytes(b"#define VAL 2.0f\n")  # same size, the same second
        recorded = json.loads(built.blob.decode("ascii"))["files"][0]
        if int(real_stat(str(header)).st_ctime) == recorded[3] // 10 ** 9:
            break
    else:
        pytest.skip("every rewrite landed in a later second")
    deps.forget()
    assert not deps.fresh(built.section, {built.digest: built.blob}.get)


@pytest.mark.toolkit
def test_nvrtc_replaced_while_loaded_is_an_error_not_a_compile_by_the_old_library(nvrtc12_pair, tmp_path,
                                                                                   monkeypatch):
    old, new = nvrtc12_pair
    lib = str(tmp_path / "site" / "nvrtc")
    _install_nvrtc(old, lib)
    monkeypatch.setenv("PTXBACKEND_NVRTC", lib)
    first = ptxbackend.compile(KERNEL.replace("VAL", "1.0f"), target="compute_75", compiler="nvrtc")
    assert first.producer == "nvrtc-12.0.76"
    _install_nvrtc(new, lib)
    with pytest.raises(ptxbackend.errors.CompilerNotFoundError, match="replaced after this process loaded it"):
        ptxbackend.compile(KERNEL.replace("VAL", "2.0f"), target="compute_75", compiler="nvrtc")


@pytest.mark.toolkit
def test_nvrtc_quoted_include_from_the_working_directory_follows_the_directory(nvrtc117, tmp_path, monkeypatch):
    """NVRTC reads `#include "val.h"` of the program from the working directory: the same request run
    from another directory with another val.h is a miss with that directory's bytes."""
    monkeypatch.setenv("PTXBACKEND_NVRTC", nvrtc117)
    monkeypatch.setattr(deps, "RACY_SECONDS", 0.0)
    source = '#include "val.h"\n' + KERNEL
    images = {}
    for name, value in (("a", "1.0f"), ("b", "2.0f")):
        _write(tmp_path / name / "val.h", "#define VAL %s\n" % value)
        monkeypatch.chdir(str(tmp_path / name))
        art = ptxbackend.compile(source, target="compute_75", compiler="nvrtc")
        assert not art.cache_hit, "a header of another directory was taken for this one's"
        assert _comparable(art.image) == _direct("nvrtc", nvrtc117, source, [], "kernel.cu", str(tmp_path / name))
        images[name] = art.image
        assert ptxbackend.compile(source, target="compute_75", compiler="nvrtc").cache_hit
    assert images["a"] != images["b"]


@pytest.mark.toolkit
def test_a_header_changed_while_the_compiler_runs_is_not_vouched_for(nvcc13, tmp_path, monkeypatch):
    """The compiler read version 1; the header became version 2 before ptxbackend recorded it.  That
    record must not let version 1's output pass for version 2's (ccache: "include file too new")."""
    header = tmp_path / "inc" / "val.cuh"
    _write(header, "#define VAL 1.0f\n")
    wrapper = tmp_path / "bin" / "nvcc"
    # nvcc runs (and reads version 1), then the header is edited, then the wrapper returns.
    _write(wrapper, '#!/bin/sh\n"%s" "$@"\nstatus=$?\ncase "$*" in *-MD*) echo "#define VAL 2.0f" > "%s" ;; '
                    'esac\nexit $status\n' % (nvcc13, header))
    os.chmod(str(wrapper), 0o755)
    monkeypatch.setenv("PTXBACKEND_NVCC", str(wrapper))
    monkeypatch.setattr(deps, "RACY_SECONDS", 0.0)
    source = "#include <val.cuh>\n" + KERNEL
    first = ptxbackend.compile(source, ["-I", str(tmp_path / "inc")], target="compute_75")
    assert b"1065353216" in first.image  # 1.0f: what nvcc read
    monkeypatch.setenv("PTXBACKEND_NVCC", nvcc13)
    second = ptxbackend.compile(source, ["-I", str(tmp_path / "inc")], target="compute_75")
    assert not second.cache_hit and b"1073741824" in second.image  # 2.0f: the header as it is now

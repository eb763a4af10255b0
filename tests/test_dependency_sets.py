"""Issue 24: the rows the include scan, the stat signature and the version string missed, one test each.

Each stale-hit row compiles, changes one input the compiler reads (or looks for), compiles again, and
asserts a miss whose image equals a direct compiler run on the changed input; then that the new result
is kept (a hit).  The rows where ptxbackend used to fail although the compiler alone succeeds assert
the compile works and is cached.  Then the costs: a CuPy-14-sized set is checked once per process.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import ptxbackend
from ptxbackend.compiling import engine
from ptxbackend.files import watching
from ptxbackend.dependencies import depsets
from ptxbackend.config import NVCC_ENVIRONMENT
from test_key_completeness import KERNEL, _write, run_row

VALUE_1, VALUE_2 = b"1065353216", b"1073741824"  # 1.0f and 2.0f as PTX writes them


def _computed_include(tmp):
    _write(tmp / "inc" / "val.h", "#define VAL 1.0f\n")
    return ('#define HEADER <val.h>\n#include HEADER\n' + KERNEL, ["-I", str(tmp / "inc")], "k.cu", {},
            lambda: _write(tmp / "inc" / "val.h", "#define VAL 2.0f\n"))


def _include_next(tmp):
    _write(tmp / "a" / "val.h", "#include_next <val.h>\n")
    _write(tmp / "b" / "val.h", "#define VAL 1.0f\n")
    return ('#include <val.h>\n' + KERNEL, ["-I", str(tmp / "a"), "-I", str(tmp / "b")], "k.cu", {},
            lambda: _write(tmp / "b" / "val.h", "#define VAL 2.0f\n"))


def _comment_in_directive(tmp):
    _write(tmp / "inc" / "val.h", "#define VAL 1.0f\n")
    return ('#include /* the value */ <val.h>\n' + KERNEL, ["-I", str(tmp / "inc")], "k.cu", {},
            lambda: _write(tmp / "inc" / "val.h", "#define VAL 2.0f\n"))


def _line_splice(tmp):
    _write(tmp / "inc" / "val.h", "#define VAL 1.0f\n")
    return ('#include \\\n<val.h>\n' + KERNEL, ["-I", str(tmp / "inc")], "k.cu", {},
            lambda: _write(tmp / "inc" / "val.h", "#define VAL 2.0f\n"))


def _name_with_directory(tmp):
    """NVRTC looks for the program's quoted includes in the directory of its name."""
    _write(tmp / "src" / "val.h", "#define VAL 1.0f\n")
    return ('#include "val.h"\n' + KERNEL, [], "src/k.cu", {},
            lambda: _write(tmp / "src" / "val.h", "#define VAL 2.0f\n"))


def _shadowed_beside_the_named_source(tmp):
    """NVRTC looks beside the program's name before the include path: a new header there wins."""
    (tmp / "src").mkdir()
    _write(tmp / "inc" / "val.h", "#define VAL 1.0f\n")
    return ('#include "val.h"\n' + KERNEL, ["-I", str(tmp / "inc")], "src/k.cu", {},
            lambda: _write(tmp / "src" / "val.h", "#define VAL 2.0f\n"))


def _no_source_include(tmp):
    _write(tmp / "val.h", "#define VAL 5.0f\n")  # what a scan of the working directory would take
    _write(tmp / "inc" / "val.h", "#define VAL 1.0f\n")
    return ('#include "val.h"\n' + KERNEL, ["--no-source-include", "-I", str(tmp / "inc")], "k.cu", {},
            lambda: _write(tmp / "inc" / "val.h", "#define VAL 2.0f\n"))


def _shadowed_on_the_path(tmp):
    (tmp / "a").mkdir()
    _write(tmp / "b" / "val.h", "#define VAL 1.0f\n")
    return ('#include <val.h>\n' + KERNEL, ["-I", str(tmp / "a"), "-I", str(tmp / "b")], "k.cu", {},
            lambda: _write(tmp / "a" / "val.h", "#define VAL 2.0f\n"))


def _shadowed_in_a_subdirectory(tmp):
    (tmp / "a").mkdir()
    _write(tmp / "b" / "sub" / "val.h", "#define VAL 1.0f\n")
    return ('#include <sub/val.h>\n' + KERNEL, ["-I", str(tmp / "a"), "-I", str(tmp / "b")], "k.cu", {},
            lambda: _write(tmp / "a" / "sub" / "val.h", "#define VAL 2.0f\n"))


def _has_include_created(tmp):
    (tmp / "inc").mkdir()
    source = ('#if __has_include(<opt.h>)\n#define VAL 2.0f\n#else\n#define VAL 1.0f\n#endif\n' + KERNEL)
    return source, ["-I", str(tmp / "inc")], "k.cu", {}, lambda: _write(tmp / "inc" / "opt.h", "\n")


def _has_include_deleted(tmp):
    _write(tmp / "inc" / "opt.h", "\n")
    source = ('#if __has_include(<opt.h>)\n#define VAL 1.0f\n#else\n#define VAL 2.0f\n#endif\n' + KERNEL)
    return source, ["-I", str(tmp / "inc")], "k.cu", {}, lambda: os.unlink(str(tmp / "inc" / "opt.h"))


def _profile_includes(tmp):
    """nvcc.profile appends the toolkit's include directory to INCLUDES from the environment."""
    _write(tmp / "one" / "val.h", "#define VAL 1.0f\n")
    _write(tmp / "two" / "val.h", "#define VAL 2.0f\n")
    env = {"INCLUDES": "-I%s" % (tmp / "one")}
    return ('#include <val.h>\n' + KERNEL, [], "k.cu", env,
            lambda: env.update({"INCLUDES": "-I%s" % (tmp / "two")}))


def _source_date_epoch(tmp):
    env = {"SOURCE_DATE_EPOCH": "1500000000"}
    source = ('extern "C" __global__ void k(char* y) { const char d[] = __DATE__; '
              'for (int i = 0; i < 11; ++i) y[i] = d[i]; }\n')
    return source, [], "k.cu", env, lambda: env.update({"SOURCE_DATE_EPOCH": "1600000000"})


def _nested_options_file(tmp):
    _write(tmp / "inner.txt", "-DVAL=1.0f\n")
    _write(tmp / "outer.txt", "--options-file %s\n" % (tmp / "inner.txt"))
    return (KERNEL, ["--options-file", str(tmp / "outer.txt")], "k.cu", {},
            lambda: _write(tmp / "inner.txt", "-DVAL=2.0f\n"))


def _options_file_in_append_flags(tmp):
    _write(tmp / "flags.txt", "-DVAL=1.0f\n")
    env = {"NVCC_APPEND_FLAGS": "--options-file %s" % (tmp / "flags.txt")}
    return KERNEL, [], "k.cu", env, lambda: _write(tmp / "flags.txt", "-DVAL=2.0f\n")


def _host_compiler(tmp, name, value):
    path = tmp / name
    _write(path, '#!/bin/sh\nexec %s -DVAL=%s "$@"\n' % (shutil.which("gcc") or "gcc", value))
    os.chmod(str(path), 0o755)
    return path


def _ccbin_in_options_file(tmp):
    one, two = _host_compiler(tmp, "gcc-one", "1.0f"), _host_compiler(tmp, "gcc-two", "2.0f")
    _write(tmp / "host.txt", "-ccbin %s\n" % one)
    return (KERNEL, ["--options-file", str(tmp / "host.txt")], "k.cu", {},
            lambda: _write(tmp / "host.txt", "-ccbin %s\n" % two))


def _host_link_retargeted(tmp):
    one, two = _host_compiler(tmp, "gcc-one", "1.0f"), _host_compiler(tmp, "gcc-two", "2.0f")
    link = tmp / "gcc-current"
    os.symlink(str(one), str(link))

    def change():
        os.unlink(str(link))
        os.symlink(str(two), str(link))
    return KERNEL, ["-ccbin", str(link)], "k.cu", {}, change


ROWS = [
    ("computed-include", ("nvcc13", "nvrtc117"), _computed_include),
    ("include-next", ("nvcc13", "nvrtc117"), _include_next),
    ("comment-in-directive", ("nvcc13", "nvrtc117"), _comment_in_directive),
    ("line-splice-in-directive", ("nvcc13", "nvrtc117"), _line_splice),
    ("name-with-directory", ("nvrtc117",), _name_with_directory),
    ("shadowed-beside-the-named-source", ("nvrtc117",), _shadowed_beside_the_named_source),
    ("no-source-include", ("nvrtc117",), _no_source_include),
    ("shadowed-earlier-on-the-path", ("nvcc13", "nvrtc117"), _shadowed_on_the_path),
    ("shadowed-in-a-subdirectory", ("nvcc13", "nvrtc117"), _shadowed_in_a_subdirectory),
    ("has-include-created", ("nvcc13", "nvrtc117"), _has_include_created),
    ("has-include-deleted", ("nvcc13", "nvrtc117"), _has_include_deleted),
    ("profile-includes-variable", ("nvcc13",), _profile_includes),
    ("source-date-epoch", ("nvcc13",), _source_date_epoch),
    ("nested-options-file", ("nvcc13",), _nested_options_file),
    ("options-file-in-append-flags", ("nvcc13",), _options_file_in_append_flags),
    ("ccbin-inside-options-file", ("nvcc13",), _ccbin_in_options_file),
    ("host-compiler-link-retargeted", ("nvcc13",), _host_link_retargeted),
]
CASES = [pytest.param(row, comp, id="%s-%s" % (row[0], comp)) for row in ROWS for comp in row[1]]


@pytest.mark.toolkit
@pytest.mark.parametrize("row,compiler", CASES)
def test_changed_input_is_a_miss_with_the_bytes_of_a_direct_run(row, compiler, request, tmp_path, monkeypatch):
    run_row(row, compiler, request, tmp_path, monkeypatch)


# -- the toolkit at the same version -------------------------------------------------------------

@pytest.fixture
def toolkit_copy(nvcc112, tmp_path):
    """A private copy of the nvcc 11.2 bundle (relocatable), to edit."""
    bundle = os.path.dirname(os.path.dirname(nvcc112))
    copy = str(tmp_path / "toolkit")
    shutil.copytree(bundle, copy, symlinks=True)
    return os.path.join(copy, "bin", "nvcc112"), os.path.join(copy, "cuda-11.2", "bin")


def _a_new_process():
    engine._reset_for_tests()


@pytest.mark.toolkit
@pytest.mark.parametrize("edit", ["nvcc.profile", "fatbinary", "ptxas"])
def test_toolkit_changed_at_the_same_version_is_another_key(toolkit_copy, edit, monkeypatch):
    wrapper, bindir = toolkit_copy
    monkeypatch.setenv("PTXBACKEND_NVCC", wrapper)
    source = KERNEL.replace("VAL", "1.0f")
    first = ptxbackend.compile(source, target="sm_75")
    path = os.path.join(bindir, edit)
    with open(path, "ab") as handle:
        handle.write(b"\n# edited\n" if edit == "nvcc.profile" else b"\0")
    _a_new_process()
    second = ptxbackend.compile(source, target="sm_75")
    assert second.producer == first.producer == "nvcc-11.2.152"  # the readable name stays
    assert not second.cache_hit and second.key != first.key
    _a_new_process()
    assert ptxbackend.compile(source, target="sm_75").cache_hit


@pytest.mark.toolkit
def test_nvrtc_builtins_from_ld_library_path_are_another_toolkit(nvrtc12_pair, tmp_path, monkeypatch):
    """NVRTC loads libnvrtc-builtins by name: LD_LIBRARY_PATH comes before the library's own directory."""
    old, new = nvrtc12_pair
    monkeypatch.setenv("PTXBACKEND_NVRTC", old)
    source = KERNEL.replace("VAL", "1.0f")
    first = ptxbackend.compile(source, target="compute_75", compiler="nvrtc")
    monkeypatch.setenv("LD_LIBRARY_PATH", new)
    _a_new_process()
    comp = engine.toolchain.prepare(engine.compile_settings(None, "nvrtc", None, None), "nvrtc")[1]
    assert any(path.startswith(new) and "builtins" in path for path, _sig in comp.identity.files)
    assert request_key_of(source, comp) != first.key


def request_key_of(source, comp):
    from ptxbackend.cache import request_key
    from ptxbackend.compiling.targets import parse_target
    settings = engine.compile_settings("compute_75", "nvrtc", None, None)
    request = engine.requests.settled((), "kernel.cu", None, comp, settings)
    return request_key(source, request.options, parse_target("compute_75"), request.context)


@pytest.mark.toolkit
def test_compiler_check_command_sees_a_toolkit_behind_an_unchanged_wrapper(nvcc13, nvcc112, tmp_path,
                                                                          monkeypatch):
    """The wrapper's text stays the same; the toolkit it runs is chosen by a file it reads."""
    choice = tmp_path / "choice"
    choice.write_text(nvcc112)
    wrapper = tmp_path / "bin" / "nvcc"
    _write(wrapper, '#!/bin/sh\nexec "$(cat %s)" "$@"\n' % choice)
    os.chmod(str(wrapper), 0o755)
    monkeypatch.setenv("PTXBACKEND_NVCC", str(wrapper))
    monkeypatch.setenv("PTXBACKEND_COMPILER_CHECK", "command")
    source = KERNEL.replace("VAL", "1.0f")
    assert ptxbackend.compile(source, target="compute_75").producer == "nvcc-11.2.152"
    choice.write_text(nvcc13)
    _a_new_process()
    assert ptxbackend.compile(source, target="compute_75").producer.startswith("nvcc-13.")


# -- the stat signature and the clock ------------------------------------------------------------

class _OtherDevice(object):
    """A stat that says what the recorded one said, except the device."""

    def __init__(self, st, recorded):
        for name in ("st_mode", "st_size", "st_mtime", "st_ctime", "st_atime"):
            setattr(self, name, getattr(st, name))
        self.st_size, self.st_mtime_ns, self.st_ctime_ns, self.st_ino = recorded[1:5]
        self.st_dev = recorded[5] + 1


def test_a_header_on_another_device_with_the_same_stat_is_compared_by_content(tmp_path, monkeypatch):
    header = tmp_path / "val.h"
    header.write_bytes(b"#define VAL 1.0f\n")
    monkeypatch.setattr(depsets, "RACY_SECONDS", 0.0)
    built = depsets.build([str(header)], [str(tmp_path)], [], [], b"", started=time.time() + 5)
    recorded = json.loads(built.blob.decode("ascii"))["files"][0]
    header.write_bytes(b"#define VAL 2.0f\n")  # same size; the stat below claims the old times and inode
    real_stat = os.stat
    monkeypatch.setattr(depsets, "_stat", lambda p: _OtherDevice(real_stat(p), recorded)
                        if p == str(header) else real_stat(p))
    depsets.forget()
    assert not depsets.fresh(built.section, {built.digest: built.blob}.get)


@pytest.mark.toolkit
def test_date_is_part_of_the_hit_and_time_is_never_cached(nvcc13, tmp_path, monkeypatch):
    dated = ('extern "C" __global__ void k(char* y) { const char d[] = __DATE__; '
             'for (int i = 0; i < 11; ++i) y[i] = d[i]; }\n')
    assert not ptxbackend.compile(dated, target="compute_75").cache_hit
    assert ptxbackend.compile(dated, target="compute_75").cache_hit
    monkeypatch.setattr(depsets, "today", lambda from_epoch=False: "Jan 01 2099")
    assert not ptxbackend.compile(dated, target="compute_75").cache_hit  # another day: compiled again
    timed = dated.replace("__DATE__", "__TIME__")
    assert not ptxbackend.compile(timed, target="compute_75").cache_hit
    assert not ptxbackend.compile(timed, target="compute_75").cache_hit


@pytest.mark.toolkit
def test_nvrtc_writes_the_clock_date_whatever_source_date_epoch_says(nvrtc117, monkeypatch):
    """NVRTC ignores SOURCE_DATE_EPOCH (nvcc honours it): with it set, a new day is still a miss."""
    monkeypatch.setenv("PTXBACKEND_NVRTC", nvrtc117)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1500000000")
    dated = ('extern "C" __global__ void k(char* y) { const char d[] = __DATE__; '
             'for (int i = 0; i < 11; ++i) y[i] = d[i]; }\n')
    assert not ptxbackend.compile(dated, target="compute_75", compiler="nvrtc").cache_hit
    assert ptxbackend.compile(dated, target="compute_75", compiler="nvrtc").cache_hit
    real = time.localtime
    monkeypatch.setattr(depsets.time, "localtime", lambda *a: real(time.time() + 86400 * 40))
    assert not ptxbackend.compile(dated, target="compute_75", compiler="nvrtc").cache_hit


@pytest.mark.toolkit
def test_a_header_dated_in_the_future_is_hashed_and_still_hits(nvcc13, tmp_path):
    header = tmp_path / "inc" / "val.h"
    _write(header, "#define VAL 1.0f\n")
    future = time.time() + 3 * 365 * 86400
    os.utime(str(header), (future, future))
    source = "#include <val.h>\n" + KERNEL
    options = ["-I", str(tmp_path / "inc")]
    assert not ptxbackend.compile(source, options, target="compute_75").cache_hit
    assert ptxbackend.compile(source, options, target="compute_75").cache_hit
    _a_new_process()
    assert ptxbackend.compile(source, options, target="compute_75").cache_hit
    _write(header, "#define VAL 2.0f\n")
    os.utime(str(header), (future, future))
    second = ptxbackend.compile(source, options, target="compute_75")
    assert not second.cache_hit and VALUE_2 in second.image


# -- what used to fail although the compiler alone succeeds ---------------------------------------

def _compiles_hits_then_sees(source, options, edit, **kwargs):
    """VAL is 1.0f, the same request hits, ``edit()`` makes it 2.0f, and the next request sees it."""
    kwargs.setdefault("target", "compute_75")
    assert VALUE_1 in ptxbackend.compile(source, options, **kwargs).image
    assert ptxbackend.compile(source, options, **kwargs).cache_hit
    edit()
    assert VALUE_2 in ptxbackend.compile(source, options, **kwargs).image


@pytest.mark.toolkit
@pytest.mark.parametrize("dirname", ["with\ttab", "with\nnewline", "with,comma", "with#hash", "with$dollar"])
def test_include_directories_with_odd_names_work_and_hit(nvcc13, tmp_path, dirname):
    header = tmp_path / dirname / "val.h"
    _write(header, "#define VAL 1.0f\n")
    source = "#include <val.h>\n" + KERNEL
    # nvcc takes -I a,b as two directories; a comma that is part of the name is quoted, as for nvcc.
    options = ["-I", ('"%s"' if "," in dirname else "%s") % (tmp_path / dirname)]
    _compiles_hits_then_sees(source, options, lambda: _write(header, "#define VAL 2.0f\n"))


@pytest.mark.toolkit
def test_a_backslash_in_an_include_directory_compiles_uncached(nvcc13, tmp_path):
    """nvcc writes a backslash in its dependency list as '/': the list cannot be trusted, the image can."""
    _write(tmp_path / "a\\b" / "val.h", "#define VAL 1.0f\n")
    source = "#include <val.h>\n" + KERNEL
    options = ["-I", str(tmp_path / "a\\b")]
    assert VALUE_1 in ptxbackend.compile(source, options, target="compute_75").image
    _write(tmp_path / "a\\b" / "val.h", "#define VAL 2.0f\n")
    assert VALUE_2 in ptxbackend.compile(source, options, target="compute_75").image


@pytest.mark.toolkit
def test_a_comma_list_of_options_files(nvcc13, tmp_path):
    _write(tmp_path / "a.txt", "-DVAL=1.0f\n")
    _write(tmp_path / "b.txt", "-DUNUSED=1\n")
    options = ["--options-file", "%s,%s" % (tmp_path / "a.txt", tmp_path / "b.txt")]
    _compiles_hits_then_sees(KERNEL, options, lambda: _write(tmp_path / "a.txt", "-DVAL=2.0f\n"))


@pytest.mark.toolkit
def test_a_relative_pre_include_found_on_the_include_path(nvcc13, tmp_path, monkeypatch):
    _write(tmp_path / "inc" / "val.h", "#define VAL 1.0f\n")
    monkeypatch.chdir(str(tmp_path))
    options = ["-I", "inc", "-include", "val.h"]
    _compiles_hits_then_sees(KERNEL, options, lambda: _write(tmp_path / "inc" / "val.h", "#define VAL 2.0f\n"))


@pytest.mark.toolkit
def test_an_nvrtc_include_directory_that_is_not_utf8(nvrtc117, tmp_path, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_NVRTC", nvrtc117)
    raw = os.fsencode(str(tmp_path)) + b"/inc\xff"
    os.makedirs(raw)
    with open(raw + b"/val.h", "wb") as handle:
        handle.write(b"#define VAL 1.0f\n")
    options = [b"-I" + raw]
    source = "#include <val.h>\n" + KERNEL

    def edit():
        with open(raw + b"/val.h", "wb") as handle:
            handle.write(b"#define VAL 2.0f\n")
    _compiles_hits_then_sees(source, options, edit, compiler="nvrtc")


@pytest.mark.toolkit
@pytest.mark.parametrize("option", [["-arch=sm_86"], ["-gencode", "arch=compute_80,code=sm_80"]])
def test_an_architecture_in_the_options_that_contradicts_the_target_is_a_clear_error(nvcc13, option):
    with pytest.raises(ptxbackend.errors.TargetError, match="other than the target compute_75"):
        ptxbackend.compile(KERNEL.replace("VAL", "1.0f"), option, target="compute_75")


# -- what nvcc.profile reads ----------------------------------------------------------------------

def _appended_variables(profile):
    names = set()
    with open(profile) as handle:
        for line in handle:
            head = line.split("=", 1)[0] if "=" in line else ""
            if line.split("=", 1)[0].rstrip().endswith("+") or (len(line.split("=", 1)) > 1
                                                               and line.split("=", 1)[1].startswith("+")):
                names.add(head.rstrip(" +\t"))
    return names - {"PATH", "LD_LIBRARY_PATH"}


@pytest.mark.toolkit
def test_every_variable_nvcc_profile_appends_to_is_in_the_key(nvcc13, nvcc112):
    """PATH (the host compiler, which has its own identity) and LD_LIBRARY_PATH (the toolkit's programs
    link only system libraries) are the two left out on purpose (docs/design.md)."""
    profiles = [os.path.join(os.path.dirname(os.path.realpath(nvcc13)), "nvcc.profile")]
    bundle = os.path.dirname(os.path.dirname(nvcc112))
    profiles.append(os.path.join(bundle, "cuda-11.2", "bin", "nvcc.profile"))
    found = set()
    for profile in profiles:
        if os.path.isfile(profile):
            found |= _appended_variables(profile)
    assert found and found <= set(NVCC_ENVIRONMENT)


# -- what a hit costs ----------------------------------------------------------------------------

def test_a_set_is_checked_once_per_process_then_only_after_a_change(tmp_path, monkeypatch):
    headers = [tmp_path / "inc" / ("h%d.h" % i) for i in range(50)]
    for header in headers:
        _write(header, "// %s\n" % header.name)
    built = depsets.build([str(h) for h in headers], [str(tmp_path / "inc")], [], [], b"",
                          started=time.time() + 5)
    load = {built.digest: built.blob}.get
    calls = []
    real_stat = os.stat
    monkeypatch.setattr(depsets, "_stat", lambda p: calls.append(p) or real_stat(p))
    depsets.forget()
    assert depsets.fresh(built.section, load)
    first = len(calls)
    assert first >= len(headers)
    if not watching.watcher or watching.watcher[0] is None:
        pytest.skip("no inotify here: every hit checks the set (PTXBACKEND_DEPS_RECHECK)")
    for _ in range(100):
        assert depsets.fresh(built.section, load)
    assert len(calls) == first  # watched: no stat at all on later hits
    _write(headers[7], "// edited\n")
    assert not depsets.fresh(built.section, load)  # the edit is seen at the very next hit


def test_a_forked_child_checks_for_itself(tmp_path):
    """A child inherits the parent's memory but not its watch: it must check the set itself."""
    code = """
import os, sys, time
from ptxbackend.dependencies import depsets
header = sys.argv[1]
built = depsets.build([header], [os.path.dirname(header)], [], [], b"", started=time.time() + 5)
load = {built.digest: built.blob}.get
assert depsets.fresh(built.section, load)
reader, writer = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(reader, 1)
    os._exit(0 if not depsets.fresh(built.section, load) else 3)
with open(header, "w") as handle:
    handle.write("// changed\\n")
os.write(writer, b"x")
print(os.waitpid(pid, 0)[1] >> 8)
"""
    header = tmp_path / "val.h"
    header.write_text("// one\n")
    out = subprocess.run([sys.executable, "-c", code, str(header)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(ptxbackend.__file__))))
    assert out.stdout.strip() == "0", out.stderr


@pytest.mark.toolkit
def test_cupy14_headers_cost_a_hit_little_and_an_entry_stays_small(nvcc13, tmp_path):
    """The issue's CPU acceptance: CuPy 14's real include tree (nvcc 13): a hit costs at most 1.25x a
    header-free hit, and an entry holds at most 2 KiB besides its payload.  Timed here only to report:
    benchmarks/bench_deps.py measures it (a test asserts no timing)."""
    cupy = pytest.importorskip("cupy")
    include = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
    cccl = os.path.join(include, "cupy", "_cccl")
    if not os.path.isdir(cccl):
        pytest.skip("this CuPy has no bundled CCCL")
    options = ["-I", include] + sum((["-I", os.path.join(cccl, d)] for d in ("libcudacxx", "cub", "thrust")), [])
    source = ('#include <cupy/complex.cuh>\n#include <cupy/carray.cuh>\n#include <cupy/atomics.cuh>\n'
              + KERNEL.replace("VAL", "1.0f"))
    art = ptxbackend.compile(source, options, target="compute_75", cache_dir=str(tmp_path / "c"))
    with open(art.path, "rb") as handle:
        blob = handle.read()
    assert len(blob) - len(art.image) <= 2048
    depset = json.loads(art.store.load_depset(art.deps.decode("ascii")).decode("ascii"))
    assert 100 < len(depset["files"]) < 400  # nvcc's own list (252 with CuPy 14.2), not a scan's ~1,000


# -- the list of files nvcc read, without a second preprocessing pass -----------------------------

@pytest.mark.toolkit
@pytest.mark.parametrize("compiler", ["nvcc13", "nvcc112"])
def test_the_host_preprocessor_lists_what_nvcc_would(compiler, request, tmp_path):
    """nvcc's own -MD runs the host preprocessor once more; -Xcompiler -MD writes the same list as a
    side effect of the pass nvcc runs anyway."""
    from ptxbackend.compilers.nvcc import NvccCompiler, probe_nvcc
    from ptxbackend.compilers.options import read_path_options
    from ptxbackend.compiling.targets import parse_target
    comp = NvccCompiler(probe_nvcc(request.getfixturevalue(compiler)))
    _write(tmp_path / "inc" / "my header.h", "#define VAL 1.0f\n")
    _write(tmp_path / "inc" / "val.h", '#include "my header.h"\n')
    source, options = "#include <val.h>\n" + KERNEL, ["-I", str(tmp_path / "inc")]
    target = parse_target("compute_75")
    assert comp._host_can_list(target, read_path_options(options), str(tmp_path / "out.d"))
    by_host = []
    comp.compile(source, options, target, "k.cu", by_host)
    real = comp._host_can_list
    comp._host_can_list = lambda *a: False
    by_nvcc = []
    comp.compile(source, options, target, "k.cu", by_nvcc)
    comp._host_can_list = real
    assert set(by_host) == set(by_nvcc) and len(set(by_host)) > 100  # gcc may name a file twice
    assert str(tmp_path / "inc" / "my header.h") in by_host


@pytest.mark.toolkit
def test_a_host_compiler_that_writes_no_list_falls_back_to_nvccs(nvcc13, tmp_path):
    host = tmp_path / "cc"
    # Drops -MD, -MF FILE and -MT TARGET: no list from the host.
    _write(host, '#!/bin/bash\nargs=()\nwhile [ $# -gt 0 ]; do case "$1" in -MD) ;; -MF|-MT) shift ;; '
                 '*) args+=("$1") ;; esac; shift; done\nexec gcc "${args[@]}"\n')
    os.chmod(str(host), 0o755)
    _write(tmp_path / "inc" / "val.h", "#define VAL 1.0f\n")
    source, options = "#include <val.h>\n" + KERNEL, ["-ccbin", str(host), "-I", str(tmp_path / "inc")]
    _compiles_hits_then_sees(source, options, lambda: _write(tmp_path / "inc" / "val.h", "#define VAL 2.0f\n"))


@pytest.mark.toolkit
def test_the_default_host_compiler_retargeted_while_a_process_runs_is_seen(nvcc13, tmp_path, monkeypatch):
    """nvcc finds `gcc` on PATH; the link is retargeted to a compiler that defines VAL otherwise."""
    one, two = _host_compiler(tmp_path, "gcc-one", "1.0f"), _host_compiler(tmp_path, "gcc-two", "2.0f")
    bindir = tmp_path / "hostbin"
    bindir.mkdir()
    os.symlink(str(one), str(bindir / "gcc"))
    os.symlink(shutil.which("g++") or "/usr/bin/g++", str(bindir / "g++"))
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))
    first = ptxbackend.compile(KERNEL, target="compute_75")
    assert VALUE_1 in first.image and ptxbackend.compile(KERNEL, target="compute_75").cache_hit
    os.unlink(str(bindir / "gcc"))
    os.symlink(str(two), str(bindir / "gcc"))
    second = ptxbackend.compile(KERNEL, target="compute_75")
    assert not second.cache_hit and VALUE_2 in second.image


# -- NVRTC's record of what it opened: one recorder per process, watches kept ---------------------

@pytest.mark.toolkit
def test_nvrtc_keeps_its_watches_between_compiles_and_sees_a_new_subdirectory(nvrtc117, tmp_path, monkeypatch):
    """The second compile adds no watch and walks no tree (the 10-30 ms a CuPy 14 kernel paid per
    compile); a directory created under an include root afterwards is walked and watched again, so
    a header read from it is a dependency like any other."""
    from ptxbackend.files import inotify as _inotify
    recorder = _inotify.OpenRecorder.shared()
    if recorder is None:
        pytest.skip("no inotify here: NVRTC's reads come from the include scan")
    monkeypatch.setenv("PTXBACKEND_NVRTC", nvrtc117)
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "inc"
    for i in range(20):
        _write(root / ("d%d" % i) / "h.h", "// %d\n" % i)
    _write(root / "val.h", "#define VAL 1.0f\n")
    options = ["-I", str(root)]
    compile_ = lambda source: ptxbackend.compile(source, options, target="compute_75", compiler="nvrtc")
    compile_("#include <val.h>\n" + KERNEL)
    watches = len(recorder._inotify.labels)
    assert watches >= 21
    walked = []
    real_walk = sys.modules["ptxbackend.dependencies.reads"].include_trees
    monkeypatch.setattr("ptxbackend.dependencies.reads.include_trees",
                        lambda *a: walked.append(a) or real_walk(*a))
    compile_("#include <val.h>\n// another kernel\n" + KERNEL)
    assert walked == [] and len(recorder._inotify.labels) == watches
    assert _inotify.OpenRecorder.shared() is recorder

    _write(root / "new" / "val2.h", "#define VAL 1.0f\n")
    source = "#include <new/val2.h>\n" + KERNEL
    assert VALUE_1 in compile_(source).image
    assert walked, "a directory appeared under a root: the tree must be walked again"
    _a_new_process()
    assert compile_(source).cache_hit
    _write(root / "new" / "val2.h", "#define VAL 2.0f\n")
    _a_new_process()
    again = compile_(source)
    assert not again.cache_hit and VALUE_2 in again.image


@pytest.mark.toolkit
def test_nvrtc_records_a_header_in_a_subdirectory_of_a_root_that_also_holds_a_direct_include(
        nvrtc117, tmp_path, monkeypatch):
    """The root's own directory is also the directory of a direct include: its subdirectories must
    still be watched (they were not, so ``sub/inner.h`` went unrecorded and an edit to it hit)."""
    monkeypatch.setenv("PTXBACKEND_NVRTC", nvrtc117)
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "inc"
    _write(root / "val.h", '#include "sub/inner.h"\n')
    _write(root / "sub" / "inner.h", "#define VAL 1.0f\n")
    source = "#include <val.h>\n" + KERNEL
    compile_ = lambda: ptxbackend.compile(source, ["-I", str(root)], target="compute_75", compiler="nvrtc")
    assert VALUE_1 in compile_().image
    _a_new_process()
    assert compile_().cache_hit
    _write(root / "sub" / "inner.h", "#define VAL 2.0f\n")
    _a_new_process()
    again = compile_()
    assert not again.cache_hit and VALUE_2 in again.image


def test_a_set_built_again_from_the_same_reads_is_remembered_until_a_header_changes(tmp_path, monkeypatch):
    """Every CuPy kernel reads the same headers: the second build is the first's set, with no stat at
    all; a header edited since is heard, and the set is built again from the file system."""
    import hashlib
    headers = [tmp_path / "inc" / ("h%d.h" % i) for i in range(30)]
    for header in headers:
        _write(header, "// %s\n" % header.name)
    depsets.forget()
    if not watching.watch([str(tmp_path / "inc")]):
        pytest.skip("no inotify here: every build looks at the file system")
    calls = []
    real_stat = os.stat
    monkeypatch.setattr(depsets, "_stat", lambda p: calls.append(p) or real_stat(p))
    args = ([str(h) for h in headers], [str(tmp_path / "inc")], [], [], b"#include <h0.h>\n")
    first = depsets.build(*args, started=time.time() + 5)
    looked = len(calls)
    assert looked >= len(headers)
    again = depsets.build(*args, started=time.time() + 5)
    assert again.digest == first.digest and len(calls) == looked
    _write(headers[3], "// edited\n")
    third = depsets.build(*args, started=time.time() + 5)
    assert len(calls) > looked and third.digest != first.digest
    record = [f for f in json.loads(third.blob.decode())["files"] if f[0] == str(headers[3])][0]
    assert record[6] == hashlib.sha256(b"// edited\n").hexdigest()


def test_doctor_says_how_the_headers_of_each_place_are_checked(tmp_path, monkeypatch):
    """On a network file system every hit looks at every header (the H200's hook hit cost twice
    0.2.0's and could not be told why): doctor says which way each place goes."""
    from ptxbackend.cli import doctor
    monkeypatch.chdir(tmp_path)
    depsets.forget()
    monkeypatch.setattr(watching, "mount_type", lambda path: "nfs4")
    how = depsets.watch_mode(str(tmp_path))
    assert "every hit" in how and "nfs4" in how and "PTXBACKEND_DEPS_RECHECK" in how
    text = doctor.render(doctor.collect())
    assert "headers under %s: checked on every hit" % os.getcwd() in text, text
    depsets.forget()
    monkeypatch.setattr(watching, "mount_type", lambda path: "ext4")
    assert depsets.watch_mode(str(tmp_path)).startswith(("checked once per process", "checked on every hit: no inotify"))

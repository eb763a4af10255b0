"""Option and dependency-list parsing checked against what the real nvcc does."""

import os
import shutil
import subprocess

import pytest

from ptxbackend.dependencies.depfiles import parse_depfile
from ptxbackend.compilers.options import expand_option_files, read_path_options, split_list, split_options_file

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
KERNEL = b"#include <val.h>\n__global__ void k(int *p) { *p = VAL; }\n"
# Every byte nvcc 13 accepts in an -I directory (a comma splits the list, quotes and
# backquotes break its shell): each must come back exactly from the dependency list.
ODD_NAMES = [b"sp ace", b"two  sp", b"ta\tb", b"ha#sh", b"dol$lar", b"d$$d", b"new\nline", b"cr\rx",
             b"co:lon", b"co: lon", b"pct%x", b"bad\xffbyte", b"u\xc3\xa9", b"semi;x", b"eq=x"]


def _nvcc(cwd, *args, **env):
    environ = dict(os.environ, **env)
    return subprocess.run([NVCC, "--ptx", "-arch=compute_75"] + list(args), cwd=str(cwd), env=environ,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _depfile_compile(work, *args, **env):
    """The files nvcc itself lists for a compile of k.cu, parsed; None when it fails."""
    (work / "k.cu").write_bytes(KERNEL)
    depfile = work / "out.d"
    if depfile.exists():
        depfile.unlink()
    done = _nvcc(work, "-MD", "-MF", "out.d", "k.cu", "-o", "out.ptx", *args, **env)
    if done.returncode != 0:
        return None
    # bytes (or newline=""): universal newlines would turn a CR in a name into a newline
    return parse_depfile(depfile.read_bytes(), str(work), target="out.ptx")


def _header_dir(tmp_path, name, value=1):
    directory = os.path.join(os.fsencode(str(tmp_path)), name)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, b"val.h"), "wb") as handle:
        handle.write(b"#define VAL %d\n" % value)
    return os.fsdecode(directory)


@needs_nvcc
@pytest.mark.parametrize("name", ODD_NAMES, ids=[repr(n) for n in ODD_NAMES])
def test_depfile_paths_come_back_exactly(tmp_path, name):
    work = tmp_path / "w"
    work.mkdir()
    directory = _header_dir(tmp_path, name)
    found = _depfile_compile(work, "-I", directory)
    assert found is not None
    assert os.path.join(directory, "val.h") in found
    assert str(work / "k.cu") in found


@needs_nvcc
def test_depfile_backslash_is_detected(tmp_path):
    # nvcc writes a backslash as '/': the listed file does not exist, and that is caught.
    work = tmp_path / "w"
    work.mkdir()
    directory = _header_dir(tmp_path, b"back\\slash")
    with pytest.raises(ValueError, match="backslash"):
        _depfile_compile(work, "-I", directory)


def test_depfile_format_edges():
    text = "/t/a : b/o.ptx : k.cu \\\n    /x/sp\\ ace/h.h \\\n    /x/new\\nl/t\tab#$$:.h\n"
    assert parse_depfile(text, "/w", target="/t/a : b/o.ptx", check_exists=False) == [
        "/w/k.cu", "/x/sp ace/h.h", "/x/new\nl/t\tab#$$:.h"]
    assert parse_depfile("out.ptx: k.cu\n", "/w", check_exists=False) == ["/w/k.cu"]
    assert parse_depfile(b"o : k\xff.cu\n", "/w", check_exists=False) == ["/w/k\udcff.cu"]
    for bad, why in [("o : k.cu", "cut short"), ("a : b : k.cu\n", "target"),
                     ("o : k\\#.cu\n", "escape"), ("o : a\nb : c\n", "more than one rule")]:
        with pytest.raises(ValueError, match=why):
            parse_depfile(bad, "/w", check_exists=False)


@needs_nvcc
def test_comma_lists_split_like_nvcc(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    good, odd = _header_dir(tmp_path, b"good"), _header_dir(tmp_path, b"c,m", 2)
    for flag in ("-I", "-isystem", "--include-path="):
        value = str(tmp_path / "nope") + "," + good
        args = [flag + value] if flag.endswith("=") else [flag, value]
        parsed = read_path_options(args)
        assert parsed.named_dirs == [str(tmp_path / "nope"), good]
        assert os.path.join(good, "val.h") in _depfile_compile(work, *args)
    # nvcc splits a comma inside a directory name, unless the value quotes it
    assert _depfile_compile(work, "-I", odd) is None
    assert read_path_options(["-I", odd], str(work)).include_dirs == [odd.split(",")[0], str(work / "m")]
    quoted = '"%s"' % odd
    assert read_path_options(["-I", quoted]).include_dirs == [odd]
    assert os.path.join(odd, "val.h") in _depfile_compile(work, "-I", quoted)


def test_relative_comma_list_is_rewritten(tmp_path):
    parsed = read_path_options(["-I", "a,/abs,c,d", "-optf", "x.txt,y.txt"], str(tmp_path))
    assert parsed.options == ("-I", "%s/a,/abs,%s/c,%s/d" % ((tmp_path,) * 3),
                              "-optf", "%s/x.txt,%s/y.txt" % ((tmp_path,) * 2))
    assert parsed.option_files == [str(tmp_path / "x.txt"), str(tmp_path / "y.txt")]
    assert split_list('a,"b,c",d') == ["a", "b,c", "d"]


@needs_nvcc
def test_pre_include_found_in_cwd_then_on_include_path(tmp_path):
    work, inc = tmp_path / "w", tmp_path / "inc"
    work.mkdir()
    inc.mkdir()
    (inc / "val.h").write_text("#define VAL 1\n")
    # not in cwd: nvcc finds it on the include path, so the name must stay as it is
    parsed = read_path_options(["-include", "val.h", "-I", str(inc)], str(work))
    assert parsed.options == ("-include", "val.h", "-I", str(inc)) and parsed.pre_includes == []
    assert parsed.pre_include_names == ["val.h"]
    assert parsed.resolve_pre_includes() == [str(inc / "val.h")]
    assert str(inc / "val.h") in _depfile_compile(work, "-include", "val.h", "-I", str(inc))
    # in cwd: nvcc takes that one first
    (work / "val.h").write_text("#define VAL 2\n")
    parsed = read_path_options(["-include", "val.h", "-I", str(inc)], str(work))
    assert parsed.pre_includes == [str(work / "val.h")] and parsed.pre_include_names == []
    assert str(work / "val.h") in _depfile_compile(work, "-include", "val.h", "-I", str(inc))
    # a comma list of pre-includes is split
    assert read_path_options(["-include", "/a.h,/b.h"]).pre_includes == ["/a.h", "/b.h"]


def test_bytes_options(tmp_path):
    parsed = read_path_options([b"-I", b"inc\xff", b"-DX", "-Isub"], str(tmp_path))
    assert parsed.options == (b"-I", os.fsencode(str(tmp_path)) + b"/inc\xff", b"-DX",
                              "-I" + str(tmp_path / "sub"))
    assert parsed.include_dirs == [str(tmp_path) + "/inc\udcff", str(tmp_path / "sub")]
    absolute = [b"-I/abs/\xfe", b"-DY"]
    assert read_path_options(absolute).options == tuple(absolute)


def test_options_file_splitting_rules():
    text = '-I "/a b" -I/x/"y z"\t-DA=\\"q\\"\n-DS=\'1 # 2\' ""  \\\\x'
    assert split_options_file(text) == ["-I", "/a b", "-I/x/y z", '-DA="q"', "-DS='1", "#", "2'", "",
                                        "\\x"]
    with pytest.raises(ValueError, match="quote"):
        split_options_file('-I "/a')


@needs_nvcc
def test_options_file_quotes_and_escapes_as_nvcc(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    directory = _header_dir(tmp_path, b"sp ace")
    for text in ('-I "%s"\n' % directory, "-I %s\n" % directory.replace(" ", "\\ "),
                 '-I%s"%s"\n' % tuple(directory.split("sp", 1)[0:1] + ["sp" + directory.split("sp", 1)[1]])):
        optf = tmp_path / "o.txt"
        optf.write_text(text)
        parsed = expand_option_files(["-optf", str(optf)], str(work), {})
        assert parsed.include_dirs == [directory]
        assert parsed.option_files == [str(optf)]
        assert os.path.join(directory, "val.h") in _depfile_compile(work, "-optf", str(optf))
        # the expanded options reach the same header without reading the file
        assert os.path.join(directory, "val.h") in _depfile_compile(work, *parsed.options)


@needs_nvcc
def test_options_file_paths_are_relative_to_cwd_and_nested(tmp_path):
    work, sub = tmp_path / "w", tmp_path / "sub"
    work.mkdir()
    sub.mkdir()
    _header_dir(work, b"rel", 1)
    _header_dir(sub, b"rel", 2)
    (sub / "outer.txt").write_text("-DX --options-file inner.txt,second.txt\n")
    (work / "inner.txt").write_text("-I rel\n")  # nvcc looks beside cwd, not beside outer.txt
    (work / "second.txt").write_text("-isystem /sys\n")
    (sub / "inner.txt").write_text("-I /wrong\n")
    parsed = expand_option_files(["-optf=" + str(sub / "outer.txt")], str(work), {})
    assert parsed.option_files == [str(sub / "outer.txt"), str(work / "inner.txt"), str(work / "second.txt")]
    assert parsed.include_dirs == [str(work / "rel")] and parsed.system_dirs == ["/sys"]
    assert parsed.options == ("-DX", "-I", str(work / "rel"), "-isystem", "/sys")
    assert str(work / "rel" / "val.h") in _depfile_compile(work, "-optf=" + str(sub / "outer.txt"))


@needs_nvcc
def test_env_flags_and_their_option_files(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    directory, other = _header_dir(tmp_path, b"sp ace"), _header_dir(tmp_path, b"other", 2)
    (work / "e.txt").write_text("-I %s\n" % other)
    env = {"NVCC_PREPEND_FLAGS": '-I "%s"' % directory, "NVCC_APPEND_FLAGS": "-optf e.txt -ccbin gcc"}
    parsed = expand_option_files(["-DX"], str(work), env)
    assert parsed.include_dirs == [directory, other]
    assert parsed.option_files == [str(work / "e.txt")] and parsed.ccbin == "gcc"
    assert parsed.options == ("-DX",)  # nvcc reads the variables itself
    found = _depfile_compile(work, **env)
    assert os.path.join(directory, "val.h") in found and str(work / "e.txt") not in found


@needs_nvcc
def test_options_file_bounds(tmp_path):
    loop = tmp_path / "loop.txt"
    loop.write_text("-optf %s\n" % loop)
    with pytest.raises(ValueError, match="names itself"):
        expand_option_files(["-optf", str(loop)], str(tmp_path), {})
    assert b"Too many options file" in _nvcc(tmp_path, "k.cu", "-optf", str(loop)).stdout
    chain = [tmp_path / ("c%d.txt" % i) for i in range(70)]
    for here, there in zip(chain, chain[1:]):
        here.write_text("-optf %s\n" % there)
    chain[-1].write_text("-DX\n")
    with pytest.raises(ValueError, match="more than 64"):
        expand_option_files(["-optf", str(chain[0])], str(tmp_path), {})
    big = tmp_path / "big.txt"
    big.write_bytes(b"-DX " * (1 << 18) + b" ")
    with pytest.raises(ValueError, match="larger than"):
        expand_option_files(["-optf", str(big)], str(tmp_path), {})

"""Stale hits found on 0.4.0 by an adversarial user, one test per class, with nvcc (CUDA 13 on PATH) and
NVRTC 13.5: a header reached through a symbolic link, a ``..`` include leaving the watched trees,
``#include_next`` past a directory that must stay empty, an edit through a link or a hard link seen by
a long-lived process, and an empty ``mkdir`` on the way to a missing ``-I`` directory (not a change).

Each test compiles, changes one thing, then asserts the value the kernel stores is the one the compiler
gives for the files as they are now (known by construction), in this process and in a new one.
"""

import json
import os
import re
import struct
import sys

import pytest

import ptxbackend
from conftest import run_python

KERNEL = 'extern "C" __global__ void k(float* y) { y[0] = VAL; }\n'

CHILD = r'''
import json, re, struct, sys
import ptxbackend
compiler, source, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
a = ptxbackend.compile(source, options, target="compute_90", compiler=compiler)
bits = re.search(r"mov\.u32\s+%r\d+, (\d+);", bytes(a.image).decode()).group(1)
print(struct.unpack("f", struct.pack("I", int(bits)))[0])
'''


def value(artifact):
    bits = re.search(r"mov\.u32\s+%r\d+, (\d+);", bytes(artifact.image).decode()).group(1)
    return struct.unpack("f", struct.pack("I", int(bits)))[0]


def write(path, text):
    path = str(path)
    if not os.path.isdir(os.path.dirname(path)):
        os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write(text)


def edit_in_place(path, text):
    """Rewrite the bytes of the file itself (its inode), as an editor that does not rename does."""
    with open(str(path), "r+") as handle:
        handle.seek(0)
        handle.truncate()
        handle.write(text)


@pytest.fixture(params=["nvcc", "nvrtc"])
def compiler(request, monkeypatch):
    if request.param == "nvcc":
        request.getfixturevalue("nvcc13")
    else:
        monkeypatch.setenv("PTXBACKEND_NVRTC", request.getfixturevalue("nvrtc_pch"))
    return request.param


def here(compiler, source, options):
    return ptxbackend.compile(source, list(options), target="compute_90", compiler=compiler)


def new_process(compiler, source, options):
    return float(run_python(CHILD.replace("sys.argv[1], sys.argv[2], json.loads(sys.argv[3])",
                                          "%r, %r, %s" % (compiler, source, json.dumps(list(options))))).split()[-1])


def test_a_header_reached_through_a_symbolic_link_is_recorded(compiler, tmp_path):
    write(tmp_path / "real" / "val.cuh", "#define VAL 1.0f\n")
    (tmp_path / "inc").mkdir()
    os.symlink(os.path.join("..", "real", "val.cuh"), str(tmp_path / "inc" / "val.cuh"))
    source, options = '#include <val.cuh>\n' + KERNEL, ["-I", str(tmp_path / "inc")]
    assert value(here(compiler, source, options)) == 1.0
    write(tmp_path / "real" / "val.cuh", "#define VAL 2.0f\n")
    assert new_process(compiler, source, options) == 2.0
    assert value(here(compiler, source, options)) == 2.0


def test_a_header_edited_in_place_through_a_symbolic_link_is_seen_by_a_long_lived_process(compiler, tmp_path):
    write(tmp_path / "real" / "val.cuh", "#define VAL 1.0f\n")
    (tmp_path / "inc").mkdir()
    os.symlink(str(tmp_path / "real" / "val.cuh"), str(tmp_path / "inc" / "val.cuh"))
    source, options = '#include <val.cuh>\n' + KERNEL, ["-I", str(tmp_path / "inc")]
    assert value(here(compiler, source, options)) == 1.0
    assert here(compiler, source, options).cache_hit  # checked once, then watched
    edit_in_place(tmp_path / "real" / "val.cuh", "#define VAL 2.0f\n")
    assert value(here(compiler, source, options)) == 2.0


def test_a_dotdot_include_leaving_the_include_tree_is_recorded(compiler, tmp_path):
    write(tmp_path / "inc" / "a.cuh", '#include "../common/b.cuh"\n')
    write(tmp_path / "common" / "b.cuh", "#define VAL 1.0f\n")
    source, options = '#include <a.cuh>\n' + KERNEL, ["-I", str(tmp_path / "inc")]
    assert value(here(compiler, source, options)) == 1.0
    write(tmp_path / "common" / "b.cuh", "#define VAL 2.0f\n")
    assert new_process(compiler, source, options) == 2.0
    assert value(here(compiler, source, options)) == 2.0


def test_include_next_records_the_directories_after_the_includer_that_must_stay_empty(compiler, tmp_path):
    write(tmp_path / "A" / "val.cuh", "#include_next <val.cuh>\n")
    write(tmp_path / "C" / "val.cuh", "#define VAL 1.0f\n")
    (tmp_path / "B").mkdir()
    source = '#include <val.cuh>\n' + KERNEL
    options = ["-I", str(tmp_path / "A"), "-I", str(tmp_path / "B"), "-I", str(tmp_path / "C")]
    assert value(here(compiler, source, options)) == 1.0
    write(tmp_path / "B" / "val.cuh", "#define VAL 2.0f\n")
    assert new_process(compiler, source, options) == 2.0
    assert value(here(compiler, source, options)) == 2.0


def test_a_header_reached_by_include_next_through_a_symbolic_link_is_recorded(compiler, tmp_path):
    # NVRTC reports the open in the link target's directory; the include scan that fills that gap
    # has to follow #include_next too, or the header is in no set (found by the stale-hit fuzzer).
    write(tmp_path / "A" / "val.cuh", "#include_next <val.cuh>\n")
    write(tmp_path / "real" / "v.cuh", "#define VAL 1.0f\n")
    (tmp_path / "B").mkdir()
    os.symlink(os.path.join("..", "real", "v.cuh"), str(tmp_path / "B" / "val.cuh"))
    source = '#include <val.cuh>\n' + KERNEL
    options = ["-I", str(tmp_path / "A"), "-I", str(tmp_path / "B")]
    assert value(here(compiler, source, options)) == 1.0
    edit_in_place(tmp_path / "real" / "v.cuh", "#define VAL 2.0f\n")
    assert value(here(compiler, source, options)) == 2.0
    assert new_process(compiler, source, options) == 2.0


def test_an_edit_through_a_hard_link_elsewhere_is_seen_by_a_long_lived_process(compiler, tmp_path):
    write(tmp_path / "inc" / "val.cuh", "#define VAL 1.0f\n")
    (tmp_path / "elsewhere").mkdir()
    os.link(str(tmp_path / "inc" / "val.cuh"), str(tmp_path / "elsewhere" / "val.cuh"))
    source, options = '#include <val.cuh>\n' + KERNEL, ["-I", str(tmp_path / "inc")]
    assert value(here(compiler, source, options)) == 1.0
    assert here(compiler, source, options).cache_hit
    edit_in_place(tmp_path / "elsewhere" / "val.cuh", "#define VAL 2.0f\n")
    assert value(here(compiler, source, options)) == 2.0


def test_an_empty_mkdir_on_the_way_to_a_missing_include_directory_is_not_a_change(compiler, tmp_path):
    write(tmp_path / "inc" / "val.cuh", "#define VAL 1.0f\n")
    missing = tmp_path / "later" / "deeper" / "inc"
    source = '#include <val.cuh>\n' + KERNEL
    options = ["-I", str(missing), "-I", str(tmp_path / "inc")]
    assert value(here(compiler, source, options)) == 1.0
    (tmp_path / "later").mkdir()
    assert here(compiler, source, options).cache_hit, "an empty directory made a miss"
    assert new_process(compiler, source, options) == 1.0
    # ... while the header itself appearing there is a change, in this process too.
    write(missing / "val.cuh", "#define VAL 2.0f\n")
    assert value(here(compiler, source, options)) == 2.0
    assert new_process(compiler, source, options) == 2.0


def test_retargeting_a_link_in_the_middle_of_a_chain_is_seen_by_a_long_lived_process(compiler, tmp_path):
    write(tmp_path / "real" / "one.cuh", "#define VAL 1.0f\n")
    write(tmp_path / "real" / "two.cuh", "#define VAL 2.0f\n")
    (tmp_path / "inc").mkdir()
    (tmp_path / "mid").mkdir()
    os.symlink(str(tmp_path / "real" / "one.cuh"), str(tmp_path / "mid" / "val.cuh"))
    os.symlink(str(tmp_path / "mid" / "val.cuh"), str(tmp_path / "inc" / "val.cuh"))
    source, options = '#include <val.cuh>\n' + KERNEL, ["-I", str(tmp_path / "inc")]
    assert value(here(compiler, source, options)) == 1.0
    assert here(compiler, source, options).cache_hit
    os.rename(str(tmp_path / "mid" / "val.cuh"), str(tmp_path / "mid" / "old.cuh"))
    os.symlink(str(tmp_path / "real" / "two.cuh"), str(tmp_path / "mid" / "val.cuh"))
    assert value(here(compiler, source, options)) == 2.0


def test_retargeting_a_directory_link_to_an_identical_header_with_a_different_sibling_is_seen_by_a_new_process(
        compiler, tmp_path):
    # The chain is not stored link by link: the set records the spelt path and what it resolves to
    # today.  This pins that a retarget whose new target has the same bytes, but whose quoted
    # neighbour differs, still misses in a process that never watched the link.
    for name, val in (("one", "1.0f"), ("two", "2.0f")):
        write(tmp_path / name / "a.cuh", '#include "b.cuh"\n')
        write(tmp_path / name / "b.cuh", "#define VAL %s\n" % val)
    (tmp_path / "inc").mkdir()
    os.symlink(str(tmp_path / "one"), str(tmp_path / "inc" / "lib"))
    source, options = '#include <lib/a.cuh>\n' + KERNEL, ["-I", str(tmp_path / "inc")]
    assert value(here(compiler, source, options)) == 1.0
    os.rename(str(tmp_path / "inc" / "lib"), str(tmp_path / "inc" / "old"))
    os.symlink(str(tmp_path / "two"), str(tmp_path / "inc" / "lib"))
    assert new_process(compiler, source, options) == 2.0
    assert value(here(compiler, source, options)) == 2.0


def test_a_header_appearing_where_a_retargeted_directory_link_now_leads_is_seen_by_a_long_lived_process(
        compiler, tmp_path):
    # `-I inc` (a link to an empty directory) before `-I other`: val.cuh must stay absent in inc.  The
    # link is retargeted to another empty directory (still absent: a hit), then val.cuh appears
    # there.  A watch made on the name `inc` still watched the old directory, which heard nothing.
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    write(tmp_path / "other" / "val.cuh", "#define VAL 1.0f\n")
    os.symlink(str(tmp_path / "one"), str(tmp_path / "inc"))
    source, options = '#include <val.cuh>\n' + KERNEL, ["-I", str(tmp_path / "inc"), "-I", str(tmp_path / "other")]
    assert value(here(compiler, source, options)) == 1.0
    assert here(compiler, source, options).cache_hit
    os.symlink(str(tmp_path / "two"), str(tmp_path / "inc.new"))
    os.rename(str(tmp_path / "inc.new"), str(tmp_path / "inc"))
    assert here(compiler, source, options).cache_hit  # nothing the compiler reads changed
    write(tmp_path / "two" / "val.cuh", "#define VAL 2.0f\n")
    assert value(here(compiler, source, options)) == 2.0
    assert new_process(compiler, source, options) == 2.0

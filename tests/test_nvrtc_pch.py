"""NVRTC's precompiled headers (12.8+) and the cache: what such a compile returns is never cached.

NVRTC keeps a precompiled header in the process and reuses it for a later compile with the same
options without opening the headers again, also after one of them changed.  These tests use a real
NVRTC 13.5 (CI unpacks it; PTXBACKEND_TEST_NVRTC_PCH).
"""

import logging
import os
import re
import struct
import subprocess
import sys

import pytest

import ptxbackend
from ptxbackend.compilers.nvrtc import uses_precompiled_headers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SOURCE = '#include "val.cuh"\nextern "C" __global__ void k%d(float* y) { y[0] = VAL + %d.0f; }\n'

# The value kernel N stores, as a fresh process compiles it now (prints VAL + N).
FRESH = r'''
import re, struct, sys
import ptxbackend
source, inc, i = sys.argv[1], sys.argv[2], int(sys.argv[3])
a = ptxbackend.compile(source, ("-I", inc, "--pch"), target="compute_90", compiler="nvrtc")
bits = re.search(r"mov\.u32\s+%r\d+, (\d+);", bytes(a.image).decode()).group(1)
print(struct.unpack("f", struct.pack("I", int(bits)))[0])
'''


def _stored(artifact):
    bits = re.search(r"mov\.u32\s+%r\d+, (\d+);", bytes(artifact.image).decode()).group(1)
    return struct.unpack("f", struct.pack("I", int(bits)))[0]


@pytest.fixture
def headers(tmp_path, nvrtc_pch, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_NVRTC", nvrtc_pch)
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "val.cuh").write_text(u"#pragma once\n#define VAL 1.0f\n")
    return inc


def _compile(inc, i):
    return ptxbackend.compile(SOURCE % (i, i), ("-I", str(inc), "--pch"), target="compute_90", compiler="nvrtc")


def _fresh_process(inc, i):
    env = dict(os.environ, PYTHONPATH=REPO)
    out = subprocess.check_output([sys.executable, "-c", FRESH, SOURCE % (i, i), str(inc), str(i)], env=env)
    return float(out.decode().split()[-1])


def test_a_kernel_that_reused_a_precompiled_header_is_not_cached_so_a_new_process_sees_the_edit(headers):
    assert _stored(_compile(headers, 0)) == 1.0       # VAL + 0; makes the precompiled header
    (headers / "val.cuh").write_text(u"#pragma once\n#define VAL 2.0f\n")
    # NVRTC itself reuses the header it has: kernel 1 computes 1 + 1 in this process, not 2 + 1.  Had
    # ptxbackend filed that (with the empty list of reads such a compile shows), later processes would get it.
    assert _stored(_compile(headers, 1)) == 2.0, "NVRTC saw the edit: revisit nvrtc.py's precompiled headers"
    assert _fresh_process(headers, 1) == 3.0


def test_an_entry_an_older_version_filed_for_pch_options_is_never_served(headers, monkeypatch):
    # 0.4.0 cached --pch compiles like any other: emulate it for the two compiles of the first process.
    monkeypatch.setattr("ptxbackend.compilers.nvrtc.uses_precompiled_headers", lambda options: False)
    monkeypatch.setattr("ptxbackend.compiling.request.uses_precompiled_headers", lambda options: False)
    _compile(headers, 0)
    _compile(headers, 1)  # reused the precompiled header: filed with no headers in its list
    (headers / "val.cuh").write_text(u"#pragma once\n#define VAL 2.0f\n")
    assert _fresh_process(headers, 1) == 3.0


def test_compiles_with_precompiled_headers_say_once_why_they_are_not_cached(headers, caplog):
    with caplog.at_level(logging.WARNING, logger="ptxbackend"):
        _compile(headers, 0)
        _compile(headers, 1)
        again = _compile(headers, 1)
    assert not again.cache_hit
    said = [r.getMessage() for r in caplog.records if "precompiled headers" in r.getMessage()]
    assert len(said) <= 1 and all("not cached" in m for m in said)


@pytest.mark.parametrize("options, expected", [
    (["--pch"], True), (["-pch"], True), (["--use-pch=k.pch"], True), (["-create-pch=k.pch"], True),
    (["--std=c++17", "--pch"], True),
    (["--pch-verbose=true"], False), (["-DPCH"], False), (["--std=c++17"], False), ([], False),
])
def test_which_options_make_or_use_a_precompiled_header(options, expected):
    assert uses_precompiled_headers(options) is expected


# -- ptxbackend's own use of them (PTXBACKEND_NVRTC_PCH=1, precompiled.py) --------------------------------

def _own(inc, i, *dirs, **kwargs):
    options = sum((("-I", str(d)) for d in dirs or (inc,)), ())
    return ptxbackend.compile(SOURCE % (i, i), options, target=kwargs.get("target", "compute_90"),
                              compiler="nvrtc")


@pytest.fixture
def own_pch(headers, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_NVRTC_PCH", "1")
    return headers


def test_own_precompiled_headers_see_a_header_edited_between_two_compiles_of_one_process(own_pch):
    assert _stored(_own(own_pch, 0)) == 1.0
    (own_pch / "val.cuh").write_text(u"#pragma once\n#define VAL 2.0f\n")
    assert _stored(_own(own_pch, 1)) == 3.0  # NVRTC alone would reuse its header: 1 + 1


def test_a_compile_that_reused_the_precompiled_header_records_the_headers_it_was_made_of(own_pch):
    _own(own_pch, 0)
    first = _own(own_pch, 1)  # NVRTC opens no header for this one
    assert b"val.cuh" in first.store.load_depset(first.deps.decode()), "kernel 1's set lacks the header"
    (own_pch / "val.cuh").write_text(u"#pragma once\n#define VAL 2.0f\n")
    env = dict(os.environ, PYTHONPATH=REPO)
    env["PTXBACKEND_NVRTC_PCH"] = "0"  # the new process compiles from the headers, not a precompiled one
    out = subprocess.check_output([sys.executable, "-c", FRESH.replace('"--pch"', ""), SOURCE % (1, 1),
                                   str(own_pch), "1"], env=env)
    assert float(out.decode().split()[-1]) == 3.0


def test_own_precompiled_headers_see_a_new_header_that_shadows_one_they_hold(own_pch, tmp_path):
    first = tmp_path / "first"
    first.mkdir()
    assert _stored(_own(own_pch, 0, first, own_pch)) == 1.0
    (first / "val.cuh").write_text(u"#pragma once\n#define VAL 5.0f\n")
    assert _stored(_own(own_pch, 1, first, own_pch)) == 6.0


def test_own_precompiled_headers_change_no_byte(headers, monkeypatch, tmp_path):
    monkeypatch.setenv("PTXBACKEND_NVRTC_PCH", "0")
    plain = [bytes(_own(headers, i).image) for i in range(3)]
    monkeypatch.setenv("PTXBACKEND_NVRTC_PCH", "1")
    monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(tmp_path / "with-pch"))
    assert [bytes(_own(headers, i).image) for i in range(3)] == plain


def test_an_nvrtc_without_precompiled_headers_is_not_asked_for_them(nvrtc117, monkeypatch, tmp_path):
    monkeypatch.setenv("PTXBACKEND_NVRTC", nvrtc117)
    monkeypatch.setenv("PTXBACKEND_NVRTC_PCH", "1")
    (tmp_path / "val.cuh").write_text(u"#pragma once\n#define VAL 1.0f\n")
    assert _stored(_own(tmp_path, 0, target="compute_87")) == 1.0


def test_own_precompiled_headers_are_on_by_default_and_0_turns_them_off(headers, monkeypatch):
    from ptxbackend.config import load_settings
    monkeypatch.delenv("PTXBACKEND_NVRTC_PCH", raising=False)
    assert load_settings().nvrtc_pch is True
    monkeypatch.setenv("PTXBACKEND_NVRTC_PCH", "0")
    assert load_settings().nvrtc_pch is False


def test_a_failed_compile_ends_the_generation_so_no_compile_reuses_its_precompiled_header(own_pch):
    # A typo: NVRTC still made a precompiled header from val.cuh (VAL 1) before it failed.
    with pytest.raises(ptxbackend.CompileError):
        ptxbackend.compile(SOURCE.replace("y[0] =", "y[0] = oops +") % (1, 1), ("-I", str(own_pch)),
                           target="compute_90", compiler="nvrtc")
    (own_pch / "val.cuh").write_text(u"#pragma once\n#define VAL 2.0f\n")
    fixed = _own(own_pch, 1)
    assert _stored(fixed) == 3.0, "the fixed kernel reused the failed compile's precompiled header"
    assert b"val.cuh" in fixed.store.load_depset(fixed.deps.decode()), "filed with no headers read"


def test_no_compile_is_filed_that_may_have_reused_a_precompiled_header_of_unknown_reads(own_pch):
    import threading
    from ptxbackend.compiling import precompiled
    from ptxbackend.dependencies.reads import UNKNOWN_READS
    generation = precompiled.current()
    options = ("-I", str(own_pch))
    other = precompiled.start(generation, options)  # another thread's compile, still running
    mine = precompiled.start(generation, options)
    result = []
    waiting = threading.Thread(target=lambda: result.append(precompiled.finish(mine, [str(own_pch / "val.cuh")])))
    waiting.start()
    waiting.join(0.5)
    assert not result, "filed before a compile it may have reused the precompiled header of was done"
    precompiled.finish(other, [UNKNOWN_READS + "could not be told"])
    waiting.join(10)
    assert any(p.startswith(UNKNOWN_READS) for p in result[0])
    assert precompiled.current() is not generation

"""Corruption fuzz: every damaged entry is detected, reported once, never loaded, and rebuilt.

The entries are real (PTX, cubin and fatbin from the real nvcc, compiled once); hypothesis then
damages them in every way the format can be damaged and the store reads them back the way
``compile()`` does.  A smaller set goes through ``compile()`` itself, real rebuild included.
Figures go to lines starting with ``reliability:`` (run with ``-s``).
"""

import collections
import contextlib
import logging
import os
import shutil
import signal
import struct

import pytest

from conftest import Captured, figures, store_name
from hypothesis import HealthCheck, given, settings, strategies as st

import ptxbackend
from ptxbackend.cache import entry

pytestmark = pytest.mark.reliability

CASES = 1000
PER_KIND = 120  # 16 kinds of damage; those with few variants (an empty file) end early
REASONS = ("shorter than the header", "bad magic", "schema", "reserved field", "unknown kind code",
           "header says", "checksum mismatch", "entry belongs to key", "entry holds", "not a regular file")
HEADER = struct.Struct("<4sHBBIIQ64sI")
KERNEL = r'''
extern "C" __global__ void scale(float a, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * y[i];
}
'''


@contextlib.contextmanager
def captured(name, quiet=False):
    """Records of logger ``name``; ``quiet`` keeps them off stderr (a thousand would flood ``-s``)."""
    handler = Captured()
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    propagate = logger.propagate
    if quiet:
        logger.propagate = False
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


class Hang(Exception):
    pass


@contextlib.contextmanager
def no_hang(seconds=10):
    """Turn a read that blocks (a FIFO opened without O_NONBLOCK) into an exception, not a stuck CI."""
    def expire(*_args):
        raise Hang()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def damage_kinds():
    """``(name, function(blob, draw) -> damaged bytes or a special marker)`` for hypothesis' data()."""

    def truncate(blob, draw):
        return blob[:draw(st.integers(0, len(blob) - 1))]

    def extend(blob, draw):
        return blob + draw(st.binary(min_size=1, max_size=64))

    def bit_flips(blob, draw):
        out = bytearray(blob)
        for pos in draw(st.sets(st.integers(0, len(blob) - 1), min_size=1, max_size=8)):
            out[pos] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)

    def overwrite(blob, draw):
        start = draw(st.integers(0, len(blob) - 1))
        junk = draw(st.binary(min_size=1, max_size=min(256, len(blob) - start)))
        out = blob[:start] + junk + blob[start + len(junk):]
        return out if out != blob else bit_flips(blob, draw)

    def wrong_magic(blob, draw):
        magic = draw(st.binary(min_size=4, max_size=4).filter(lambda m: m != entry.MAGIC))
        return magic + blob[4:]

    def wrong_schema(blob, draw):
        schema = draw(st.integers(0, 0xFFFF).filter(lambda s: s != entry.SCHEMA_VERSION))
        return blob[:4] + struct.pack("<H", schema) + blob[6:]

    def reserved_field(blob, draw):
        return blob[:7] + bytes([draw(st.integers(1, 0xFF))]) + blob[8:]

    def kind_code(blob, draw):
        return blob[:6] + bytes([draw(st.integers(0, 0xFF).filter(lambda k: k != blob[6]))]) + blob[7:]

    def lying_lengths(blob, draw):
        magic, schema, kind, reserved, meta_len, deps_len, body_len, key, checksum = HEADER.unpack_from(blob)
        if draw(st.booleans()):
            # The same total, the boundary moved: the bytes the checksum covers after the header
            # are the same, so only its coverage of the header catches this.
            shift = draw(st.integers(-meta_len, body_len).filter(lambda d: d != 0))
            new_meta, new_body = meta_len + shift, body_len - shift
        else:
            new_meta = draw(st.integers(0, 0xFFFFFFFF))
            new_body = draw(st.integers(0, 0xFFFFFFFFFFFFFFFF))
            if (new_meta, new_body) == (meta_len, body_len):
                new_body += 1
        return (HEADER.pack(magic, schema, kind, reserved, new_meta, deps_len, new_body, key, checksum)
                + blob[HEADER.size:])

    def empty(blob, draw):
        return b""

    def header_only(blob, draw):
        return blob[:draw(st.integers(1, HEADER.size))]

    def random_bytes(blob, draw):
        return draw(st.binary(min_size=1, max_size=4096).filter(lambda b: b != blob))

    def directory(blob, draw):
        return ("directory", draw(st.integers(0, 3)))

    def fifo(blob, draw):
        return ("fifo", 0)

    return [(f.__name__, f) for f in (truncate, extend, bit_flips, overwrite, wrong_magic, wrong_schema,
                                      reserved_field, kind_code, lying_lengths, empty, header_only,
                                      random_bytes, directory, fifo)]


def other_entry(entries):
    """Damage that keeps a valid file: another key's entry, or this key's under the wrong kind."""

    def foreign_key(blob, draw, me):
        other = draw(st.sampled_from([e for e in entries if e["key"] != me["key"]]))
        return other["blob"]

    def wrong_kind(blob, draw, me):
        kind = draw(st.sampled_from([k for k in ("ptx", "cubin", "fatbin") if k != me["kind"]]))
        return entry.encode(me["payload"], dict(me["meta"], kind=kind))

    return [("foreign_key", foreign_key), ("wrong_kind", wrong_kind)]


def plant(path, damaged):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
    if isinstance(damaged, tuple):
        if damaged[0] == "fifo":
            os.mkfifo(path, 0o600)
        else:
            os.makedirs(path, 0o700)
            for i in range(damaged[1]):
                with open(os.path.join(path, "f%d" % i), "wb") as handle:
                    handle.write(b"x")
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(damaged)


@pytest.fixture
def real_entries(nvcc13):
    """Entries made by real compiles: PTX, cubin and fatbin."""
    found = []
    for target in ("compute_75", "sm_75", "sm_75,compute_75"):
        # device_cc: sm_75 is a cache-format sample here, built whatever GPU this machine has
        art = ptxbackend.compile(KERNEL, target=target, device_cc="7.5")
        with open(art.path, "rb") as handle:
            blob = handle.read()
        payload, meta = entry.decode(blob, art.key, art.kind)
        assert payload == art.image
        found.append({"art": art, "path": art.path, "key": art.key, "kind": art.kind, "blob": blob,
                      "payload": payload, "meta": meta})
    return found


def reason_of(message):
    for reason in REASONS:
        if reason in message:
            return reason.replace(" ", "_")
    return "other"


def test_fuzzed_entries_are_always_detected_reported_once_and_rebuilt(real_entries):
    store = real_entries[0]["art"].store
    tally = collections.Counter()
    reasons = collections.Counter()
    failures = []

    def fuzz(name, damage, with_entry):
        @settings(max_examples=PER_KIND, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(data=st.data())
        def one_case(data):
            me = data.draw(st.sampled_from(real_entries))
            damaged = damage(me["blob"], data.draw, me) if with_entry else damage(me["blob"], data.draw)
            check(name, me, damaged)
        one_case()

    def check(name, me, damaged):
        assert damaged != me["blob"]
        plant(me["path"], damaged)
        with captured("ptxbackend.cache", quiet=True) as records:
            try:
                with no_hang():
                    found = store.read(store_name(store, me["path"]), me["key"], me["kind"])  # what compile() does first
            except Hang:
                failures.append((name, "hung", None))
                plant(me["path"], b"")  # unblock the rest of the run
                return
        warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
        if found is not None:
            failures.append((name, "loaded", found[0] == me["payload"]))
        elif len(warnings) != 1 or me["path"] not in warnings[0] or os.path.lexists(me["path"]):
            failures.append((name, "reported %d times" % len(warnings), os.path.lexists(me["path"])))
        else:
            reasons[reason_of(warnings[0])] += 1
        # The rebuild: what compile() does after a miss, then a hit must give the right bytes.
        store.write(store_name(store, me["path"]), me["payload"], me["meta"])
        again = store.read(store_name(store, me["path"]), me["key"], me["kind"])
        if again is None or again[0] != me["payload"]:
            failures.append((name, "not rebuilt", None))
        tally[name] += 1

    for name, damage in damage_kinds():
        fuzz(name, damage, False)
    for name, damage in other_entry(real_entries):
        fuzz(name, damage, True)
    total = sum(tally.values())
    figures("corruption fuzz", cases=total, detected=total - len(failures), failures=len(failures),
            wrong_loads=sum(1 for f in failures if f[1] == "loaded"))
    figures("corruption fuzz by damage", **dict(tally))
    figures("corruption fuzz by reason", **dict(reasons))
    assert failures == []
    assert total >= CASES


@pytest.mark.parametrize("damage", ["truncate", "bit flip", "wrong magic", "wrong schema", "lying length",
                                    "empty", "directory", "foreign key"])
def test_damaged_entry_through_compile_is_rebuilt_by_the_compiler(logging_nvcc, monkeypatch, damage):
    """The whole path once per kind of damage: compile() detects, warns once, recompiles, stores."""
    wrapper, calls = logging_nvcc
    monkeypatch.setenv("PTXBACKEND_NVCC", wrapper)
    art = ptxbackend.compile(KERNEL, target="compute_75")
    blob = open(art.path, "rb").read()
    other = ptxbackend.compile(KERNEL + "// another", target="compute_75")
    magic, schema, kind, reserved, meta_len, deps_len, body_len, key, checksum = HEADER.unpack_from(blob)
    damaged = {
        "truncate": blob[:len(blob) // 3],
        "bit flip": blob[:-7] + bytes([blob[-7] ^ 0x20]) + blob[-6:],
        "wrong magic": b"PTXA" + blob[4:],
        "wrong schema": blob[:4] + struct.pack("<H", entry.SCHEMA_VERSION + 1) + blob[6:],
        "lying length": HEADER.pack(magic, schema, kind, reserved, meta_len + 2, deps_len, body_len - 2, key,
                                    checksum)
        + blob[HEADER.size:],
        "empty": b"",
        "directory": ("directory", 1),
        "foreign key": open(other.path, "rb").read(),
    }[damage]
    plant(art.path, damaged)
    before = sum(1 for line in open(str(calls)) if "--ptx" in line)
    with captured("ptxbackend.cache") as records:
        again = ptxbackend.compile(KERNEL, target="compute_75")
    assert not again.cache_hit and again.image == art.image
    assert sum(1 for line in open(str(calls)) if "--ptx" in line) == before + 1  # really recompiled
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and art.path in warnings[0].getMessage()
    assert ptxbackend.compile(KERNEL, target="compute_75").cache_hit
    figures("compile() with damage: %s" % damage, detected=1, recompiled=1, warnings=len(warnings))

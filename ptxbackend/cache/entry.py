"""The on-disk format of one cache entry.

Layout (little-endian), schema 4::

    magic      4 bytes   b"PTXB"
    schema     u16       SCHEMA_VERSION of the writer
    kind       u8        1 PTX, 2 cubin, 3 fatbin
    reserved   u8        0
    meta_len   u32       length of the metadata JSON
    deps_len   u32       length of the dependency section
    body_len   u64       length of the payload
    key        64 bytes  the request key, ASCII, NUL-padded
    checksum   u32       CRC-32 of every other byte of the file
    metadata   meta_len bytes of UTF-8 JSON (an object; never pickle)
    deps       deps_len bytes: the digest of the entry's dependency set (see ptxbackend.dependencies.depsets)
    payload    body_len bytes: the PTX, cubin or fatbin image

Every field is checked on read, and the file's size must match the header
exactly, so a truncated, extended, bit-flipped or foreign file is rejected.
The key and kind sit in the fixed header so that a warm hit checks them
without parsing JSON.  The checksum finds damage (a torn write after a power
cut, a flipped bit); it is not a defence against someone who can write to
the cache, which the store's owner and mode checks are.  CRC-32 rather than
SHA-256 because every warm kernel pays it: about 5 us for a 20 kB cubin
against 12 us.
"""

import json
import struct
import time
import zlib

from .._version import __version__
from .keys import SCHEMA_VERSION

MAGIC = b"PTXB"
_HEADER = struct.Struct("<4sHBBIIQ64sI")
HEADER_SIZE = _HEADER.size
_CHECKED_HEAD = HEADER_SIZE - 4  # the header bytes before the checksum, which it covers
KIND_CODES = {"ptx": 1, "cubin": 2, "fatbin": 3}
_KIND_NAMES = dict((code, name) for name, code in KIND_CODES.items())
_KEY_BYTES = 64


class CorruptEntry(Exception):
    """An entry failed verification; the message says which check."""


def _key_field(key):
    raw = str(key).encode("ascii")
    if len(raw) > _KEY_BYTES or b"\0" in raw:
        raise ValueError("a cache key is at most %d ASCII characters without NUL: %r" % (_KEY_BYTES, key))
    return raw.ljust(_KEY_BYTES, b"\0")


def encode(payload, metadata, deps=b""):
    """Serialise ``payload`` (bytes), ``metadata`` (a JSON-able dict with ``key`` and ``kind``)
    and the dependency section ``deps`` (bytes)."""
    kind = KIND_CODES.get(metadata.get("kind"))
    if kind is None:
        raise ValueError("entry kind must be one of %s, not %r"
                         % (", ".join(sorted(KIND_CODES)), metadata.get("kind")))
    meta = json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode("utf-8")
    payload = bytes(payload)
    deps = bytes(deps)
    head = _HEADER.pack(MAGIC, SCHEMA_VERSION, kind, 0, len(meta), len(deps), len(payload),
                        _key_field(metadata.get("key", "")), 0)[:_CHECKED_HEAD]
    checksum = zlib.crc32(payload, zlib.crc32(deps, zlib.crc32(meta, zlib.crc32(head))))
    return head + struct.pack("<I", checksum) + meta + deps + payload


def decode(blob, expect_key=None, expect_kind=None, with_metadata=True):
    """Verify ``blob`` and return ``(payload, metadata)``; see :func:`decode_all`."""
    return decode_all(blob, expect_key, expect_kind, with_metadata)[:2]


def decode_all(blob, expect_key=None, expect_kind=None, with_metadata=True):
    """Verify ``blob`` and return ``(payload, metadata, deps)``.

    ``with_metadata=False`` skips parsing the JSON (the checksum already
    covers it) and returns ``None`` in its place: the warm path needs only
    the payload.  Raises :class:`CorruptEntry` naming the first check that
    failed.
    """
    if len(blob) < HEADER_SIZE:
        raise CorruptEntry("shorter than the header (%d bytes)" % len(blob))
    magic, schema, kind, reserved, meta_len, deps_len, body_len, key, checksum = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise CorruptEntry("bad magic %r" % magic)
    if schema != SCHEMA_VERSION:
        raise CorruptEntry("schema %d, expected %d" % (schema, SCHEMA_VERSION))
    if reserved != 0:
        # Writers put 0 here (a future use bumps the schema), so every byte of a file is checked.
        raise CorruptEntry("reserved field is %d, expected 0" % reserved)
    kind_name = _KIND_NAMES.get(kind)
    if kind_name is None:
        raise CorruptEntry("unknown kind code %d" % kind)
    if HEADER_SIZE + meta_len + deps_len + body_len != len(blob):
        raise CorruptEntry("header says %d bytes, file has %d"
                           % (HEADER_SIZE + meta_len + deps_len + body_len, len(blob)))
    view = memoryview(blob)
    # Header fields and body in one running CRC, without copying a large image just to check it.
    if zlib.crc32(view[HEADER_SIZE:], zlib.crc32(view[:_CHECKED_HEAD])) != checksum:
        raise CorruptEntry("checksum mismatch")
    if expect_key is not None and key != _key_field(expect_key):
        raise CorruptEntry("entry belongs to key %r" % key.rstrip(b"\0").decode("ascii", "replace"))
    if expect_kind is not None and kind_name != expect_kind:
        raise CorruptEntry("entry holds %r, expected %r" % (kind_name, expect_kind))
    deps_start = HEADER_SIZE + meta_len
    payload = bytes(view[deps_start + deps_len:])
    deps = bytes(view[deps_start:deps_start + deps_len]) if deps_len else b""
    if not with_metadata:
        return payload, None, deps
    try:
        metadata = json.loads(bytes(view[HEADER_SIZE:HEADER_SIZE + meta_len]).decode("utf-8"))
    except ValueError:
        raise CorruptEntry("metadata is not JSON")
    if not isinstance(metadata, dict):
        raise CorruptEntry("metadata is not an object")
    return payload, metadata, deps


def metadata(key, target, producer, options, level, **extra):
    """The metadata every entry carries: what it is, what made it, and when.

    ``level`` is ``'compile'`` (compiler output) or ``'jit'`` (the driver's cubin of a PTX entry).
    """
    meta = {"key": key, "kind": "cubin" if level == "jit" else target.output_kind,
            "target": str(target), "producer": producer, "options": [str(o) for o in options],
            "level": level, "created": time.time(), "ptxbackend": __version__}
    meta.update(extra)
    return meta

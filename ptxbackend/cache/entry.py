"""The on-disk format of one cache entry.

Layout (little-endian)::

    magic      4 bytes   b"PTXB"
    schema     u16       SCHEMA_VERSION of the writer
    reserved   u16       0
    meta_len   u32       length of the metadata JSON
    body_len   u64       length of the payload
    checksum   32 bytes  SHA-256 of metadata JSON + payload
    metadata   meta_len bytes of UTF-8 JSON (an object; never pickle)
    payload    body_len bytes: the PTX, cubin or fatbin image

Every field is checked on read, and the file's size must match the header
exactly, so a truncated, extended, bit-flipped or foreign file is rejected.
"""

import hashlib
import json
import struct

from .keys import SCHEMA_VERSION

MAGIC = b"PTXB"
_HEADER = struct.Struct("<4sHHIQ32s")
HEADER_SIZE = _HEADER.size


class CorruptEntry(Exception):
    """An entry failed verification; the message says which check."""


def encode(payload, metadata):
    """Serialise ``payload`` (bytes) and ``metadata`` (a JSON-able dict)."""
    meta = json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode("utf-8")
    checksum = hashlib.sha256(meta + payload).digest()
    return _HEADER.pack(MAGIC, SCHEMA_VERSION, 0, len(meta), len(payload), checksum) + meta + payload


def decode(blob, expect_key=None, expect_kind=None):
    """Verify ``blob`` and return ``(payload, metadata)``.

    Raises :class:`CorruptEntry` naming the first check that failed.
    """
    if len(blob) < HEADER_SIZE:
        raise CorruptEntry("shorter than the header (%d bytes)" % len(blob))
    magic, schema, reserved, meta_len, body_len, checksum = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise CorruptEntry("bad magic %r" % magic)
    if schema != SCHEMA_VERSION:
        raise CorruptEntry("schema %d, expected %d" % (schema, SCHEMA_VERSION))
    if reserved != 0:
        # Writers put 0 here (a future use bumps the schema), so every byte of a file is checked.
        raise CorruptEntry("reserved field is %d, expected 0" % reserved)
    if HEADER_SIZE + meta_len + body_len != len(blob):
        raise CorruptEntry("header says %d bytes, file has %d"
                           % (HEADER_SIZE + meta_len + body_len, len(blob)))
    body = memoryview(blob)[HEADER_SIZE:]  # no copy of a large image just to hash it
    if hashlib.sha256(body).digest() != checksum:
        raise CorruptEntry("checksum mismatch")
    try:
        metadata = json.loads(bytes(body[:meta_len]).decode("utf-8"))
    except ValueError:
        raise CorruptEntry("metadata is not JSON")
    if not isinstance(metadata, dict):
        raise CorruptEntry("metadata is not an object")
    if expect_key is not None and metadata.get("key") != expect_key:
        raise CorruptEntry("entry belongs to key %r" % metadata.get("key"))
    if expect_kind is not None and metadata.get("kind") != expect_kind:
        raise CorruptEntry("entry holds %r, expected %r" % (metadata.get("kind"), expect_kind))
    return bytes(body[meta_len:]), metadata

"""Reading a bundle someone else made, front to back, and signing one.

Both kinds of bundle (kernel bundles, :mod:`.bundle`; driver-JIT bundles, :mod:`ptxbackend.deploy.jit_bundle`)
are tars whose first member is a JSON manifest listing every file (name, size, SHA-256) and, when the
machine that made it has a fleet key, whose second member is the manifest's HMAC-SHA256 under that key
(the manifest's checksums then vouch for every file).

An import reads the archive once, in archive order, the way it was written: no index of all members is
built first (``getmember`` would decompress and parse every header of a 400,000-member archive before
the first one could be refused), so a member that does not belong is refused when it is reached.  The
decompressor's output is counted as it is produced against what the manifest declares, so a small
archive that unpacks to gigabytes (in a member, a tar extension header or padding) stops at the budget,
and the signature is checked before any file is read.  A member's extension header (pax, GNU long
name) is refused by its declared size before tarfile reads it whole into memory.  Nothing else reads
an archive first: the kind of a bundle is told by its first member, read through the same bounds
(:func:`first_member_name`).
"""

import bz2
import gzip
import hashlib
import hmac
import json
import os
import stat
import tarfile

try:
    import lzma
except ImportError:  # a Python built without liblzma reads gzip and bzip2 bundles still
    lzma = None

from ..errors import CacheError

# Beyond the files' declared bytes, what a tar may hold: per member a header, a long-name or pax
# extension (tarfile writes one for long names) and padding; then the end-of-archive blocks.
_PER_MEMBER = 4 << 10
_END = 64 << 10
_HEX = frozenset("0123456789abcdef")
# An extension header holds a long name or a few attributes: hundreds of bytes.  tarfile reads one
# whole before the member it describes, so its declared size is checked first.
HEADER_LIMIT = 1 << 20
_EXTENSION_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


class OverBudget(Exception):
    """The archive unpacks to more than its manifest declares."""


class _BoundedTarInfo(tarfile.TarInfo):
    """A member header that refuses an extension header larger than :data:`HEADER_LIMIT` before its
    content is read (tarfile would read a pax header declaring 1 GiB into memory whole)."""

    def _proc_member(self, tarfile_):
        if self.type in _EXTENSION_TYPES and self.size > HEADER_LIMIT:
            raise OverBudget("a tar extension header of %d bytes (at most %d are read)" % (self.size,
                                                                                        HEADER_LIMIT))
        return super(_BoundedTarInfo, self)._proc_member(tarfile_)


class _CountingReader(object):
    """A file object over the decompressed stream that refuses to produce more than ``limit`` bytes."""

    def __init__(self, raw, limit):
        self._raw = raw
        self.limit = limit
        self.produced = 0

    def read(self, size=-1):
        if size is None or size < 0:
            size = self.limit - self.produced + 1
        data = self._raw.read(min(size, self.limit - self.produced + 1))
        self.produced += len(data)
        if self.produced > self.limit:
            raise OverBudget("it unpacks to more than %d bytes" % self.limit)
        return data

    def close(self):
        self._raw.close()


def _decompressing(handle):
    """``handle`` (a binary file at its start) as its decompressed stream, by the format's magic."""
    head = handle.read(6)
    handle.seek(0)
    if head[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=handle, mode="rb")
    if head[:3] == b"BZh":
        return bz2.BZ2File(handle, "rb")
    if head == b"\xfd7zXZ\x00" and lzma is not None:
        return lzma.LZMAFile(handle, "rb")
    return handle


class Untrusted(object):
    """``with Untrusted(source, first_limit) as reading``: ``reading.archive`` is the tar in stream mode;
    :meth:`allow` sets the budget once the manifest has said how much it holds."""

    def __init__(self, source, first_limit):
        self.source = source
        self._first_limit = first_limit

    def __enter__(self):
        # Opened without waiting and checked by descriptor: a FIFO or device named as a bundle is
        # refused at once, never read (an API caller has no command line checking it first).
        fd = os.open(self.source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CacheError("%s is not a regular file: name a bundle file" % self.source)
        self._file = os.fdopen(fd, "rb")
        try:
            self._reader = _CountingReader(_decompressing(self._file), self._first_limit + _END)
            self.archive = tarfile.open(fileobj=self._reader, mode="r|", tarinfo=_BoundedTarInfo)
        except tarfile.TarError as exc:
            self._file.close()
            raise CacheError("%s is not a ptxbackend bundle (cannot open it as tar: %s)" % (self.source, exc))
        except BaseException:
            self._file.close()
            raise
        return self

    def allow(self, declared, members):
        """Let the archive unpack to what the manifest declares (``declared`` bytes in ``members`` files)."""
        self._reader.limit = self._reader.produced + declared + (members + 2) * _PER_MEMBER + _END

    def __exit__(self, *exc):
        try:
            self.archive.close()
        finally:
            self._file.close()


def first_member_name(source, limit):
    """The name of the archive's first member (``None`` when it has none or is no tar), read through
    the same bounds as an import: what tells a kernel bundle from a driver-JIT bundle."""
    import zlib
    try:
        with Untrusted(source, limit) as reading:
            first = reading.archive.next()
            return first.name if first is not None else None
    except (OverBudget, CacheError, tarfile.TarError, EOFError, zlib.error, ValueError):
        return None
    except OSError as exc:
        if exc.errno is None:  # gzip's BadGzipFile: damage, said by the import that follows
            return None
        raise


def strict_json(data):
    """Parse JSON: ``ValueError`` also for nesting too deep to parse (``RecursionError``, a traceback
    otherwise).  ``NaN`` and ``Infinity`` parse; where a number matters (a size) it is checked."""
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply")


def read_manifest(reading, name, limit):
    """``(bytes, dict)`` of the manifest, which must be the archive's first member, a regular file of at
    most ``limit`` bytes holding a JSON object."""
    member = reading.archive.next()
    if member is None or member.name != name or not member.isfile() or member.size > limit:
        raise CacheError("%s is not a ptxbackend bundle: its first member is not %s (a regular file of at "
                         "most %d bytes)" % (reading.source, name, limit))
    data = reading.archive.extractfile(member).read(limit + 1)
    try:
        manifest = strict_json(data)
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise CacheError("%s has no valid %s: not a ptxbackend bundle (%s)" % (reading.source, name, exc))
    return data, manifest


def file_records(source, manifest_name, records, max_file, max_total):
    """The manifest's file list as ``{name: record}``, each record checked: a name (text), a size that
    is a whole number from 0 to ``max_file``, a SHA-256 (64 lowercase hex digits); no name twice; at
    most ``max_total`` bytes in all."""
    if not isinstance(records, list):
        raise CacheError("%s has no valid %s: its file list is not a list" % (source, manifest_name))
    expected = {}
    for record in records:
        why = _record_problem(record, max_file)
        if why is None and record["name"] in expected:
            why = "lists %r twice" % record["name"]
        if why:
            raise CacheError("%s has no valid %s: %s; nothing was imported" % (source, manifest_name, why))
        expected[record["name"]] = record
    declared = sum(r["size"] for r in expected.values())
    if declared > max_total:
        raise CacheError("%s declares %d bytes of files, more than an import reads (%d); nothing was "
                         "imported" % (source, declared, max_total))
    return expected


def _record_problem(record, max_file):
    if not isinstance(record, dict) or not isinstance(record.get("name"), str):
        return "a file record without a name: %.80r" % (record,)
    size, digest = record.get("size"), record.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= max_file:
        return "%s has the size %.40r (a whole number of bytes from 0 to %d is one)" % (record["name"], size,
                                                                                     max_file)
    if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
        return "%s has no SHA-256" % record["name"]
    return None


def read_member(reading, member):
    """The bytes of ``member`` (the current one), at most one more than its header says."""
    return reading.archive.extractfile(member).read(member.size + 1)


def sign(key, context, manifest_bytes):
    """The signature member's content: HMAC-SHA256 of the manifest under the fleet key, hex."""
    return hmac.new(key, context + manifest_bytes, hashlib.sha256).hexdigest().encode("ascii")


def members_after_signature(reading, signature_name, key, context, manifest_bytes):
    """Yield the members after the manifest, once the signature (the second member) is checked.

    With ``key`` (a fleet key is configured here) the bundle must be signed with it: an unsigned one,
    or one signed with another key, is refused before any file is read.  Without a key, a signature is
    skipped.  ``signed`` is set on ``reading`` (whether the bundle carried a signature that verified).
    """
    reading.signed = False
    member = reading.archive.next()
    if member is not None and member.name == signature_name:
        if not member.isfile() or member.size > 256:
            raise CacheError("%s: %s is not a signature; nothing was imported" % (reading.source, signature_name))
        signature = reading.archive.extractfile(member).read(257)
        if key is not None:
            if not hmac.compare_digest(signature, sign(key, context, manifest_bytes)):
                raise CacheError("%s is signed with another key, or its manifest was changed: nothing was "
                                 "imported" % reading.source)
            reading.signed = True
        member = reading.archive.next()
    elif key is not None:
        raise CacheError("%s is not signed, and a fleet key is configured (PTXBACKEND_REMOTE_KEY_FILE): only "
                         "bundles signed with it are imported. Export it again where the key is configured."
                         % reading.source)
    while member is not None:
        yield member
        member = reading.archive.next()

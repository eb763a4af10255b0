"""Portable bundles: move cache entries from a build box to production machines.

A bundle is a tar file holding ``ptxbackend-bundle.json`` (format, schema
version, and the SHA-256 and size of every file) followed by the files
themselves, laid out as in the store (``v4/<producer>/<target>/...``): the
entries, each producer's record (what it can emit; no path of the build box),
and the dependency sets the entries name, each once
(``v4/depsets/<kk>/<sha256>.json``), so that a line PC with the same headers
can check them and hit instead of compiling again.

Import trusts nothing in the archive: only regular files of those three kinds
are accepted (never this machine's own compiler memos), every file must match
the manifest's checksum and be a valid entry, producer record or dependency set
(a set's name is its content's SHA-256), an nvcc entry must name a set the
bundle or the cache holds, and each one is written atomically, so a damaged
bundle adds nothing half-written to the cache.  The archive is read once, front
to back (:mod:`.archive`).  Where a fleet key is configured, export signs the
manifest with it and import takes only bundles signed with it; entries of an
unsigned bundle are marked (:mod:`.provenance`) and never sent on.
"""

import contextlib
import hashlib
import io
import json
import os
import posixpath
import tarfile
import time
import zlib

from ..files import private
from .._version import __version__
from ..errors import CacheError
from . import archive as archive_format
from ..dependencies import depsets
from . import entry as entry_format
from . import provenance
from .layout import depset_name
from .keys import SCHEMA_VERSION
from .store import LAYOUT

MANIFEST = "ptxbackend-bundle.json"
SIGNATURE = "ptxbackend-bundle.sig"  # the second member when signed: HMAC-SHA256 of the manifest
BUNDLE_FORMAT = 1
_MAC_CONTEXT = b"ptxbackend-bundle-1\0"
# What an import reads at most: a manifest, one file, all files.  Far above any real cache (kernels are
# kilobytes, a dependency set tens of kilobytes), far below what would exhaust a line PC's memory.
MAX_MANIFEST = 64 << 20
MAX_FILE = 256 << 20
MAX_TOTAL = 4 << 30


def _identity_files(store):
    for producer in store.producers():
        path = os.path.join(store.base, producer, "identity.json")
        if os.path.isfile(path) and not os.path.islink(path):
            yield path


def _dependency_sets(store):
    top = os.path.join(store.base, "depsets")
    for base, _dirs, files in os.walk(top):
        for name in sorted(files):
            if name.endswith(".json") and not name.startswith("."):
                yield os.path.join(base, name)


def export_bundle(store, destination, include_jit=True, force=False, key=None, progress=None):
    """Write every entry of ``store`` (and the producers' identities) to a tar at ``destination``.

    An existing ``destination`` is replaced only with ``force``.  The tar is written to a new file
    (``O_EXCL``) beside it and renamed into place, so nothing planted there is ever written through.
    With ``key`` (the fleet key) the manifest is signed, and entries that arrived in an unsigned
    bundle stay home: a signature vouches only for what this machine compiled or received signed.
    Returns the number of entries written.
    """
    # A bundle must hit where it lands: an entry that verify finds bad (damaged, or naming a set or a
    # record that is missing, damaged or not ours) would be a miss there, or refused: say which, write nothing.
    broken = [(path, why) for path, why in getattr(store, "verify", lambda: (0, []))()[1]
              if path.rsplit(".", 1)[-1] in ("ptx", "cubin", "fatbin")
              and (include_jit or os.sep + "jit" + os.sep not in path)]
    if broken:
        shown = "; ".join("%s: %s" % (path, why) for path, why in broken[:5])
        raise CacheError("cache export: %d entr%s would not hit on the machine that imports the bundle (%s%s). "
                         "Run `ptxbackend cache verify --repair` (they are compiled again when next asked for), "
                         "then export again; nothing was written" % (
                             len(broken), "y" if len(broken) == 1 else "ies", shown,
                             "; and %d more" % (len(broken) - 5) if len(broken) > 5 else ""))
    files = []
    for path, _size, _mtime in store.entries():
        if not include_jit and os.sep + "jit" + os.sep in path:
            continue
        files.append(path)
    if key is not None:
        files = [p for p in files if provenance.vouched(store, _store_name(store, p), _read_or_none(p))]
    files.extend(_identity_files(store))
    files.extend(_dependency_sets(store))
    records = []
    blobs = []
    meter = progress(len(files)) if progress else None  # the caller's display: a terminal's bar
    for path in sorted(files):
        if meter is not None:
            meter.step()
        try:
            data = private.read_file(path)
        except OSError:
            continue
        if path.endswith(".json"):
            try:
                json.loads(data.decode("utf-8"))
            except ValueError:
                continue
        else:
            try:
                entry_format.decode(data)
            except entry_format.CorruptEntry:
                continue  # a bad entry stays home
        name = posixpath.join(LAYOUT, *os.path.relpath(path, store.base).split(os.sep))
        records.append({"name": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
        blobs.append((name, data))
    manifest = {"format": BUNDLE_FORMAT, "schema": SCHEMA_VERSION, "ptxbackend": __version__,
                "created": time.time(), "files": records}
    with private.new_file_beside(destination, force) as handle:
        with tarfile.open(fileobj=handle, mode="w:gz") as archive:
            manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
            add_member(archive, MANIFEST, manifest_bytes)
            if key is not None:
                add_member(archive, SIGNATURE, archive_format.sign(key, _MAC_CONTEXT, manifest_bytes))
            for name, data in blobs:
                add_member(archive, name, data)
    return sum(1 for r in records if not r["name"].endswith(".json"))


def _store_name(store, path):
    return os.path.relpath(path, store.base).replace(os.sep, "/")


def _read_or_none(path):
    try:
        return private.read_file(path)
    except OSError:
        return None


def add_member(archive, name, data):
    """Add ``data`` to a tar as a private regular file named ``name``."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600
    info.mtime = int(time.time())
    archive.addfile(info, io.BytesIO(data))


def _safe_name(name):
    parts = name.split("/")
    return (parts[0] == LAYOUT and len(parts) >= 3 and "" not in parts
            and not any(p in (".", "..") for p in parts) and not name.startswith("/"))


_HEX = frozenset("0123456789abcdef")


def _kind_of(name):
    """``'entry'``, ``'producer'`` or ``'headers'`` for a name a bundle may carry, else ``None``.

    Nothing else is accepted: in particular not ``meta/`` (this machine's compiler memos,
    which name the programs and libraries it runs), locks, or files of another layout.
    """
    parts = name.split("/")
    if len(parts) == 3 and parts[2] == "identity.json" and parts[1] not in ("meta", "locks", "depsets"):
        return "producer"
    if len(parts) == 4 and parts[1] == "depsets" and parts[3].endswith(".json"):
        digest = parts[3][:-5]
        if len(digest) == 64 and set(digest) <= _HEX and parts[2] == digest[:2]:
            return "headers"
        return None
    if len(parts) >= 5 and parts[1] not in ("meta", "locks", "depsets") \
            and parts[-1].rsplit(".", 1)[-1] in ("ptx", "cubin", "fatbin"):
        return "entry"
    return None


def _check_file(kind, name, data):
    """Raise ``ValueError`` saying why ``data`` is not a valid file of ``kind``."""
    if kind == "entry":
        key, suffix = name.rsplit("/", 1)[1].rsplit(".", 1)
        try:
            # The key and kind its name claims, as a read will expect them.
            entry_format.decode(data, expect_key=key, expect_kind=suffix)
        except (entry_format.CorruptEntry, ValueError) as exc:
            raise ValueError("not a valid entry (%s)" % exc)
        return
    try:
        value = json.loads(data.decode("utf-8"))
    except ValueError:
        raise ValueError("not JSON")
    if kind == "headers":
        if hashlib.sha256(data).hexdigest() != name.rsplit("/", 1)[1][:-5]:
            raise ValueError("its name is not the SHA-256 of its content")
        if not depsets.well_formed(value):
            raise ValueError("not a dependency set")
        return
    allowed = {"kind", "version", "virtual_archs", "real_archs", "archs_reliable", "host", "toolkits"}
    if not isinstance(value, dict) or not set(value) <= allowed or "kind" not in value \
            or not all(isinstance(t, str) for t in value.get("toolkits") or []):
        raise ValueError("not a producer record (a producer record names no program or library)")


def _needs_dependency_set(name, data, carried, store):
    """Why an entry of nvcc (whose output depends on headers read at compile time) cannot be served, or
    ``None``: it must name a dependency set, carried by the bundle or already in ``store``."""
    if not name.split("/")[1].startswith("nvcc"):
        return None
    digest = entry_format.decode_all(data, with_metadata=False)[2].decode("ascii", "replace")
    if not digest:
        return "an nvcc entry without a dependency set (a line PC could not tell its headers changed)"
    if len(digest) != 64 or not set(digest) <= _HEX:
        return "an entry naming no dependency set (%.80r)" % digest
    depset = LAYOUT + "/" + depset_name(digest)
    if depset not in carried and (store is None or not os.path.isfile(os.path.join(store.root, *depset.split("/")))):
        return "an nvcc entry whose dependency set %s is neither in the bundle nor in this cache" % depset
    return None


def _read_verified(source, key=None, store=None):
    """``(files, signed)``: every file of the bundle at ``source``, checked, and whether the bundle was
    signed with ``key``; raises before anything is written."""
    with archive_format.Untrusted(source, MAX_MANIFEST) as reading:
        manifest_bytes, manifest = archive_format.read_manifest(reading, MANIFEST, MAX_MANIFEST)
        if manifest.get("schema") != SCHEMA_VERSION or manifest.get("format") != BUNDLE_FORMAT:
            raise CacheError(
                "%s was made with cache schema %s (bundle format %s); this ptxbackend %s reads schema %d. "
                "Export the bundle again with a matching ptxbackend version on the build box."
                % (source, manifest.get("schema"), manifest.get("format"), __version__, SCHEMA_VERSION))
        expected = archive_format.file_records(source, MANIFEST, manifest.get("files"), MAX_FILE, MAX_TOTAL)
        reading.allow(sum(r["size"] for r in expected.values()), len(expected))
        verified = []
        for member in archive_format.members_after_signature(reading, SIGNATURE, key, _MAC_CONTEXT,
                                                             manifest_bytes):
            kind = _kind_of(member.name) if _safe_name(member.name) else None
            if not member.isfile() or kind is None or member.name not in expected:
                raise CacheError("%s: unexpected member %r (not a regular file listed in the manifest, or "
                                 "not an entry, producer record or dependency set); nothing was imported"
                                 % (source, member.name))
            record = expected.pop(member.name)
            # Sizes are checked before a byte is read: a small archive may unpack to gigabytes.
            if member.size != record["size"]:
                raise CacheError("%s: %s is %d bytes, its manifest says %d (at most %d are read); nothing "
                                 "was imported" % (source, member.name, member.size, record["size"], MAX_FILE))
            data = archive_format.read_member(reading, member)
            if hashlib.sha256(data).hexdigest() != record["sha256"] or len(data) != record["size"]:
                raise CacheError("%s: %s does not match its checksum; the bundle is damaged, nothing was "
                                 "imported" % (source, member.name))
            try:
                _check_file(kind, member.name, data)
            except ValueError as exc:
                raise CacheError("%s: %s is %s; nothing was imported" % (source, member.name, exc))
            verified.append((member.name, data))
        if expected:
            raise CacheError("%s: %d files listed in the manifest are missing (e.g. %s); nothing was imported"
                             % (source, len(expected), sorted(expected)[0]))
        signed = reading.signed
    carried = set(name for name, _data in verified)
    for name, data in verified:
        why = _needs_dependency_set(name, data, carried, store) if _kind_of(name) == "entry" else None
        if why:
            raise CacheError("%s: %s is %s; nothing was imported" % (source, name, why))
    return verified, signed


@contextlib.contextmanager
def _held(store, name):
    lock = getattr(store, "lock", None)
    if lock is None:
        yield
        return
    with lock(name):
        yield


def import_bundle(store, source, key=None, progress=None, seen=None):
    """Verify and add the bundle at ``source`` to ``store``.

    With ``key`` (the fleet key, when one is configured) only a bundle signed with it is imported.
    Entries of an unsigned bundle are marked (:mod:`.provenance`): ``cache push`` never uploads them.
    Returns ``(entries_added, entries_already_present)``; ``seen``, a list, gets the name of every
    entry in the bundle (``<producer>/<target>/...``).  Raises
    :class:`CacheError` for a bundle of another schema version, a missing or
    invalid manifest, or any file whose checksum or format does not verify
    (then nothing from the bundle is added).
    """
    try:
        verified, signed = _read_verified(source, key, store)
    except archive_format.OverBudget as exc:
        raise CacheError("%s unpacks to more than its manifest declares (%s): a damaged or hostile "
                         "bundle; nothing was imported" % (source, exc))
    except (EOFError, zlib.error, tarfile.TarError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise CacheError("cannot read %s: %s" % (source, exc.strerror or exc))
        raise CacheError("%s is damaged or not a complete bundle (%s: %s); copy it again. Nothing was "
                         "imported" % (source, type(exc).__name__, exc))
    added = present = 0
    meter = progress(len(verified)) if progress else None
    for name, data in verified:
        if meter is not None:
            meter.step()
        path = os.path.join(store.root, *name.split("/"))
        is_entry = not name.endswith(".json")
        # Under the name's lock: two imports of one bundle at once count each entry once between them.
        with _held(store, "import/" + name):
            try:
                if private.read_file(path) == data:
                    present += is_entry
                    continue
            except OSError:
                pass
            private.make_private_dirs(os.path.dirname(path))
            private.write_atomic(path, data, durable=True)
            added += is_entry
    for name, data in verified:
        if not name.endswith(".json"):
            provenance.remember(store, name.split("/", 1)[1], data, signed)
            if seen is not None:
                seen.append(name.split("/", 1)[1])
    return added, present

"""Where each kind of cache file lives: names as pure functions of what identifies the file.

Names are relative and ``/``-separated, inside one schema version's layout
(:data:`LAYOUT`); every store maps them to its own places (a path under the
cache directory, a key on the fleet server)::

    <producer>/<target>/<kk>/<key>.<kind>                       compiler output (an entry)
    <producer>/<target>/jit/sm_<cc>-<driver>/<kk>/<key>.cubin   the driver's JIT of a PTX entry
    <producer>/identity.json                                    what that producer can emit
    depsets/<kk>/<sha256>.json                                  what a compile read and searched (depsets.py)
    work/nvcc-XXXX/                                             a compile's private directory (nvcc.py), gone after it

Older versions left their own trees beside it (0.1: ``v1/``, 0.2: ``v2/``, 0.3: ``v3/``; there was
never a ``v0/``), laid out as above without ``depsets/`` and ``work/``, plus ``locks/`` and
``meta/`` (and 0.3's ``sysdeps/<kk>/<sha256>.json``); they wrote no mark file, so such a tree is known as theirs by that layout and by the
magic and schema number every one of their entries begins with (:func:`old_layout_role`).
"""

import re
import struct

from .keys import SCHEMA_VERSION

LAYOUT = "v%d" % SCHEMA_VERSION
KINDS = ("ptx", "cubin", "fatbin")
#: Top-level names that are not producers (the directory store keeps locks and memos there).
RESERVED = ("locks", "meta", "depsets", "work")
#: The schemas older versions wrote (their trees are v1 .. v3).
OLD_SCHEMAS = tuple(range(1, SCHEMA_VERSION))
#: What ptxbackend keeps in the cache root besides its layouts: the driver-JIT cache `cache import`
#: installs and its record (deploy/jit_bundle.py), their staging directories, a write's temporary file.
ROOT_NAMES = ("driver-jit", "driver-jit.json")
ROOT_PREFIXES = (".driver-jit-incoming-", ".driver-jit-old-", ".tmp-")
_KEY_FILE = re.compile(r"^([0-9a-f]{64})\.(ptx|cubin|fatbin)$")
_DIGEST_FILE = re.compile(r"^([0-9a-f]{64})\.json$")


def layout_schema(name):
    """The schema number of a layout directory's name (``v4`` -> 4), else ``None``."""
    digits = name[1:]
    if name.startswith("v") and digits.isdigit() and str(int(digits)) == digits:
        return int(digits)
    return None


def old_entry_head(schema):
    """The first bytes of every entry that ``schema``'s ptxbackend wrote: its magic and schema number
    (entry.py's header began so in every version)."""
    return b"PTXB" + struct.pack("<H", schema)


def old_layout_role(parts):
    """What the file at ``parts`` (its path below an old tree, split) was in the layout 0.1 to 0.3
    wrote: ``'entry'`` (``<producer>/<target>/<kk>/<key>.<kind>`` or its ``jit/sm_<cc>-<driver>/``
    form), ``'producer'`` (``<producer>/identity.json``), ``'lock'``, ``'memo'`` (under ``meta/``),
    ``'headers'`` (0.3's ``sysdeps/<kk>/<sha256>.json``), ``'temporary'`` (a writer's ``.tmp-``
    file), or ``None``: not a file ptxbackend put there."""
    if not parts or any(p in ("", ".", "..") for p in parts):
        return None
    if parts[-1].startswith(".tmp-"):
        return "temporary"
    if parts[0] == "locks":
        return "lock" if len(parts) == 3 and parts[2].endswith(".lock") else None
    if parts[0] == "meta":
        return "memo" if len(parts) >= 2 else None
    if parts[0] == "sysdeps":
        found = _DIGEST_FILE.match(parts[-1])
        return "headers" if len(parts) == 3 and found and parts[1] == found.group(1)[:2] else None
    if len(parts) == 2 and parts[1] == "identity.json":
        return "producer"
    found = _KEY_FILE.match(parts[-1])
    if not found or parts[-2] != found.group(1)[:2]:
        return None
    if len(parts) == 4 or (len(parts) == 6 and parts[2] == "jit" and parts[3].startswith("sm_")
                           and found.group(2) == "cubin"):
        return "entry"
    return None


def entry_name(producer, target, key, kind):
    return "%s/%s/%s/%s.%s" % (producer, target, key[:2], key, kind)


def jit_name(producer, target, key, device_cc, driver_build):
    return "%s/%s/jit/sm_%d-%s/%s/%s.cubin" % (producer, target, device_cc, driver_build, key[:2], key)


def producer_name(producer):
    return producer + "/identity.json"


def depset_name(digest):
    return "depsets/%s/%s.json" % (digest[:2], digest)


def level_of(name):
    """``'entry'``, ``'jit'`` or ``'other'``: what a name holds, for counters."""
    if name.endswith((".ptx", ".cubin", ".fatbin")):
        return "jit" if "/jit/" in name else "entry"
    return "other"

"""Where each kind of cache file lives: names as pure functions of what identifies the file.

Names are relative and ``/``-separated, inside one schema version's layout
(:data:`LAYOUT`); every store maps them to its own places (a path under the
cache directory, a key on the fleet server)::

    <producer>/<target>/<kk>/<key>.<kind>                       compiler output (an entry)
    <producer>/<target>/jit/sm_<cc>-<driver>/<kk>/<key>.cubin   the driver's JIT of a PTX entry
    <producer>/identity.json                                    what that producer can emit
    depsets/<kk>/<sha256>.json                                  what a compile read and searched (depsets.py)
    work/nvcc-XXXX/                                             a compile's private directory (nvcc.py), gone after it
"""

from .keys import SCHEMA_VERSION

LAYOUT = "v%d" % SCHEMA_VERSION
KINDS = ("ptx", "cubin", "fatbin")
#: Top-level names that are not producers (the directory store keeps locks and memos there).
RESERVED = ("locks", "meta", "depsets", "work")


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

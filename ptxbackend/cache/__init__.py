"""The kernel cache: request keys, names, the entry format, and the stores that hold them.

Owns: :mod:`.keys` and :mod:`.layout` (what names an entry), :mod:`.entry` (the on-disk format),
:mod:`.base` (the store interface), :mod:`.store` (a local directory), :mod:`.remote` with
:mod:`.resp`, :mod:`.cluster` and :mod:`.workingset` (the fleet store), :mod:`.entries` (verified
entries over the tiers), :mod:`.stores` and :mod:`.counters` (the stores a process's settings open,
and their counters), :mod:`.bundle`, :mod:`.archive` and :mod:`.provenance` (bundles).  May import
``dependencies``, ``files``, ``errors``, ``state`` and the leaf :mod:`_ptxbackend_env`; never the
compile path above it.
"""

from .keys import SCHEMA_VERSION, request_key
from .store import DirectoryStore

__all__ = ["SCHEMA_VERSION", "DirectoryStore", "request_key"]

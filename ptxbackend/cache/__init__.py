"""The kernel cache: request keys, the entry format, dependency checks and the directory store."""

from .keys import SCHEMA_VERSION, request_key
from .store import DirectoryStore

__all__ = ["SCHEMA_VERSION", "DirectoryStore", "request_key"]

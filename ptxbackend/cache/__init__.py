"""The kernel cache: request keys, the entry format, and the directory store."""

from .keys import SCHEMA_VERSION, header_fingerprint, include_dirs, request_key
from .store import DirectoryStore

__all__ = ["SCHEMA_VERSION", "DirectoryStore", "header_fingerprint", "include_dirs", "request_key"]

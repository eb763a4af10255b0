"""Cache keys: what identifies a compile *request*.

The key covers everything known before compiling that changes the output:
schema version, target, output kind, options (relative paths made absolute,
options files inlined), the file name the compiler sees, the host compiler
nvcc preprocesses with, the environment variables the compiler reads
(``NVCC_APPEND_FLAGS``, ``CPATH``, nvcc.profile's ...) and the digest of the
toolkit's content.  The files a compile reads (headers) are not known before
it runs: they go into the entry's dependency set (see
:mod:`ptxbackend.dependencies.depsets`).  The compiler's readable name (the
*producer*) is part of the entry's path and metadata, so a machine with no
compiler can still find an entry for the same request.
"""

import hashlib
import json

SCHEMA_VERSION = 4

_key_heads = {}
_KEY_HEADS_LIMIT = 4096


def request_key(source, options, target, context=()):
    """The hex SHA-256 that names a compile request in the cache.

    ``context`` is a tuple of strings: everything besides the source, options
    and target that decides the output (the kernel's file name, the host
    compiler, the compiler's environment variables, the toolkit's content).
    """
    if not isinstance(source, bytes):
        source = source.encode("utf-8")
    marker = (target, tuple(options), context)
    try:
        head = _key_heads.get(marker)
    except TypeError:  # an unhashable option: build the head every time
        marker, head = None, None
    if head is None:
        # Every warm kernel needs its key: the JSON of everything but the source is built once.
        head = json.dumps([SCHEMA_VERSION, str(target), target.output_kind,
                           [str(o) for o in options], [str(c) for c in context]], separators=(",", ":"))
        head = head.encode("utf-8") + b"\0"
        if marker is not None:
            if len(_key_heads) >= _KEY_HEADS_LIMIT:
                _key_heads.clear()
            _key_heads[marker] = head
    digest = hashlib.sha256(head)
    digest.update(source)
    return digest.hexdigest()

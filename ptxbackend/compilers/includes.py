"""Which files a compile reads: nvcc's make-style dependency list, and NVRTC's includes resolved here."""

import errno
import os
import re
import stat as stat_module

from .._fsutil import read_regular


def parse_depfile(text, base_dir):
    """The prerequisites of a make rule as nvcc ``-MD -MF`` writes it, as absolute paths."""
    joined = text.replace("\\\n", " ")
    _target, _colon, rest = joined.partition(": ")
    found = []
    for token in re.findall(r"(?:\\ |[^\s])+", rest):
        path = token.replace("\\ ", " ").replace("$$", "$")
        found.append(os.path.normpath(os.path.join(base_dir, path)))
    return found


_INCLUDE_RE = re.compile(br'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\r\n]+)[>"]', re.M)


def scan_includes(source, include_dirs, pre_includes=(), source_dir=None):
    """Every existing file that ``source`` may include, directly or through other headers.

    Quoted includes are looked up beside the including file first (the main
    source: ``source_dir``; ``os.curdir`` for NVRTC, which looks in the
    working directory, and then the path found stays relative, so that a hit
    checks the file of the directory it runs in), then in ``include_dirs`` in
    order; angle includes in ``include_dirs`` only, as NVRTC does.  Conditional sections are not
    evaluated, so this may list a header the compiler skips: an extra check,
    never a missed one.  Names found nowhere (NVRTC's built-in headers) are
    not files and are left out.  Raises :class:`NotARegularFile` for an
    include that resolves to a FIFO or device.
    """
    if not isinstance(source, bytes):
        source = source.encode("utf-8")
    found = []
    seen = set()
    pending = [(source, source_dir)]
    for path in pre_includes:
        pending.append((None, path))
    while pending:
        text, where = pending.pop()
        if text is None:  # a pre-included file, named by path
            if where in seen or not os.path.exists(where):
                continue
            seen.add(where)
            found.append(where)
            text, where = read_regular(where)[0], os.path.dirname(where)
        for quote, name in _INCLUDE_RE.findall(text):
            name = name.decode("utf-8", "surrogateescape").strip()
            candidates = [name] if os.path.isabs(name) else (
                ([where] if quote == b'"' and where else []) + list(include_dirs))
            for directory in candidates:
                path = os.path.normpath(name if os.path.isabs(name) else os.path.join(directory, name))
                try:
                    st = os.stat(path)
                except OSError as exc:
                    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                        continue
                    raise
                if stat_module.S_ISDIR(st.st_mode):
                    continue
                if path not in seen:
                    seen.add(path)
                    found.append(path)
                    pending.append((read_regular(path)[0], os.path.dirname(path) or os.curdir))
                break
    return found

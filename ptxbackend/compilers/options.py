"""Options that name files or directories, and what the cache must know about them.

A relative path in an option means "relative to where I am": the compile runs
elsewhere (nvcc in a private directory) and the cache is shared between
working directories, so relative paths are made absolute before the compile
and before the key is computed.  Absolute paths (what CuPy passes) are kept
byte for byte, so their keys do not change.

What nvcc 11.2 and 13.0 do, found by experiment (tests/test_option_paths.py):
``-I``, ``-isystem``, ``-include`` and ``--options-file`` take comma lists
(a comma inside double quotes is kept, the quotes dropped); ``-ccbin`` does
not.  A relative path inside an options file is relative to nvcc's working
directory, not to the file.  A relative ``-include`` is looked up in the
working directory first, then on the include path.
"""

import os

from ..files.private import read_regular

# flag -> what its value is.  Both "-I dir" and "-Idir" / "--include-path=dir" forms are read.
_PATH_FLAGS = {
    "-I": "include", "--include-path": "include",
    "-isystem": "system", "--system-include": "system",
    "-include": "pre", "--pre-include": "pre",
    "-optf": "optfile", "--options-file": "optfile",
    "-ccbin": "ccbin", "--compiler-bindir": "ccbin",
}
# Only -I may be glued to its value ("-Idir"); nvcc rejects "-isystemdir", "-optfX", "-includeX".
_GLUED = ("-I",)
# nvcc splits these values at commas; a -ccbin value is one path.
_LIST_ROLES = ("include", "system", "pre", "optfile")
_SPACES = " \t\n\r\v\f"
MAX_OPTION_FILE_BYTES = 1 << 20
MAX_OPTION_FILES = 64


class PathOptions(object):
    """The options with relative paths made absolute, and the paths by role.

    Attributes:
        options: the effective option list (a tuple; items given as bytes stay bytes).
        include_dirs: ``-I`` directories, in order.
        system_dirs: ``-isystem`` directories, in order.
        pre_includes: ``-include`` files named by absolute path (or found relative to cwd).
        pre_include_names: relative ``-include`` names not in cwd: nvcc looks them up on
            the include path (see :meth:`resolve_pre_includes`).
        option_files: ``--options-file`` files (their text is more options).
        ccbin: the ``-ccbin`` value, or ``None``.
    """

    __slots__ = ("options", "include_dirs", "system_dirs", "pre_includes", "pre_include_names",
                 "option_files", "ccbin")

    def __init__(self):
        self.options = ()
        self.include_dirs = []
        self.system_dirs = []
        self.pre_includes = []
        self.pre_include_names = []
        self.option_files = []
        self.ccbin = None

    @property
    def named_dirs(self):
        """Every directory the request names (its headers are the caller's, not the system's)."""
        return self.include_dirs + self.system_dirs

    def resolve_pre_includes(self, extra_dirs=()):
        """``pre_includes`` plus each name found first in the named dirs, then ``extra_dirs``.

        A name found nowhere is left out: it is a toolkit or system header, or the compile fails.
        """
        found = list(self.pre_includes)
        for name in self.pre_include_names:
            for directory in self.named_dirs + list(extra_dirs):
                path = os.path.join(directory, name)
                if os.path.isfile(path):
                    found.append(os.path.normpath(path))
                    break
        return found


def _absolute(value, cwd):
    return value if os.path.isabs(value) else os.path.normpath(os.path.join(cwd, value))


def _text(option):
    """An option as str; NVRTC options may be bytes in any encoding."""
    if isinstance(option, bytes):
        return option.decode("utf-8", "surrogateescape")
    return str(option)


def split_list(value):
    """The items of a comma list as nvcc reads it: commas inside double quotes are kept."""
    items, current, quoted = [], [], False
    for ch in value:
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return items


def _join_list(items):
    return ",".join('"%s"' % item if "," in item else item for item in items)


def _split_flag(opt, following):
    """(flag, role, value, joined) when ``opt`` is a path option, else ``None``."""
    if opt in _PATH_FLAGS and following is not None:
        return opt, _PATH_FLAGS[opt], following, False
    head, eq, tail = opt.partition("=")
    if eq and head in _PATH_FLAGS:
        return head, _PATH_FLAGS[head], tail, True
    for glued in _GLUED:
        if opt.startswith(glued) and len(opt) > len(glued) and opt not in _PATH_FLAGS:
            return glued, _PATH_FLAGS[glued], opt[len(glued):], True
    return None


def _resolve(role, item, cwd):
    """(the item as nvcc should be given it, its absolute path or None when it names no path yet)."""
    if role == "ccbin" and os.sep not in item:
        return item, item  # a program name, looked up on PATH as nvcc does
    if role == "pre" and not os.path.isabs(item) and not os.path.exists(os.path.join(cwd, item)):
        return item, None  # nvcc searches the include path for it: keep the name
    absolute = _absolute(item, cwd)
    return absolute, absolute


def _record(result, role, path, item):
    if role == "include":
        result.include_dirs.append(path)
    elif role == "system":
        result.system_dirs.append(path)
    elif role == "pre":
        if path is None:
            result.pre_include_names.append(item)
        else:
            result.pre_includes.append(path)
    elif role == "optfile":
        result.option_files.append(path)
    else:
        result.ccbin = path


def _rewrite_value(result, role, value, cwd):
    """The value with relative paths made absolute (unchanged when none was), recording each path."""
    # CuPy v2-v9 pass "-I " + path as one option: the space is not part of the directory.
    stripped = value.strip()
    items = split_list(stripped) if role in _LIST_ROLES else [stripped]
    rewritten = []
    for item in items:
        item = item.strip()
        given, path = _resolve(role, item, cwd) if item else (item, item)
        rewritten.append(given)
        if item:
            _record(result, role, path, item)
    if rewritten == items:
        return value  # nothing relative: keep the caller's spelling byte for byte
    return _join_list(rewritten) if role in _LIST_ROLES else rewritten[0]


def read_path_options(options, cwd=None):
    """Parse ``options`` (str or bytes items) into a :class:`PathOptions`."""
    cwd = cwd or os.getcwd()
    result = PathOptions()
    out = []
    given = list(options)
    texts = [_text(o) for o in given]
    index = 0
    while index < len(texts):
        opt = texts[index]
        found = _split_flag(opt, texts[index + 1] if index + 1 < len(texts) else None)
        if found is None:
            out.append(given[index])
            index += 1
            continue
        flag, role, value, joined = found
        new_value = _rewrite_value(result, role, value, cwd)
        if joined:
            spelled = flag + ("=" if opt.startswith(flag + "=") else "") + new_value
            out.append(_like(given[index], spelled if new_value != value else opt))
            index += 1
        else:
            out.extend([given[index], _like(given[index + 1], new_value)])
            index += 2
    result.options = tuple(out)
    return result


def _like(original, text):
    """``text`` in the type of ``original`` (bytes stay bytes); unchanged text keeps the original."""
    if isinstance(original, bytes):
        encoded = text.encode("utf-8", "surrogateescape")
        return original if encoded == original else encoded
    return original if text == _text(original) else text


def split_options_file(text):
    """The options in an options file's text, split as nvcc 13 does.

    Whitespace separates; double quotes group (and may sit mid-word); a
    backslash takes the next character literally, inside quotes too; ``""``
    is an empty option; single quotes and ``#`` are ordinary characters.
    """
    return _split_words(text, escapes=True)


def split_env_flags(text):
    """``NVCC_PREPEND_FLAGS`` / ``NVCC_APPEND_FLAGS`` as nvcc splits them: like an options
    file, except that a backslash is an ordinary character."""
    return _split_words(text, escapes=False)


def _split_words(text, escapes):
    words, current, started, quoted = [], [], False, False
    index = 0
    while index < len(text):
        ch = text[index]
        index += 1
        if ch == "\\" and escapes and index < len(text):
            current.append(text[index])
            index += 1
            started = True
        elif ch == '"':
            quoted, started = not quoted, True
        elif ch in _SPACES and not quoted:
            if started:
                words.append("".join(current))
            current, started = [], False
        else:
            current.append(ch)
            started = True
    if quoted:
        raise ValueError("an options file or NVCC_*_FLAGS holds an unterminated double quote: %r"
                         % text[:200])
    if started:
        words.append("".join(current))
    return words


class _Reader(object):
    """Reads options files depth first, bounded, remembering each one read."""

    def __init__(self, cwd):
        self.cwd = cwd
        self.files = []
        self.stack = []

    def expand(self, options):
        out = []
        index = 0
        while index < len(options):
            opt = _text(options[index])
            found = _split_flag(opt, _text(options[index + 1]) if index + 1 < len(options) else None)
            if found is None or found[1] != "optfile":
                out.append(options[index])
                index += 1
                continue
            index += 1 if found[3] else 2
            for item in split_list(found[2].strip()):
                if item.strip():
                    out.extend(self.read(_absolute(item.strip(), self.cwd)))
        return out

    def read(self, path):
        if path in self.stack:
            raise ValueError("options file %s names itself through %s" % (path, " -> ".join(self.stack)))
        if len(self.files) >= MAX_OPTION_FILES:
            raise ValueError("more than %d options files are read (%s ...)" % (MAX_OPTION_FILES, path))
        self.files.append(path)
        data, st = read_regular(path)
        if len(data) > MAX_OPTION_FILE_BYTES:
            raise ValueError("options file %s is larger than %d bytes" % (path, MAX_OPTION_FILE_BYTES))
        self.stack.append(path)
        try:
            return self.expand(split_options_file(data.decode("utf-8", "surrogateescape")))
        finally:
            self.stack.pop()


def expand_option_files(options, cwd=None, environ=None):
    """Every options file a compile with ``options`` reads, and the paths it really uses.

    Reads each ``--options-file`` / ``-optf`` (comma lists too) named in
    ``options``, in ``NVCC_PREPEND_FLAGS`` / ``NVCC_APPEND_FLAGS`` of
    ``environ`` (default ``os.environ``) and, transitively, inside options
    files; relative paths are taken against ``cwd`` (nvcc's rule: not against
    the options file).  Returns a :class:`PathOptions` whose path lists are the
    effective ones in nvcc's order (prepended flags, the options, appended
    flags), whose ``option_files`` lists every file read (absolute), and whose
    ``options`` are ``options`` with each options file replaced by its
    contents (relative paths made absolute): nvcc given those reads no options
    file and sees the same command.  Raises ``ValueError`` for a cycle, more
    than 64 files, a file over 1 MiB or an unterminated quote; ``OSError``
    when a file cannot be read (``NotARegularFile`` for a FIFO or device).
    """
    cwd = cwd or os.getcwd()
    environ = os.environ if environ is None else environ
    reader = _Reader(cwd)
    prepend = reader.expand(split_env_flags(environ.get("NVCC_PREPEND_FLAGS", "")))
    middle = reader.expand(list(options))
    append = reader.expand(split_env_flags(environ.get("NVCC_APPEND_FLAGS", "")))
    result = read_path_options(prepend + middle + append, cwd)
    result.options = read_path_options(middle, cwd).options
    result.option_files = reader.files
    return result

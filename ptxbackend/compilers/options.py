"""Options that name files or directories, and what the cache must know about them.

A relative path in an option means "relative to where I am": the compile runs
elsewhere (nvcc in a private directory) and the cache is shared between
working directories, so relative paths are made absolute before the compile
and before the key is computed.  Absolute paths (what CuPy passes) are kept
byte for byte, so their keys do not change.
"""

import os

# flag -> what its value is.  Both "-I dir" and "-Idir" / "--include-path=dir" forms are read.
_PATH_FLAGS = {
    "-I": "include", "--include-path": "include",
    "-isystem": "system", "--system-include": "system",
    "-include": "pre", "--pre-include": "pre",
    "-optf": "optfile", "--options-file": "optfile",
    "-ccbin": "ccbin", "--compiler-bindir": "ccbin",
}
# Only -I may be glued to its value ("-Idir"); the others would be ambiguous ("-includeX").
_GLUED = ("-I",)


class PathOptions(object):
    """The options with relative paths made absolute, and the paths by role.

    Attributes:
        options: the effective option list (a tuple of str).
        include_dirs: ``-I`` directories, in order.
        system_dirs: ``-isystem`` directories, in order.
        pre_includes: ``-include`` files.
        option_files: ``--options-file`` files (their text is more options).
        ccbin: the ``-ccbin`` value, or ``None``.
    """

    __slots__ = ("options", "include_dirs", "system_dirs", "pre_includes", "option_files", "ccbin")

    def __init__(self):
        self.options = ()
        self.include_dirs = []
        self.system_dirs = []
        self.pre_includes = []
        self.option_files = []
        self.ccbin = None

    @property
    def named_dirs(self):
        """Every directory the request names (its headers are the caller's, not the system's)."""
        return self.include_dirs + self.system_dirs


def _absolute(value, cwd):
    return value if os.path.isabs(value) else os.path.normpath(os.path.join(cwd, value))


def read_path_options(options, cwd=None):
    """Parse ``options`` (strings) into a :class:`PathOptions`."""
    cwd = cwd or os.getcwd()
    result = PathOptions()
    out = []
    options = [str(o) for o in options]
    index = 0
    while index < len(options):
        opt = options[index]
        flag = role = value = None
        joined = False
        if opt in _PATH_FLAGS and index + 1 < len(options):
            flag, role, value = opt, _PATH_FLAGS[opt], options[index + 1]
        else:
            head, eq, tail = opt.partition("=")
            if eq and head in _PATH_FLAGS:
                flag, role, value, joined = head, _PATH_FLAGS[head], tail, True
            else:
                for glued in _GLUED:
                    if opt.startswith(glued) and len(opt) > len(glued) and opt not in _PATH_FLAGS:
                        flag, role, value, joined = glued, _PATH_FLAGS[glued], opt[len(glued):], True
                        break
        if flag is None:
            out.append(opt)
            index += 1
            continue
        # CuPy v2-v9 pass "-I " + path as one option: the space is not part of the directory.
        stripped = value.strip()
        if role == "ccbin" and os.sep not in stripped:
            absolute = stripped  # a program name, looked up on PATH as nvcc does
        else:
            absolute = _absolute(stripped, cwd) if stripped else stripped
        if absolute != stripped:
            value = absolute  # rewritten: only then does the option's spelling change
        if joined:
            out.append(flag + ("=" if opt.startswith(flag + "=") else "") + value)
        else:
            out.extend([opt, value])
        index += 1 if joined else 2
        if not absolute:
            continue
        if role == "include":
            result.include_dirs.append(absolute)
        elif role == "system":
            result.system_dirs.append(absolute)
        elif role == "pre":
            result.pre_includes.append(absolute)
        elif role == "optfile":
            result.option_files.append(absolute)
        else:
            result.ccbin = absolute
    result.options = tuple(out)
    return result

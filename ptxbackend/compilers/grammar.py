"""What may reach a compiler's command line from data, and how a file name is spelt for nvcc.

nvcc hands its host-compiler and cicc steps to a shell, with file names and
option values inside double quotes: ``$(...)``, a backquote or a backslash in
any of them is run or read by that shell (tests/test_injection.py shows it with
a canary).  So nothing that came from a file, the fleet or a setting is ever
passed through:

* options read from data (a ``warm`` manifest, a record) must match
  :func:`check_data_options`' grammar: the forms CuPy v1..v14, Chainer and the
  docs produce, each value made only of characters with no shell meaning;
  anything else is refused with one line naming the option and the character;
* a kernel name becomes a path inside the compiler's private directory that is
  never read as an option and holds no character a shell reads inside quotes
  (:func:`source_argument`);
* the private directory itself (nvcc puts its absolute path on those lines)
  must be made of such characters (:func:`shell_quiet`).

Options a program passes to ``ptxbackend.compile()`` itself are its own and
are kept as given.
"""

import hashlib
import re

from ..errors import PtxBackendError


class UnsafeOption(PtxBackendError):
    """An option from data that is not in the grammar, or holds a character with shell meaning."""


# Characters a POSIX shell gives meaning to, inside or outside double quotes, named for the message.
_SHELL = {
    "$": "a dollar sign ($)", "`": "a backquote (`)", ";": "a semicolon (;)", "|": "a pipe (|)",
    "&": "an ampersand (&)", "<": "a '<'", ">": "a '>'", "'": "a single quote (')", '"': 'a double quote (")',
    "\\": "a backslash (\\)", "\n": "a newline", "\r": "a carriage return", "\0": "a NUL character",
}


def shell_character(text):
    """A description of the first character of ``text`` a shell gives meaning to (or a control
    character), else ``None``."""
    for ch in text:
        if ch in _SHELL:
            return _SHELL[ch]
        if ord(ch) < 32 or ord(ch) == 127:
            return "a control character (%r)" % ch
    return None


# A path nvcc may be given as its working directory, temporary directory or output (it writes the
# absolute path on its shell lines): plain characters only.
_QUIET_PATH = re.compile(r"^[A-Za-z0-9_./+,=@%~:-]+$")


def shell_quiet(path):
    """Whether ``path`` can sit on nvcc's shell lines as it is."""
    return bool(_QUIET_PATH.match(path))


# A character of a kernel name kept as it is; any other becomes '_'.  Non-ASCII letters are kept:
# a shell gives them no meaning.
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.+,=@%~: ()\[\]{}#/-]")


def _name_char(ch):
    if _NAME_CHARS.match(ch) or (ord(ch) > 127 and ch.isprintable()):
        return ch
    return "_"


# A file name's bytes (255 on Linux, less the ".cu" that may be added) and the directories above it.
_MAX_PART = 200
_MAX_DEPTH = 16


def _fitting(part):
    """``part``, or (longer than a file name may be) its start and a digest of the whole."""
    if len(part.encode("utf-8", "surrogateescape")) <= _MAX_PART:
        return part
    digest = hashlib.sha256(part.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    kept = part[:_MAX_PART // 4 - 20]  # at most 4 bytes a character
    return "%s~%s" % (kept, digest)


def source_argument(name):
    """The name nvcc is given for the source file the caller calls ``name``: a relative path inside
    its private directory, no character a shell reads inside double quotes, ending in ``.cu`` (nvcc
    picks the language by the ending), and ``./`` before one that starts with ``-`` (nvcc would read
    it as an option).  Names made of plain characters are kept as spelt (nvcc writes the name into
    its output: ``assert`` messages), so their keys do not change.  A part longer than a file name
    may be is shortened, and kept apart from others by a digest of it."""
    name = str(name).replace("\\", "/")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or name.startswith("/") or ".." in parts:
        base = name.rpartition("/")[2]
        parts = [base] if base not in ("", ".", "..") else ["kernel.cu"]
    parts = ["".join(_name_char(ch) for ch in part) for part in parts]
    if len(parts) > _MAX_DEPTH:
        parts = parts[-1:]  # a path that deep is no layout anyone compiles from: its file name will do
    found = "/".join(_fitting(part) for part in parts)
    found = found if found.endswith(".cu") else found + ".cu"
    return "./" + found if found.startswith("-") else found


# -- the grammar of options from data ------------------------------------------------------------
# Flags without a value.
_SWITCHES = frozenset((
    "-lineinfo", "--generate-line-info", "-G", "--device-debug", "-use_fast_math", "--use_fast_math",
    "-rdc", "-dc", "--device-c", "-dlto", "-restrict", "--restrict", "-w", "--disable-warnings",
    "--expt-relaxed-constexpr", "-expt-relaxed-constexpr", "--expt-extended-lambda", "-expt-extended-lambda",
    "--extended-lambda", "-extended-lambda", "-m64", "--machine=64", "--device-as-default-execution-space",
    "-default-device", "--extra-device-vectorization", "-extra-device-vectorization",
    "-Wno-deprecated-gpu-targets", "--Wno-deprecated-gpu-targets", "-Wno-deprecated-declarations",
    "--Wno-deprecated-declarations", "-Werror=all-warnings", "--device-int128", "-fcuda-flush-denormals-to-zero",
    "--no-source-include", "-O0", "-O1", "-O2", "-O3", "--dopt=on", "--dopt=off", "-src-in-ptx",
    "--source-in-ptx", "--resource-usage", "-res-usage", "--pch",
))
# Flags with a value from a small set (given as "-flag=value" or "-flag value").
_BOOLEAN = ("true", "false")
_CHOICES = {
    "-rdc": _BOOLEAN, "--relocatable-device-code": _BOOLEAN, "-fmad": _BOOLEAN, "--fmad": _BOOLEAN,
    "-ftz": _BOOLEAN, "--ftz": _BOOLEAN, "-prec-div": _BOOLEAN, "--prec-div": _BOOLEAN,
    "-prec-sqrt": _BOOLEAN, "--prec-sqrt": _BOOLEAN, "-dopt": ("on", "off"), "--dopt": ("on", "off"),
    "-std": ("c++03", "c++11", "c++14", "c++17", "c++20", "c++23"),
    "--std": ("c++03", "c++11", "c++14", "c++17", "c++20", "c++23"),
}
_ARCH = re.compile(r"^(compute|sm|lto)_\d+[af]?$|^native$|^all$|^all-major$")
_GENCODE = re.compile(r"^arch=(compute_\d+[af]?),code=(\[?[a-z_0-9,]+\]?)$")
_NUMBER = re.compile(r"^\d{1,4}$")
_MACRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A macro's value: numbers, identifiers, arithmetic and brackets; no quotes (a string macro is
# compiled with ptxbackend.compile() in the program itself), no shell characters, no spaces.
_MACRO_VALUE = re.compile(r"^[A-Za-z0-9_.+/%(),:^=-]*$")
_VALUED = {
    "-arch": "arch", "--gpu-architecture": "arch", "-code": "code", "--gpu-code": "code",
    "-gencode": "gencode", "--generate-code": "gencode", "-maxrregcount": "number", "--maxrregcount": "number",
    "-D": "macro", "--define-macro": "macro", "-U": "undef", "--undefine-macro": "undef",
    "-I": "path", "--include-path": "path", "-isystem": "path", "--system-include": "path",
    "-include": "path", "--pre-include": "path",
}
_VALUED.update((flag, "choice") for flag in _CHOICES)
# Flags whose value may follow in the next option ("-I dir", "-D X=1", "-arch sm_75").
_SEPARATE = ("-arch", "--gpu-architecture", "-code", "--gpu-code", "-gencode", "--generate-code", "-D",
             "--define-macro", "-U", "--undefine-macro", "-I", "--include-path", "-isystem",
             "--system-include", "-include", "--pre-include", "-maxrregcount", "--maxrregcount", "-std",
             "--std")
# Flags glued to their value ("-DX=1", "-Idir", "-Uname").
_GLUED = ("-D", "-I", "-U")


def _value_problem(kind, flag, value):
    """Why ``value`` is not a valid value of ``flag`` (``None`` when it is)."""
    if kind == "choice":
        return None if value in _CHOICES[flag] else "takes one of %s" % ", ".join(_CHOICES[flag])
    if kind in ("arch", "code"):
        ok = all(_ARCH.match(part) for part in value.split(",")) if value else False
        return None if ok else "takes compute_XY or sm_XY"
    if kind == "gencode":
        return None if _GENCODE.match(value) else "takes arch=compute_XY,code=sm_XY"
    if kind == "number":
        return None if _NUMBER.match(value) else "takes a number"
    if kind == "undef":
        return None if _MACRO_NAME.match(value) else "takes a macro name"
    if kind == "macro":
        macro, eq, body = value.partition("=")
        if not _MACRO_NAME.match(macro):
            return "takes NAME or NAME=VALUE with NAME an identifier"
        if eq and not _MACRO_VALUE.match(body):
            return "takes a value of numbers, names and arithmetic (no spaces or quotes)"
        return None
    # A path: CuPy v2-v9 write "-I " + dir as one option, so blanks around it are not part of it.
    path = value.strip()
    if not path:
        return "takes a path"
    # nvcc splits these at commas: no item may read as an option either.
    for item in path.split(","):
        if item.strip().startswith("-"):
            return "takes a path, not an option (%s)" % item.strip()[:60]
    return None


def _split(option, following):
    """(flag, kind, value, consumed) for a valued option, else ``None``."""
    head, eq, tail = option.partition("=")
    if eq and head in _VALUED:
        return head, _VALUED[head], tail, 1
    if option in _VALUED and option in _SEPARATE:
        if following is None:
            return option, _VALUED[option], "", 1
        return option, _VALUED[option], following, 2
    for flag in _GLUED:
        if option.startswith(flag) and len(option) > len(flag) and option not in _SWITCHES:
            return flag, _VALUED[flag], option[len(flag):], 1
    return None


def option_problem(options):
    """Why the option list read from data is refused (one line), or ``None`` when every option is in
    the grammar.  ``options``: a list of str."""
    index = 0
    while index < len(options):
        option = options[index]
        if not isinstance(option, str):
            return "an option is %r, not a string" % (option,)
        shown = option if len(option) <= 80 else option[:77] + "..."
        following = options[index + 1] if index + 1 < len(options) else None
        bad = shell_character(option)
        if bad:
            return "the option %r holds %s, which a shell would read" % (shown, bad)
        if option in _SWITCHES:
            index += 1
            continue
        found = _split(option, following)
        if found is None:
            return ("the option %r is not one CuPy, Chainer or the docs produce (the options ptxbackend "
                    "replays from data are -arch, -gencode, -I, -isystem, -include, -D, -U, -std, "
                    "-rdc, --fmad, --ftz, --prec-div, --prec-sqrt, -lineinfo, -G, --use_fast_math and "
                    "a few more; see docs/reliability.md)" % shown)
        flag, kind, value, consumed = found
        if consumed == 2:
            bad = shell_character(value)
            if bad:
                return "the value %r of %s holds %s, which a shell would read" % (value[:80], flag, bad)
        why = _value_problem(kind, flag, value)
        if why:
            return "the option %r: %s %s" % (shown if consumed == 1 else "%s %s" % (flag, value[:60]), flag, why)
        index += consumed
    return None


def check_data_options(options, origin):
    """Raise :class:`UnsafeOption` (one line naming ``origin``) when :func:`option_problem` finds one."""
    why = option_problem(list(options))
    if why:
        raise UnsafeOption("%s: %s; such a kernel is compiled with ptxbackend.compile() in the program "
                           "itself, never replayed from a file" % (origin, why))

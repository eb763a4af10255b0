"""The lists of files a compile read that nvcc and the host preprocessor write (make syntax)."""

import os
import re


def parse_depfile(text, base_dir, target=None, check_exists=True):
    """The prerequisites of the make rule nvcc ``-MD -MF`` writes, as absolute paths.

    nvcc 11.2 and 13.0 write their own format, not GCC's (tests/test_option_paths.py):
    the target verbatim, `` : ``, then one prerequisite per line joined by
    `` \\<newline>``; in a prerequisite a space is ``\\ `` and a newline ``\\n``,
    every other character (tab, ``#``, ``$``, ``:``, ``%``, any byte) is
    written as is, and a backslash is written as ``/``.  So ``$$`` is two
    dollars here, not make's one.  ``text`` is str (read with
    surrogateescape) or bytes.  ``target``, when known, is the ``-o`` path
    and settles a target that holds `` : ``.

    Raises ``ValueError`` when the list cannot be read exactly: it is cut
    short, holds an escape nvcc does not write, the target cannot be told
    apart, or (``check_exists``) a listed file does not exist, which is what
    a name holding a backslash looks like once nvcc wrote it as ``/``.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    if not text.endswith("\n"):
        raise ValueError("nvcc's dependency list is cut short (no final newline)")
    body = text[:-1]
    if "\n" in body.replace("\\\n", ""):
        raise ValueError("nvcc's dependency list holds more than one rule")
    rest = body[_rule_separator(body, target):]
    found = []
    for name in _prerequisites(rest):
        path = os.path.normpath(os.path.join(base_dir, name))
        if check_exists and not os.path.exists(path):
            raise ValueError("nvcc lists %r, which does not exist: a file name holding a backslash "
                             "(nvcc writes it as '/') or a file removed during the compile" % path)
        found.append(path)
    return found


def _rule_separator(body, target):
    """Where the prerequisites start: after the target and its colon."""
    first = body.split("\\\n", 1)[0]
    if target is not None:
        if not first.startswith(target):
            raise ValueError("nvcc's dependency list is not for %r: %r" % (target, first[:200]))
        match = re.compile(r"[ \t]*:(?: |$)").match(first, len(target))
        if match is None:
            raise ValueError("nvcc's dependency list has no ':' after its target: %r" % first[:200])
        return match.end()
    # A prerequisite writes its spaces as "\\ ", so only the target can hold ": ".
    colons = [m.end() for m in re.finditer(r":(?: |$)", first)]
    if len(colons) != 1:
        raise ValueError("cannot tell the target from the files in nvcc's dependency list %r; "
                         "pass the target" % first[:200])
    return colons[0]


def _prerequisites(rest):
    names, current, index = [], [], 0
    while index < len(rest):
        ch = rest[index]
        index += 1
        if ch == "\\":
            escaped = rest[index:index + 1]
            index += 1
            if escaped not in (" ", "n", "\n"):
                raise ValueError("nvcc's dependency list holds an escape it does not write: %r"
                                 % ("\\" + escaped))
            if escaped != "\n":
                current.append(" " if escaped == " " else "\n")
                continue
        elif ch != " ":
            current.append(ch)
            continue
        if current:
            names.append("".join(current))
        current = []
    if current:
        names.append("".join(current))
    return names


_INCLUDE_RE = re.compile(br'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\r\n]+)[>"]', re.M)


def parse_make_rule(text, base_dir, target):
    """The prerequisites of the one rule for ``target`` that a GCC-style preprocessor writes with
    ``-MD -MF file -MT target`` (also clang): GNU make syntax, with ``\\ `` for a space, ``\\#`` for
    ``#``, ``$$`` for ``$`` and backslash-newline between lines.  Used only where no directory on the
    search path holds a character that syntax spells ambiguously (nvcc.py); a listed file that does
    not exist still raises ``ValueError``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    head = target + ":"
    if not text.startswith(head) or not text.endswith("\n"):
        raise ValueError("the host compiler's dependency list is not one rule for %r" % target)
    body = text[len(head):-1].replace("\\\n", " ")
    if "\n" in body:
        raise ValueError("the host compiler's dependency list holds more than one rule")
    if "\\" in body or "$" in body:
        names = [re.sub(r"\\([ \t#\\])", r"\1", token).replace("$$", "$")
                 for token in re.findall(r"(?:\\.|[^\s\\])+", body)]
    else:
        names = body.split()  # the usual list: nothing escaped
    found = []
    for name in names:
        path = os.path.normpath(os.path.join(base_dir, name))
        if not os.path.exists(path):
            raise ValueError("the host compiler lists %r, which does not exist" % path)
        found.append(path)
    return found


"""What a compile request is besides its source and target: the effective options, the key's
context, and the paths the compiler will search, remembered per process."""

import os

from ..compilers import COMPILERS
from ..compilers.nvrtc import uses_precompiled_headers
from ..compilers.options import expand_option_files, read_path_options
from ..errors import CompileError, TargetError
from ..state import state

# Options that choose the architecture: the target does that, so one that disagrees is an error.
_ARCH_FLAGS = ("-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code", "--gpu-code")


class Request(object):
    """The effective options (relative paths made absolute), the key's context and the parsed paths."""

    __slots__ = ("options", "context", "path_options", "cwd_free", "arch_options")

    def __init__(self, options, context, path_options, cwd_free, arch_options):
        self.options = options
        self.context = context
        self.path_options = path_options
        self.cwd_free = cwd_free  # no relative path: the same wherever the process is
        self.arch_options = arch_options

    def check_target(self, target):
        """Refuse options that name another architecture than ``target`` (both would be passed)."""
        for option in self.arch_options:
            value = option.split("=", 1)[1] if "=" in option else option
            if not all(str(t) in value or str(t).replace("compute_", "sm_") in value
                       for t in _target_parts(target)):
                raise TargetError(
                    "the options name an architecture (%s) other than the target %s: ptxbackend passes "
                    "the target's own. Remove it from the options and choose the target with "
                    "PTXBACKEND_TARGET (or target=), e.g. PTXBACKEND_TARGET=%s."
                    % (option, target, value.split(",")[0].split("=")[-1]))


def _target_parts(target):
    return ["%s_%d%s" % part for part in target.parts]


def _arch_options(options):
    found = []
    for index, option in enumerate(options):
        head = option.split("=", 1)[0]
        if head in _ARCH_FLAGS:
            found.append(option if "=" in option or index + 1 >= len(options)
                         else "%s=%s" % (option, options[index + 1]))
    return tuple(found)


def build(options, name, source_dir, kind, host, environment, toolkit=""):
    """The :class:`Request` for these options (remembered unless it depends on the working directory)."""
    marker = (options, name, source_dir, kind, host, environment, toolkit)
    try:
        found = state.requests.get(marker)
    except TypeError:
        marker = found = None
    if found is not None:
        return found
    if source_dir:
        # Quoted includes beside the source file, as when the compiler reads it there.
        options = ("-I", os.path.abspath(source_dir)) + options
    parsed = _parse(options, kind)
    backend = COMPILERS.get(kind)
    compiled_name = backend.compiled_name(name) if backend else str(name)
    context = (compiled_name, host) + environment + ((toolkit,) if toolkit else ())
    if kind == "nvrtc" and uses_precompiled_headers(parsed.options):
        # Never cached (nvrtc.py says why); the key differs too, so no entry an older version filed
        # for these options, with the empty list of reads such a compile shows, is ever served.
        context += ("precompiled headers",)
    # A relative path depends on the working directory, and an options file's text can change: those
    # requests are parsed every time.
    found = Request(parsed.options, context, parsed,
                    parsed.options == options and (not source_dir or os.path.isabs(source_dir))
                    and not parsed.option_files, _arch_options(parsed.options))
    _remember(state.requests, marker, found)
    return found


def _parse(options, kind):
    """The paths the compile will use; for nvcc with every options file (also those named in
    NVCC_PREPEND_FLAGS / NVCC_APPEND_FLAGS, and nested ones) read and inlined, so nvcc reads the
    same text the key was made of."""
    if kind != "nvcc":
        return read_path_options(options)
    try:
        return expand_option_files(options)
    except (ValueError, OSError) as exc:
        raise CompileError("cannot read the options files of this compile: %s" % exc)


def _remember(memo, marker, found):
    """Keep ``found`` under ``marker`` (a bounded memo), unless it depends on the working directory."""
    if marker is not None and found.cwd_free:
        with state.lock:
            if len(memo) >= 1024:
                memo.clear()
            memo[marker] = found


def settled(options, name, source_dir, comp, settings):
    """:func:`build` for a compiler in use, remembered per (options, name, directory, compiler,
    settings): the warm path's one dictionary lookup for all of it."""
    marker = (options, name, source_dir, comp, settings)
    try:
        found = state.settled.get(marker)
    except TypeError:
        marker = found = None
    if found is None:
        found = build(options, name, source_dir, comp.kind, comp.identity.host,
                      environment(settings, type(comp)), comp.identity.content)
        _remember(state.settled, marker, found)
    return found


def environment(settings, comp_class):
    """The compiler's variables that are set, as ``NAME=value`` (config reads nvcc's only)."""
    return settings.compiler_env if comp_class.environment else ()


def host(comp, path_options):
    """The host compiler nvcc preprocesses with, as the key names it ('' for NVRTC), and its own
    include directories when the options chose it."""
    ccbin = path_options.ccbin
    if ccbin and hasattr(comp, "host_compiler"):
        found = comp.host_compiler(ccbin)
        return found.host, found.system_dirs
    return comp.identity.host, ()

"""nvcc, run as a subprocess: what Chainer 1.x's CuPy compiles with."""

import errno
import logging
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time

from ..config import KNOBS, NVCC_ENVIRONMENT
from ..errors import CompileError, CompilerNotFoundError
from .base import (Compiler, CompilerIdentity, archs_from_table, content_digest, file_signature,
                   remembered_identity, unknown_arch_hint)
from ..dependencies.depfiles import parse_depfile, parse_make_rule
from .options import read_path_options
from .grammar import shell_quiet, source_argument
from .stopping import compile_stops_cleanly
from ..files import private
from ..dependencies.reads import UNKNOWN_READS, environment_include_dirs, scan_includes

NVCC_ENV = "PTXBACKEND_NVCC"
#: The installers' default place, searched last (nothing on PATH, no CUDA_PATH or CUDA_HOME).
DEFAULT_TOOLKIT = "/usr/local/cuda"
logger = logging.getLogger("ptxbackend")

_VERSION_RE = re.compile(r"release (\d+)\.(\d+), V(\d+\.\d+\.\d+)")
_ARCH_LINE_RE = re.compile(r"^(compute|sm)_(\d+)$")
_OUTPUT_FLAG = {"ptx": "--ptx", "cubin": "--cubin", "fatbin": "--fatbin"}


def find_nvcc(explicit=None):
    """Locate nvcc: ``explicit``, ``PTXBACKEND_NVCC``, ``CUDA_PATH``, ``CUDA_HOME``, PATH, /usr/local/cuda.

    ``explicit`` and ``PTXBACKEND_NVCC`` may name the program or a toolkit
    directory.  Raises :class:`CompilerNotFoundError` saying where it looked.
    """
    looked = []
    from_env = os.environ.get(NVCC_ENV)
    for origin, value in (("argument", explicit), (NVCC_ENV, from_env)):
        if not value:
            continue
        if value == from_env:
            # Settings hand the variable's value down as ``explicit``: name where the user set it.
            origin = "the environment (%s)" % NVCC_ENV
        for candidate in (value, os.path.join(value, "bin", "nvcc"), os.path.join(value, "nvcc")):
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
        # An explicit choice that does not exist is an error, not a reason to fall back silently.
        raise CompilerNotFoundError(
            "nvcc given by %s (%s) is not an executable file or a toolkit directory "
            "holding bin/nvcc. Fix the path, or unset it to search CUDA_PATH, CUDA_HOME "
            "and PATH." % (origin, value))
    for var in ("CUDA_PATH", "CUDA_HOME"):
        root = os.environ.get(var)
        if root:
            candidate = os.path.join(root, "bin", "nvcc")
            looked.append("%s=%s" % (var, candidate))
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    found = shutil.which("nvcc")
    looked.append("PATH")
    if found:
        return found
    if os.name == "posix" and not (os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME")):
        # Where NVIDIA's installers put the toolkit and CuPy looks last. Only when neither variable
        # names a toolkit: one that does is the user's choice, and a guess must not override it.
        candidate = os.path.join(DEFAULT_TOOLKIT, "bin", "nvcc")
        looked.append(candidate)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CompilerNotFoundError(
        "nvcc not found (looked in: %s). Install a CUDA toolkit, or point "
        "PTXBACKEND_NVCC at its nvcc (or set CUDA_PATH), or use NVRTC "
        "(PTXBACKEND_COMPILER=nvrtc)." % ", ".join(looked))


def _run(cmd, cwd=None, timeout=None, env=None):
    # Its own process group: a time-out, Ctrl-C, SIGTERM or SIGHUP (compilers/stopping.py) kills
    # nvcc's children too (cicc, ptxas, the host compiler), which would otherwise hold the output pipe
    # open and keep running.
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=hasattr(os, "killpg"), env=env)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        _kill_group(proc)
        raise
    return proc.returncode, out.decode("utf-8", "replace")


def _kill_group(proc):
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except OSError:
        pass
    proc.wait()


def _list_archs(path, flag, prefix):
    try:
        code, out = _run([path, flag], timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if code != 0:
        return None
    archs = []
    for line in out.split():
        match = _ARCH_LINE_RE.match(line.strip())
        if match and match.group(1) == prefix:
            archs.append(int(match.group(2)))
    return archs or None


def _dryrun_facts(path):
    """What nvcc's ``-dryrun`` says of the files it would use: ``{name: value}`` and the host command.

    It names the directory of the real nvcc behind any wrapper (``_HERE_``),
    the toolkit root, cicc's and libdevice's directories, the include
    directories and the host compiler, spelt as nvcc reached them (a link
    like ``/usr/local/cuda`` is kept, so a later swap of it is seen).
    """
    try:
        code, out = _run([path, "-dryrun", "--ptx", "-arch=compute_%d" % 75, "ptxbackend-probe.cu"],
                         timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}, None
    facts, host, cicc = {}, None, None
    for line in out.splitlines():
        if not line.startswith("#$ "):
            continue
        body = line[3:].strip()
        name, eq, value = body.partition("=")
        if eq and re.match(r"^[A-Z_]+$", name):
            facts.setdefault(name, value)
            continue
        if cicc is None and re.match(r'^"?[^ ]*cicc"? ', body):
            cicc = shlex.split(body)[0].replace("$CICC_PATH", facts.get("CICC_PATH", ""))
            continue
        if host is None and " -E " in " %s " % body and "cicc" not in body:
            try:
                host = shlex.split(body)[0]
            except ValueError:
                host = None
    if cicc:
        facts["cicc"] = cicc
    return facts, host


def _quoted_dirs(text):
    try:
        words = shlex.split(text or "")
    except ValueError:
        return []
    dirs = []
    for index, word in enumerate(words):
        if word.startswith("-I") and len(word) > 2:
            dirs.append(word[2:])
        elif word == "-isystem" and index + 1 < len(words):
            dirs.append(words[index + 1])
    return dirs


def probe_host(path):
    """The host compiler at ``path``: its version and its own include directories (spawns it)."""
    version = ""
    try:
        code, out = _run([path, "-dumpfullversion", "-dumpversion"], timeout=60)
        if code == 0:
            version = out.strip().splitlines()[0] if out.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        pass
    dirs = []
    try:
        code, out = _run([path, "-E", "-x", "c++", "-v", os.devnull], timeout=60)
        inside = False
        for line in out.splitlines():
            if line.startswith("#include <...> search starts here"):
                inside = True
            elif line.startswith("End of search list"):
                break
            elif inside and line.startswith(" "):
                dirs.append(os.path.normpath(line.strip()))
    except (OSError, subprocess.TimeoutExpired):
        pass
    # The name, the version and what the file holds: a link retargeted or a wrapper script edited
    # is another host compiler even where both report one version.
    return CompilerIdentity("host", path, version or "unknown", (), (), False,
                            files=[[path, file_signature(path)]], system_dirs=dirs,
                            host="%s %s %s" % (os.path.basename(path), version or "unknown",
                                               content_digest([path])[:12]))


def _resolve_host(name, search_path):
    if os.sep in name:
        return name
    return shutil.which(name, path=search_path) or name


def probe_nvcc(path):
    """Ask nvcc at ``path`` for its version, architectures and the files it works with (spawns nvcc)."""
    try:
        code, out = _run([path, "--version"], timeout=60)
    except OSError as exc:
        raise CompilerNotFoundError("cannot run nvcc at %s: %s" % (path, exc))
    match = _VERSION_RE.search(out)
    if code != 0 or not match:
        raise CompilerNotFoundError(
            "%s --version did not report a CUDA release (exit %s):\n%s" % (path, code, out.strip()))
    version = match.group(3)
    virtual = _list_archs(path, "--list-gpu-arch", "compute")
    real = _list_archs(path, "--list-gpu-code", "sm")
    reliable = virtual is not None and real is not None
    if not reliable:
        virtual = real = archs_from_table(version)
    facts, host = _dryrun_facts(path)
    here = facts.get("_HERE_") or os.path.dirname(path)
    top = facts.get("TOP") or os.path.join(here, "..")
    search_path = facts.get("PATH") or os.environ.get("PATH")
    cicc = _resolve_host(facts.get("cicc") or os.path.join(top, "nvvm", "bin", "cicc"), search_path)
    libdevice = facts.get("NVVMIR_LIBRARY_DIR") or os.path.join(top, "nvvm", "libdevice")
    # The sentinels first: what discovery found, the real nvcc behind it (through any link, so a
    # swapped /usr/local/cuda shows) and the host compiler (a retargeted gcc link): a stat each on every
    # call.  The rest is checked by every new process and before every compile.
    workers = [path, os.path.join(here, "nvcc")]
    rest = [os.path.join(here, "nvcc.profile"), cicc, os.path.join(here, "ptxas"),
            os.path.join(here, "cudafe++"), os.path.join(here, "fatbinary"),
            os.path.join(libdevice, "libdevice.10.bc")]
    system_dirs = [os.path.join(top, "include")] + _quoted_dirs(facts.get("INCLUDES")) \
        + _quoted_dirs(facts.get("SYSTEM_INCLUDES"))
    host_text = ""
    if host:
        host_path = _resolve_host(host, search_path)
        host_identity = probe_host(host_path)
        workers.append(host_path)
        system_dirs += host_identity.system_dirs
        host_text = host_identity.host
    files, seen = [], set()
    for worker in workers + [None] + rest:
        if worker is None:
            sentinels = len(files)
        elif worker not in seen:
            seen.add(worker)
            files.append([worker, file_signature(worker)])
    real_dirs = []
    for directory in system_dirs:
        for form in (os.path.normpath(os.path.abspath(directory)), os.path.realpath(directory)):
            if form not in real_dirs:
                real_dirs.append(form)
    return CompilerIdentity("nvcc", path, version, virtual, real, reliable, files, real_dirs, host_text,
                            sentinels)


def _arch_flags(target):
    if target.output_kind == "ptx":
        return ["-arch=compute_%d%s" % target.parts[0][1:]]
    if target.output_kind == "cubin":
        return ["-arch=sm_%d%s" % target.parts[0][1:]]
    flags = []
    for kind, arch, suffix in target.parts:
        # SASS needs a virtual arch to lower from: the same number is the natural one.
        flags.append("-gencode=arch=compute_%d%s,code=%s_%d%s" % (arch, suffix, kind, arch, suffix))
    return flags


def _name_in_workdir(name):
    """The file name nvcc compiles (grammar.source_argument): the caller's spelling where it is
    plain, never an option, never a shell character."""
    return source_argument(name)


#: The private directory's own temporary directory (nvcc's TMPDIR), and where the source goes.
_TMP = "tmp"


def private_workdir(scratch):
    """A new 0700 directory for one compile: under ``scratch`` (the cache's work directory) when
    that can be made, else under the system's temporary directory.  nvcc writes its absolute path on
    the lines it hands a shell, so only a path of plain characters is used (grammar.shell_quiet)."""
    tried = []
    for parent in (scratch, tempfile.gettempdir(), "/tmp"):
        if not parent or parent in tried:
            continue
        tried.append(parent)
        try:
            if parent == scratch:
                private.make_private_dirs(parent)
                _sweep(parent)
            path = tempfile.mkdtemp(prefix="nvcc-", dir=parent)
        except OSError:
            continue
        if shell_quiet(path) and shell_quiet(os.path.realpath(path)):
            os.mkdir(os.path.join(path, _TMP), 0o700)
            return path
        shutil.rmtree(path, ignore_errors=True)
    raise CompileError("no private directory for nvcc could be made whose path is plain characters "
                       "(tried %s): nvcc hands that path to a shell. Set PTXBACKEND_CACHE_DIR or TMPDIR "
                       "to a directory whose path holds only letters, digits and ._+,=@%%~:-/"
                       % ", ".join(tried))


# A private directory this old was left by a compile killed with SIGKILL (or a power loss): no
# compile runs a day.
_STALE_SECONDS = 24 * 3600


def _sweep(scratch):
    """Remove what killed compiles left in the cache's work directory (a listing per miss)."""
    now = time.time()
    try:
        names = os.listdir(scratch)
    except OSError:
        return
    for name in names:
        path = os.path.join(scratch, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if name.startswith("nvcc-") and stat.S_ISDIR(st.st_mode) and now - st.st_mtime > _STALE_SECONDS:
            shutil.rmtree(path, ignore_errors=True)


def _out_of_space(exc):
    """Whether a compile failed because the private directory's file system is full (or over quota)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return any(sign in (exc.log or "") for sign in (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT)))


def _private_environment(workdir):
    """nvcc's environment: ours, with its temporary files inside its private directory (not in a
    shared /tmp under names predictable from its pid)."""
    env = dict(os.environ)
    tmp = os.path.join(workdir, _TMP)
    for name in ("TMPDIR", "TMP", "TEMP"):
        env[name] = tmp
    return env


class NvccCompiler(Compiler):
    """Compiles with an nvcc subprocess into a private temporary directory.

    The caller's options must not hold relative paths (the engine makes them
    absolute first): nvcc runs in the private directory.
    """

    kind = "nvcc"
    makes_fatbins = True
    environment = NVCC_ENVIRONMENT
    dates_from_epoch = True

    def __init__(self, identity):
        super(NvccCompiler, self).__init__(identity)
        self._hosts = {}
        self.memo_dir = None

    @classmethod
    def locate(cls, explicit=None):
        return find_nvcc(explicit)

    @classmethod
    def probe(cls, path):
        return probe_nvcc(path)

    @classmethod
    def compiled_name(cls, name):
        return _name_in_workdir(name)

    @classmethod
    def discovery_context(cls):
        # The host compiler nvcc finds depends on these; the identity records which one it was.
        return "\0".join(os.environ.get(name) or "" for name in ("PATH", "NVCC_CCBIN", "NVCC_PREPEND_FLAGS",
                                                                 "NVCC_APPEND_FLAGS"))

    @classmethod
    def open(cls, explicit=None, memo_dir=None):
        compiler = super(NvccCompiler, cls).open(explicit, memo_dir)
        compiler.memo_dir = memo_dir
        return compiler

    def host_compiler(self, ccbin):
        """The identity of the host compiler a ``-ccbin`` option names (remembered like nvcc's)."""
        found = self._hosts.get(ccbin)
        if found is None or not found.unchanged():
            path = ccbin
            if os.path.isdir(path):
                path = os.path.join(path, "gcc")
            path = _resolve_host(path, os.environ.get("PATH"))
            found = remembered_identity("host", path, probe_host, self.memo_dir, os.environ.get("PATH") or "")
            self._hosts[ccbin] = found
        return found

    def answers_as_probed(self):
        try:
            code, out = _run([self.identity.path, "--version"], timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return False
        match = _VERSION_RE.search(out)
        if code != 0 or not match or match.group(3) != self.identity.version:
            return False
        host = _dryrun_facts(self.identity.path)[1]
        if not host:
            return not self.identity.host
        search_path = os.environ.get("PATH")
        return probe_host(_resolve_host(host, search_path)).host == self.identity.host

    def search_path(self, path_options, name, options):
        # nvcc's own directory for quoted includes is a private temporary one: nothing to find there.
        return (path_options.include_dirs + path_options.system_dirs + environment_include_dirs()
                + list(self.identity.system_dirs))

    def command(self, target, options, source_name, output_name):
        """The argument list nvcc is run with (no shell is involved)."""
        return ([self.identity.path, _OUTPUT_FLAG[target.output_kind]] + _arch_flags(target)
                + list(options) + ["-o", output_name, source_name])

    def compile(self, source, options, target, name="kernel.cu", inputs=None, timeout=None, scratch=None):
        """See :meth:`Compiler.compile`; ``timeout``: seconds before nvcc's process group is killed
        (``PTXBACKEND_COMPILE_TIMEOUT`` as the engine resolved it; ``None``: that knob's default; 0: none).
        ``scratch``: the cache's work directory, where nvcc's private directory is made (its working
        directory and TMPDIR); ``None``: the system's temporary directory."""
        if timeout is None:
            timeout = KNOBS["compile_timeout"][1]
        name = _name_in_workdir(name)
        if any("\0" in str(option) for option in options):
            # execve() cannot pass it: Popen would raise a bare ValueError
            raise CompileError("an option contains a NUL character, which cannot be passed to nvcc; "
                               "remove it", command=[str(o).replace("\0", "\\0") for o in options])
        paths = read_path_options(options)
        # Never hand nvcc an include that is a FIFO or device: it would wait on it forever.
        scan_includes(source, paths.include_dirs + paths.system_dirs, paths.resolve_pre_includes())
        with compile_stops_cleanly():
            parents = (scratch, None) if scratch else (None,)
            for attempt, parent in enumerate(parents):
                workdir = private_workdir(parent)
                try:
                    return self._compile_in(workdir, source, options, target, name, inputs, timeout, paths)
                except (CompileError, OSError) as exc:
                    # A full cache must not stop the compile (only its filing): once more in the system's
                    # temporary directory, as private.
                    if attempt + 1 == len(parents) or not _out_of_space(exc):
                        raise
                    logger.debug("ptxbackend: the cache's file system is full (%s); nvcc runs in %s",
                                 " ".join(str(exc).split())[:200], tempfile.gettempdir())
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)

    def _compile_in(self, workdir, source, options, target, name, inputs, timeout, paths):
        source_path = os.path.normpath(os.path.join(workdir, name))
        if os.path.dirname(source_path) != workdir:
            private.make_private_dirs(os.path.dirname(source_path))
        output_path = os.path.join(workdir, "out." + target.output_kind)
        depfile = os.path.join(workdir, "out.d")
        with open(source_path, "wb") as handle:
            handle.write(source.encode("utf-8") if not isinstance(source, bytes) else source)
        env = _private_environment(workdir)
        cmd = self.command(target, options, name, output_path)
        by_host = inputs is not None and self._host_can_list(target, paths, depfile)
        if inputs is not None:
            cmd[-3:-3] = _dependency_flags(depfile, by_host)
        code, log = self._run(cmd, workdir, timeout, env)
        if code != 0 or not os.path.isfile(output_path):
            raise CompileError(
                ("nvcc %s failed with exit status %s while building %s for %s" if code != 0 else
                 "nvcc %s exited with status %s but wrote no output while building %s for %s")
                % (self.identity.version, code, name, target),
                command=cmd, returncode=code, log=log,
                hint=unknown_arch_hint(log, self.identity))
        with open(output_path, "rb") as handle:
            image = handle.read()
        if by_host and not os.path.isfile(depfile):
            # A host compiler that did not take -MD: nvcc's own list, at the cost of its extra pass.
            # The image is read already: this run is for the list alone.
            by_host = False
            output_path += ".again"
            cmd = self.command(target, options, name, output_path)
            cmd[-3:-3] = _dependency_flags(depfile, False)
            self._run(cmd, workdir, timeout, env)
        if inputs is not None:
            inputs.extend(_read_depfile(depfile, workdir, output_path, by_host))
        return image

    def _run(self, cmd, workdir, timeout, env=None):
        timeout = timeout or None  # 0: no limit
        try:
            return _run(cmd, cwd=workdir, timeout=timeout, env=env)
        except OSError as exc:
            raise CompilerNotFoundError("cannot run %s: %s" % (self.identity.path, exc))
        except subprocess.TimeoutExpired:
            raise CompileError("nvcc %s did not finish within %.0f s and was stopped (PTXBACKEND_COMPILE_TIMEOUT"
                               "=%.0f). Raise PTXBACKEND_COMPILE_TIMEOUT for a very large kernel, or find "
                               "what hangs (a wrapper script, a host compiler waiting on input)."
                               % (self.identity.version, timeout, timeout), command=cmd)

    def _host_can_list(self, target, paths, depfile):
        """Whether the host preprocessor's own ``-MD`` gives the list exactly: one preprocessing pass
        (one architecture; a fatbin has one per architecture, each would overwrite the list) and no
        directory whose name its make syntax cannot spell unambiguously."""
        if len(target.parts) != 1:
            return False
        dirs = (paths.include_dirs + paths.system_dirs + paths.pre_includes + environment_include_dirs()
                + list(self.identity.system_dirs) + [depfile])
        return not any(_AWKWARD.search(d) for d in dirs)


# Characters the host compiler's make syntax writes ambiguously (or -Xcompiler would split on).
_AWKWARD = re.compile(r"[\s\\#$:,]")
_HOST_TARGET = "ptxbackend-dependencies"


def _dependency_flags(depfile, by_host):
    """How the compile lists the files it read.  The host preprocessor writes the list as a side
    effect of the pass nvcc runs anyway (about nothing); nvcc's own -MD runs the preprocessor once
    more (30-110 ms a kernel)."""
    if by_host:
        return ["-Xcompiler", "-MD,-MF,%s,-MT,%s" % (depfile, _HOST_TARGET)]
    return ["-MD", "-MF", depfile]


def _read_depfile(depfile, workdir, output_path, by_host=False):
    try:
        with open(depfile, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise CompileError("nvcc did not write the list of files it read (%s): the cache cannot tell "
                           "when its headers change" % exc)
    try:
        if by_host:
            paths = parse_make_rule(data, workdir, _HOST_TARGET)
        else:
            paths = parse_depfile(data, workdir, target=output_path)
    except ValueError as exc:
        # nvcc writes a backslash in a path as '/': such a list cannot be trusted.  The image is
        # right; it is just not cached.
        return [UNKNOWN_READS + str(exc)]
    inside = workdir.rstrip(os.sep) + os.sep
    return [path for path in paths if not path.startswith(inside)]


def nvcc_compiler(path=None, memo_dir=None):
    """An :class:`NvccCompiler` for the nvcc found by :func:`find_nvcc`.

    Its identity is remembered in ``memo_dir`` so later processes skip the probe.
    """
    return NvccCompiler.open(path, memo_dir)

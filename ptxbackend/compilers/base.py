"""What every compiler backend shares: its identity, the identity memo, and error hints."""

import hashlib
import json
import os

from ..files import private, watching

# Architectures each CUDA release knows, for tools that cannot list them
# (nvcc before --list-gpu-arch, NVRTC before nvrtcGetSupportedArchs).
# Keys are (major, minor) of the first release with that set.
_ARCH_TABLE = (
    ((8, 0), (20, 21, 30, 32, 35, 37, 50, 52, 53, 60, 61, 62)),
    ((9, 0), (30, 32, 35, 37, 50, 52, 53, 60, 61, 62, 70)),
    ((9, 1), (30, 32, 35, 37, 50, 52, 53, 60, 61, 62, 70, 72)),
    ((10, 0), (30, 32, 35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75)),
    ((11, 0), (35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75, 80)),
    ((11, 1), (35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86)),
    ((11, 4), (35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87)),
    ((11, 8), (35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90)),
    ((12, 0), (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90)),
)


def archs_from_table(version):
    """Architectures a CUDA release of ``version`` ('11.2.152') knows, by the table."""
    parts = [int(p) for p in version.split(".")[:2] if p.isdigit()]
    key = tuple(parts + [0] * (2 - len(parts)))
    known = ()
    for first, archs in _ARCH_TABLE:
        if key >= first:
            known = archs
    return known


def file_signature(path):
    """What a stat says of ``path`` (following links, as running or loading it does), or ``None``."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def content_digest(paths):
    """A short digest of what the files at ``paths`` hold (missing ones count as missing).

    Hashing a toolkit (cicc, ptxas, libnvrtc: 100-300 MB) takes a fraction of a second: it is done
    when a compiler is probed, and the identity memo keeps the result while every file stats the same.
    """
    digest = hashlib.sha256()
    for path in paths:
        digest.update(os.fsencode(os.path.basename(path)) + b"\0")
        try:
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        except (OSError, IOError):
            digest.update(b"\0missing")
        digest.update(b"\0")
    return digest.hexdigest()[:16]


class CompilerIdentity(object):
    """Who produces an image: kind, the path discovery found, full version, and what it can emit.

    ``producer`` (e.g. ``nvcc-13.0.88``, ``nvrtc-12.0.140``) names the cache
    subtree and is stored in every entry's metadata, so outputs of two
    toolkits never mix.  ``archs_reliable`` is true when the lists came from
    the tool itself rather than from the table.

    ``files`` lists ``[path, signature]`` of the files that do the work (for
    nvcc: the program found, the real nvcc behind any wrapper, the host
    compiler, cicc, ptxas, libdevice and nvcc.profile; for NVRTC: the library
    and its builtins), as the tool itself reports them, links unresolved: a
    ``/usr/local/cuda`` link swapped to another toolkit changes what a stat
    of those paths sees.  The first ``sentinels`` of them change whenever a
    toolkit is swapped, upgraded or re-pointed: :meth:`unchanged` stats those
    on every call (a hit's whole budget is tens of microseconds), and
    :meth:`all_unchanged` stats every file, which a new process does before
    its first use and every compile does before it runs.
    ``system_dirs`` are the toolkit's and the host compiler's own include
    directories; ``host`` names the host compiler and its version.
    """

    __slots__ = ("kind", "path", "version", "virtual_archs", "real_archs", "archs_reliable",
                 "files", "system_dirs", "host", "sentinels", "content", "_checks", "_absent", "_trusted",
                 "_directories")
    _FIELDS = ("kind", "path", "version", "virtual_archs", "real_archs", "archs_reliable",
               "files", "system_dirs", "host", "sentinels", "content")

    def __init__(self, kind, path, version, virtual_archs, real_archs, archs_reliable,
                 files=(), system_dirs=(), host="", sentinels=None, content=None):
        self.kind = kind
        self.path = path
        self.version = version
        self.virtual_archs = tuple(sorted(set(int(a) for a in virtual_archs)))
        self.real_archs = tuple(sorted(set(int(a) for a in real_archs)))
        self.archs_reliable = bool(archs_reliable)
        self.files = [[str(p), list(sig) if sig is not None else None] for p, sig in files]
        self.sentinels = len(self.files) if sentinels is None else int(sentinels)
        self._checks = tuple((p,) + tuple(sig) for p, sig in self.files[:self.sentinels] if sig is not None)
        self._absent = tuple(p for p, sig in self.files[:self.sentinels] if sig is None)
        self._trusted = None  # (pid, watcher epoch) of the last full check, while its directories are watched
        self._directories = None
        self.system_dirs = [str(d) for d in system_dirs]
        self.host = str(host or "")
        # What the files that do the work hold: two installs of one version (an edited nvcc.profile,
        # a replaced ptxas or NVRTC builtins library) are two toolkits.  Part of every request's key.
        self.content = content_digest(p for p, _sig in self.files) if content is None else str(content)

    @property
    def producer(self):
        return "%s-%s" % (self.kind, self.version)

    def unchanged(self):
        """Whether every file that does the work is still the one probed (a stat each, no process).

        Checked in full once, then trusted while inotify hears no change to those files themselves or
        in the directories of them, of the links on the way to them and of the names that must stay
        absent: a hit then
        costs one read of the watcher instead of a stat per file (3-4 for nvcc with a host compiler,
        2 us each on the H200).  Where they cannot be watched, every call checks in full.
        """
        ticket = (private.process_id(), watching.poll())
        if self._trusted == ticket:
            return True
        # Watch before checking, so that a change between the two is heard.
        directories = self._watched_directories()
        watched = bool(directories) and watching.watch(directories, [check[0] for check in self._checks])
        if not watched:
            self._directories = ()  # a network file system, no inotify: not tried again in this process
        fine = self._stats_match() and not self._absent_now_present()
        self._trusted = ticket if fine and watched else None
        return fine

    def _stats_match(self):
        stat = os.stat
        try:
            for path, size, mtime, ctime, ino, dev in self._checks:
                st = stat(path)
                if st.st_mtime_ns != mtime or st.st_ctime_ns != ctime or st.st_ino != ino \
                        or st.st_size != size or st.st_dev != dev:
                    return False
        except OSError:
            return False
        return True

    def _watched_directories(self):
        if self._directories is None:
            found = []
            try:
                for path in [check[0] for check in self._checks] + list(self._absent):
                    found.extend(d for d in watching.file_directories(path) if d not in found)
            except OSError:
                found = ()  # a link that cannot be read: nothing is trusted, every call checks
            self._directories = found
        return self._directories

    def all_unchanged(self):
        """Whether every file that does the work, not only the sentinels, is still the one probed."""
        for path, signature in self.files:
            if file_signature(path) != signature:
                return False
        return True

    def _absent_now_present(self):
        for path in self._absent:
            if os.path.exists(path):
                return True
        return False

    def to_json(self):
        return {name: getattr(self, name) for name in self._FIELDS}

    def producer_record(self):
        """What a cache may keep of this identity: what it can emit and the host compiler's name
        and version (part of every key), and no path of this machine."""
        return {"kind": self.kind, "version": self.version, "virtual_archs": list(self.virtual_archs),
                "real_archs": list(self.real_archs), "archs_reliable": self.archs_reliable, "host": self.host,
                "toolkits": [self.content]}

    @classmethod
    def from_json(cls, data):
        return cls(data["kind"], data.get("path", ""), data["version"], data["virtual_archs"],
                   data["real_archs"], data["archs_reliable"], data.get("files", ()),
                   data.get("system_dirs", ()), data.get("host", ""), data.get("sentinels"),
                   data.get("content", ""))

    def __repr__(self):
        return "CompilerIdentity(%s at %s)" % (self.producer, self.path)


def remembered_identity(kind, path, probe, memo_dir, context=""):
    """Return ``probe(path)``, remembered on disk while the files that do the work are unchanged.

    This is what lets a warm start skip ``nvcc --version`` and ``-dryrun``
    (subprocesses) and the load of the NVRTC library.  The memo is named by
    the program or library discovery found (and ``context``: what else
    decides the result, e.g. PATH for nvcc's host compiler) and is used only
    when it names that same path and every file it lists still stats the
    same: a memo never decides what gets run or loaded, discovery does.  A
    memo that cannot be read or written is ignored.
    """
    fingerprint = "%s\0%s\0%s" % (kind, path, context)
    memo = None
    if memo_dir:
        memo = os.path.join(memo_dir, hashlib.sha256(fingerprint.encode("utf-8", "surrogateescape"))
                            .hexdigest()[:32] + ".json")
        try:
            data = json.loads(private.read_file(memo).decode("utf-8"))
            if data.get("fingerprint") == fingerprint:
                identity = CompilerIdentity.from_json(data["identity"])
                if identity.kind == kind and identity.path == path and identity.files \
                        and identity.all_unchanged():
                    return identity
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    identity = probe(path)
    if memo:
        try:
            private.make_private_dirs(memo_dir)
            blob = json.dumps({"fingerprint": fingerprint, "identity": identity.to_json()})
            private.write_atomic(memo, blob.encode("utf-8"))
        except OSError:
            pass
    return identity


_UNKNOWN_ARCH_SIGNS = (
    "is not defined for option 'gpu-architecture'",
    "unsupported gpu architecture",
    "invalid value for --gpu-architecture",
)


def unknown_arch_hint(log, identity):
    """A remedy when ``log`` says the compiler does not know the requested architecture."""
    lowered = log.lower()
    if not any(sign.lower() in lowered for sign in _UNKNOWN_ARCH_SIGNS):
        return ""
    archs = identity.virtual_archs if identity else ()
    known = ("; it knows compute_%d..compute_%d" % (archs[0], archs[-1])) if archs else ""
    return (
        "The compiler does not know this GPU architecture%s. Let ptxbackend pick: "
        "PTXBACKEND_TARGET=auto builds PTX for the newest architecture the toolkit knows, "
        "and the driver JIT-compiles it for the GPU. Or name one the toolkit knows, e.g. "
        "PTXBACKEND_TARGET=compute_%s." % (known, archs[-1] if archs else "61"))


class Compiler(object):
    """A compiler backend: how to find it, what it is, and how it compiles.

    Subclasses set :attr:`kind` and implement :meth:`locate`, :meth:`probe`
    and :meth:`compile`; :data:`ptxbackend.compilers.COMPILERS` maps each
    kind to its class.

    Attributes:
        identity: the :class:`CompilerIdentity` of the tool in use.
    """

    kind = None
    #: whether it can bundle several architectures into a fatbin
    makes_fatbins = False
    #: environment variables that change what it produces (part of every request's key)
    environment = ()
    #: whether ``__DATE__`` comes from ``SOURCE_DATE_EPOCH`` when that is set
    dates_from_epoch = False

    def __init__(self, identity):
        self.identity = identity
        # The output kinds this compiler can produce: a subset of ptx, cubin, fatbin (asked per hit).
        self.output_kinds = ("ptx",) + (("cubin",) if identity.real_archs else ()) \
            + (("fatbin",) if self.makes_fatbins else ())

    @classmethod
    def locate(cls, explicit=None):
        """The program or library to use: ``explicit``, else this machine's own discovery."""
        raise NotImplementedError

    @classmethod
    def probe(cls, path):
        """The :class:`CompilerIdentity` of the tool at ``path`` (may run or load it)."""
        raise NotImplementedError

    @classmethod
    def compiled_name(cls, name):
        """The file name the compiler sees for a source the caller calls ``name``."""
        return str(name)

    @classmethod
    def discovery_context(cls):
        """What besides the located path decides :meth:`probe`'s answer (remembered with it)."""
        return ""

    @classmethod
    def open(cls, explicit=None, memo_dir=None):
        """A ready compiler for the tool discovery finds, its identity remembered in ``memo_dir``."""
        path = cls.locate(explicit)
        return cls(remembered_identity(cls.kind, path, cls.probe, memo_dir, cls.discovery_context()))

    def answers_as_probed(self):
        """Whether running the compiler's version probe now gives the identity probed
        (``PTXBACKEND_COMPILER_CHECK=command``); a library loaded in-process has nothing to run."""
        return True

    def search_path(self, path_options, name, options):
        """The directories a compile looks for headers in, in order (for the dependency set)."""
        return list(path_options.include_dirs)

    def source_directory(self, name, options):
        """Where the program's own quoted includes are looked for first (``None``: nowhere that can
        change, such as nvcc's private working directory)."""
        return None

    def compile(self, source, options, target, name="kernel.cu", inputs=None, timeout=None, scratch=None):
        """Compile CUDA C++ ``source`` for ``target`` and return the image bytes.

        Args:
            source: the kernel source text.
            options: the caller's compiler options (a sequence of str), kept as given.
            target: a concrete :class:`~ptxbackend.compiling.targets.Target`.
            name: the file name the compiler sees (appears in its messages and in ``assert``).
            inputs: a list that receives the path of every file the compile read
                besides the source, for the cache's dependency check.
            timeout: seconds the compile may take (``PTXBACKEND_COMPILE_TIMEOUT``; where it can be
                enforced).
            scratch: a private directory of the cache's where a compiler that runs as a program
                makes its own working directory (``None``: the system's temporary directory).

        Raises:
            CompileError: the compiler failed; the error carries its log.
        """
        raise NotImplementedError

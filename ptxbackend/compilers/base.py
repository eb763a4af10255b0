"""What every compiler backend shares: its identity, the identity memo, and error hints."""

import hashlib
import json
import os

from .. import _fsutil

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


class CompilerIdentity(object):
    """Who produces an image: kind, real path, version, and what it can emit.

    ``producer`` (e.g. ``nvcc-11.2.152``) names the cache subtree and is stored
    in every entry's metadata, so outputs of two toolkits never mix.
    ``archs_reliable`` is true when the lists came from the tool itself rather
    than from the table.
    """

    __slots__ = ("kind", "path", "version", "virtual_archs", "real_archs", "archs_reliable")

    def __init__(self, kind, path, version, virtual_archs, real_archs, archs_reliable):
        self.kind = kind
        self.path = path
        self.version = version
        self.virtual_archs = tuple(sorted(set(int(a) for a in virtual_archs)))
        self.real_archs = tuple(sorted(set(int(a) for a in real_archs)))
        self.archs_reliable = bool(archs_reliable)

    @property
    def producer(self):
        return "%s-%s" % (self.kind, self.version)

    def to_json(self):
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_json(cls, data):
        return cls(data["kind"], data["path"], data["version"], data["virtual_archs"],
                   data["real_archs"], data["archs_reliable"])

    def __repr__(self):
        return "CompilerIdentity(%s at %s)" % (self.producer, self.path)


def remembered_identity(kind, path, probe, memo_dir):
    """Return ``probe(path)``, remembered on disk keyed by real path, size and mtime.

    This is what lets a warm start skip ``nvcc --version`` (a subprocess) and
    the load of the NVRTC library: the memo is valid as long as the file at
    ``path`` is unchanged.  A memo that cannot be read or written is ignored.
    """
    real = os.path.realpath(path)
    stat = os.stat(real)
    fingerprint = "%s\0%s\0%d\0%d" % (kind, real, stat.st_size, getattr(stat, "st_mtime_ns", int(stat.st_mtime * 1e9)))
    memo = None
    if memo_dir:
        memo = os.path.join(memo_dir, hashlib.sha256(fingerprint.encode("utf-8")).hexdigest()[:32] + ".json")
        try:
            data = json.loads(_fsutil.read_file(memo).decode("utf-8"))
            if data.get("fingerprint") == fingerprint:
                return CompilerIdentity.from_json(data["identity"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    identity = probe(real)
    if memo:
        try:
            _fsutil.make_private_dirs(memo_dir)
            blob = json.dumps({"fingerprint": fingerprint, "identity": identity.to_json()})
            _fsutil.write_atomic(memo, blob.encode("utf-8"))
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
    """A compiler backend.  Subclasses set ``kind`` and implement :meth:`compile`.

    Attributes:
        identity: the :class:`CompilerIdentity` of the tool in use.
    """

    kind = None

    def __init__(self, identity):
        self.identity = identity

    @property
    def output_kinds(self):
        """The output kinds this compiler can produce: a subset of ptx, cubin, fatbin."""
        raise NotImplementedError

    def compile(self, source, options, target, name="kernel.cu"):
        """Compile CUDA C++ ``source`` for ``target`` and return the image bytes.

        Args:
            source: the kernel source text.
            options: the caller's compiler options (a sequence of str), kept as given.
            target: a concrete :class:`~ptxbackend.targets.Target`.
            name: the file name the compiler sees (appears in its messages).

        Raises:
            CompileError: the compiler failed; the error carries its log.
        """
        raise NotImplementedError

"""What compile() returns: an image, and where it came from."""


class Artifact(object):
    """A compiled image and where it came from.

    Attributes:
        image: the bytes (PTX text, cubin or fatbin).  After a hit at the cubin
            level the PTX is read from the cache on first access only.
        kind: ``'ptx'``, ``'cubin'`` or ``'fatbin'``.
        target: the concrete :class:`~ptxbackend.compiling.targets.Target` built.
        producer: the compiler that made it, e.g. ``'nvcc-11.2.152'``.
        key: the request key (hex SHA-256).
        name: the entry's name in every store (:mod:`ptxbackend.cache.layout`).
        path: the entry's file in the local cache.
        cache_hit: whether it came from the cache.
        reason: why this target was chosen.
        device_cc: the compute capability the choice was made for (or ``None``).
        deps: the entry's dependency section (the digest of its dependency set, or empty): a JIT
            cubin must carry the same one.
    """

    __slots__ = ("_image", "kind", "target", "producer", "key", "name", "path", "cache_hit", "reason",
                 "device_cc", "store", "cubin_cache", "jit", "_again", "deps")

    def __init__(self, image, kind, target, producer, key, name, cache_hit, reason, device_cc, store):
        self._image = image
        self.kind = kind
        self.target = target
        self.producer = producer
        self.key = key
        self.name = name
        self.path = store.path_of(name)
        self.cache_hit = cache_hit
        self.reason = reason
        self.device_cc = device_cc
        self.store = store
        self.cubin_cache = True  # PTXBACKEND_CUBIN_CACHE as compile() saw it: spares load() a settings read
        self.jit = None  # (cc, driver build, cubin) found by compile() at the cubin level
        self._again = None  # compile() once more, when it skipped reading the PTX and the entry is gone
        self.deps = b""

    @property
    def image(self):
        if self._image is None:
            self._image = self._skipped_ptx()
        return self._image

    def _skipped_ptx(self):
        """The PTX of a hit served at the cubin level, which compile() did not read: read it now."""
        found = self.store.read(self.name, self.key, "ptx", False, True)
        if found is not None and found[2] == self.deps:
            return found[0]
        # Gone (pruned) or rebuilt since: the request again, without the shortcut.
        return self._again().image

    def __repr__(self):
        return "<Artifact %s %s by %s, %s, %s>" % (
            self.kind, self.target, self.producer,
            "%d bytes" % len(self._image) if self._image is not None else "PTX not read",
            "hit" if self.cache_hit else "compiled")

"""The engine's memory for this process, in one object: what tests reset, and what holds the stores."""

import threading


class EngineState(object):
    """Everything :mod:`ptxbackend.compiling.engine` and :mod:`ptxbackend.compiling.image` remember between calls.

    All of it is derived (settings -> store, compiler, target; device -> compute capability):
    dropping it costs a little time, never correctness.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        #: cache directory -> DirectoryStore (the local store alone, for maintenance)
        self.stores = {}
        #: (cache directory, fleet settings) -> EntryCache (local store, and the fleet store when configured)
        self.caches = {}
        #: cache directory -> an EntryCache given with give_cache(), used whatever the settings say
        self.given = {}
        #: why the fleet store is not used, per cache directory (for doctor and the one warning)
        self.remote_problems = {}
        self.compilers = {}
        self.device_ccs = {}
        self.choices = {}
        self.prepared = {}
        self.requests = {}
        self.settled = {}
        self.warned = set()
        #: Whether a cache that cannot be used falls back to a private temporary one.  A running program
        #: must go on (its kernels are compiled again); the command line turns this off, so that an
        #: administrator's `cache import` or `warm` never reports success on a throwaway cache.
        self.temporary_cache_fallback = True

    def give_cache(self, cache_dir, cache):
        """Make ``cache`` (an :class:`~ptxbackend.cache.entries.EntryCache`) the one used for
        ``cache_dir`` in this process, e.g. one with a fleet store built by hand."""
        with self.lock:
            self.given[cache_dir] = cache


state = EngineState()

"""This process's cache counters, per tier, for programs and ``ptxbackend cache info``.

Summed over every cache the process opened (one per cache directory and fleet settings), so a
program asks once, whatever settings its kernels were compiled with.
"""

from ..state import state

#: What :func:`cache_counters` reports, in the order ``cache info`` prints it.
FIELDS = ("local_hits", "remote_hits", "prefetched", "misses", "rejected", "failures", "round_trips",
          "remote_seconds")


def cache_counters():
    """A dict of this process's counters (see :data:`FIELDS`):

    ``local_hits``/``remote_hits``/``misses``: lookups answered by the local cache, by the fleet store
    (a single fetch or the working set held in memory), by neither; ``prefetched``: fleet values taken
    with the working set and verified; ``rejected``: fleet values refused (authentication, bounds, entry
    checks); ``failures``: fleet store errors (timeouts, refusals); ``round_trips``: requests sent to the
    fleet store; ``remote_seconds``: time spent waiting for it.
    """
    totals = dict((name, 0) for name in FIELDS)
    totals["remote_seconds"] = 0.0
    with state.lock:
        caches = list(state.caches.values()) + list(state.given.values())
    seen = set()
    for cache in caches:
        if id(cache) in seen:
            continue
        seen.add(id(cache))
        counts = cache.counters
        totals["local_hits"] += counts.get("local_hits", 0)
        totals["remote_hits"] += counts.get("remote_hits", 0)
        totals["misses"] += counts.get("misses", 0)
        totals["rejected"] += counts.get("remote_discarded", 0)
        remote = cache.remote
        if remote is None or id(remote) in seen:
            continue
        seen.add(id(remote))
        stats = remote.stats()
        for level in stats.values():
            if isinstance(level, dict):
                totals["rejected"] += level.get("rejected", 0)
                totals["failures"] += level.get("errors", 0)
        totals["prefetched"] += getattr(remote, "prefetched", 0)
        totals["round_trips"] += getattr(remote, "requests", 0)
        totals["remote_seconds"] += getattr(remote, "spent", 0.0)
    return totals


def describe(totals):
    """``cache info``'s line: ``local hits 3, remote hits 0, ...``."""
    return ", ".join("%s %s" % (name.replace("_", " "), ("%.3f" % totals[name]) if name == "remote_seconds"
                                else totals[name]) for name in FIELDS)

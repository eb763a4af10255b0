"""What every cache store offers: opaque bytes by name.

A name is a relative, ``/``-separated path inside one schema version's layout,
e.g. ``nvcc-13.0.88/compute_75/ab/<key>.ptx`` (see :mod:`.layout`).  A store
knows nothing of entries: decoding, checksums and discarding what fails are
done once, above every store, by :mod:`.entries`, so a local directory and a
fleet-wide server get the very same checks.
"""

import contextlib


class UnusableValue(Exception):
    """Something is stored under a name but must not be used (planted, unreadable, someone else's).

    The message says why; the layer above discards it with a warning and rebuilds.
    """


class Store(object):
    """The interface.  A backend overrides ``get``, ``put`` and ``delete``; the rest is optional."""

    #: Shown by ``cache info`` and ``doctor``: where the store is (no secrets).
    description = "store"
    #: Whether ``put`` may store anything (a read-only fleet member: ``False``).
    writable = True

    def get(self, name):
        """The bytes stored under ``name``, or ``None`` (absent, unreadable, or refused)."""
        raise NotImplementedError

    def put(self, name, blob):
        """Store ``blob`` under ``name``, whole or not at all.  May raise ``OSError``."""
        raise NotImplementedError

    def delete(self, name):
        """Remove ``name`` if present; never raises for an absent name."""
        raise NotImplementedError

    @contextlib.contextmanager
    def lock(self, name, timeout):
        """Hold a lock on ``name`` for at most ``timeout`` seconds of waiting.

        Yields whether the lock is held: a store without locks (or one whose
        wait ran out, where that is not an error) yields ``False`` and the
        caller goes on without it.
        """
        yield False

    def list(self, prefix=""):
        """Names starting with ``prefix``; a store that cannot list raises ``NotImplementedError``."""
        raise NotImplementedError

    def stats(self):
        """Counters for reports (hits, misses, errors ...), as a dict of ints; empty if none."""
        return {}

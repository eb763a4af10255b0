"""Which entries of this cache arrived unsigned, so that they never leave it vouched for.

A build box signs what it sends on with the fleet key: every value it uploads (the fleet store seals
them) and every bundle it exports.  An entry that came in a bundle nobody signed is vouched for by no
one; if the build box sent it on, every line PC would trust it.  Importing such a bundle leaves a
marker per entry (``meta/unsigned/<kk>/<sha256 of the name>``, holding the SHA-256 of the entry's
bytes; ``meta/`` is never exported or pushed); ``cache push`` and a signed export leave out an entry
whose bytes match its marker.  The same entry compiled here, or imported signed, is vouched for again.
"""

import hashlib

from .base import UnusableValue


def _marker(name):
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
    return "meta/unsigned/%s/%s" % (digest[:2], digest)


def remember(store, name, data, signed):
    """Record how the entry ``name`` (bytes ``data``) of ``store`` arrived: in a signed bundle or not."""
    if signed:
        store.delete(_marker(name))
    else:
        store.put(_marker(name), hashlib.sha256(data).hexdigest().encode("ascii"))


def vouched(store, name, data):
    """Whether this machine may send the entry ``name`` (bytes ``data``) on: it was not imported
    unsigned, or its bytes have changed since (compiled here again)."""
    try:
        marker = store.get(_marker(name))
    except UnusableValue:
        return False  # a marker we cannot read: the entry stays home
    return marker is None or data is None or marker != hashlib.sha256(data).hexdigest().encode("ascii")

"""Which entries of this cache arrived unsigned, so that they never leave it vouched for.

A build box signs what it sends on with the fleet key: every value it uploads (the fleet store seals
them) and every bundle it exports.  An entry that came in a bundle nobody signed is vouched for by no
one; if the build box sent it on, every line PC would trust it.  Importing such a bundle leaves a
marker per entry (``meta/unsigned/<kk>/<sha256 of the name>``, holding the SHA-256 of the entry's
bytes; ``meta/`` is never exported or pushed); ``cache push`` and a signed export leave out an entry
whose bytes match its marker.  The same entry compiled here, or imported signed, is vouched for again.

Provenance follows an entry to what is made from it: the driver's JIT cubin of a PTX entry that may not
be sent on is the same unvouched code in another form, so it is marked as that entry is (never
uploaded when it is made, never pushed later), and a fleet key never seals it.
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


def source_vouched(store, name):
    """Whether what is made here from the entry ``name`` of ``store`` (its JIT cubin) may be sent on.

    The entry itself is read only when it has a marker (the usual entry has none: one failed open);
    a marked entry that is gone or unreadable vouches for nothing.
    """
    try:
        marker = store.get(_marker(name))
    except UnusableValue:
        return False
    if marker is None:
        return True
    try:
        data = store.get(name)
    except UnusableValue:
        return False
    return data is not None and marker != hashlib.sha256(data).hexdigest().encode("ascii")

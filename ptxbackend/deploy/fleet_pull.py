"""``ptxbackend warm --from-fleet``: fill this machine's local cache with the fleet's working set.

The groups are this machine's own: the compiler this machine's discovery finds, the target the settings
choose for its GPU, and (with a GPU) its driver's JIT cubins.  Each value authenticates under the fleet
key (the store), then passes the checks a lookup makes: an entry decodes with the key and kind its name
says, a dependency set hashes to the digest its name says.  Nothing else is written.
"""

import hashlib

from ..gpu import driver
from ..compiling import toolchain
from ..cache import entry as entry_format
from ..cache import layout
from ..errors import PtxBackendError


def groups(settings):
    """``(cache, [group])`` of this machine for ``settings``; raises a one-line error without a compiler."""
    cache, comp, missing = toolchain.prepare(settings, None)
    if comp is None:
        raise PtxBackendError("warm --from-fleet needs this machine's compiler to know which kernels are "
                              "its own: %s" % missing)
    cc = toolchain.device_compute_capability(settings)
    chosen, _reason = toolchain.choose(settings.target, comp, cc)
    found = ["%s/%s" % (comp.identity.producer, chosen)]
    if chosen.output_kind == "ptx" and cc is not None and settings.device_cc is None and settings.cubin_cache:
        try:
            build = driver.driver_build()
        except Exception:  # no driver here: the PTX entries are still worth having
            build = None
        if build:
            found.append(layout.jit_name(comp.identity.producer, chosen, "00", cc, build).rsplit("/", 2)[0])
    return cache, found


def _passes(name, blob):
    """Whether ``blob`` is what a lookup of ``name`` would accept (the store already authenticated it)."""
    if name.startswith("depsets/"):
        return hashlib.sha256(blob).hexdigest() == name.rsplit("/", 1)[-1][:-len(".json")]
    stem, _dot, kind = name.rpartition("/")[2].partition(".")
    try:
        entry_format.decode_all(blob, stem, kind, False)
    except entry_format.CorruptEntry:
        return False
    return True


def pull(settings):
    """Write the working set's values that pass into the local cache: ``(written, refused, groups)``."""
    cache, found = groups(settings)
    written = refused = 0
    for group in found:
        for name, blob in cache.remote.fetch_working_set(group):
            if not _passes(name, blob):
                refused += 1
                continue
            cache.local.put(name, blob)
            written += 1
    state = cache.remote.stats().get("state", "ok")
    if state.startswith("failed"):
        raise PtxBackendError("warm --from-fleet: the %s %s" % (cache.remote.description, state))
    return written, refused, found

"""The image step: the bytes the driver loads for an artifact, and the one retry when it rejects them.

For PTX with the cubin level on, the image is the driver's JIT output for
this device and driver, from the cache or linked now and stored: the JIT is
paid once per machine (or once per fleet), not once per process.  Both
:func:`ptxbackend.load` and CuPy's integration load through :func:`load`.
"""

import logging

from ..gpu import driver
from ..cache import entry as entry_format, layout
from ..state import state

log = logging.getLogger("ptxbackend")


def current_device_cc():
    """The compute capability of the current device (remembered per ordinal)."""
    ordinal = driver.current_device()
    found = state.device_ccs.get(ordinal)
    if found is None:
        found = state.device_ccs[ordinal] = driver.compute_capability(ordinal)
    return found


def jit_name(artifact, device_cc=None):
    return layout.jit_name(artifact.producer, artifact.target, artifact.key,
                           current_device_cc() if device_cc is None else device_cc, driver.driver_build())


def loadable_image(artifact, cubin_cache=None):
    """``(bytes, kind)`` to hand to ``cuModuleLoadData`` on the current device.

    ``cubin_cache`` defaults to the PTXBACKEND_CUBIN_CACHE setting in force when the artifact
    was compiled.
    """
    if cubin_cache is None:
        cubin_cache = artifact.cubin_cache
    if artifact.kind != "ptx" or not cubin_cache or artifact.store is None:
        return artifact.image, artifact.kind
    cc = current_device_cc()
    if artifact.jit is not None and artifact.jit[0] == cc:
        return artifact.jit[2], "cubin"  # compile() found it already
    cache = artifact.store
    name = jit_name(artifact, cc)
    found = cache.read(name, artifact.key, "cubin", False, True)
    # Linked from the PTX of the same compile only: a recompile after a header changed keeps the key.
    if found is not None and found[2] == artifact.deps:
        return found[0], "cubin"
    cubin = driver.link_ptx(artifact.image)
    try:
        cache.write(name, cubin, entry_format.metadata(artifact.key, artifact.target, artifact.producer, (), "jit",
                                                device_cc=cc, driver=driver.driver_build()), artifact.deps,
                    derived_from=artifact.name)
    except OSError as exc:
        cache.note_unwritable(exc)
    return cubin, "cubin"


def discard_jit(artifact, why):
    """Forget the cached JIT cubin of a PTX ``artifact`` for the current device."""
    artifact.jit = None
    if artifact.kind == "ptx" and artifact.store is not None:
        artifact.store.discard(jit_name(artifact), why)


def load(artifact, load_image):
    """``load_image(bytes, kind)`` on the artifact's loadable image; a cached JIT cubin the driver
    rejects is discarded, linked again from the PTX and loaded once more."""
    image, kind = loadable_image(artifact)
    try:
        return load_image(image, kind)
    except Exception as exc:
        if not (kind == "cubin" and artifact.kind == "ptx"):
            raise
        log.warning("ptxbackend: the driver rejected the cached JIT cubin of %s (%s); linking it again",
                    artifact.key[:12], getattr(exc, "name", None) or exc)
        discard_jit(artifact, "rejected by the driver")
        image, kind = loadable_image(artifact)
        return load_image(image, kind)

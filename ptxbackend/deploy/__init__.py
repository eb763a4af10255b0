"""Getting kernels and library JIT output onto production machines before their programs start.

Owns: :mod:`.replay` (``warm MANIFEST``), :mod:`.fleet_pull` (``warm --from-fleet``),
:mod:`.library_warmup` (``warm --libs``: a library initialised in child processes),
:mod:`.parallel_jit` (its images JIT-compiled in worker processes) and :mod:`.jit_bundle` (the
driver's JIT cache packed, shipped and installed).  May import ``compiling``, ``cache``, ``gpu``,
``files`` and ``config``; never ``hook`` or ``cli``.
"""

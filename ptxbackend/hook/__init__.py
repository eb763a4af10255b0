"""CuPy's kernel compiles handed to ptxbackend: what the start-up hook's second stage installs.

Owns: :mod:`.cupy_integration` (the replacement of each CuPy generation's compile function).
May import ``compiling``, ``gpu``, ``config`` and the leaf :mod:`_ptxbackend_env`; it is imported by
:mod:`_ptxbackend_boot` only once CuPy is, and never imports CuPy itself.
"""

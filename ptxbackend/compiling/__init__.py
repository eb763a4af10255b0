"""The compile path: source -> request and key -> cache hit or compile -> image.

Owns: :mod:`.engine` (``compile``/``load``: settings, compiler, target, request and key resolved
once per compile and handed down), :mod:`.toolchain` (which compiler, re-checked per call),
:mod:`.targets`, :mod:`.request` (effective options and the key's context), :mod:`.precompiled`
(NVRTC's precompiled headers), :mod:`.image` (the loadable image and the JIT cubin level),
:mod:`.artifact` and :mod:`.record` (``PTXBACKEND_RECORD``).

May import: ``config``, ``state``, ``errors``, and the packages below it (``compilers``, ``cache``,
``dependencies``, ``gpu``, ``files``); nothing above it (``hook``, ``deploy``, ``cli``).
"""

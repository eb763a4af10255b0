"""What a compile read, and whether it still holds (imports ``ptxbackend.files``).

Owns: :mod:`.reads` (the files an NVRTC compile opened, the include scan), :mod:`.depfiles` (the
lists nvcc and the host preprocessor write) and :mod:`.depsets` (dependency sets: built on a miss,
checked once per process and then watched on a hit).  It knows nothing of compilers or stores:
they hand it paths and take its answers.
"""

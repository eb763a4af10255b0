"""The CUDA driver and libraries on this machine (imports ``ptxbackend.errors`` and ``ptxbackend.state``).

Owns: :mod:`.libcuda` (the ctypes binding, cuInit, contexts), :mod:`.driver` (device and driver
queries, loading and linking images), :mod:`.launch` (running kernels, device memory),
:mod:`.fatbin` (reading the fatbin images inside a library) and :mod:`.libraries` (finding NVRTC,
cuDNN, cuBLAS, cuRAND).  Nothing here compiles or caches.
"""

"""Stage what another GPU model would leave in a shared CuPy 7.8 kernel cache (issue 15).

    python stage_foreign.py CACHE_DIR INCLUDE_DIR LIBNVRTC ARCH CUDA_INCLUDE_DIR

CuPy v2-v7 file the driver-linked cubin under a key made of the *clamped*
architecture (CuPy 7.8 with NVRTC 11: ``min(device, '80')``), the options, the
NVRTC version and the source, never the device itself.  An A100 (sm_80) and an
H200 (sm_90) therefore compute the same key for a kernel, and whichever runs
first leaves a cubin for its own GPU.  This script writes, for every
``<md5>_2.cubin`` with its saved ``.cu`` (``CUPY_CACHE_SAVE_CUDA_SOURCE=1``),
what the other machine would have written: the same source built for ARCH
(e.g. ``sm_80``) by the same NVRTC, in CuPy's own file format (the md5 of the
cubin in hex, then the cubin).  Runs under the old interpreter; stdlib only.
"""

import ctypes
import glob
import hashlib
import os
import sys


def nvrtc_cubin(lib, source, options):
    prog = ctypes.c_void_p()
    check = lambda rc, what: rc == 0 or sys.exit("stage_foreign: %s failed (%d)" % (what, rc))  # noqa: E731
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source, b"foreign.cu", 0, None, None), "nvrtcCreateProgram")
    argv = (ctypes.c_char_p * len(options))(*options)
    rc = lib.nvrtcCompileProgram(prog, len(options), argv)
    if rc != 0:
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        text = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, text)
        sys.exit("stage_foreign: NVRTC failed:\n" + text.value.decode(errors="replace"))
    size = ctypes.c_size_t()
    check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
    data = ctypes.create_string_buffer(size.value)
    check(lib.nvrtcGetCUBIN(prog, data), "nvrtcGetCUBIN")
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return data.raw


def main(cache_dir, include_dir, libnvrtc, arch, cuda_include_dir):
    lib = ctypes.CDLL(libnvrtc)
    staged = 0
    for path in sorted(glob.glob(os.path.join(cache_dir, "*_2.cubin"))):
        with open(path + ".cu", "rb") as handle:
            source = handle.read()
        cubin = nvrtc_cubin(lib, source, [b"-arch=" + arch.encode(), b"-I" + include_dir.encode(),
                                          b"-I" + cuda_include_dir.encode(), b"-ftz=true"])
        with open(path, "wb") as handle:
            handle.write(hashlib.md5(cubin).hexdigest().encode("ascii") + cubin)
        staged += 1
    print("stage_foreign: %d cached kernels replaced by %s cubins" % (staged, arch))
    return 0 if staged else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))

"""The user's cuDNN 7 story as a small program: ctypes only, no framework (issue 28).

    python3 program.py --lib /path/to/libcudnn.so.7 [--dry-run]

Steps, each timed: load the library, cudnnGetVersion/cudnnGetCudartVersion, the CUDA context (libcuda,
primary context), cudnnCreate (the CUDA 8 runtime linked into cuDNN starts here: the driver JIT-compiles
the library's PTX for a GPU it has no machine code for), one cudnnConvolutionForward (NCHW float32,
3x3, pad 1) and one cudnnActivationForward (ReLU), each compared with numpy.  Prints progress lines on
stderr as each step starts (a process killed by its deadline shows where it was) and one JSON line on
stdout at the end.  --dry-run stops before the first CUDA call: it checks the arguments, the numpy
reference and the library's version calls, which a machine without a GPU can answer.
"""

import argparse
import ctypes
import hashlib
import json
import sys
import time

import numpy

SHAPE_X = (2, 3, 8, 8)  # N, C, H, W
SHAPE_W = (4, 3, 3, 3)  # K, C, R, S
PAD = 1
TOLERANCE = 1e-4

# cudnn.h (7.1) enum values
NCHW, FLOAT, CROSS_CORRELATION, FWD_ALGO_IMPLICIT_GEMM, RELU, NOT_PROPAGATE_NAN = 0, 0, 1, 0, 1, 0

STARTED = time.perf_counter()


def progress(message):
    sys.stderr.write("[%.1fs] %s\n" % (time.perf_counter() - STARTED, message))
    sys.stderr.flush()


class Steps(object):
    """Times each named step; the program's JSON names every step that finished, in order."""

    def __init__(self):
        self.done = []

    def run(self, name, call):
        progress(name + " ...")
        begun = time.perf_counter()
        result = call()
        self.done.append([name, round(time.perf_counter() - begun, 6)])
        return result


def inputs():
    rng = numpy.random.RandomState(28)
    return (rng.standard_normal(SHAPE_X).astype(numpy.float32),
            rng.standard_normal(SHAPE_W).astype(numpy.float32))


def reference(x, w):
    """Cross-correlation with zero padding (what cuDNN calls CUDNN_CROSS_CORRELATION), then ReLU."""
    n, c, h, width = x.shape
    k, _c, r, s = w.shape
    padded = numpy.zeros((n, c, h + 2 * PAD, width + 2 * PAD), numpy.float64)
    padded[:, :, PAD:PAD + h, PAD:PAD + width] = x
    y = numpy.zeros((n, k, h, width), numpy.float64)
    for i in range(r):
        for j in range(s):
            y += numpy.einsum("nchw,kc->nkhw", padded[:, :, i:i + h, j:j + width], w[:, :, i, j])
    y = y.astype(numpy.float32)
    return y, numpy.maximum(y, 0)


def _check(status, call, lib):
    if status != 0:
        lib.cudnnGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError("%s: status %d (%s)" % (call, status, lib.cudnnGetErrorString(status).decode()))


def _cu(status, call):
    if status != 0:
        raise RuntimeError("%s: CUresult %d" % (call, status))


class Device(object):
    """Device memory through libcuda (ctypes): the primary context, which cuDNN's runtime then uses."""

    def __init__(self):
        self.api = ctypes.CDLL("libcuda.so.1")
        _cu(self.api.cuInit(0), "cuInit")
        device, context = ctypes.c_int(), ctypes.c_void_p()
        _cu(self.api.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        _cu(self.api.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        _cu(self.api.cuCtxSetCurrent(context), "cuCtxSetCurrent")

    def upload(self, array):
        pointer = ctypes.c_uint64()
        _cu(self.api.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(max(array.nbytes, 1))), "cuMemAlloc")
        _cu(self.api.cuMemcpyHtoD_v2(pointer, array.ctypes.data_as(ctypes.c_void_p),
                                     ctypes.c_size_t(array.nbytes)), "cuMemcpyHtoD")
        return ctypes.c_void_p(pointer.value)

    def download(self, pointer, like):
        out = numpy.empty_like(like)
        _cu(self.api.cuCtxSynchronize(), "cuCtxSynchronize")
        _cu(self.api.cuMemcpyDtoH_v2(out.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(pointer.value),
                                     ctypes.c_size_t(out.nbytes)), "cuMemcpyDtoH")
        return out


def _descriptors(lib, x, w):
    made = {}
    for name, create in (("x", "cudnnCreateTensorDescriptor"), ("y", "cudnnCreateTensorDescriptor"),
                         ("w", "cudnnCreateFilterDescriptor"), ("conv", "cudnnCreateConvolutionDescriptor"),
                         ("act", "cudnnCreateActivationDescriptor")):
        made[name] = ctypes.c_void_p()
        _check(getattr(lib, create)(ctypes.byref(made[name])), create, lib)
    _check(lib.cudnnSetTensor4dDescriptor(made["x"], NCHW, FLOAT, *x.shape), "cudnnSetTensor4dDescriptor", lib)
    _check(lib.cudnnSetFilter4dDescriptor(made["w"], FLOAT, NCHW, *w.shape), "cudnnSetFilter4dDescriptor", lib)
    _check(lib.cudnnSetConvolution2dDescriptor(made["conv"], PAD, PAD, 1, 1, 1, 1, CROSS_CORRELATION, FLOAT),
           "cudnnSetConvolution2dDescriptor", lib)
    dims = [ctypes.c_int() for _ in range(4)]
    _check(lib.cudnnGetConvolution2dForwardOutputDim(made["conv"], made["x"], made["w"],
                                                     *[ctypes.byref(d) for d in dims]),
           "cudnnGetConvolution2dForwardOutputDim", lib)
    shape = tuple(d.value for d in dims)
    _check(lib.cudnnSetTensor4dDescriptor(made["y"], NCHW, FLOAT, *shape), "cudnnSetTensor4dDescriptor(y)", lib)
    _check(lib.cudnnSetActivationDescriptor(made["act"], RELU, NOT_PROPAGATE_NAN, ctypes.c_double(0.0)),
           "cudnnSetActivationDescriptor", lib)
    return made, shape


def run(lib_path, dry_run):
    steps = Steps()
    x, w = inputs()
    want_conv, want_relu = steps.run("numpy reference", lambda: reference(x, w))
    lib = steps.run("load library", lambda: ctypes.CDLL(lib_path))
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    lib.cudnnGetCudartVersion.restype = ctypes.c_size_t
    version = steps.run("cudnnGetVersion", lib.cudnnGetVersion)
    cudart = steps.run("cudnnGetCudartVersion", lib.cudnnGetCudartVersion)
    result = {"library": lib_path, "cudnn_version": version, "cudart_version": cudart, "dry_run": dry_run,
              "shapes": {"x": SHAPE_X, "w": SHAPE_W, "y": list(want_conv.shape)}, "steps": steps.done}
    if dry_run:
        return result
    device = steps.run("CUDA context (libcuda primary context)", Device)
    handle = ctypes.c_void_p()
    steps.run("cudnnCreate", lambda: _check(lib.cudnnCreate(ctypes.byref(handle)), "cudnnCreate", lib))
    made, shape = steps.run("descriptors", lambda: _descriptors(lib, x, w))
    if shape != want_conv.shape:
        raise RuntimeError("cuDNN's output shape %s, numpy's %s" % (shape, want_conv.shape))
    x_dev, w_dev = device.upload(x), device.upload(w)
    y_dev, z_dev = device.upload(numpy.zeros_like(want_conv)), device.upload(numpy.zeros_like(want_conv))
    workspace = ctypes.c_size_t()
    _check(lib.cudnnGetConvolutionForwardWorkspaceSize(handle, made["x"], made["w"], made["conv"], made["y"],
                                                       FWD_ALGO_IMPLICIT_GEMM, ctypes.byref(workspace)),
           "cudnnGetConvolutionForwardWorkspaceSize", lib)
    work = device.upload(numpy.zeros(workspace.value, numpy.uint8))
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def convolve():
        _check(lib.cudnnConvolutionForward(handle, ctypes.byref(alpha), made["x"], x_dev, made["w"], w_dev,
                                           made["conv"], FWD_ALGO_IMPLICIT_GEMM, work, workspace, ctypes.byref(beta),
                                           made["y"], y_dev), "cudnnConvolutionForward", lib)
        return device.download(y_dev, want_conv)

    def activate():
        _check(lib.cudnnActivationForward(handle, made["act"], ctypes.byref(alpha), made["y"], y_dev,
                                          ctypes.byref(beta), made["y"], z_dev), "cudnnActivationForward", lib)
        return device.download(z_dev, want_relu)

    conv = steps.run("cudnnConvolutionForward", convolve)
    relu = steps.run("cudnnActivationForward (ReLU)", activate)
    conv_error = float(numpy.abs(conv - want_conv).max())
    relu_error = float(numpy.abs(relu - want_relu).max())
    result.update(conv_max_error=conv_error, relu_max_error=relu_error,
                  matches_numpy=conv_error <= TOLERANCE and relu_error <= TOLERANCE,
                  conv_sha256=hashlib.sha256(conv.tobytes()).hexdigest(),
                  relu_sha256=hashlib.sha256(relu.tobytes()).hexdigest(),
                  total_s=round(time.perf_counter() - STARTED, 6))
    lib.cudnnDestroy(handle)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description="cuDNN 7 through ctypes: create, convolve, ReLU, vs numpy")
    parser.add_argument("--lib", required=True, help="path of libcudnn.so.7")
    parser.add_argument("--dry-run", action="store_true", help="stop before the first CUDA call")
    args = parser.parse_args(argv)
    try:
        result = run(args.lib, args.dry_run)
    except (OSError, RuntimeError, AttributeError) as exc:  # one line: which step, what it said
        sys.stderr.write("program.py: error: %s\n" % (" ".join(str(exc).split()) or type(exc).__name__))
        return 1
    print(json.dumps(result))
    return 0 if result["dry_run"] or result["matches_numpy"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""CPU check of the cuDNN build (no GPU): Chainer 1.24's own cupy.cuda.cudnn against cuDNN 7.1.2.

The module imports, answers version 7102, Chainer enables cuDNN, and descriptors set through the
module's setters (among them the three that patch 07 maps onto cuDNN 7's API) read back equal through
cuDNN's own getters.  Exits non-zero with one line on any difference.
"""
import ctypes
import os
import sys


def fail(message):
    sys.stderr.write("cudnn_cpu_check: %s\n" % message)
    sys.exit(1)


def loaded_libcudnn():
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libcudnn.so"):
                return path
    fail("libcudnn is not loaded by cupy.cuda.cudnn")


def main():
    import chainer
    from cupy.cuda import cudnn
    if cudnn.getVersion() != 7102:
        fail("cudnn.getVersion() = %r, not 7102" % cudnn.getVersion())
    if not chainer.cuda.cudnn_enabled:
        fail("chainer.cuda.cudnn_enabled is False")
    lib = ctypes.CDLL(loaded_libcudnn())
    c_int = ctypes.c_int
    ints = [c_int() for _ in range(10)]
    refs = [ctypes.byref(v) for v in ints]

    t = cudnn.createTensorDescriptor()
    cudnn.setTensor4dDescriptor(t, cudnn.CUDNN_TENSOR_NCHW, cudnn.CUDNN_DATA_DOUBLE, 8, 3, 32, 31)
    status = lib.cudnnGetTensor4dDescriptor(ctypes.c_void_p(t), *refs)
    got = [v.value for v in ints]
    if status or got[:5] != [cudnn.CUDNN_DATA_DOUBLE, 8, 3, 32, 31]:
        fail("tensor descriptor reads back %r (status %d)" % (got[:5], status))

    f = cudnn.createFilterDescriptor()
    cudnn.setFilter4dDescriptor_v4(f, cudnn.CUDNN_DATA_HALF, cudnn.CUDNN_TENSOR_NCHW, 16, 3, 7, 5)
    status = lib.cudnnGetFilter4dDescriptor(ctypes.c_void_p(f), *refs[:6])
    got = [v.value for v in ints[:6]]
    if status or got != [cudnn.CUDNN_DATA_HALF, cudnn.CUDNN_TENSOR_NCHW, 16, 3, 7, 5]:
        fail("filter descriptor reads back %r (status %d)" % (got, status))

    for setter, args, compute in (
            ("setConvolution2dDescriptor_v5", (cudnn.CUDNN_DATA_DOUBLE,), cudnn.CUDNN_DATA_DOUBLE),
            ("setConvolution2dDescriptor_v4", (), cudnn.CUDNN_DATA_FLOAT)):
        c = cudnn.createConvolutionDescriptor()
        getattr(cudnn, setter)(c, 3, 2, 2, 1, 1, 1, cudnn.CUDNN_CROSS_CORRELATION, *args)
        status = lib.cudnnGetConvolution2dDescriptor(ctypes.c_void_p(c), *refs[:8])
        got = [v.value for v in ints[:8]]
        if status or got != [3, 2, 2, 1, 1, 1, cudnn.CUDNN_CROSS_CORRELATION, compute]:
            fail("%s reads back %r (status %d)" % (setter, got, status))
    # The v5 RNN setter that patch 07 maps cudnnSetRNNDescriptor onto (no handle: no GPU needed)
    r = cudnn.createRNNDescriptor()
    d = cudnn.createDropoutDescriptor()
    try:
        cudnn.setRNNDescriptor(r, 16, 2, d, cudnn.CUDNN_LINEAR_INPUT, cudnn.CUDNN_UNIDIRECTIONAL,
                               cudnn.CUDNN_LSTM, cudnn.CUDNN_DATA_FLOAT)
    except Exception as exc:  # the dropout descriptor is unset without a GPU: cuDNN may refuse it
        if "KeyError" in type(exc).__name__:
            fail("a cuDNN 7 status has no name: %s" % exc)
    try:
        cudnn.check_status(13)
    except KeyError:
        fail("CuDNNError raises KeyError for status 13")
    except cudnn.CuDNNError as exc:
        if "CUDNN_STATUS_RUNTIME_FP_OVERFLOW" not in str(exc):
            fail("status 13 reads %r" % str(exc))
    print("cudnn_cpu_check: cuDNN %d through Chainer %s's cupy.cuda.cudnn: descriptors read back equal"
          % (cudnn.getVersion(), chainer.__version__))


if __name__ == "__main__":
    main()

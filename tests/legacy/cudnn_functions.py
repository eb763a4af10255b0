"""Every Chainer 1.24 function with a cuDNN path, run once in one mode; outputs and gradients saved.

    python cudnn_functions.py --mode {cpu,gpu} --out DIR

The caller chooses cuDNN on or off (CHAINER_CUDNN) and the steering (PTXBACKEND_CUDNN_STEERING) through
the environment; the same seeded inputs and weights in every mode, so run_cudnn_gpu.sh's comparison is
item by item.  Shapes reach the convolution algorithms cuDNN's heuristic picks on the H200 (1x1, 3x3,
5x5, 7x7; strides 1 and 2; float16/32/64).  In a GPU mode, each algorithm choice is recorded: what the
heuristic gave (the library's own function) and what was used (after the hook's steering, if any).
Writes DIR/functions-<label>.npz and DIR/functions-<label>.json.
"""

import argparse
import json
import os
import sys
import time
import traceback

import numpy

CONV_SHAPES = (  # name, x shape, W shape, stride, pad
    ("3x3s1", (4, 3, 17, 17), (8, 3, 3, 3), 1, 1),
    ("3x3s2", (4, 3, 17, 17), (8, 3, 3, 3), 2, 1),
    ("1x1s1", (4, 16, 9, 9), (8, 16, 1, 1), 1, 0),
    ("1x1s2", (4, 16, 9, 9), (8, 16, 1, 1), 2, 0),
    ("5x5s1", (2, 8, 12, 12), (8, 8, 5, 5), 1, 2),
    ("7x7s2", (2, 3, 32, 32), (8, 3, 7, 7), 2, 3),
    ("3x3s1c64", (2, 64, 14, 14), (64, 64, 3, 3), 1, 1),
)
DECONV_SHAPES = (  # name, x shape, W shape (in, out, kh, kw), stride, pad
    ("3x3s1", (4, 8, 9, 9), (8, 4, 3, 3), 1, 1),
    ("4x4s2", (4, 8, 9, 9), (8, 4, 4, 4), 2, 1),
    ("1x1s1", (4, 8, 9, 9), (8, 4, 1, 1), 1, 0),
)
DTYPES = ("float16", "float32", "float64")


def _rand(rng, shape, dtype, scale=1.0):
    return (rng.uniform(-1, 1, shape) * scale).astype(dtype)


def items():
    """name -> build(rng, dtype) returning (call, inputs); call(F, L, *variables) -> a Variable."""
    out = []
    for name, xs, ws, stride, pad in CONV_SHAPES:
        for dtype in DTYPES:
            def build(rng, dtype=dtype, xs=xs, ws=ws, stride=stride, pad=pad):
                x, w, b = _rand(rng, xs, dtype), _rand(rng, ws, dtype, 0.3), _rand(rng, ws[:1], dtype)
                return (lambda F, x, w, b: F.convolution_2d(x, w, b, stride=stride, pad=pad)), [x, w, b]
            out.append(("convolution_2d %s %s" % (name, dtype), build))
    for name, xs, ws, stride, pad in DECONV_SHAPES:
        for dtype in DTYPES:
            def build(rng, dtype=dtype, xs=xs, ws=ws, stride=stride, pad=pad):
                x, w, b = _rand(rng, xs, dtype), _rand(rng, ws, dtype, 0.3), _rand(rng, ws[1:2], dtype)
                return (lambda F, x, w, b: F.deconvolution_2d(x, w, b, stride=stride, pad=pad)), [x, w, b]
            out.append(("deconvolution_2d %s %s" % (name, dtype), build))
    for dtype in ("float32", "float64"):
        def conv3d(rng, dtype=dtype):
            x, w = _rand(rng, (2, 3, 8, 8, 8), dtype), _rand(rng, (4, 3, 3, 3, 3), dtype, 0.3)
            return (lambda F, x, w: F.convolution_nd(x, w, stride=2, pad=1)), [x, w]
        out.append(("convolution_nd 3x3x3s2 %s" % dtype, conv3d))
        def deconv3d(rng, dtype=dtype):
            x, w = _rand(rng, (2, 4, 5, 5, 5), dtype), _rand(rng, (4, 3, 3, 3, 3), dtype, 0.3)
            return (lambda F, x, w: F.deconvolution_nd(x, w, stride=2, pad=1)), [x, w]
        out.append(("deconvolution_nd 3x3x3s2 %s" % dtype, deconv3d))
        def dilated(rng, dtype=dtype):
            x, w = _rand(rng, (2, 4, 12, 12), dtype), _rand(rng, (4, 4, 3, 3), dtype, 0.3)
            return (lambda F, x, w: F.dilated_convolution_2d(x, w, pad=2, dilate=2)), [x, w]
        out.append(("dilated_convolution_2d 3x3d2 %s" % dtype, dilated))
    for dtype in DTYPES:
        # Distinct values, integers below 2048 (exact in float16): max pooling's gradient is exact only
        # without ties.
        def distinct(rng, shape, dtype=dtype):
            n = int(numpy.prod(shape))
            assert n <= 2048
            return (rng.permutation(n).reshape(shape) - n // 2).astype(dtype)
        out.append(("max_pooling_2d 3s2 %s" % dtype, lambda rng, d=distinct: (
            lambda F, x: F.max_pooling_2d(x, 3, stride=2, pad=1), [d(rng, (2, 4, 15, 15))])))
        out.append(("average_pooling_2d 3s2 %s" % dtype, lambda rng, dtype=dtype: (
            lambda F, x: F.average_pooling_2d(x, 3, stride=2, pad=1), [_rand(rng, (4, 8, 15, 15), dtype)])))
        out.append(("max_pooling_nd 2s2 %s" % dtype, lambda rng, d=distinct: (
            lambda F, x: F.max_pooling_nd(x, 2, stride=2), [d(rng, (2, 4, 6, 6, 6))])))
        out.append(("average_pooling_nd 2s2 %s" % dtype, lambda rng, dtype=dtype: (
            lambda F, x: F.average_pooling_nd(x, 2, stride=2), [_rand(rng, (2, 4, 6, 6, 6), dtype)])))
        for fname in ("relu", "sigmoid", "tanh"):
            out.append(("%s %s" % (fname, dtype), lambda rng, dtype=dtype, fname=fname: (
                lambda F, x: getattr(F, fname)(x), [_rand(rng, (8, 16, 5, 5), dtype, 3.0)])))
        for fname in ("softmax", "log_softmax"):
            out.append(("%s %s" % (fname, dtype), lambda rng, dtype=dtype, fname=fname: (
                lambda F, x: getattr(F, fname)(x), [_rand(rng, (8, 10, 3, 3), dtype, 3.0)])))
        out.append(("batch_normalization %s" % dtype, lambda rng, dtype=dtype: (
            lambda F, x, g, b: F.batch_normalization(x, g, b),
            [_rand(rng, (8, 6, 5, 5), dtype, 2.0), _rand(rng, (6,), dtype) + 1.5, _rand(rng, (6,), dtype)])))
        out.append(("fixed_batch_normalization %s" % dtype, lambda rng, dtype=dtype: (
            lambda F, x, g, b, m, v: F.fixed_batch_normalization(x, g, b, m, v),
            [_rand(rng, (8, 6, 5, 5), dtype, 2.0), _rand(rng, (6,), dtype) + 1.5, _rand(rng, (6,), dtype),
             _rand(rng, (6,), dtype), _rand(rng, (6,), dtype) + 1.5])))
    out.append(("softmax_cross_entropy float32", lambda rng: (
        lambda F, x: F.softmax_cross_entropy(x, _labels(x)), [_rand(rng, (16, 10), "float32", 3.0)])))
    for kind in ("NStepLSTM", "NStepGRU", "NStepRNNTanh", "NStepBiLSTM"):
        out.append(("%s float32" % kind, lambda rng, kind=kind: _rnn(rng, kind)))
    return out


def _labels(x):
    xp = sys.modules["chainer"].cuda.get_array_module(x.data)
    return xp.asarray(numpy.arange(x.shape[0]) % x.shape[1], dtype=numpy.int32)


def _rnn(rng, kind):
    """An n-step RNN link (cuDNN's RNN functions), weights drawn from the seeded rng, three sequences."""
    import chainer.links as L
    layers, in_size, out_size = 2, 6, 5
    numpy.random.seed(int(rng.randint(1 << 30)))
    link = getattr(L, kind)(layers, in_size, out_size, 0.0)
    bi = 2 if "Bi" in kind else 1
    xs = [_rand(rng, (n, in_size), "float32") for n in (4, 3, 2)]
    hx = _rand(rng, (layers * bi, 3, out_size), "float32")
    cx = _rand(rng, (layers * bi, 3, out_size), "float32")
    lstm = "LSTM" in kind

    def call(F, hx, cx, *xs):
        out = link(hx, cx, list(xs)) if lstm else link(hx, list(xs))
        hy, ys = out[0], out[-1]
        return F.concat([F.reshape(hy, (-1,))] + [F.reshape(y, (-1,)) for y in ys], axis=0)
    call.link = link
    return call, [hx, cx] + xs


def _record_choices(choices):
    """Wrap the algorithm choice (after the hook's wrapper, if any): the heuristic's answer and the one used."""
    from cupy.cuda import cudnn
    for name in ("getConvolutionForwardAlgorithm", "getConvolutionBackwardDataAlgorithm",
                 "getConvolutionBackwardFilterAlgorithm"):
        current = getattr(cudnn, name)
        original = getattr(current, "_ptxbackend_cudnn_original", current)

        def wrapper(*args, current=current, original=original, name=name):
            used = current(*args)
            choices.append({"call": name, "heuristic": original(*args) if original is not current else used,
                            "used": used, "item": choices_item[0]})
            return used
        setattr(cudnn, name, wrapper)


choices_item = [None]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("cpu", "gpu"), required=True)
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    import chainer
    import chainer.functions as F
    from chainer import cuda
    record = {"label": args.label, "mode": args.mode, "cudnn_enabled": bool(cuda.cudnn_enabled),
              "env": {k: os.environ.get(k) for k in ("CHAINER_CUDNN", "PTXBACKEND_CUDNN_STEERING",
                                                     "PTXBACKEND_DISABLE")},
              "items": {}, "choices": []}
    if args.mode == "gpu":
        cuda.get_device(0).use()
        if cuda.cudnn_enabled:
            _record_choices(record["choices"])
    arrays = {}
    for name, build in items():
        if args.only and args.only not in name:
            continue
        choices_item[0] = name
        rng = numpy.random.RandomState(_seed(name))
        try:
            call, inputs = build(rng)
            link = getattr(call, "link", None)
            if link is not None:
                link.cleargrads()  # Chainer 1.x fills a new parameter's gradient with NaN
            if args.mode == "gpu":
                if link is not None:
                    link.to_gpu()
                inputs = [cuda.to_gpu(a) for a in inputs]
            variables = [chainer.Variable(a) for a in inputs]
            started = time.perf_counter()
            y = call(F, *variables)
            gy = numpy.asarray(_rand(numpy.random.RandomState(_seed(name) + 1), y.shape, y.dtype))
            y.grad = cuda.to_gpu(gy) if args.mode == "gpu" else gy
            y.backward()
            if args.mode == "gpu":
                cuda.Device().synchronize()
            arrays[name + "|y"] = cuda.to_cpu(y.data).astype(numpy.float64)
            for i, v in enumerate(variables):
                if v.grad is not None:
                    arrays["%s|g%d" % (name, i)] = cuda.to_cpu(v.grad).astype(numpy.float64)
            if link is not None:
                for pname, p in sorted(link.namedparams()):
                    if p.grad is not None:
                        arrays["%s|%s" % (name, pname)] = cuda.to_cpu(p.grad).astype(numpy.float64)
            record["items"][name] = {"ok": True, "seconds": time.perf_counter() - started}
        except Exception as exc:
            record["items"][name] = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc),
                                     "traceback": traceback.format_exc()[-2000:]}
    try:
        from ptxbackend.hook import cudnn_steering
        record["steering"] = cudnn_steering.status()
    except ImportError:
        record["steering"] = None
    numpy.savez(os.path.join(args.out, "functions-%s.npz" % args.label), **arrays)
    with open(os.path.join(args.out, "functions-%s.json" % args.label), "w") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
    failed = [n for n, r in record["items"].items() if not r["ok"]]
    print("%s: %d items, %d failed%s" % (args.label, len(record["items"]), len(failed),
                                         (": " + "; ".join(failed[:5])) if failed else ""))


def _seed(name):
    import zlib
    return zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF


if __name__ == "__main__":
    main()

"""The user's kind of program: a small ResNet-like inspection CNN on 224x224 images, Chainer 1.24.

    python cudnn_model.py --device {cpu,gpu} --label L --out DIR [--time N] [--train N] [--handfix]

The net (documented in docs/compat-h200/chainer-cudnn.md): a 7x7 stride-2 stem (3->32) with batch
normalization, ReLU and 3x3 stride-2 max pooling (56x56); a residual block of two 3x3 convolutions (32);
three stages that halve the size with a 3x3 stride-2 convolution and a 1x1 stride-2 shortcut
(32->64->128->256: 28, 14, 7); 7x7 average pooling; a linear layer to 10 classes.  Every convolution
shape that cuDNN 7.1's heuristic sends to algorithm 1 on the H200 (7x7 s2, 3x3 s2, 1x1) is in it.

Measured, in this fresh process: seconds from the parent's spawn ($CUDNN_SPAWN_T, time.time()) to the
end of imports and to the end of the first inference (batch 1, synchronised); then the median inference
time per batch (batch 1 and 8, `--time` repetitions after 3 warm-ups); then `--train` MomentumSGD steps
on batch 8 (losses).  Logits of batch 1 and 8 go to DIR/model-<label>.npz.
``--handfix``: the user's own fix instead of ptxbackend (run with PTXBACKEND_DISABLE=1): CuPy v1's
compiler.nvcc made to emit `nvcc --ptx -arch compute_61` (the patched compiler.py).
"""

import argparse
import json
import os
import sys
import time

T_SPAWN = float(os.environ.get("CUDNN_SPAWN_T") or time.time())


def handfix():
    """The user's patched cupy/cuda/compiler.py: PTX for compute_61, which the driver JIT-compiles."""
    import subprocess
    import tempfile
    from cupy.cuda import compiler

    def nvcc(source, options=(), arch=None):
        with tempfile.TemporaryDirectory() as root:
            path = os.path.join(root, "kern")
            with open(path + ".cu", "w") as handle:
                handle.write(source)
            subprocess.check_call(["nvcc", "--ptx", "-arch", "compute_61"] + list(options) + [path + ".cu"],
                                  cwd=root)
            with open(path + ".ptx", "rb") as handle:
                return handle.read()
    compiler.nvcc = nvcc


def build_model():
    import chainer
    import chainer.functions as F
    import chainer.links as L

    class Block(chainer.Chain):
        def __init__(self, cin, cout, stride):
            links = dict(c1=L.Convolution2D(cin, cout, 3, stride, 1, nobias=True), b1=L.BatchNormalization(cout),
                         c2=L.Convolution2D(cout, cout, 3, 1, 1, nobias=True), b2=L.BatchNormalization(cout))
            if stride != 1 or cin != cout:
                links.update(cs=L.Convolution2D(cin, cout, 1, stride, 0, nobias=True), bs=L.BatchNormalization(cout))
            super(Block, self).__init__(**links)
            self.shortcut = "cs" in links

        def __call__(self, x, test):
            h = F.relu(self.b1(self.c1(x), test=test))
            h = self.b2(self.c2(h), test=test)
            s = self.bs(self.cs(x), test=test) if self.shortcut else x
            return F.relu(h + s)

    class InspectNet(chainer.Chain):
        def __init__(self):
            super(InspectNet, self).__init__(
                stem=L.Convolution2D(3, 32, 7, 2, 3, nobias=True), bn=L.BatchNormalization(32),
                r1=Block(32, 32, 1), r2=Block(32, 64, 2), r3=Block(64, 128, 2), r4=Block(128, 256, 2),
                fc=L.Linear(256, 10))

        def __call__(self, x, test=True):
            h = F.relu(self.bn(self.stem(x), test=test))
            h = F.max_pooling_2d(h, 3, stride=2, pad=1)
            for name in ("r1", "r2", "r3", "r4"):
                h = getattr(self, name)(h, test)
            h = F.average_pooling_2d(h, h.shape[2])
            return self.fc(h)
    return InspectNet()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cpu", "gpu"), required=True)
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--time", type=int, default=0)
    parser.add_argument("--train", type=int, default=0)
    parser.add_argument("--handfix", action="store_true")
    args = parser.parse_args()
    import numpy
    import chainer
    import chainer.functions as F
    from chainer import cuda, optimizers
    if args.handfix:
        handfix()
    t_import = time.time() - T_SPAWN
    gpu = args.device == "gpu"
    xp = cuda.cupy if gpu else numpy
    numpy.random.seed(0)
    model = build_model()
    rng = numpy.random.RandomState(1)
    images = {b: rng.uniform(0, 1, (b, 3, 224, 224)).astype(numpy.float32) for b in (1, 8)}
    labels = numpy.arange(8, dtype=numpy.int32) % 10
    if gpu:
        cuda.get_device(0).use()
        model.to_gpu()

    def infer(batch):
        x = chainer.Variable(xp.asarray(images[batch]), volatile="on")
        y = model(x, test=True)
        if gpu:
            cuda.Device().synchronize()
        return y

    y1 = infer(1)
    t_first = time.time() - T_SPAWN
    record = {"label": args.label, "device": args.device, "cudnn_enabled": bool(cuda.cudnn_enabled),
              "handfix": args.handfix, "s_to_imports": t_import, "s_to_first_inference": t_first,
              "env": {k: os.environ.get(k) for k in ("CHAINER_CUDNN", "PTXBACKEND_CUDNN_STEERING",
                                                     "PTXBACKEND_DISABLE", "CUDA_CACHE_PATH")}}
    logits = {"b1": cuda.to_cpu(y1.data), "b8": cuda.to_cpu(infer(8).data)}
    if args.time:
        for batch in (1, 8):
            for _ in range(3):
                infer(batch)
            times = []
            for _ in range(args.time):
                t0 = time.perf_counter()
                infer(batch)
                times.append(time.perf_counter() - t0)
            times.sort()
            record["infer_ms_b%d" % batch] = 1000 * times[len(times) // 2]
            record["infer_ms_b%d_min" % batch] = 1000 * times[0]
    if args.train:
        optimizer = optimizers.MomentumSGD(lr=0.01)
        optimizer.setup(model)
        x = chainer.Variable(xp.asarray(images[8]))
        t = chainer.Variable(xp.asarray(labels))
        losses = []
        for _ in range(args.train):
            model.cleargrads()
            loss = F.softmax_cross_entropy(model(x, test=False), t)
            loss.backward()
            optimizer.update()
            losses.append(float(cuda.to_cpu(loss.data)))
        record["losses"] = losses
    try:
        from ptxbackend.hook import cudnn_steering
        record["steering"] = cudnn_steering.status()
    except ImportError:
        record["steering"] = None
    numpy.savez(os.path.join(args.out, "model-%s.npz" % args.label), **logits)
    with open(os.path.join(args.out, "model-%s.json" % args.label), "w") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
    print(json.dumps(record, sort_keys=True))


if __name__ == "__main__":
    main()

"""The user's kind of program, for Chainer 1.24: train two small models on GPU and on CPU.

Knows nothing about ptxbackend.  A Linear MLP and a small CNN (Convolution2D,
BatchNormalization, relu, max_pooling_2d) are trained for --iters steps with SGD
and with Adam, from identical initial weights on fixed data, no dropout, cuDNN
off (as the user ran it).  Writes one JSON file:

    {"meta": {...}, "runs": {"<device>/<model>/<optimizer>": {
        "losses": [...],                  # loss before each update
        "first_grads": {"<param>": [...]},# gradients of the first step (SGD and Adam alike)
        "init_checksum": float,           # sum |w| of the initial weights
        "outputs": [[...]],               # logits after training
        "seconds": float, "first_step_seconds": float}}}

Usage: python train.py --out result.json [--device gpu,cpu] [--iters 50]
"""

import argparse
import json
import os
import sys
import time

os.environ["CHAINER_CUDNN"] = "0"  # what the user did; Chainer 1.24 reads it at import

T0 = time.time()
import numpy  # noqa: E402

import chainer  # noqa: E402
from chainer import cuda, optimizers  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402

T_IMPORT = time.time() - T0

BATCH, CLASSES, SIDE = 16, 10, 16


class MLP(chainer.Chain):
    def __init__(self):
        super(MLP, self).__init__(l1=L.Linear(SIDE * SIDE, 64), l2=L.Linear(64, CLASSES))

    def __call__(self, x):
        h = F.reshape(x, (x.shape[0], -1))
        return self.l2(F.relu(self.l1(h)))


class CNN(chainer.Chain):
    def __init__(self):
        # conv has a bias right before BatchNormalization: its exact gradient is zero.
        super(CNN, self).__init__(conv=L.Convolution2D(1, 8, 3, pad=1),
                                  bn=L.BatchNormalization(8),
                                  fc=L.Linear(8 * (SIDE // 2) ** 2, CLASSES))

    def __call__(self, x):
        h = F.relu(self.bn(self.conv(x)))  # Chainer 1.x: BN in training mode by default
        h = F.max_pooling_2d(h, 2)
        return self.fc(h)


MODELS = {"mlp": MLP, "cnn": CNN}
OPTIMIZERS = {"sgd": lambda: optimizers.SGD(lr=0.01), "adam": lambda: optimizers.Adam(alpha=0.001)}


def data():
    rng = numpy.random.RandomState(0)
    x = rng.standard_normal((BATCH, 1, SIDE, SIDE)).astype(numpy.float32)
    t = rng.randint(0, CLASSES, size=BATCH).astype(numpy.int32)
    return x, t


def build(model_name):
    """The same initial weights in every process: seeded, drawn on the CPU."""
    model = MODELS[model_name]()
    rng = numpy.random.RandomState(1234)
    for name, param in sorted(model.namedparams()):
        if param.data.ndim > 1:  # weights: He-like scale; biases, gamma, beta: small values
            fan_in = int(numpy.prod(param.data.shape[1:]))
            value = rng.standard_normal(param.data.shape) * numpy.sqrt(2.0 / fan_in)
        elif name.endswith("gamma"):
            value = 1.0 + 0.1 * rng.standard_normal(param.data.shape)
        else:
            value = 0.1 * rng.standard_normal(param.data.shape)
        param.data[...] = value.astype(numpy.float32)
    return model


def run(device, model_name, opt_name, iters, x_cpu, t_cpu):
    model = build(model_name)
    checksum = float(sum(numpy.abs(p.data).sum() for _, p in model.namedparams()))
    xp = numpy
    if device == "gpu":
        cuda.get_device(0).use()
        model.to_gpu()
        xp = cuda.cupy
    x = chainer.Variable(xp.asarray(x_cpu))
    t = chainer.Variable(xp.asarray(t_cpu))
    optimizer = OPTIMIZERS[opt_name]()
    optimizer.setup(model)
    losses, first_grads = [], {}
    start = time.time()
    first_step = None
    for i in range(iters):
        model.cleargrads()
        loss = F.softmax_cross_entropy(model(x), t)
        loss.backward()
        losses.append(float(cuda.to_cpu(loss.data)))
        if i == 0:
            first_grads = {name: cuda.to_cpu(p.grad).ravel().tolist()
                           for name, p in sorted(model.namedparams())}
            first_step = time.time() - start
        optimizer.update()
    outputs = cuda.to_cpu(model(x).data).tolist()  # to_cpu waits for the GPU
    return {"losses": losses, "first_grads": first_grads, "init_checksum": checksum,
            "outputs": outputs, "seconds": time.time() - start, "first_step_seconds": first_step}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="gpu,cpu", help="comma list of gpu, cpu")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args(argv)
    x, t = data()
    result = {"meta": {"chainer": chainer.__version__, "python": sys.version.split()[0],
                       "numpy": numpy.__version__, "cuda_available": bool(cuda.available),
                       "cudnn_enabled": bool(cuda.cudnn_enabled), "iters": args.iters,
                       "import_seconds": T_IMPORT},
              "runs": {}}
    gpu_start = None
    for device in args.device.split(","):
        device_start = time.time()
        if device == "gpu":
            gpu_start = device_start
        for model_name in MODELS:
            for opt_name in OPTIMIZERS:
                key = "%s/%s/%s" % (device, model_name, opt_name)
                result["runs"][key] = run(device, model_name, opt_name, args.iters, x, t)
                print("%-14s loss %.6f -> %.6f  (%.2f s)" % (key, result["runs"][key]["losses"][0],
                                                           result["runs"][key]["losses"][-1],
                                                           result["runs"][key]["seconds"]))
                sys.stdout.flush()
        result["meta"]["%s_seconds" % device] = time.time() - device_start
    if gpu_start is not None:
        result["meta"]["gpu_first_step_seconds"] = result["runs"]["gpu/mlp/sgd"]["first_step_seconds"]
    result["meta"]["total_seconds"] = time.time() - T0
    with open(args.out, "w") as handle:
        json.dump(result, handle)
    print("wrote %s (total %.2f s)" % (args.out, result["meta"]["total_seconds"]))


if __name__ == "__main__":
    main()

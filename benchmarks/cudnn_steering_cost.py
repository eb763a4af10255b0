"""What the cuDNN algorithm steering adds to each call Chainer 1.24 makes (issue 39).

    python benchmarks/cudnn_steering_cost.py [--calls N] [--rounds R]

No GPU needed: the calls go to the gcc-built stand-in library of tests/test_cudnn_steering.py (the same
C entry points and signatures as cuDNN 7, trivial bodies), through the stand-in of Chainer's module, so
what is measured is the wrapper's own work: per call, the unwrapped function, the wrapped one when the
heuristic's algorithm is verified good (one cudnnGetTensorNdDescriptor through ctypes), and when it is
steered (that, plus a workspace query per candidate).  Rounds interleave the arms; medians of per-call
means.  On the GPU the real cuDNN calls take microseconds to milliseconds more; this is the overhead alone.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

CHILD = r'''
import ctypes, json, os, sys, time
sys.path.insert(0, os.environ["REPO"])
from ptxbackend.hook import cudnn_steering
from ptxbackend.gpu import cudnn_algos
sys.path.insert(0, os.environ["SITE"])
from cupy.cuda import cudnn as mod
calls, verdict = int(sys.argv[1]), sys.argv[2]
plain = {n: getattr(mod, n) for n in ("getConvolutionForwardAlgorithm", "convolutionForward")}
if verdict != "none":
    cudnn_steering.on_import(mod)
    good = {"float32": {0, 2} if verdict == "steer" else {0, 1, 2}}
    cudnn_steering._state["steering"] = cudnn_algos.Steering(
        cudnn_algos.Library(os.environ["STANDIN_CUDNN"]), {d: dict(good) for d in cudnn_algos.DIRECTIONS})
x = mod.createTensorDescriptor()
mod.setTensor4dDescriptor(x, 0, 0, 1, 1, 1, 1)
buf = (ctypes.c_float * 1)(1.0)
a = ctypes.addressof(buf)
out = {}
for name in ("getConvolutionForwardAlgorithm", "convolutionForward"):
    fn = getattr(mod, name)
    args = (0, x, 0, 0, x, 2, 8 << 20) if name.startswith("get") else (0, 0, x, a, 0, a, 0, 1, 0, 8 << 20, 0, x, a)
    fn(*args)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    out[name] = (time.perf_counter() - t0) / calls * 1e6
print(json.dumps(out))
'''


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import test_cudnn_steering as standin
    work = tempfile.mkdtemp(prefix="ptxb-steering-bench-")
    try:
        src = os.path.join(work, "standin.c")
        with open(src, "w") as handle:
            handle.write(standin.STANDIN_C)
        lib = os.path.join(work, "libcudnn.so.7")
        subprocess.check_call(["gcc", "-shared", "-fPIC", "-O1", "-o", lib, src])
        pkg = os.path.join(work, "site", "cupy", "cuda")
        os.makedirs(pkg)
        for path, text in ((os.path.join(work, "site", "cupy", "__init__.py"), ""),
                           (os.path.join(pkg, "__init__.py"), ""), (os.path.join(pkg, "cudnn.py"), standin.MODULE_PY)):
            with open(path, "w") as handle:
                handle.write(text)
        # The installed hook stays out (it would wrap the module on import); each arm wraps it itself
        env = dict(os.environ, REPO=REPO, SITE=os.path.join(work, "site"), STANDIN_CUDNN=lib, PTXBACKEND_DISABLE="1")
        samples = {}
        for _ in range(args.rounds):
            for arm in ("none", "good", "steer"):
                out = json.loads(subprocess.check_output([sys.executable, "-c", CHILD, str(args.calls), arm], env=env))
                for name, us in out.items():
                    samples.setdefault((arm, name), []).append(us)
        result = {}
        for (arm, name), values in sorted(samples.items()):
            values.sort()
            result.setdefault(name, {})[arm] = round(values[len(values) // 2], 3)
        for name, arms in result.items():
            arms["added_us_good"] = round(arms["good"] - arms["none"], 3)
            arms["added_us_steered"] = round(arms["steer"] - arms["none"], 3)
        print(json.dumps({"unit": "microseconds per call (median of %d rounds of %d calls)" % (args.rounds, args.calls),
                          "python": sys.version.split()[0], "results": result}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

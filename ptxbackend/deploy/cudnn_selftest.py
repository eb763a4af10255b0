"""A self-test of every cuDNN convolution algorithm on this GPU, run by ``warm --libs cudnn``.

An old cuDNN on a GPU it has no code for can return success from an algorithm whose kernels never run
(issue 39: cuDNN 7.1's forward algorithm 1 on the H200 leaves the output as it was).  Here each algorithm
of each direction (forward, backward data, backward filter) runs once per data type Chainer uses
(float16 with float compute, float32, float64) on small shapes (1x1, 3x3, 5x5, 7x7; strides 1 and 2),
into an output filled with NaN first, and is compared with a reference computed here in plain Python
(no numpy: the package needs none).  The verdict per algorithm and data type: ``good`` (every shape it
accepted matched), ``wrong`` (some shape did not: detail says which and how), ``failed`` (an error status
other than NOT_SUPPORTED, or a CUDA error), ``unsupported`` (it accepted no shape).  What cuDNN's
heuristic (the call Chainer 1.24 makes) picks for each shape is recorded too.

Run as ``python -m ptxbackend.deploy.cudnn_selftest PATH`` it is the child ``warm`` starts: one JSON line.
"""

import ctypes
import json
import struct
import sys
import time

from ..gpu import cudnn_algos

#: (name, n, c, h, w, k, r, s, pad, stride)
CASES = (
    ("3x3 stride 1", 2, 3, 9, 9, 4, 3, 3, 1, 1),
    ("3x3 stride 2", 2, 3, 9, 9, 4, 3, 3, 1, 2),
    ("1x1 stride 1", 2, 8, 8, 8, 4, 1, 1, 0, 1),
    ("1x1 stride 2", 2, 8, 8, 8, 4, 1, 1, 0, 2),
    ("5x5 stride 1", 2, 4, 10, 10, 4, 5, 5, 2, 1),
    ("7x7 stride 2", 1, 3, 16, 16, 4, 7, 7, 3, 2),
    ("3x3 stride 1, 16 channels", 1, 16, 12, 12, 8, 3, 3, 1, 1),
)
#: name -> (cudnnDataType_t, struct format, compute type, tolerance relative to the largest reference value)
DTYPES = {"float16": (2, "e", 0, 2e-2), "float32": (0, "f", 0, 1e-3), "float64": (1, "d", 1, 1e-9)}
ALGO_COUNT = {"forward": 8, "backward_data": 6, "backward_filter": 7}
NOT_SUPPORTED = 9
WORKSPACE_CAP = 512 << 20
CHAINER_WORKSPACE = 8 << 20  # chainer.cuda's default max workspace: what its heuristic calls pass


def _values(count, seed):
    """Deterministic inputs, multiples of 1/8 in [-1, 1]: exact in float16, so one reference serves all types."""
    out, state = [], seed
    for _ in range(count):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(((state >> 8) % 17 - 8) / 8.0)
    return out


def reference(case):
    """x, w, dy and the three results (y, dx, dw) of one case, flat NCHW / KCRS lists of floats."""
    _name, n, c, h, w, k, r, s, pad, st = case
    oh, ow = (h + 2 * pad - r) // st + 1, (w + 2 * pad - s) // st + 1
    x = _values(n * c * h * w, 1)
    wt = _values(k * c * r * s, 2)
    dy = _values(n * k * oh * ow, 3)
    y = [0.0] * (n * k * oh * ow)
    dx = [0.0] * len(x)
    dw = [0.0] * len(wt)
    for b in range(n):
        for o in range(k):
            for i in range(oh):
                for j in range(ow):
                    yi = ((b * k + o) * oh + i) * ow + j
                    acc, g = 0.0, dy[yi]
                    for ch in range(c):
                        for di in range(r):
                            hi = i * st - pad + di
                            if hi < 0 or hi >= h:
                                continue
                            for dj in range(s):
                                wi = j * st - pad + dj
                                if wi < 0 or wi >= w:
                                    continue
                                xi = ((b * c + ch) * h + hi) * w + wi
                                fi = ((o * c + ch) * r + di) * s + dj
                                acc += x[xi] * wt[fi]
                                dx[xi] += g * wt[fi]
                                dw[fi] += x[xi] * g
                    y[yi] = acc
    return {"x": x, "w": wt, "dy": dy, "y": y, "dx": dx, "dw": dw, "out_hw": (oh, ow)}


def compare(got, want, tolerance):
    """None when ``got`` matches, else why not (NaN left: the algorithm did not write its output)."""
    if any(v != v for v in got):
        return "output not written (NaN stays)" if all(v != v for v in got) else "NaN in the output"
    scale = max(max(abs(v) for v in want), 1e-30)
    err = max(abs(a - b) for a, b in zip(got, want))
    return None if err <= tolerance * scale else "max error %.3g (%.2g of the largest value)" % (err, err / scale)


class _Cudnn(object):
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.cudnnGetVersion.restype = ctypes.c_size_t

    def __call__(self, name, *args):
        return getattr(self.lib, name)(*args)

    def check(self, name, *args):
        status = self(name, *args)
        if status != 0:
            raise RuntimeError("%s returned status %d" % (name, status))


def _descriptors(cu, case, dtype_code, compute):
    _name, n, c, h, w, k, r, s, pad, st = case
    oh, ow = (h + 2 * pad - r) // st + 1, (w + 2 * pad - s) // st + 1
    x, y, f, conv = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    cu.check("cudnnCreateTensorDescriptor", ctypes.byref(x))
    cu.check("cudnnCreateTensorDescriptor", ctypes.byref(y))
    cu.check("cudnnCreateFilterDescriptor", ctypes.byref(f))
    cu.check("cudnnCreateConvolutionDescriptor", ctypes.byref(conv))
    cu.check("cudnnSetTensor4dDescriptor", x, 0, dtype_code, n, c, h, w)
    cu.check("cudnnSetTensor4dDescriptor", y, 0, dtype_code, n, k, oh, ow)
    cu.check("cudnnSetFilter4dDescriptor", f, dtype_code, 0, k, c, r, s)
    cu.check("cudnnSetConvolution2dDescriptor", conv, pad, pad, st, st, 1, 1, 1, compute)  # cross-correlation
    return x, y, f, conv


# direction -> (workspace call, run call, heuristic call, descriptor order, inputs, output)
_CALLS = {
    "forward": ("cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward",
                "cudnnGetConvolutionForwardAlgorithm", ("x", "f", "conv", "y"), ("x", "w"), "y"),
    "backward_data": ("cudnnGetConvolutionBackwardDataWorkspaceSize", "cudnnConvolutionBackwardData",
                      "cudnnGetConvolutionBackwardDataAlgorithm", ("f", "y", "conv", "x"), ("w", "dy"), "dx"),
    "backward_filter": ("cudnnGetConvolutionBackwardFilterWorkspaceSize", "cudnnConvolutionBackwardFilter",
                        "cudnnGetConvolutionBackwardFilterAlgorithm", ("x", "y", "conv", "f"), ("x", "dy"), "dw"),
}


def run(path, directions=None, algos=None):
    """Self-test ``directions`` (default all) and, when given, only the algorithms in ``algos``."""
    from ..gpu import driver
    from ..gpu.launch import DeviceBuffer
    started = time.perf_counter()
    driver.ensure_context()
    cu = _Cudnn(path)
    handle = ctypes.c_void_p()
    cu.check("cudnnCreate", ctypes.byref(handle))
    directions = [d for d in _CALLS if directions is None or d in directions]
    results = {d: {t: {} for t in DTYPES} for d in directions}
    heuristic = []
    refs = [(case, reference(case)) for case in CASES]
    for dtype, (code, fmt, compute, tolerance) in sorted(DTYPES.items()):
        size = struct.calcsize(fmt)
        scalar = ctypes.c_double if fmt == "d" else ctypes.c_float
        one, zero = scalar(1.0), scalar(0.0)
        for case, ref in refs:
            descs = dict(zip(("x", "y", "f", "conv"), _descriptors(cu, case, code, compute)))
            buffers = {}
            for name in ("x", "w", "dy", "y", "dx", "dw"):
                buffers[name] = DeviceBuffer(len(ref[name]) * size)
            for name in ("x", "w", "dy"):
                buffers[name].copy_from_host(struct.pack("%d%s" % (len(ref[name]), fmt), *ref[name]))
            for direction in directions:
                ws_call, run_call, pick_call, order, inputs, output = _CALLS[direction]
                picked = ctypes.c_int(-1)
                status = cu(pick_call, handle, *[descs[d] for d in order], 2, ctypes.c_size_t(CHAINER_WORKSPACE),
                            ctypes.byref(picked))
                heuristic.append({"case": case[0], "dtype": dtype, "direction": direction,
                                  "algo": picked.value if status == 0 else None, "status": status})
                for algo in range(ALGO_COUNT[direction]):
                    if algos is not None and algo not in algos:
                        continue
                    record = results[direction][dtype].setdefault(str(algo), {"ok": [], "unsupported": [],
                                                                              "wrong": [], "failed": []})
                    need = ctypes.c_size_t(0)
                    status = cu(ws_call, handle, *[descs[d] for d in order], algo, ctypes.byref(need))
                    if status == NOT_SUPPORTED:
                        record["unsupported"].append(case[0])
                        continue
                    if status != 0:
                        record["failed"].append("%s: workspace query status %d" % (case[0], status))
                        continue
                    if need.value > WORKSPACE_CAP:
                        record["unsupported"].append(case[0])
                        continue
                    nan = struct.pack(fmt, float("nan")) * len(ref[output])
                    buffers[output].copy_from_host(nan)
                    workspace = DeviceBuffer(need.value) if need.value else None
                    try:
                        status = cu(run_call, handle, ctypes.byref(one), descs[order[0]],
                                    ctypes.c_void_p(buffers[inputs[0]].ptr), descs[order[1]],
                                    ctypes.c_void_p(buffers[inputs[1]].ptr), descs["conv"], algo,
                                    ctypes.c_void_p(workspace.ptr if workspace else 0), ctypes.c_size_t(need.value),
                                    ctypes.byref(zero), descs[order[3]], ctypes.c_void_p(buffers[output].ptr))
                        if status == NOT_SUPPORTED:
                            record["unsupported"].append(case[0])
                            continue
                        if status != 0:
                            record["failed"].append("%s: status %d" % (case[0], status))
                            continue
                        driver.synchronize()
                        raw = bytes(buffers[output].copy_to_host())
                    except Exception as exc:
                        record["failed"].append("%s: %s" % (case[0], " ".join(str(exc).split())[:200]))
                        continue
                    finally:
                        if workspace is not None:
                            workspace.free()
                    got = struct.unpack("%d%s" % (len(ref[output]), fmt), raw)
                    why = compare(got, ref[output], tolerance)
                    if why is None:
                        record["ok"].append(case[0])
                    else:
                        record["wrong"].append("%s: %s" % (case[0], why))
            for buffer in buffers.values():
                buffer.free()
            for name in ("x", "y"):
                cu("cudnnDestroyTensorDescriptor", descs[name])
            cu("cudnnDestroyFilterDescriptor", descs["f"])
            cu("cudnnDestroyConvolutionDescriptor", descs["conv"])
    cu("cudnnDestroy", handle)
    verdicts = {}
    for direction, by_dtype in results.items():
        for dtype, by_algo in by_dtype.items():
            for algo, record in by_algo.items():
                if record["wrong"]:
                    verdict, detail = "wrong", record["wrong"][0]
                elif record["failed"]:
                    verdict, detail = "failed", record["failed"][0]
                elif record["ok"]:
                    verdict, detail = "good", "%d shapes" % len(record["ok"])
                else:
                    verdict, detail = "unsupported", ""
                verdicts.setdefault(direction, {}).setdefault(dtype, {})[algo] = {
                    "verdict": verdict, "detail": detail, "ok": len(record["ok"]),
                    "unsupported": len(record["unsupported"]), "wrong": record["wrong"], "failed": record["failed"]}
    ordinal = driver.current_device()
    return {"library": path, "cudnn_version": int(cu.lib.cudnnGetVersion()),
            "device": cudnn_algos.device_identity(ordinal),
            "driver": driver.driver_build(), "verdicts": verdicts, "heuristic": heuristic,
            "cases": [c[0] for c in CASES], "seconds": round(time.perf_counter() - started, 3)}


def entry_from(result, library):
    """The verdict file's entry for a self-test result and the library identity the parent took."""
    return {"library": library, "device": result["device"], "driver": result.get("driver"),
            "cudnn_version": result["cudnn_version"],
            "tested_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "verdicts": result["verdicts"]}


def summary(result):
    """One line per direction and type: the algorithms by verdict; and which of them the heuristic picks."""
    lines = []
    for direction in cudnn_algos.DIRECTIONS:
        for dtype, by_algo in sorted(result["verdicts"].get(direction, {}).items()):
            words = {}
            for algo, v in sorted(by_algo.items(), key=lambda kv: int(kv[0])):
                words.setdefault(v["verdict"], []).append(algo)
            picks = sorted(set(str(h["algo"]) for h in result["heuristic"]
                               if h["direction"] == direction and h["dtype"] == dtype and h["algo"] is not None))
            lines.append("%s %s: %s; the heuristic picks %s" % (
                direction, dtype, ", ".join("%s %s" % (w, "/".join(a)) for w, a in sorted(words.items())),
                "/".join(picks) or "-"))
    return lines


def merge(parts):
    """One result from the results of several children (each a part of the directions or algorithms)."""
    merged = dict(parts[0], verdicts={}, heuristic=[], seconds=0.0)
    for part in parts:
        for direction, by_dtype in part["verdicts"].items():
            for dtype, by_algo in by_dtype.items():
                merged["verdicts"].setdefault(direction, {}).setdefault(dtype, {}).update(by_algo)
        merged["heuristic"].extend(part["heuristic"])
        merged["seconds"] += part["seconds"]
    return merged


def died(direction, algo, why):
    """The verdicts for an algorithm whose self-test process did not come back: failed, in every type."""
    detail = "the self-test process failed: %s" % why
    return {t: {str(algo): {"verdict": "failed", "detail": detail, "ok": 0, "unsupported": 0, "wrong": [],
                            "failed": [detail]}} for t in DTYPES}


if __name__ == "__main__":
    try:
        chosen = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] else None
        only = set(int(a) for a in sys.argv[3].split(",")) if len(sys.argv) > 3 and sys.argv[3] else None
        print(json.dumps(run(sys.argv[1], chosen, only)))
    except Exception as exc:
        sys.stderr.write("%s\n" % (" ".join(str(exc).split()) or type(exc).__name__))
        sys.exit(1)

"""Section 3: kernel run time, native cubin against PTX JIT-compiled from compute_61/75/86 (GPU only).

One child process (PTXBACKEND_CUBIN_CACHE=0, so ptxbackend.load hands PTX to the driver, which
JIT-compiles it).  Kernels: saxpy on 64M floats (memory-bound, benchmarks/kernels/elementwise.cu)
and a chain of 64 sinf per element on 64M floats (compute-bound, transcendental.cu).  Each variant is
checked against the native one on a small buffer first.  Timing: N back-to-back launches between two
synchronize() calls, N chosen so one batch takes at least 100 ms; repetitions interleave the variants.
"""

import array
import ctypes
import math
import os
import time

import benchutil
import machine

ELEMENTS = 64 * 1024 * 1024
CHECK_ELEMENTS = 1 << 16
BLOCK = 256
MIN_BATCH_S = 0.1


# --------------------------------------------------------------------------- child

def _grid(n):
    return (n + BLOCK - 1) // BLOCK


def _floats(buf):
    values = array.array("f")
    values.frombytes(bytes(buf.copy_to_host()))
    return values


def _launcher(kernel_name, function, x, y, n):
    if kernel_name == "saxpy":
        args = [ctypes.c_float(0.5), x, y, ctypes.c_uint(n)]
    else:
        args = [x, y, ctypes.c_uint(n)]
    grid = _grid(n)

    def launch():
        function.launch(grid, BLOCK, args)
    return launch


def _time_batch(launch, count, driver):
    driver.synchronize()
    started = time.perf_counter()
    for _ in range(count):
        launch()
    driver.synchronize()
    return (time.perf_counter() - started) / count


def kernels_child(args):
    import ptxbackend
    from ptxbackend.gpu import driver
    driver.ensure_context()
    n = int(args["elements"])
    reps = int(args["reps"])
    out = {"variants": [], "kernels": {}}
    modules = {}
    for variant in args["variants"]:
        os.environ.update(variant["env"])
        loaded = {}
        for kernel_name, file_name in (("saxpy", "elementwise"), ("sinf_chain", "transcendental")):
            artifact = ptxbackend.compile(benchutil.kernel_source(file_name), (), target=variant["target"],
                                          compiler=variant["compiler"])
            module = ptxbackend.load(artifact)
            loaded[kernel_name] = (module, module.get_function(kernel_name), module.get_function("bench_init"))
        modules[variant["label"]] = loaded
        out["variants"].append({"label": variant["label"], "target": variant["target"],
                                "producer": artifact.producer, "loaded_as": module.kind})
    labels = [v["label"] for v in args["variants"]]
    native = labels[0]

    for kernel_name in ("saxpy", "sinf_chain"):
        init = modules[native][kernel_name][2]
        # Correctness on a small buffer: every variant against the native one, same inputs.
        results = {}
        for label in labels:
            with driver.DeviceBuffer(CHECK_ELEMENTS * 4) as x, driver.DeviceBuffer(CHECK_ELEMENTS * 4) as y:
                init.launch(_grid(CHECK_ELEMENTS), BLOCK, [x, ctypes.c_uint(CHECK_ELEMENTS), ctypes.c_float(1.0 / 1024)])
                init.launch(_grid(CHECK_ELEMENTS), BLOCK, [y, ctypes.c_uint(CHECK_ELEMENTS), ctypes.c_float(0.5 / 1024)])
                _launcher(kernel_name, modules[label][kernel_name][1], x, y, CHECK_ELEMENTS)()
                driver.synchronize()
                results[label] = _floats(y)
        reference = results[native]
        checks = {}
        for label in labels:
            diff = max(abs(a - b) for a, b in zip(results[label], reference))
            checks[label] = diff
        finite = all(math.isfinite(v) for v in reference)
        # Timing on the big buffers.
        timings = {label: [] for label in labels}
        counts = {}
        with driver.DeviceBuffer(n * 4) as x, driver.DeviceBuffer(n * 4) as y:
            init.launch(_grid(n), BLOCK, [x, ctypes.c_uint(n), ctypes.c_float(1.0 / 1024)])
            init.launch(_grid(n), BLOCK, [y, ctypes.c_uint(n), ctypes.c_float(0.5 / 1024)])
            launches = {label: _launcher(kernel_name, modules[label][kernel_name][1], x, y, n) for label in labels}
            for label in labels:  # warm up, then size the batch
                _time_batch(launches[label], 3, driver)
                estimate = _time_batch(launches[label], 5, driver)
                counts[label] = max(10, int(math.ceil(MIN_BATCH_S / max(estimate, 1e-6))))
            for rep in range(reps):
                order = labels if rep % 2 == 0 else list(reversed(labels))
                for label in order:
                    timings[label].append(_time_batch(launches[label], counts[label], driver) * 1000.0)
        out["kernels"][kernel_name] = {"ms_per_launch": timings, "launches_per_batch": counts,
                                       "max_abs_diff_vs_native": checks, "reference_finite": finite}
    return out


# --------------------------------------------------------------------------- runner

def _variants(ctx):
    cc = ctx.device_cc
    variants, notes = [], []
    slot, entry = machine.pick(ctx.toolkits, ("nvcc13", "nvrtc13"), cc, kind="sm")
    if not entry:
        return None, ["no compiler here emits sm_%d cubins: no native reference" % cc]
    variants.append({"label": "native sm_%d" % cc, "target": "sm_%d" % cc, "compiler": entry["kind"],
                     "env": machine.env_for(entry), "toolkit": machine.label(slot, entry)})
    for arch in (61, 75, 86):
        if arch > cc:
            continue
        slot, entry = machine.pick(ctx.toolkits, ("nvcc13", "nvrtc13", "nvcc112", "nvrtc117"), arch)
        if not entry:
            notes.append("compute_%d not measured: no compiler here knows it" % arch)
            continue
        variants.append({"label": "PTX compute_%d" % arch, "target": "compute_%d" % arch,
                         "compiler": entry["kind"], "env": machine.env_for(entry),
                         "toolkit": machine.label(slot, entry)})
    return variants, notes


def run(ctx):
    title = "Kernel run time: native cubin vs PTX JIT-compiled by the driver"
    if not ctx.gpu.get("available"):
        return ctx.skipped(title, "needs a GPU (%s)" % ctx.gpu.get("why", "none found"))
    variants, notes = _variants(ctx)
    if not variants:
        return ctx.skipped(title, notes[0])
    reps = ctx.reps(full=7, quick=3)
    env = benchutil.clean_env({"PTXBACKEND_CUBIN_CACHE": "0", "PTXBACKEND_CACHE_DIR": ctx.ws.fresh("kernels-cache"),
                               "CUDA_CACHE_PATH": ctx.ws.fresh("kernels-jit"), "CUDA_CACHE_DISABLE": None,
                               "PTXBACKEND_DISABLE": "1"})
    benchutil.log("kernels: %s" % ", ".join(v["label"] for v in variants))
    try:
        got = benchutil.spawn("bench_kernels", "kernels_child",
                              {"variants": variants, "elements": ELEMENTS, "reps": reps}, env, timeout=600)
    except benchutil.ChildError as exc:
        return {"title": title, "status": "error", "notes": notes + [str(exc)], "summary": {}}
    notes.append("ms per launch: median (min-max, repetitions) of batches of back-to-back launches "
                 "(>= %d ms per batch) on %dM floats; ratio = variant / native." % (MIN_BATCH_S * 1000, ELEMENTS >> 20))
    toolkit = {v["label"]: v["toolkit"] for v in variants}
    loaded = {v["label"]: v["loaded_as"] for v in got["variants"]}
    native = variants[0]["label"]
    rows, ratios = [], []
    series = {}
    plot_labels = [v["label"] for v in variants]
    stats = {}
    for kernel_name, data in got["kernels"].items():
        base = benchutil.summarize(data["ms_per_launch"][native])
        series[kernel_name] = []
        for v in variants:
            label = v["label"]
            stat = benchutil.summarize(data["ms_per_launch"][label])
            r = benchutil.ratio(stat, base)
            stats.setdefault(kernel_name, {})[label] = {"ms_per_launch": stat, "ratio": r,
                                                        "launches_per_batch": data["launches_per_batch"][label],
                                                        "max_abs_diff_vs_native": data["max_abs_diff_vs_native"][label]}
            if label != native and r is not None:
                ratios.append(r)
            series[kernel_name].append(r)
            diff = data["max_abs_diff_vs_native"][label]
            rows.append([kernel_name, label, toolkit[label], loaded[label], benchutil.fmt_stat(stat),
                         benchutil.fmt_ratio(r), "%.2g" % diff])
            if diff > 1e-3:
                notes.append("%s %s differs from native by %.3g: check it." % (kernel_name, label, diff))
        if not data["reference_finite"]:
            notes.append("%s: the native result has non-finite values." % kernel_name)
    return {"title": title, "status": "ok", "notes": notes, "stats": stats,
            "summary": {"worst_ratio": max(ratios) if ratios else None,
                        "best_ratio": min(ratios) if ratios else None},
            "table": {"columns": ["kernel", "variant", "compiler", "loaded as", "ms per launch", "ratio to native",
                                  "max |diff| vs native"], "rows": rows},
            "plots": [{"file": "kernels.png", "title": "Kernel time relative to native cubin", "ylabel": "ratio",
                       "labels": plot_labels, "series": series, "plain": True}]}

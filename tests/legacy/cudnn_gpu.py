"""Chainer 1.24 with cuDNN on, on the GPU machine, through the installed start-up hook (issue 39).

Run by run_cudnn_gpu.sh (which stages the library, the wheels and ptxbackend); steps in $CUDNN_STEPS:

  warm       `ptxbackend warm --libs cudnn` (parallel JIT + the algorithm self-test; verdicts filed), doctor
  functions  every function with a cuDNN path (cudnn_functions.py) on the CPU, the GPU with cuDNN off, on,
             and on with steering off; each compared item by item; the heuristic's algorithm picks
  story      the inspection CNN (cudnn_model.py): inference time per batch on vs off (and steering off),
             python start to first inference after the warm-up (kernels cached) and on a "new machine"
             (empty ptxbackend cache and driver JIT cache, given the kernel bundle and the driver JIT bundle),
             a few training steps on vs off vs CPU, and the hook's logits against the hand fix's

Writes $OUT/cudnn-gpu.json, $OUT/summary.txt (CHECK lines and figures), a log per process; exit 1 when a
check failed.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("OUT", "/tmp/legacy-cudnn-out")
HOME = os.environ["CUDNN_HOME"]
PY = os.environ.get("PYTHON", "python3")
STEPS = [s for s in os.environ.get("CUDNN_STEPS", "warm,functions,story").split(",") if s]
JOBS = os.environ.get("CUDNN_JOBS", str(os.cpu_count() or 8))
REPS = int(os.environ.get("CUDNN_TIME_REPS", "20"))
TOL = {"float16": 5e-2, "float32": 2e-3, "float64": 1e-6}
RESULTS = os.path.join(HOME, "results.json")
LIB = os.path.join(HOME, "lib", "libcudnn.so.7")

results = json.load(open(RESULTS)) if os.path.exists(RESULTS) else {}
lines = []


def say(text):
    sys.stdout.write("[cudnn_gpu %s] %s\n" % (time.strftime("%H:%M:%S"), text))
    sys.stdout.flush()


def check(name, ok, detail=""):
    results.setdefault("checks", {})[name] = {"ok": bool(ok), "detail": detail}
    say("CHECK %s: %s %s" % (name, "PASS" if ok else "FAIL", detail))


def base_env(nvcc="13", **extra):
    env = dict(os.environ)
    for name in ("CUDA_PATH", "CUDA_HOME", "CHAINER_CUDNN", "PTXBACKEND_CUDNN_STEERING", "PTXBACKEND_DISABLE"):
        env.pop(name, None)
    env["PATH"] = os.path.join(HOME, "bin" + nvcc) + os.pathsep + env["PATH"]
    env["PYTHONPATH"] = os.path.join(HOME, "site")
    env["LD_LIBRARY_PATH"] = os.path.join(HOME, "lib") + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    env["CUDA_CACHE_PATH"] = os.path.join(HOME, "jit")
    env["PTXBACKEND_CACHE_DIR"] = os.path.join(HOME, "ptxb-" + nvcc)
    env["HOME"] = os.path.join(HOME, "home-" + nvcc)
    env["PYTHONWARNINGS"] = "ignore"
    env.update({k: v for k, v in extra.items() if v is not None})
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
    os.makedirs(env["HOME"], exist_ok=True)
    return env


def run(label, argv, env, timeout=420):
    env = dict(env, CUDNN_SPAWN_T=repr(time.time()))
    started = time.time()
    log = os.path.join(OUT, "%s.log" % label)
    try:
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=timeout)
        code, text = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        code, text = "timeout", (exc.stdout or "") if isinstance(exc.stdout, str) else ""
    with open(log, "w") as handle:
        handle.write(text)
    say("%s: exit %s in %.1f s (%s)" % (label, code, time.time() - started, log))
    return code, text, time.time() - started


def step_warm():
    env = base_env()
    # The file named: the machine's torch wheels bring a cuDNN 9 that the search by name would find first
    code, text, seconds = run("warm", [PY, "-m", "ptxbackend", "warm", "--libs", LIB, "--jobs", JOBS], env,
                              timeout=480)
    results["warm"] = {"exit": code, "seconds": seconds, "output": text[-6000:]}
    check("warm --libs cudnn", code == 0, "%.1f s" % seconds)
    verdicts = glob.glob(os.path.join(env["PTXBACKEND_CACHE_DIR"], "**", "cudnn-algorithms.json"), recursive=True)
    if verdicts:
        shutil.copy(verdicts[0], os.path.join(OUT, "cudnn-verdicts.json"))
        results["verdict_file"] = verdicts[0]
    check("self-test verdicts filed", bool(verdicts), verdicts[0] if verdicts else "no cudnn-algorithms.json")
    # The nvcc 11.2 runs use a cache of their own: the same verdicts filed there by the package's own code
    if verdicts:
        code, text, _ = run("verdicts-to-112", [PY, "-c", (
            "import sys; from ptxbackend.gpu import cudnn_algos as c; from ptxbackend.config import load_settings; "
            "from ptxbackend.cache.stores import open_store; "
            "[c.save(open_store(load_settings()).meta_dir, e) for e in c.load(sys.argv[1])]"),
            os.path.dirname(verdicts[0])], base_env("112"), timeout=60)
        check("verdicts filed for the nvcc 11.2 cache too", code == 0)
    code, text, _ = run("doctor", [PY, "-m", "ptxbackend", "doctor"], env, timeout=120)
    results["doctor"] = text[-4000:]


def _compare(a, b, names):
    """Per item: ok, and the worst error relative to the largest reference value."""
    out = {}
    for name in names:
        dtype = name.split("|")[0].split()[-1]
        keys = [k for k in a.files if k.split("|")[0] == name]
        if not keys or any(k not in b.files for k in keys):
            out[name] = {"ok": False, "why": "missing"}
            continue
        worst, why = 0.0, ""
        for k in keys:
            x, y = a[k], b[k]
            if x.shape != y.shape:
                worst, why = float("inf"), "shape %s vs %s" % (x.shape, y.shape)
                break
            if not (abs(y) < float("inf")).all() or not (abs(x) < float("inf")).all():
                worst, why = float("inf"), "%s: NaN/inf" % k.split("|")[1]
                break
            scale = max(float(abs(y).max()), 1e-12) if y.size else 1.0
            err = float(abs(x - y).max()) / scale if y.size else 0.0
            if err > worst:
                worst, why = err, k.split("|")[1]
        out[name] = {"ok": worst <= TOL.get(dtype, 2e-3), "err": worst, "where": why}
    return out


def step_functions():
    import numpy
    modes = [("cpu", "cpu", {}), ("off", "gpu", {"CHAINER_CUDNN": "0"}), ("on", "gpu", {}),
             ("nosteer", "gpu", {"PTXBACKEND_CUDNN_STEERING": "0"})]
    for label, device, extra in modes:
        code, text, seconds = run("functions-" + label, [PY, os.path.join(HERE, "cudnn_functions.py"), "--mode",
                                                         device, "--label", label, "--out", OUT],
                                  base_env(**extra))
        results.setdefault("functions", {})[label] = {"exit": code, "seconds": seconds, "line": text.strip()[-300:]}
    loaded = {}
    for label, _d, _e in modes:
        path = os.path.join(OUT, "functions-%s.npz" % label)
        if os.path.exists(path):
            loaded[label] = numpy.load(path)
    meta = {}
    for label, _d, _e in modes:
        path = os.path.join(OUT, "functions-%s.json" % label)
        if os.path.exists(path):
            meta[label] = json.load(open(path))
    names = sorted(meta.get("cpu", {}).get("items", {}))
    table = {}
    for a, b in (("on", "off"), ("on", "cpu"), ("off", "cpu"), ("nosteer", "off")):
        if a in loaded and b in loaded:
            table["%s_vs_%s" % (a, b)] = _compare(loaded[a], loaded[b], names)
    results["functions"]["compare"] = table
    on = meta.get("on", {})
    check("functions: cuDNN enabled in the on run", on.get("cudnn_enabled") is True)
    check("functions: cuDNN disabled in the off run", meta.get("off", {}).get("cudnn_enabled") is False)
    for pair in ("on_vs_off", "on_vs_cpu", "off_vs_cpu"):
        bad = sorted(n for n, r in table.get(pair, {}).items() if not r["ok"])
        check("functions %s (%d items)" % (pair.replace("_", " "), len(table.get(pair, {}))),
              pair in table and not bad, "; ".join("%s: %s" % (n, table[pair][n].get("err", table[pair][n].get("why")))
                                                   for n in bad[:8]))
    wrong = sorted(n for n, r in table.get("nosteer_vs_off", {}).items() if not r["ok"])
    results["functions"]["wrong_without_steering"] = wrong
    say("steering OFF: %d items differ from cuDNN off: %s" % (len(wrong), "; ".join(wrong[:20])))
    choices = on.get("choices", [])
    picked = {}
    for c in choices:
        key = "%s %s" % (c["call"].replace("getConvolution", "").replace("Algorithm", ""), c["item"].split()[-1])
        entry = picked.setdefault(key, {"heuristic": set(), "used": set(), "steered": 0})
        entry["heuristic"].add(c["heuristic"])
        entry["used"].add(c["used"])
        entry["steered"] += c["heuristic"] != c["used"]
    results["functions"]["algorithms"] = {k: {"heuristic": sorted(v["heuristic"]), "used": sorted(v["used"]),
                                              "steered_calls": v["steered"]} for k, v in sorted(picked.items())}
    for k, v in sorted(results["functions"]["algorithms"].items()):
        say("algorithms %s: heuristic %s, used %s, %d calls steered" % (k, v["heuristic"], v["used"], v["steered_calls"]))
    verdicts_path = os.path.join(OUT, "cudnn-verdicts.json")
    if os.path.exists(verdicts_path):
        entries = json.load(open(verdicts_path))["entries"]
        good = {}
        for e in entries:
            for direction, by_dtype in e["verdicts"].items():
                for dtype, by_algo in by_dtype.items():
                    good[(direction, dtype)] = set(int(a) for a, v in by_algo.items() if v["verdict"] == "good")
        calls = {"getConvolutionForwardAlgorithm": "forward", "getConvolutionBackwardDataAlgorithm": "backward_data",
                 "getConvolutionBackwardFilterAlgorithm": "backward_filter"}
        unverified = [c for c in choices if c["used"] not in good.get((calls[c["call"]], c["item"].split()[-1]), {c["used"]})]
        check("functions: no algorithm used that the self-test did not find good", not unverified,
              "; ".join("%s %s used %s" % (c["item"], c["call"], c["used"]) for c in unverified[:8]))


def _model(label, device, env, *args):
    code, text, seconds = run("model-" + label, [PY, os.path.join(HERE, "cudnn_model.py"), "--device", device,
                                                 "--label", label, "--out", OUT] + list(args), env, timeout=400)
    path = os.path.join(OUT, "model-%s.json" % label)
    record = json.load(open(path)) if code == 0 and os.path.exists(path) else {"exit": code}
    record["process_s"] = seconds
    results.setdefault("story", {})[label] = record
    return record


def step_story():
    import numpy
    nvcc = "112" if os.path.exists(os.path.join(HOME, "bin112", "nvcc")) else "13"
    results["story_compiler"] = "nvcc 11.2" if nvcc == "112" else "nvcc 13"
    reps, train = str(REPS), "3"
    _model("cpu", "cpu", base_env(nvcc), "--train", train)
    first = _model("on-first", "gpu", base_env(nvcc), "--train", train)  # compiles the kernels (ptxbackend cache)
    on = _model("on", "gpu", base_env(nvcc), "--time", reps, "--train", train)
    off = _model("off", "gpu", base_env(nvcc, CHAINER_CUDNN="0"), "--time", reps, "--train", train)
    nosteer = _model("nosteer", "gpu", base_env(nvcc, PTXBACKEND_CUDNN_STEERING="0"), "--time", reps)
    start = _model("on-start", "gpu", base_env(nvcc))  # python start to first inference, all caches warm
    if nvcc == "112":
        # The user's hand fix: no steering, so with cuDNN on it runs the heuristic's algorithms, as the hook
        # does with steering off; with cuDNN off the same kernels as the hook's cuDNN-off run
        fix_env = base_env("112", PTXBACKEND_DISABLE="1", HOME=os.path.join(HOME, "home-handfix"))
        _model("handfix", "gpu", fix_env, "--handfix")
        _model("handfix-off", "gpu", dict(fix_env, CHAINER_CUDNN="0"), "--handfix")
    # A new machine: empty ptxbackend cache, empty driver JIT cache; given the two bundles
    a_env = base_env(nvcc)
    kernels = os.path.join(HOME, "kernels.bundle")
    jit = os.path.join(HOME, "driver-jit.bundle")
    for path in (kernels, jit):
        if os.path.exists(path):
            os.unlink(path)
    run("export-kernels", [PY, "-m", "ptxbackend", "cache", "export", kernels], a_env, timeout=120)
    code, text, seconds = run("pack-jit", [PY, "-c", (
        "import sys; from ptxbackend.deploy import jit_bundle as j; "
        "m = j.pack(sys.argv[1], [sys.argv[2]], sys.argv[3], j.this_machine()); print(len(m['files']))"),
        a_env["CUDA_CACHE_PATH"], LIB, jit], a_env, timeout=180)
    results["bundles"] = {name: os.path.getsize(p) for name, p in (("kernels", kernels), ("driver_jit", jit))
                          if os.path.exists(p)}
    b_env = base_env(nvcc, PTXBACKEND_CACHE_DIR=os.path.join(HOME, "b-cache"), HOME=os.path.join(HOME, "home-b"),
                     CUDA_CACHE_PATH=None)
    for d in (b_env["PTXBACKEND_CACHE_DIR"], b_env["HOME"]):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d, mode=0o700)
    for name, path in (("kernels", kernels), ("driver-jit", jit)):
        run("b-import-" + name, [PY, "-m", "ptxbackend", "cache", "import", path], b_env, timeout=180)
    # B's own deployment step: with the JIT bundle imported the library's JIT is found, not redone, and
    # the algorithm self-test files B's verdicts (they belong to B's GPU and library file)
    code, _text, seconds = run("b-warm", [PY, "-m", "ptxbackend", "warm", "--libs", LIB, "--jobs", JOBS],
                               b_env, timeout=300)
    results["b_warm_s"] = seconds
    check("new machine: warm --libs cudnn after the imports", code == 0, "%.1f s" % seconds)
    run("b-doctor", [PY, "-m", "ptxbackend", "doctor"], b_env, timeout=120)
    b_rec = _model("b-start", "gpu", b_env)
    # Comparisons
    logits = {k: numpy.load(os.path.join(OUT, "model-%s.npz" % k))
              for k in ("cpu", "on", "off", "nosteer", "handfix", "handfix-off", "on-first", "b-start")
              if os.path.exists(os.path.join(OUT, "model-%s.npz" % k))}

    def rel(a, b, key):
        x, y = logits[a][key], logits[b][key]
        if not numpy.isfinite(x).all():
            return float("inf")
        return float(abs(x - y).max() / max(abs(y).max(), 1e-12))
    for a, b in (("on", "off"), ("on", "cpu"), ("off", "cpu")):
        if a in logits and b in logits:
            errs = [rel(a, b, k) for k in ("b1", "b8")]
            check("model logits %s vs %s" % (a, b), max(errs) <= 2e-3, "relative error %.2g / %.2g" % tuple(errs))
    if "nosteer" in logits and "off" in logits:
        errs = [rel("nosteer", "off", k) for k in ("b1", "b8")]
        results["story"]["nosteer_error"] = errs
        say("steering OFF: logits vs cuDNN off: relative error %s / %s" % tuple(errs))
    if "handfix" in logits and "nosteer" in logits:
        errs = [rel("nosteer", "handfix", k) for k in ("b1", "b8")]
        check("model: hook equals the hand fix, cuDNN on (the heuristic's algorithms in both: steering off)",
              max(errs) <= 1e-5, "relative error %.2g / %.2g" % tuple(errs))
    if "handfix-off" in logits and "off" in logits:
        errs = [rel("off", "handfix-off", k) for k in ("b1", "b8")]
        check("model: hook equals the hand fix, cuDNN off", max(errs) <= 1e-5,
              "relative error %.2g / %.2g" % tuple(errs))
    if "handfix" in logits and "cpu" in logits:
        errs = [rel("handfix", "cpu", k) for k in ("b1", "b8")]
        results["story"]["handfix_on_vs_cpu"] = errs
        say("the hand fix with cuDNN on (no steering) vs the CPU: relative error %s / %s" % tuple(errs))
    if "on" in logits and "on-first" in logits:
        errs = [rel("on", "on-first", k) for k in ("b1", "b8")]
        check("model: the same logits in every hooked process (compiled, then cached)", max(errs) <= 1e-6,
              "%.2g / %.2g" % tuple(errs))
    if "b-start" in logits and "on" in logits:
        errs = [rel("b-start", "on", k) for k in ("b1", "b8")]
        check("model: new machine's logits equal the first machine's", max(errs) <= 1e-6, "%.2g / %.2g" % tuple(errs))
    losses = {k: results["story"].get(k, {}).get("losses") for k in ("cpu", "on", "off", "on-first")}
    if losses["on"] and losses["off"]:
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses["on"], losses["off"]))
        check("training losses on vs off", diff <= 1e-3, "on %s off %s" % (losses["on"], losses["off"]))
    if losses["on"] and losses["cpu"]:
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses["on"], losses["cpu"]))
        check("training losses on vs CPU", diff <= 1e-3, "cpu %s" % losses["cpu"])
    if on.get("infer_ms_b1") and off.get("infer_ms_b1"):
        for batch in ("b1", "b8"):
            say("inference %s: cuDNN on %.2f ms, off %.2f ms (%.2fx), steering off %s ms" % (
                batch, on["infer_ms_" + batch], off["infer_ms_" + batch],
                off["infer_ms_" + batch] / on["infer_ms_" + batch], nosteer.get("infer_ms_" + batch)))
        check("model: cuDNN on faster per inference than off (batch 8)", on["infer_ms_b8"] < off["infer_ms_b8"])
    for label, record in (("after warm --libs cudnn (kernels cached)", start), ("new machine from the bundles", b_rec),
                          ("first process (kernels compiled)", first)):
        say("python start to first inference, %s: %s s" % (label, record.get("s_to_first_inference")))
    check("start under 2 s after warm --libs cudnn", (start.get("s_to_first_inference") or 99) < 2.0,
          "%s s" % start.get("s_to_first_inference"))
    check("start under 2 s on a new machine from the bundles", (b_rec.get("s_to_first_inference") or 99) < 2.0,
          "%s s" % b_rec.get("s_to_first_inference"))


def main():
    os.makedirs(OUT, exist_ok=True)
    for step in STEPS:
        say("step %s" % step)
        try:
            {"warm": step_warm, "functions": step_functions, "story": step_story}[step]()
        except Exception as exc:
            import traceback
            check("step %s ran" % step, False, "%s: %s" % (type(exc).__name__, exc))
            traceback.print_exc()
        with open(RESULTS, "w") as handle:
            json.dump(results, handle, indent=1, sort_keys=True, default=str)
    with open(os.path.join(OUT, "cudnn-gpu.json"), "w") as handle:
        json.dump(results, handle, indent=1, sort_keys=True, default=str)
    checks = results.get("checks", {})
    with open(os.path.join(OUT, "summary.txt"), "w") as handle:
        for name, c in sorted(checks.items()):
            handle.write("%s %s %s\n" % ("PASS" if c["ok"] else "FAIL", name, c["detail"]))
    sys.exit(0 if all(c["ok"] for c in checks.values()) else 1)


if __name__ == "__main__":
    main()

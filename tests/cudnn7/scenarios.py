"""Issue 28's four scenarios on the GPU machine, each process fresh and timed, resumable across calls.

Run by run_gpu.sh (which stages the library and ptxbackend's venv and exports CUDNN7_*).  Every process
is appended to $CUDNN7_HOME/runs.jsonl as it ends, so a scenario whose warm-up outlasts one call goes on
in the next call on the still-warm machine: its driver JIT cache ($CUDNN7_HOME/<scenario>/jit) is kept,
and a warm-up that a deadline cut is run again in a new process over that cache until one finishes (the
warm-up's whole time is the sum over those processes).  No process runs past the call's deadline
($CUDNN7_DEADLINE_S after run_gpu.sh started, default 570 s: a 600 s call less its set-up).

Scenarios ($CUDNN7_STEPS, comma list, in order):
  stock   driver defaults (CUDA_CACHE_MAXSIZE unset), machine python3 without ptxbackend: first, second
  small   CUDA_CACHE_MAXSIZE=$CUDNN7_SMALL_MAXSIZE (default 64 MiB): doctor's words, the hook's sizing,
          two processes of at most $CUDNN7_SMALL_PROCESS_S (default 240 s) each, never resumed
  warm    `ptxbackend warm --libs cudnn --jobs $CUDNN7_JOBS` (default: the CPU count; found through the
          cupy/.data/lib layout), then the program
  pack    machine A: `warm --libs cudnn --jobs $CUDNN7_JOBS --driver-jit-bundle`; if that cannot finish within
          one call, the warm scenario's finished JIT cache is packed with the same function
          (driverjit.pack), and said so
  import  machine B: GPU $CUDNN7_B_GPU (default: the second GPU when there are two), an empty ptxbackend
          cache, `cache import` of A's bundle, doctor, the program; its convolution compared with A's
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from ptxbackend.deploy.library_warmup import tree_size  # run by the venv's python (run_gpu.sh), where ptxbackend is

HOME = os.environ["CUDNN7_HOME"]
LIB = os.environ["CUDNN7_LIB"]
VENV_PY = os.environ["CUDNN7_VENV_PYTHON"]
SITE = os.environ["CUDNN7_SITE"]
OUT = os.environ.get("OUT", "/tmp/cudnn7-out")
DEADLINE = float(os.environ["CUDNN7_STARTED"]) + float(os.environ.get("CUDNN7_DEADLINE_S", "570"))
PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "program.py")
RUNS = os.path.join(HOME, "runs.jsonl")
BUNDLE = os.path.join(HOME, "pack", "cudnn7-jit.tgz")
SMALL = os.environ.get("CUDNN7_SMALL_MAXSIZE", str(64 << 20))
# warm and pack JIT cuDNN's fatbin images in this many processes (`warm --libs --jobs`); 1 is the old serial
# warm-up, in which the library's own start JIT-compiles everything on one core.
JOBS = os.environ.get("CUDNN7_JOBS") or str(os.cpu_count() or 1)


REPORT_WORDS = ("parallel JIT", "own start", "WARNING", "first process", "packed the driver JIT cache")


class OutOfTime(Exception):
    pass


class Failed(Exception):
    pass


def say(message):
    print("[scenarios %.0fs left] %s" % (DEADLINE - time.time(), message))
    sys.stdout.flush()


def jit_bytes(path):
    return tree_size(path) if path else 0


def runs(scenario, label=None):
    found = []
    if os.path.exists(RUNS):
        with open(RUNS) as handle:
            for line in handle:
                entry = json.loads(line)
                if entry["scenario"] == scenario and label in (None, entry["label"]):
                    found.append(entry)
    return found


def done(scenario, label):
    return any(entry["rc"] == 0 for entry in runs(scenario, label))


def env_for(jit, **changes):
    """This machine's environment without any CUDA cache or ptxbackend setting, then ``changes``."""
    env = dict((k, v) for k, v in os.environ.items()
               if not k.startswith(("CUDA_CACHE_", "PTXBACKEND_", "CUDNN7_")) and k != "PYTHONPATH")
    if jit:
        os.makedirs(jit, exist_ok=True)
        env["CUDA_CACHE_PATH"] = jit
    env.update(changes)
    return env


def run(scenario, label, argv, env, limit=None, jit=None):
    """One fresh process, killed (its whole group) at ``limit`` or the call's deadline; recorded."""
    allowed = min(DEADLINE - time.time() - 15, limit or 1e9)
    if allowed < 20:
        raise OutOfTime()
    jit = jit or env.get("CUDA_CACHE_PATH")
    number = len(runs(scenario, label)) + 1
    # Only these characters come back from the device machine's $OUT.
    log = os.path.join(OUT, "%s-%s-%d.log" % (scenario, re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_"), number))
    samples, stop = [], threading.Event()
    begun = time.time()

    def sample():  # the JIT cache's growth while the process runs
        while not stop.wait(15):
            samples.append([round(time.time() - begun), jit_bytes(jit)])

    say("%s / %s (process %d, at most %.0f s) ..." % (scenario, label, number, allowed))
    before = jit_bytes(jit)
    sampler = threading.Thread(target=sample)
    sampler.start()
    with open(log, "w") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err, universal_newlines=True,
                                start_new_session=True)
        timed_out = False
        try:
            stdout, _ = proc.communicate(timeout=allowed)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                stdout, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, _ = proc.communicate()
    seconds = time.time() - begun
    stop.set()
    sampler.join()
    with open(log) as err:
        tail = [line.rstrip() for line in err.readlines()[-3:]]
    with open(log, "a") as err:  # doctor's whole report, the program's JSON: all in the process's log
        err.write("--- stdout ---\n" + stdout)
    result = None
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            break
    entry = {"scenario": scenario, "label": label, "process": number, "rc": proc.returncode,
             "timed_out": timed_out, "seconds": round(seconds, 3), "limit_s": round(allowed), "argv": argv,
             "cuda_cache": dict((k, v) for k, v in env.items() if k.startswith("CUDA_")),
             "jit_bytes_before": before, "jit_bytes_after": jit_bytes(jit), "jit_growth": samples,
             "stderr_tail": tail, "stdout_tail": stdout.strip().splitlines()[-12:], "result": result}
    with open(RUNS, "a") as handle:
        handle.write(json.dumps(entry) + "\n")
    say("  rc %s%s after %.1f s; JIT cache %.1f -> %.1f MiB; %s" % (
        proc.returncode, " (deadline)" if timed_out else "", seconds, before / 1048576.0,
        entry["jit_bytes_after"] / 1048576.0, (tail or [""])[-1][:200]))
    return entry


def program(scenario, label, env, python=VENV_PY, **kwargs):
    return run(scenario, label, [python, PROGRAM, "--lib", LIB], env, **kwargs)


def until_done(scenario, label, argv, env, **kwargs):
    """Run again over the same JIT cache while the deadline cut the last process; a failure stops it."""
    while not done(scenario, label):
        entry = run(scenario, label, argv, env, **kwargs)
        if entry["rc"] != 0 and not entry["timed_out"]:
            raise Failed("%s / %s failed: see its log" % (scenario, label))


def stock():
    env = env_for(os.path.join(HOME, "stock", "jit"), PTXBACKEND_DISABLE="1")
    until_done("stock", "first", ["python3", PROGRAM, "--lib", LIB], env)
    if not runs("stock", "second"):
        program("stock", "second", env, python="python3")


def small():
    jit = os.path.join(HOME, "small", "jit")
    env = env_for(jit, CUDA_CACHE_MAXSIZE=SMALL, PYTHONPATH=SITE)
    if not runs("small", "doctor"):
        run("small", "doctor", [VENV_PY, "-m", "ptxbackend", "doctor"], env)
        probe = "import os; print('CUDA_CACHE_MAXSIZE after the hook:', os.environ.get('CUDA_CACHE_MAXSIZE'))"
        run("small", "hook, CUDA_CACHE_MAXSIZE unset", [VENV_PY, "-c", probe], env_for(jit))
        run("small", "hook, CUDA_CACHE_MAXSIZE set small", [VENV_PY, "-c", probe], env)
    limit = float(os.environ.get("CUDNN7_SMALL_PROCESS_S", "240"))
    for label in ("first", "second"):
        if not runs("small", label):
            program("small", label, env, limit=limit)


def warm():
    env = env_for(os.path.join(HOME, "warm", "jit"), PYTHONPATH=SITE)
    until_done("warm", "warm --libs cudnn", [VENV_PY, "-m", "ptxbackend", "warm", "--libs", "cudnn", "--jobs", JOBS],
               env)
    if not done("warm", "program"):
        program("warm", "program", env)


def pack():
    if os.path.exists(BUNDLE) and (done("pack", "warm --driver-jit-bundle") or done("pack", "pack from warm")):
        return
    os.makedirs(os.path.dirname(BUNDLE), exist_ok=True)
    env = env_for(None, PYTHONPATH=SITE, PTXBACKEND_CACHE_DIR=os.path.join(HOME, "pack", "cache"))
    argv = [VENV_PY, "-m", "ptxbackend", "warm", "--libs", "cudnn", "--jobs", JOBS, "--driver-jit-bundle", BUNDLE,
            "--force"]
    if not runs("pack", "warm --driver-jit-bundle"):
        run("pack", "warm --driver-jit-bundle", argv, env)
        if done("pack", "warm --driver-jit-bundle"):
            return
    # --driver-jit-bundle warms into a temporary cache of its own, so a warm-up longer than one call can
    # never finish there: pack the warm scenario's cache (fresh at its start, cuDNN only) the same way.
    if not done("warm", "warm --libs cudnn"):
        say("pack: the CLI did not finish and the warm scenario has not either: run warm first")
        return
    code = ("import sys; from ptxbackend.deploy import jit_bundle as driverjit; from ptxbackend.config import load_settings; "
            "driverjit.pack(sys.argv[1], [sys.argv[2]], sys.argv[3], driverjit.this_machine(), "
            "driverjit.fleet_key(load_settings()), force=True); print('packed', sys.argv[3])")
    run("pack", "pack from warm", [VENV_PY, "-c", code, os.path.join(HOME, "warm", "jit"), LIB, BUNDLE], env)


def _gpu_count():
    try:
        listing = subprocess.check_output(["nvidia-smi", "-L"], universal_newlines=True)
    except (OSError, subprocess.CalledProcessError):
        return 1
    return len([line for line in listing.splitlines() if line.startswith("GPU ")])


def import_b():
    if not os.path.exists(BUNDLE):
        say("import: no bundle at %s: run pack first" % BUNDLE)
        return
    gpu = os.environ.get("CUDNN7_B_GPU") or ("1" if _gpu_count() > 1 else "0")
    cache = os.path.join(HOME, "b", "cache-%d" % (len(runs("import", "cache import")) + 1))
    env = env_for(None, CUDA_VISIBLE_DEVICES=gpu, PTXBACKEND_CACHE_DIR=cache, PYTHONPATH=SITE)
    run("import", "cache import", [VENV_PY, "-m", "ptxbackend", "cache", "import", BUNDLE], env)
    jit = subprocess.check_output([VENV_PY, "-c", "import os; print(os.environ.get('CUDA_CACHE_PATH'))"],
                                  env=env, universal_newlines=True).strip()
    run("import", "doctor", [VENV_PY, "-m", "ptxbackend", "doctor"], env, jit=jit)
    entry = program("import", "first process on B (GPU %s)" % gpu, env, jit=jit)
    theirs = [e["result"]["conv_sha256"] for e in runs("warm", "program") + runs("stock")
              if e["result"] and e["result"].get("conv_sha256")]
    mine = (entry["result"] or {}).get("conv_sha256")
    say("B's convolution %s A's (%s vs %s)" % ("IS IDENTICAL to" if mine and mine in theirs[:1] else "differs from",
                                               mine, theirs[:1]))


STEPS = {"stock": stock, "small": small, "warm": warm, "pack": pack, "import": import_b}


def summary():
    lines = []
    for scenario in ("stock", "small", "warm", "pack", "import"):
        labels = []
        for entry in runs(scenario):
            if entry["label"] not in labels:
                labels.append(entry["label"])
        for label in labels:
            entries = runs(scenario, label)
            last = entries[-1]
            result = last["result"] or {}
            lines.append("%-7s %-40s %d process(es), %.1f s in all, %s; JIT cache %.1f MiB%s" % (
                scenario, label, len(entries), sum(e["seconds"] for e in entries),
                "finished" if last["rc"] == 0 else "cut by the deadline" if last["timed_out"] else "rc %s" % last["rc"],
                last["jit_bytes_after"] / 1048576.0,
                "; conv vs numpy %.2g, sha %s" % (result["conv_max_error"], result["conv_sha256"][:16])
                if "conv_max_error" in result else ""))
            # warm --libs's own report: images, PTX, workers' seconds and sum, wall, the library's start after
            lines.extend("        " + line.strip() for line in last["stdout_tail"]
                         if any(word in line for word in REPORT_WORDS))
    return "\n".join(lines)


def main():
    steps = [s.strip() for s in os.environ.get("CUDNN7_STEPS", "").split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        say("unknown step(s) %s: use %s" % (", ".join(unknown), ",".join(STEPS)))
        return 2
    os.makedirs(OUT, exist_ok=True)
    status = 0
    for step in steps:
        try:
            STEPS[step]()
        except OutOfTime:
            say("out of time in %s: call again with the same CUDNN7_STEPS to go on" % step)
            break
        except Failed as exc:  # the later steps need this one's result
            say(str(exc))
            status = 1
            break
    text = summary()
    print(text)
    with open(os.path.join(OUT, "summary.txt"), "w") as handle:
        handle.write(text + "\n")
    if os.path.exists(RUNS):
        with open(RUNS) as src, open(os.path.join(OUT, "cudnn7-runs.jsonl"), "w") as dst:
            dst.write(src.read())
    return status


if __name__ == "__main__":
    sys.exit(main())

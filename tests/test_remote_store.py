"""The fleet store (ptxbackend/cache/remote.py) against a real valkey-server: no mocks.

Each check is tested with an input that is valid in every other respect, so only the check under
test can catch it.  No test asserts a wall-clock bound: the circuit breaker is shown by the store's
request counter and state, the lock's waiting by its polls.
"""

import hashlib
import hmac
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

import valkey_server
from conftest import REPO, Captured, _missing
from ptxbackend.cache import DirectoryStore, remote
from ptxbackend.cache import entry as entry_format
from ptxbackend.cache.entries import EntryCache
from ptxbackend.cache.remote import HEADER_SIZE, MAGIC, RemoteStore, open_remote

KEY_HEX = "ab" * 32
ENTRY = "nvcc-13.0.88/compute_75/ab/%s.ptx" % KEY_HEX
JIT = "nvcc-13.0.88/compute_75/jit/sm_90-580.159.04/ab/%s.cubin" % KEY_HEX
SYSDEP = "depsets/cd/%s.json" % ("cd" * 32)


# -- fixtures -----------------------------------------------------------------------------------------

@pytest.fixture
def own_valkey(server_binary, tmp_path):
    """A server of this test's own, to kill, pause or reconfigure."""
    servers = []

    def start(extra=()):
        server = valkey_server.Server(server_binary, tmp_path / ("valkey%d" % len(servers)), extra=extra)
        servers.append(server)
        return server.start()
    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def raw(redis_module, valkey):
    """A plain client of the shared server: sees and plants what the store cannot."""
    client = redis_module.Redis.from_url(valkey.url)
    yield client
    client.close()


@pytest.fixture
def namespace():
    return "t%s" % uuid.uuid4().hex[:16]


@pytest.fixture
def fleet_key():
    return os.urandom(32)


@pytest.fixture
def make_store(valkey, namespace, fleet_key):
    def make(**options):
        url = options.pop("url", valkey.url)
        key = options.pop("key", fleet_key)
        options.setdefault("namespace", namespace)
        # Generous, so a slow CI machine never trips the breaker where no test means it to.
        options.setdefault("timeout", 5.0)
        return RemoteStore(url, key, **options)
    return make


@pytest.fixture
def logged():
    """Records of the 'ptxbackend' logger (it does not propagate); once-per-process warnings re-armed."""
    logger = logging.getLogger("ptxbackend")
    handler = Captured()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    remote._warned.clear()
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)
    remote._warned.clear()


def expected_value(key, redis_key, blob):
    """The documented value format, written out independently of the module."""
    mac = hmac.new(key, b"ptxbackend-remote-1\0" + redis_key.encode() + b"\0" + blob, hashlib.sha256).digest()
    return b"PTXBR1" + mac + blob


def total(store, count):
    stats = store.stats()
    return sum(stats[level][count] for level in remote.LEVELS)


def connections_received(client):
    return int(client.info("stats")["total_connections_received"])


# -- round trip, format, listing ----------------------------------------------------------------------

def test_round_trip_put_get_delete_list(make_store, raw, fleet_key, namespace, valkey):
    store = make_store()
    assert store.state == "not connected yet"
    assert store.writable
    assert valkey.password not in store.description
    assert namespace in store.description and "rw" in store.description
    blobs = {ENTRY: b"ptx text\0\xff" * 10, JIT: os.urandom(4000), SYSDEP: b"{}"}
    for name, blob in blobs.items():
        store.put(name, blob)
    for name, blob in blobs.items():
        assert store.get(name) == blob
    assert store.state == "ok"

    # The stored value is exactly the documented format, under <namespace>:v4/<name>.
    redis_key = "%s:v4/%s" % (namespace, ENTRY)
    assert store.redis_key(ENTRY) == redis_key
    assert raw.get(redis_key) == expected_value(fleet_key, redis_key, blobs[ENTRY])
    assert raw.ttl(redis_key) == -1  # no TTL asked for

    assert store.list() == sorted(blobs)
    assert store.list("nvcc-13.0.88/compute_75/jit/") == [JIT]
    assert store.list("depsets/") == [SYSDEP]
    assert store.list("nothing/") == []

    store.delete(ENTRY)
    store.delete(ENTRY)  # absent: no error
    assert store.get(ENTRY) is None
    assert raw.exists(redis_key) == 0
    stats = store.stats()
    assert stats["entry"] == {"hits": 1, "misses": 1, "rejected": 0, "errors": 0, "puts": 1}
    assert stats["jit"] == {"hits": 1, "misses": 0, "rejected": 0, "errors": 0, "puts": 1}
    assert stats["other"] == {"hits": 1, "misses": 0, "rejected": 0, "errors": 0, "puts": 1}
    assert stats["state"] == "ok"


def test_empty_blob_round_trips(make_store):
    store = make_store()
    store.put(SYSDEP, b"")
    assert store.get(SYSDEP) == b""


def test_list_treats_glob_characters_in_the_prefix_literally(make_store):
    store = make_store()
    store.put("depsets/ab/x.json", b"1")
    store.put("depsets/ac/x.json", b"2")
    assert store.list("depsets/a?/") == []
    assert store.list("depsets/a[b]/") == []
    assert store.list("depsets/ab/") == ["depsets/ab/x.json"]


def test_namespaces_and_lock_keys_are_apart(make_store, raw, namespace):
    one = make_store()
    other = make_store(namespace=namespace + "-b")
    one.put(ENTRY, b"one")
    assert other.get(ENTRY) is None
    assert other.list() == []
    with one.lock(ENTRY, 1) as held:
        assert held
        assert raw.exists("%s:lock:v4/%s" % (namespace, ENTRY)) == 1
        assert one.list() == [ENTRY]  # the lock key is not a name


# -- authenticated values -----------------------------------------------------------------------------

def test_tampered_payload_is_rejected(make_store, raw, logged):
    store = make_store()
    store.put(ENTRY, b"mov.u32 %r1, 7;" * 20)
    redis_key = store.redis_key(ENTRY)
    value = bytearray(raw.get(redis_key))
    value[-5] ^= 0x01  # one bit of the payload; magic and MAC unchanged
    raw.set(redis_key, bytes(value))
    assert store.get(ENTRY) is None
    assert store.stats()["entry"]["rejected"] == 1
    assert store.stats()["entry"]["hits"] == 0
    warnings = logged.warnings()
    assert len(warnings) == 1
    assert redis_key in warnings[0] and "tampered" in warnings[0] and "fleet key" in warnings[0]
    # Once per process: the next rejected value is not another warning.
    assert store.get(ENTRY) is None
    assert store.stats()["entry"]["rejected"] == 2
    assert len(logged.warnings()) == 1
    assert store.state == "ok"  # a bad value is no reason to stop using the store


@pytest.mark.parametrize("cut", ["payload", "header"])
def test_truncated_value_is_rejected(make_store, raw, logged, cut):
    store = make_store()
    store.put(JIT, os.urandom(1000))
    redis_key = store.redis_key(JIT)
    value = raw.get(redis_key)
    raw.set(redis_key, value[:-1] if cut == "payload" else value[:HEADER_SIZE - 1])
    assert store.get(JIT) is None
    assert store.stats()["jit"]["rejected"] == 1
    assert len(logged.warnings()) == 1


def test_value_under_another_name_is_rejected(make_store, raw, logged):
    store = make_store()
    other = ENTRY.replace(KEY_HEX, "cd" * 32)
    store.put(ENTRY, b"the kernel of ENTRY")
    raw.set(store.redis_key(other), raw.get(store.redis_key(ENTRY)))  # valid value, wrong name
    assert store.get(other) is None
    assert store.stats()["entry"]["rejected"] == 1
    assert store.get(ENTRY) == b"the kernel of ENTRY"


def test_value_copied_from_another_namespace_is_rejected(make_store, raw, namespace, logged):
    ours = make_store()
    theirs = make_store(namespace=namespace + "-other")  # same fleet key
    theirs.put(ENTRY, b"the other fleet's kernel")
    raw.set(ours.redis_key(ENTRY), raw.get(theirs.redis_key(ENTRY)))
    assert ours.get(ENTRY) is None
    assert ours.stats()["entry"]["rejected"] == 1
    assert theirs.get(ENTRY) == b"the other fleet's kernel"


def test_wrong_fleet_key_is_rejected(make_store, logged):
    writer = make_store()
    writer.put(ENTRY, b"kernel")
    reader = make_store(key=os.urandom(32))
    assert reader.get(ENTRY) is None
    assert reader.stats()["entry"]["rejected"] == 1
    warnings = logged.warnings()
    assert len(warnings) == 1 and "fleet key differs" in warnings[0]
    assert make_store().get(ENTRY) == b"kernel"  # the right key still reads it


def test_another_magic_is_rejected(make_store, raw, fleet_key, logged):
    store = make_store()
    redis_key = store.redis_key(ENTRY)
    value = expected_value(fleet_key, redis_key, b"kernel")
    raw.set(redis_key, b"PTXBR0" + value[len(MAGIC):])  # the MAC is right: only the magic is wrong
    assert store.get(ENTRY) is None
    assert store.stats()["entry"]["rejected"] == 1
    assert "another magic" in logged.warnings()[0]
    raw.set(redis_key, value)
    assert store.get(ENTRY) == b"kernel"  # the same value with its magic is accepted


def test_values_over_the_bound_are_refused(make_store, raw, fleet_key, logged, monkeypatch):
    assert remote.MAX_VALUE == 256 << 20
    monkeypatch.setattr(remote, "MAX_VALUE", 1024)  # the real bound, scaled down to stay cheap
    store = make_store()
    redis_key = store.redis_key(JIT)
    raw.set(redis_key, expected_value(fleet_key, redis_key, b"x" * 1025))  # correctly sealed
    assert store.get(JIT) is None
    assert store.stats()["jit"]["rejected"] == 1
    assert "larger than" in logged.warnings()[0]
    raw.set(redis_key, expected_value(fleet_key, redis_key, b"x" * 1024))
    assert store.get(JIT) == b"x" * 1024  # at the bound: accepted

    store.put(ENTRY, b"y" * 1025)
    assert raw.exists(store.redis_key(ENTRY)) == 0
    assert store.stats()["entry"]["rejected"] == 1
    assert store.stats()["entry"]["puts"] == 0


def test_an_oversized_value_is_never_read_whole(make_store, raw, fleet_key, logged, monkeypatch):
    """The server sends at most the bound: a planted giant value costs neither memory nor time."""
    monkeypatch.setattr(remote, "MAX_VALUE", 1024)
    store = make_store()
    redis_key = store.redis_key(JIT)
    raw.set(redis_key, expected_value(fleet_key, redis_key, b"x" * (4 << 20)))
    assert store.get(ENTRY) is None  # connected: its handshake is not in the count below
    sent = int(raw.info("stats")["total_net_output_bytes"])
    assert store.get(JIT) is None
    sent = int(raw.info("stats")["total_net_output_bytes"]) - sent
    assert store.stats()["jit"]["rejected"] == 1
    assert sent < (256 << 10), "the server sent %d bytes for a value refused at 1 KiB" % sent


# -- read-only members --------------------------------------------------------------------------------

def test_read_only_mode_never_writes(make_store, raw, namespace):
    writer = make_store()
    writer.put(ENTRY, b"from the build box")
    before = sorted(raw.scan_iter(match=namespace + ":*"))
    reader = make_store(mode="ro")
    assert not reader.writable
    assert "ro" in reader.description
    reader.put(JIT, b"a line PC's JIT")
    reader.put(ENTRY, b"overwrite")
    reader.delete(ENTRY)
    with reader.lock(ENTRY, 5) as held:
        assert held is False
    assert sorted(raw.scan_iter(match=namespace + ":*")) == before
    assert reader.get(ENTRY) == b"from the build box"
    assert reader.requests == 1  # only the get reached the server
    assert all(reader.stats()[level]["puts"] == 0 for level in remote.LEVELS)


# -- the circuit breaker ------------------------------------------------------------------------------

def _assert_off(store, logged, requests):
    """Every operation answers at once, touches nothing and raises nothing."""
    assert store.get(ENTRY) is None
    store.put(ENTRY, b"k")
    store.delete(ENTRY)
    with store.lock(ENTRY, 30) as held:
        assert held is False
    assert store.list() == []
    assert store.requests == requests
    assert len(logged.warnings()) == 1
    assert store.state.startswith("failed: ")


def test_killed_server_turns_the_store_off(own_valkey, namespace, fleet_key, logged):
    server = own_valkey()
    store = RemoteStore(server.url, fleet_key, namespace=namespace, timeout=5.0)
    store.put(ENTRY, b"kernel")
    assert store.get(ENTRY) == b"kernel"
    server.kill()

    assert store.get(ENTRY) is None  # the first call after the kill finds out, and does not raise
    assert store.state.startswith("failed: ")
    warnings = logged.warnings()
    assert len(warnings) == 1
    assert server.password not in warnings[0] and server.password not in store.state
    assert "127.0.0.1:%d" % server.port in warnings[0]
    assert "local cache" in warnings[0]
    requests = store.requests
    assert total(store, "errors") == 1
    _assert_off(store, logged, requests)
    assert total(store, "errors") == 1


def test_a_connection_the_server_closed_while_idle_is_made_again_not_a_failure(own_valkey, namespace, fleet_key,
                                                                              logged):
    """A server with `timeout` set ends idle clients; a long-lived program's next lookup must not
    turn the fleet store off for the retry interval because of it."""
    server = own_valkey(extra=("--timeout", "1"))
    store = RemoteStore(server.url, fleet_key, namespace=namespace, timeout=5.0)
    store.put(ENTRY, b"kernel")
    assert store.get(ENTRY) == b"kernel"
    time.sleep(2.5)  # the server checks idle clients about ten times a second
    assert store.get(ENTRY) == b"kernel" and store.state == "ok"
    assert logged.warnings() == [] and total(store, "errors") == 0


def test_dead_server_from_the_start_costs_one_request(own_valkey, namespace, fleet_key, logged):
    server = own_valkey()
    url = server.url
    server.kill()
    store = RemoteStore(url, fleet_key, namespace=namespace)
    store.put(ENTRY, b"kernel")  # put may silently drop
    assert store.requests == 1
    _assert_off(store, logged, 1)
    assert "ConnectionRefusedError" in store.state


def test_paused_server_times_out_once(own_valkey, namespace, fleet_key, logged):
    server = own_valkey()
    store = RemoteStore(server.url, fleet_key, namespace=namespace, timeout=1.0)
    store.put(ENTRY, b"kernel")
    server.signal(signal.SIGSTOP)
    try:
        assert store.get(ENTRY) is None
        assert "deadline" in store.state
        requests = store.requests
        _assert_off(store, logged, requests)
    finally:
        server.signal(signal.SIGCONT)
    assert server.ping()
    _assert_off(store, logged, requests)  # a server that is back is not tried again in this process


def test_a_silent_server_is_connected_to_once(namespace, fleet_key, logged):
    """A listener that accepts and never answers: its accept queue counts our connection attempts."""
    import socket
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted = []
    try:
        store = RemoteStore("redis://:pw@127.0.0.1:%d/0" % listener.getsockname()[1], fleet_key,
                            namespace=namespace, timeout=0.2)
        assert store.get(ENTRY) is None
        assert "deadline" in store.state
        for _ in range(3):
            _assert_off(store, logged, 1)
        listener.setblocking(False)
        while True:
            try:
                accepted.append(listener.accept()[0])
            except (BlockingIOError, socket.timeout):
                break
        assert len(accepted) == 1  # no retry, no reconnect
    finally:
        for connection in accepted:
            connection.close()
        listener.close()


# -- the half-open breaker: a restarted server is used again without restarting the program ----------

RETRY = 0.5


def _until(condition, limit):
    """Polls ``condition`` (each poll is a store call that must return at once) for ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_a_restarted_server_is_used_again_within_the_retry_interval(own_valkey, namespace, fleet_key, logged,
                                                                     tmp_path):
    server = own_valkey()
    store = RemoteStore(server.url, fleet_key, namespace=namespace, timeout=5.0, retry=RETRY)
    store.put(ENTRY, b"kernel")
    server.kill()
    assert store.get(ENTRY) is None
    assert store.state.startswith("failed: ")
    # Open: a local cache's hits never wait on it, and nothing reaches the network.
    local = DirectoryStore(str(tmp_path / "local"), 1 << 20, 5.0)
    cache = EntryCache(local, store)
    blob = entry_format.encode(b"payload", {"key": KEY_HEX, "kind": "ptx"})
    local.put(ENTRY, blob)
    requests = store.requests
    for _ in range(20):
        assert cache.read(ENTRY, KEY_HEX, "ptx") is not None
        assert store.get(JIT) is None
    assert store.requests == requests and cache.counters["local_hits"] == 20
    assert len(logged.warnings()) == 1 and "at most every 0.5 s" in logged.warnings()[0]

    server.restart()  # empty, on the same port
    RemoteStore(server.url, fleet_key, namespace=namespace, timeout=5.0).put(ENTRY, b"kernel again")
    started = time.monotonic()
    assert _until(lambda: store.get(ENTRY) == b"kernel again", 10 * RETRY)
    assert store.state == "ok"
    # One probe per interval at most, however often it was asked meanwhile.
    probes = store.requests - requests  # the last of them is the get that found it
    assert 1 <= probes <= (time.monotonic() - started) / RETRY + 2
    assert "answers again" in logged.warnings()[-1]
    store.put(JIT, b"jit")
    assert store.get(JIT) == b"jit"


def test_a_failed_probe_keeps_the_breaker_open_quietly(own_valkey, namespace, fleet_key, logged):
    server = own_valkey()
    store = RemoteStore(server.url, fleet_key, namespace=namespace, timeout=5.0, retry=RETRY)
    server.kill()
    assert store.get(ENTRY) is None
    requests = store.requests
    assert _until(lambda: store.get(ENTRY) is None and store.requests == requests + 1, 10 * RETRY)
    assert store.get(ENTRY) is None and store.requests == requests + 1  # the next probe waits again
    assert total(store, "errors") == 2
    assert len(logged.warnings()) == 1  # one warning per outage, not per probe
    assert store.state.startswith("failed: ")


def test_concurrent_callers_send_one_probe(own_valkey, namespace, fleet_key, logged):
    """A paused server: the probe waits out its timeout while the other threads must not follow it."""
    server = own_valkey()
    store = RemoteStore(server.url, fleet_key, namespace=namespace, timeout=0.5, retry=RETRY)
    store.put(ENTRY, b"kernel")
    server.signal(signal.SIGSTOP)
    try:
        assert store.get(ENTRY) is None
        requests = store.requests
        time.sleep(RETRY * 1.2)
        barrier = threading.Barrier(8)

        def ask():
            barrier.wait()
            store.get(ENTRY)
        threads = [threading.Thread(target=ask) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert store.requests == requests + 1
    finally:
        server.signal(signal.SIGCONT)


def test_retry_zero_gives_up_for_the_process(own_valkey, namespace, fleet_key, logged):
    server = own_valkey()
    store = RemoteStore(server.url, fleet_key, namespace=namespace, timeout=5.0, retry=0)
    server.kill()
    assert store.get(ENTRY) is None
    server.restart()
    time.sleep(0.2)
    _assert_off(store, logged, 1)
    assert "until it restarts" in logged.warnings()[0]


def test_a_store_over_its_budget_is_never_probed(own_valkey, namespace, fleet_key, logged):
    server = own_valkey()
    store = RemoteStore(server.url, fleet_key, namespace=namespace, timeout=5.0, retry=0.05, budget=1e-9)
    store.put(ENTRY, b"kernel")  # answered, but over the budget: off
    assert "budget" in store.state
    time.sleep(0.2)
    _assert_off(store, logged, 1)


def test_wrong_password_fails_with_a_clear_reason(valkey, namespace, fleet_key, logged):
    store = RemoteStore(valkey.url_with("not-the-password"), fleet_key, namespace=namespace, timeout=5.0)
    assert store.get(ENTRY) is None
    assert "refused the password" in store.state
    assert "not-the-password" not in store.state and "not-the-password" not in store.description
    assert len(logged.warnings()) == 1 and "not-the-password" not in logged.warnings()[0]
    _assert_off(store, logged, 1)


def test_missing_password_fails_with_a_clear_reason(valkey, namespace, fleet_key, logged):
    store = RemoteStore("redis://127.0.0.1:%d/0" % valkey.port, fleet_key, namespace=namespace, timeout=5.0)
    with store.lock(ENTRY, 5) as held:
        assert held is False
    assert "refused the password" in store.state


def test_refused_writes_keep_the_reads(own_valkey, redis_module, namespace, fleet_key, logged):
    server = own_valkey()
    store = RemoteStore(server.url, fleet_key, namespace=namespace, timeout=5.0)
    store.put(ENTRY, b"kernel")
    client = redis_module.Redis.from_url(server.url)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")  # full: every write is refused with OOM
    store.put(JIT, b"jit")
    assert store.stats()["jit"]["errors"] == 1 and store.stats()["jit"]["puts"] == 0
    assert store.state == "ok"
    assert store.get(ENTRY) == b"kernel"
    assert logged.warnings() == []
    client.close()


# -- the fleet-wide lock ------------------------------------------------------------------------------

def test_second_holder_waits_then_goes_on_without_the_lock(make_store, raw):
    first = make_store()
    second = make_store()
    with first.lock(ENTRY, 5) as held:
        assert held is True
        token = raw.get(first.lock_key(ENTRY))
        assert len(token.split(b".")) == 3  # token, when taken, HMAC
        polls = second.requests
        with second.lock(ENTRY, 0.3) as held_second:
            assert held_second is False
        assert second.requests - polls >= 2  # it asked again while waiting
        assert raw.get(first.lock_key(ENTRY)) == token  # the waiter released nothing
    assert raw.exists(first.lock_key(ENTRY)) == 0
    with second.lock(ENTRY, 0) as held_second:
        assert held_second is True


def test_an_expired_lock_taken_over_is_not_released_by_the_old_holder(make_store, raw):
    old = make_store(lock_expiry=0.3)
    new = make_store()
    old_lock = old.lock(ENTRY, 0)
    assert old_lock.__enter__() is True
    raw.pexpire(old.lock_key(ENTRY), 1)  # it expired while the old holder was stopped (no renewal came)
    new_lock = new.lock(ENTRY, 60)
    assert new_lock.__enter__() is True  # waited for the old holder's lock to expire
    token = raw.get(new.lock_key(ENTRY))
    old_lock.__exit__(None, None, None)  # the old holder finishes late
    assert raw.get(new.lock_key(ENTRY)) == token
    new_lock.__exit__(None, None, None)
    assert raw.exists(new.lock_key(ENTRY)) == 0


def test_lock_is_released_when_the_body_raises(make_store, raw):
    store = make_store()
    with pytest.raises(RuntimeError):
        with store.lock(ENTRY, 1) as held:
            assert held
            raise RuntimeError("compile failed")
    assert raw.exists(store.lock_key(ENTRY)) == 0


CHILD = r'''
import sys, time
from ptxbackend.cache.remote import RemoteStore
url, key, namespace, name, expiry = sys.argv[1:6]
store = RemoteStore(url, key.encode(), namespace=namespace, lock_expiry=float(expiry), timeout=5.0)
with store.lock(name, 0) as held:
    sys.stdout.write("held\n" if held else "not held\n")
    sys.stdout.flush()
    time.sleep(600)
'''


def test_lock_of_a_dead_holder_expires(make_store, raw, valkey, namespace):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, "-c", CHILD, valkey.url, "k" * 32, namespace, ENTRY, "4"],
                             stdout=subprocess.PIPE, env=env, cwd=REPO)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 120)
        assert ready, "the child did not report"
        assert child.stdout.readline().strip() == b"held"
        store = make_store(key=b"k" * 32)
        lock_key = store.lock_key(ENTRY)
        assert raw.pttl(lock_key) > 0
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
    assert raw.exists(lock_key) == 1  # a dead holder releases nothing ...
    with store.lock(ENTRY, 120) as held:
        assert held is True  # ... its lock expires, and the next machine takes it
    assert raw.exists(lock_key) == 0


# -- TTL ----------------------------------------------------------------------------------------------

def test_ttl_is_set_and_refreshed_on_a_hit(make_store, raw):
    store = make_store(ttl=1000)
    store.put(ENTRY, b"kernel")
    redis_key = store.redis_key(ENTRY)
    assert 900 < raw.ttl(redis_key) <= 1000
    raw.expire(redis_key, 50)
    assert store.get(ENTRY) == b"kernel"
    assert raw.ttl(redis_key) > 900
    assert store.get(JIT) is None  # a miss under TTL is still a miss
    assert raw.exists(store.redis_key(JIT)) == 0


def test_fractional_ttl_rounds_up(make_store, raw):
    store = make_store(ttl=0.5)
    store.put(ENTRY, b"kernel")
    assert raw.ttl(store.redis_key(ENTRY)) == 1


# -- other transports ---------------------------------------------------------------------------------

def test_unix_socket(own_valkey, namespace, fleet_key, tmp_path):
    path = str(tmp_path / "v.sock")
    server = own_valkey(["--unixsocket", path, "--unixsocketperm", "700"])
    store = RemoteStore("unix://:%s@%s?db=0" % (server.password, path), fleet_key, namespace=namespace,
                        timeout=5.0)
    store.put(ENTRY, b"kernel")
    assert store.get(ENTRY) == b"kernel"
    assert store.state == "ok"


def test_unix_socket_in_the_documented_form_with_the_password_from_its_file(own_valkey, namespace, fleet_key,
                                                                          tmp_path):
    """``unix:///run/valkey.sock`` as docs/configuration.md writes it (0.3.0 turned it into ``unix:/...``
    and never connected); the password comes from PTXBACKEND_REMOTE_PASSWORD_FILE's value."""
    path = str(tmp_path / "v.sock")
    server = own_valkey(["--unixsocket", path, "--unixsocketperm", "700"])
    url = "unix://" + path
    assert url.startswith("unix:///")
    store = RemoteStore(url, fleet_key, namespace=namespace, timeout=5.0, password=server.password)
    store.put(ENTRY, b"kernel")
    assert store.get(ENTRY) == b"kernel" and store.state == "ok"


@pytest.mark.parametrize("url", ["redis://", "redis:///0", "unix://"])
def test_a_url_that_names_no_server_is_one_clear_line(url):
    with pytest.raises(ValueError, match="names no (host|socket)"):
        RemoteStore(url, b"k" * 32)


def test_single_node_cluster(own_valkey, redis_module, namespace, fleet_key, tmp_path):
    server = own_valkey(["--cluster-enabled", "yes",
                         "--cluster-config-file", str(tmp_path / "nodes.conf")])
    client = redis_module.Redis.from_url(server.url)
    client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    for _ in range(3000):
        if b"cluster_state:ok" in client.execute_command("CLUSTER", "INFO"):
            break
        select.select([], [], [], 0.01)
    client.close()
    store = RemoteStore(server.url + "?cluster=yes", fleet_key, namespace=namespace, ttl=100, timeout=5.0)
    assert "cluster=yes" not in store._url
    store.put(ENTRY, b"kernel")
    store.put(JIT, b"jit")
    assert store.get(ENTRY) == b"kernel"
    assert store.list() == sorted([ENTRY, JIT])
    with store.lock(ENTRY, 1) as held:
        assert held
    assert store.state == "ok"
    # The working set: its names from the set's slot, then each value from its own slot.
    other = ENTRY.replace(KEY_HEX, "cd" * 32).replace("/ab/", "/cd/")
    store.put(other, b"other kernel")
    reader = RemoteStore(server.url + "?cluster=yes", fleet_key, namespace=namespace, timeout=5.0, mode="ro")
    assert reader.get(ENTRY) == b"kernel" and reader.prefetched == 1
    requests = reader.requests
    assert reader.get(other) == b"other kernel" and reader.requests == requests


# -- open_remote --------------------------------------------------------------------------------------

class Settings(object):
    def __init__(self, **values):
        self.remote = None
        self.remote_mode = "rw"
        self.remote_timeout = 0.25
        self.remote_namespace = "ptxbackend"
        self.remote_key_file = None
        self.remote_password_file = None
        self.remote_ttl = 0.0
        self.__dict__.update(values)


def private_file(path, data, mode=0o600):
    path.write_bytes(data)
    os.chmod(str(path), mode)
    return str(path)


@pytest.fixture
def key_file(tmp_path):
    return private_file(tmp_path / "fleet.key", b"0123456789abcdef0123456789abcdef\n")


KEY32 = b"0123456789abcdef0123456789abcdef"

# Opening never connects, so the refusals need no server: this URL is never contacted.
UNUSED_PASSWORD = "never-sent"
UNUSED_URL = "redis://:%s@127.0.0.1:9/0" % UNUSED_PASSWORD


def test_open_remote_without_a_url_is_off(redis_module):
    assert open_remote(Settings()) == (None, None)


def test_open_remote_builds_without_connecting(raw, valkey, key_file, namespace):
    before = connections_received(raw)
    store, reason = open_remote(Settings(remote=valkey.url, remote_key_file=key_file,
                                         remote_namespace=namespace, remote_ttl=60.0, remote_timeout=5.0))
    assert reason is None
    assert store.state == "not connected yet" and store.requests == 0
    assert connections_received(raw) == before
    assert store.ttl == 60 and store.timeout == 5.0 and store.writable
    store.put(ENTRY, b"kernel")
    assert store.get(ENTRY) == b"kernel"
    assert connections_received(raw) == before + 1
    # The key is the file's bytes without the trailing newline.
    redis_key = store.redis_key(ENTRY)
    assert raw.get(redis_key) == expected_value(b"0123456789abcdef0123456789abcdef", redis_key, b"kernel")


@pytest.mark.parametrize("url", ["redis://[::1", "redis://:secret@[::1/0", "rediss://h:notaport/0"])
def test_a_url_that_does_not_parse_turns_the_fleet_store_off_and_keeps_its_password(url, key_file):
    """Issue 26: `redis://[::1` made urlsplit raise out of every compile; the password must not show."""
    store, reason = open_remote(Settings(remote=url, remote_key_file=key_file))
    assert store is None and "not a valid URL" in reason and "secret" not in reason


@pytest.mark.toolkit
def test_a_malformed_remote_url_never_breaks_a_compile(nvcc13, monkeypatch, key_file):
    import ptxbackend
    monkeypatch.setenv("PTXBACKEND_REMOTE", "redis://:secret@[::1")
    monkeypatch.setenv("PTXBACKEND_REMOTE_KEY_FILE", key_file)
    art = ptxbackend.compile('extern "C" __global__ void k(float* y) { y[0] = 1.0f; }\n', target="compute_75")
    assert art.image and not art.cache_hit


def test_opening_the_store_imports_no_redis_py(valkey, key_file, namespace):
    """A program whose kernels all hit locally must not pay for importing a client (0.1-0.2 s); one
    server is spoken to without redis-py at all."""
    code = ("import sys; from ptxbackend.compiling import engine; from ptxbackend.config import load_settings; "
            "cache = engine.open_cache(load_settings()); "
            "print(cache.remote is not None, 'redis' in sys.modules); cache.remote.get('x'); "
            "print('redis' in sys.modules, cache.remote.state)")
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_REMOTE=valkey.url, PTXBACKEND_REMOTE_KEY_FILE=key_file,
               PTXBACKEND_REMOTE_NAMESPACE=namespace)
    out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, check=True,
                         universal_newlines=True).stdout.split()
    assert out == ["True", "False", "False", "ok"]


def test_open_remote_from_the_environment(monkeypatch, valkey, key_file, namespace):
    from ptxbackend import config
    monkeypatch.setenv("PTXBACKEND_REMOTE", valkey.url)
    monkeypatch.setenv("PTXBACKEND_REMOTE_KEY_FILE", key_file)
    monkeypatch.setenv("PTXBACKEND_REMOTE_MODE", "ro")
    monkeypatch.setenv("PTXBACKEND_REMOTE_NAMESPACE", namespace)
    store, reason = open_remote(config.load_settings())
    assert reason is None and not store.writable and store.namespace == namespace


def test_open_remote_needs_a_key_file(redis_module):
    store, reason = open_remote(Settings(remote=UNUSED_URL))
    assert store is None
    assert "PTXBACKEND_REMOTE_KEY_FILE" in reason and "not used without a fleet key" in reason


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602])
def test_open_remote_refuses_a_key_file_others_can_reach(redis_module, tmp_path, mode):
    path = private_file(tmp_path / "fleet.key", KEY32, mode)
    store, reason = open_remote(Settings(remote=UNUSED_URL, remote_key_file=path))
    assert store is None and "group or others" in reason and "chmod 600" in reason
    os.chmod(path, 0o600)
    assert open_remote(Settings(remote=UNUSED_URL, remote_key_file=path))[0] is not None


def test_open_remote_refuses_a_key_file_of_another_user(redis_module, tmp_path):
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root to give the file away")
    path = private_file(tmp_path / "fleet.key", KEY32)
    os.chown(path, 65534, 65534)
    store, reason = open_remote(Settings(remote=UNUSED_URL, remote_key_file=path))
    assert store is None and "uid 65534" in reason
    os.chown(path, 0, 0)
    assert open_remote(Settings(remote=UNUSED_URL, remote_key_file=path))[0] is not None


def test_open_remote_refuses_a_symlinked_key_file(redis_module, tmp_path, key_file):
    link = tmp_path / "link.key"
    link.symlink_to(key_file)
    store, reason = open_remote(Settings(remote=UNUSED_URL, remote_key_file=str(link)))
    assert store is None and "symbolic link" in reason


def test_open_remote_refuses_a_key_file_that_is_not_a_file(redis_module, tmp_path):
    fifo = str(tmp_path / "fleet.fifo")
    os.mkfifo(fifo, 0o600)  # O_NONBLOCK: opening it does not hang
    store, reason = open_remote(Settings(remote=UNUSED_URL, remote_key_file=fifo))
    assert store is None and "not a regular file" in reason
    missing = str(tmp_path / "absent.key")
    store, reason = open_remote(Settings(remote=UNUSED_URL, remote_key_file=missing))
    assert store is None and "cannot be read" in reason


def test_open_remote_refuses_a_short_key(redis_module, tmp_path):
    path = private_file(tmp_path / "fleet.key", KEY32[:15] + b"\n")
    store, reason = open_remote(Settings(remote=UNUSED_URL, remote_key_file=path))
    assert store is None and "at least 16" in reason
    private_file(tmp_path / "fleet.key", KEY32[:16] + b"\n")
    assert open_remote(Settings(remote=UNUSED_URL, remote_key_file=path))[0] is not None


def test_open_remote_password_file(raw, valkey, key_file, tmp_path, namespace):
    url = "redis://127.0.0.1:%d/0" % valkey.port
    password = private_file(tmp_path / "password", (" %s\n" % valkey.password).encode())
    store, reason = open_remote(Settings(remote=url, remote_key_file=key_file, remote_password_file=password,
                                         remote_namespace=namespace, remote_timeout=5.0))
    assert reason is None
    store.put(ENTRY, b"kernel")
    assert store.get(ENTRY) == b"kernel"
    assert valkey.password not in store.description

    os.chmod(password, 0o640)
    store, reason = open_remote(Settings(remote=url, remote_key_file=key_file, remote_password_file=password))
    assert store is None and "password file" in reason and "group or others" in reason


def test_open_remote_refuses_other_schemes_and_namespaces(redis_module, key_file):
    store, reason = open_remote(Settings(remote="http://127.0.0.1:1/", remote_key_file=key_file))
    assert store is None and "unsupported scheme" in reason
    store, reason = open_remote(Settings(remote=UNUSED_URL, remote_key_file=key_file, remote_namespace="a:lock"))
    assert store is None and "namespace" in reason
    store, reason = open_remote(Settings(remote=UNUSED_URL + "?cluster=maybe", remote_key_file=key_file))
    assert store is None and "cluster=yes" in reason and UNUSED_PASSWORD not in reason


def test_open_remote_without_redis_py(monkeypatch, key_file, valkey, namespace):
    """One server needs no redis-py; only Redis Cluster does."""
    monkeypatch.setitem(sys.modules, "redis", None)  # as if it were not installed
    store, reason = open_remote(Settings(remote=UNUSED_URL + "?cluster=yes", remote_key_file=key_file))
    assert store is None and "pip install 'ptxbackend[redis]'" in reason
    assert UNUSED_PASSWORD not in reason
    store, reason = open_remote(Settings(remote=valkey.url, remote_key_file=key_file, remote_namespace=namespace,
                                         remote_timeout=5.0))
    assert reason is None
    store.put(ENTRY, b"kernel")
    assert store.get(ENTRY) == b"kernel" and store.state == "ok"


def test_the_package_imports_without_redis_py():
    code = ("import sys; sys.modules['redis'] = None; import ptxbackend, ptxbackend.cache.remote as r; "
            "print(r.open_remote(type('S', (), {'remote': 'redis://h/0?cluster=yes', "
            "'remote_key_file': None})())[1])")
    out = subprocess.check_output([sys.executable, "-c", code], cwd=REPO, timeout=120)
    assert b"pip install" in out


def test_description_hides_every_password():
    store = RemoteStore("rediss://user:s3cret@host:6380/2?password=s3cret2&ssl_ca_certs=/ca.pem", b"k" * 16)
    assert "s3cret" not in store.description
    assert "user" in store.description and "host:6380" in store.description
    assert store.state == "not connected yet"


def test_a_lock_held_past_its_expiry_is_renewed_while_the_compile_runs(make_store, raw):
    """A compile longer than the lock's expiry keeps the lock: another machine keeps waiting instead of
    compiling the same kernel, and the lock is gone once released."""
    name = "nvcc-13.0.88/compute_75/ab/long.ptx"
    holder, waiter = make_store(lock_expiry=0.6), make_store(lock_expiry=0.6)
    lock_key = holder.lock_key(name)
    with holder.lock(name, 1) as held:
        assert held
        time.sleep(1.5)  # two and a half expiries
        assert raw.exists(lock_key)
        started = time.monotonic()
        with waiter.lock(name, 0.3) as got:
            assert not got and time.monotonic() - started >= 0.3  # it verified, so the waiter waited
    assert not raw.exists(lock_key)


def test_a_lost_lock_is_neither_renewed_nor_released_as_ours(make_store, raw):
    name = "nvcc-13.0.88/compute_75/ab/lost.ptx"
    holder, other = make_store(lock_expiry=0.6), make_store(lock_expiry=5)
    lock_key = holder.lock_key(name)
    with holder.lock(name, 1) as held:
        assert held
        raw.delete(lock_key)  # expired while the machine was stopped, say
        with other.lock(name, 0) as theirs:
            assert theirs
            time.sleep(0.5)  # past the holder's next renewal
            ours = raw.get(lock_key)
        assert ours is not None and raw.get(lock_key) is None  # theirs, kept and then released by them
    assert raw.get(lock_key) is None

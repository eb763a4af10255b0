"""The fleet's working set (ptxbackend/cache/workingset.py): a new process's first lookup brings the
group's values in the same round trip; the set is advisory and every value it brings must verify.

Real valkey-server; a fake RESP server on loopback only where the server must lie.  Each check's test
feeds an input that is valid in every other respect, so removing the check makes it fail.
"""

import os
import time

import pytest

from fake_resp import FakeServer
from ptxbackend.cache import DirectoryStore, workingset
from ptxbackend.cache import entry as entry_format
from ptxbackend.cache.entries import EntryCache
from ptxbackend.cache.remote import RemoteStore, seal
from test_remote_store import fleet_key, logged, make_store, namespace, raw  # noqa: F401  (fixtures)

PRODUCER_TARGET = "nvcc-13.0.88/compute_75"


def key_of(i):
    return ("%02x" % i) * 32


def name_of(i, kind="ptx"):
    key = key_of(i)
    return "%s/%s/%s.%s" % (PRODUCER_TARGET, key[:2], key, kind)


def set_key(space):
    return "%s:ws:v4/%s" % (space, PRODUCER_TARGET)


def seed(store, count):
    blobs = {}
    for i in range(count):
        blobs[name_of(i)] = entry_format.encode(b"// ptx %d" % i, {"key": key_of(i), "kind": "ptx"})
        store.put(name_of(i), blobs[name_of(i)])
    return blobs


def test_the_first_lookup_brings_the_working_set_in_one_round_trip(make_store, raw, namespace):
    blobs = seed(make_store(), 20)
    assert raw.zcard(set_key(namespace)) == 20  # each upload recorded its name, pipelined with the SET
    for mode in ("ro", "rw"):
        reader = make_store(mode=mode)
        for name in sorted(blobs):
            assert reader.get(name) == blobs[name]
        assert reader.requests == 1 and reader.prefetched == 19
        assert reader.stats()["entry"]["hits"] == 20


def test_the_set_is_bounded_on_the_server(make_store, raw, namespace, monkeypatch):
    monkeypatch.setattr(workingset, "MAX_MEMBERS", 5)
    seed(make_store(), 12)
    members = raw.zrevrange(set_key(namespace), 0, -1)
    assert len(members) == 5 and members[0].decode() == name_of(11)  # the newest, by last use


def test_a_read_only_reader_records_nothing(make_store, raw, namespace):
    seed(make_store(), 3)
    before = raw.zrange(set_key(namespace), 0, -1, withscores=True)
    reader = make_store(mode="ro")
    assert reader.get(name_of(0)) is not None
    assert raw.zrange(set_key(namespace), 0, -1, withscores=True) == before


def test_uses_served_from_memory_are_recorded_with_the_next_request(make_store, raw, namespace):
    seed(make_store(), 3)
    reader = make_store()
    reader.get(name_of(0))
    old = raw.zscore(set_key(namespace), name_of(2))
    time.sleep(0.01)
    reader.get(name_of(2))  # from memory: no request
    assert reader.requests == 1
    reader.get(name_of(7))  # a miss: its request carries the earlier use
    assert reader.requests == 2 and raw.zscore(set_key(namespace), name_of(2)) > old
    old = raw.zscore(set_key(namespace), name_of(1))
    time.sleep(0.01)
    reader.get(name_of(1))
    reader.record_uses()  # what the process's exit does with uses no request carried
    assert reader.requests == 3 and raw.zscore(set_key(namespace), name_of(1)) > old
    reader.record_uses()
    assert reader.requests == 3  # nothing left to record: no request


def test_a_forged_set_only_fetches_values_that_must_verify(make_store, raw, namespace, fleet_key, logged):
    blobs = seed(make_store(), 2)
    # Names anyone could add to the set: a value tampered with, a valid value copied under another
    # name (the name is inside the MAC), a value sealed with another key, and names of no layout.
    raw.set("%s:v4/%s" % (namespace, name_of(5)), raw.get("%s:v4/%s" % (namespace, name_of(1))))
    tampered = bytearray(raw.get("%s:v4/%s" % (namespace, name_of(1))))
    tampered[-1] ^= 1
    raw.set("%s:v4/%s" % (namespace, name_of(6)), bytes(tampered))
    other = "%s:v4/%s" % (namespace, name_of(7))
    raw.set(other, seal(os.urandom(32), other.encode(), blobs[name_of(1)]))
    forged = [name_of(5), name_of(6), name_of(7), "../../etc/passwd", "a" * 500, "x:y/z/w.ptx"]
    raw.zadd(set_key(namespace), dict((name, 1e15) for name in forged))
    reader = make_store(mode="ro")
    assert reader.get(name_of(0)) == blobs[name_of(0)]
    assert reader.prefetched == 1  # name_of(1) alone
    assert sorted(reader._memory) == [name_of(1)]
    assert reader.stats()["entry"]["rejected"] == 3
    for name in (name_of(5), name_of(6), name_of(7)):
        assert reader.get(name) is None  # asked again, refused again: never served


def test_a_value_from_the_working_set_gets_the_entry_checks_of_a_single_fetch(make_store, raw, namespace,
                                                                              tmp_path):
    """Sealed with the fleet key, under a kernel's name, but holding another kernel's entry."""
    blobs = seed(make_store(), 2)
    writer = make_store()
    writer.put(name_of(3), blobs[name_of(1)])  # an uploader with the key, and a bug
    cache = EntryCache(DirectoryStore(str(tmp_path / "local"), 1 << 20, 5.0), make_store(mode="ro"))
    assert cache.read(name_of(0), key_of(0), "ptx") is not None
    assert cache.remote.prefetched == 2
    assert cache.read(name_of(3), key_of(3), "ptx") is None  # verified as bytes, refused as an entry
    assert cache.read(name_of(1), key_of(1), "ptx") is not None
    assert cache.counters["remote_hits"] == 2 and cache.counters["remote_discarded"] == 1
    assert cache.remote.requests == 1


def test_the_fetch_is_bounded_in_count_and_bytes_whatever_the_server_sends(fleet_key, logged, monkeypatch):
    """A server that ignores the bounds it was sent and answers with many valid values."""
    names = [name_of(i) for i in range(10)]

    def answer(command):
        if command[0] == b"FCALL_RO":
            items = []
            for name in names:
                redis_key = ("ptxbackend:v4/" + name).encode()
                value = seal(fleet_key, redis_key, b"x" * 100)
                items.append(b"$%d\r\n%s\r\n" % (len(name), name.encode()))
                items.append(b"$%d\r\n%s\r\n" % (len(value), value))
            return b"*%d\r\n" % len(items) + b"".join(items)
        return b"$0\r\n\r\n"
    monkeypatch.setattr(workingset, "FETCH_COUNT", 4)
    with FakeServer(answer) as server:
        store = RemoteStore(server.url, fleet_key, timeout=2.0, mode="ro")
        store.get(name_of(50))
        assert store.prefetched == 4
        monkeypatch.setattr(workingset, "FETCH_COUNT", 100)
        monkeypatch.setattr(workingset, "FETCH_BYTES", 3 * (100 + 38))
        store = RemoteStore(server.url, fleet_key, timeout=2.0, mode="ro")
        store.get(name_of(50))
        assert store.prefetched == 3


@pytest.mark.parametrize("reply", [b"$3\r\nabc\r\n", b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n", b":7\r\n",
                                   b"-NOSCRIPT no scripts here\r\n"])
def test_a_working_set_reply_of_the_wrong_shape_is_no_working_set(reply, fleet_key, logged):
    """An array of the wrong contents or an error reply: no working set, the store stays on.  A reply of
    another kind than an array (a string, an integer) is an answer to some other request: the pipeline
    is out of step, so none of its replies is taken and the store faults."""
    with FakeServer(lambda command: reply if command[0] == b"FCALL_RO" else b"$0\r\n\r\n") as server:
        store = RemoteStore(server.url, fleet_key, timeout=2.0, mode="ro")
        assert store.get(name_of(1)) is None
        assert store.prefetched == 0
        if reply[:1] in (b"*", b"-"):
            assert store.state == "ok"
        else:
            assert "out of step" in store.state, store.state


def test_names_of_no_layout_are_not_kept_even_when_their_values_verify(fleet_key, logged):
    """A server (or a key holder's bug) sending a validly sealed value under a name no lookup makes."""
    odd = ["../../%s" % name_of(2), "x:y/%s" % name_of(3), name_of(4) + "/" + "a" * 400]

    def answer(command):
        if command[0] != b"FCALL_RO":
            return b"$0\r\n\r\n"
        items = []
        for name in odd + [name_of(5)]:
            value = seal(fleet_key, ("ptxbackend:v4/" + name).encode(), b"kernel")
            items.append(b"$%d\r\n%s\r\n" % (len(name), name.encode()))
            items.append(b"$%d\r\n%s\r\n" % (len(value), value))
        return b"*%d\r\n" % len(items) + b"".join(items)
    with FakeServer(answer) as server:
        store = RemoteStore(server.url, fleet_key, timeout=2.0, mode="ro")
        store.get(name_of(1))
        assert sorted(store._memory) == [name_of(5)]


def test_fleet_hits_are_copied_locally_off_the_hit_path(make_store, tmp_path):
    blobs = seed(make_store(), 3)
    local = DirectoryStore(str(tmp_path / "local"), 1 << 20, 5.0)
    cache = EntryCache(local, make_store(mode="ro"))
    for i in range(3):
        assert cache.read(name_of(i), key_of(i), "ptx") is not None
    # Asked again before its file is written: served from what waits to be written, not fetched again.
    assert cache.read(name_of(0), key_of(0), "ptx") is not None
    assert cache.remote.requests == 1 and cache.counters["remote_hits"] == 3
    cache.flush()
    assert all(local.get(name) == blobs[name] for name in blobs)
    assert cache._later.pending == {}


def test_a_jit_cubin_s_group_brings_the_dependency_set_its_entries_name(make_store, tmp_path):
    """A machine that loads JIT cubins first never reads the PTX group, where the set was first
    recorded: each entry's upload records its set in the entry's own group too."""
    from ptxbackend.cache import layout
    digest = "ab" * 32
    depset = b'{"files":[]}'
    writer = EntryCache(DirectoryStore(str(tmp_path / "a"), 1 << 20, 5.0), make_store())
    writer.read(name_of(0), key_of(0), "ptx")  # a miss in the PTX group, as a compile's lookup is
    writer.save_depset(digest, depset)  # recorded in the group used last: the PTX one
    writer.write(name_of(0), b"// ptx", {"key": key_of(0), "kind": "ptx"}, digest.encode())
    jit = "%s/jit/sm_90-580/%s/%s.cubin" % (PRODUCER_TARGET, key_of(0)[:2], key_of(0))
    writer.write(jit, b"cubin", {"key": key_of(0), "kind": "cubin"}, digest.encode())
    reader = EntryCache(DirectoryStore(str(tmp_path / "b"), 1 << 20, 5.0), make_store(mode="ro"))
    found = reader.read(jit, key_of(0), "cubin", False, True)
    assert found is not None and found[2] == digest.encode()
    assert reader.load_depset(digest) == depset
    assert reader.remote.requests == 1 and layout.depset_name(digest) not in reader.remote._memory


# -- issue 38 row 4: what a new machine sends, counted by the server itself ---------------------------------

@pytest.fixture
def own_server(server_binary, tmp_path):
    """A server of this test's own: its command counters count this test's commands only."""
    import valkey_server
    server = valkey_server.Server(server_binary, str(tmp_path / "valkey")).start()
    yield server
    server.stop()


def _commands(admin):
    """``{command: calls}`` since the last CONFIG RESETSTAT, from the server's INFO commandstats
    (commands a function runs are counted under their own names)."""
    counted = {}
    for line in admin.execute(("INFO", "commandstats"))[0].decode().splitlines():
        if line.startswith("cmdstat_"):
            name, _colon, fields = line[len("cmdstat_"):].partition(":")
            counted[name] = int(dict(field.split("=") for field in fields.split(","))["calls"])
    return counted


def _admin(server):
    from ptxbackend.cache import resp
    return resp.Client(resp.Endpoint(server.url), 5.0, 1 << 20)


def test_a_new_machine_records_its_60_kernels_as_one_command_per_group(own_server, fleet_key):
    def store(**options):
        return RemoteStore(own_server.url, fleet_key, namespace="ws60", timeout=5.0, **options)
    blobs = seed(store(), 60)
    admin = _admin(own_server)
    admin.execute(("CONFIG", "RESETSTAT"))
    machine = store()  # rw: it records what it uses
    for name in sorted(blobs):
        assert machine.get(name) == blobs[name]
    machine.record_uses()  # what its exit does
    counted = _commands(admin)
    # Sent by the machine: its one lookup (GETRANGE), the library's load, the fetch, the lookup's own
    # use, then the 59 uses served from memory: one FCALL for the group (before: 2 commands a kernel).
    assert counted.get("fcall") == 2 and counted.get("fcall_ro") == 1 and machine.requests == 2
    assert counted.get("zadd") == 2 and counted.get("zremrangebyrank") == 2  # inside the two FCALLs
    sent = sum(calls for name, calls in counted.items()
               if name not in ("config|resetstat", "info", "auth", "zadd", "zremrangebyrank", "zrevrange",
                               "getrange"))
    assert sent == 4, counted  # function|load, fcall_ro, fcall, fcall
    assert counted.get("getrange") == 1 + 60  # the lookup's own, then the function's (the set holds it too)
    admin.close()


def test_a_read_only_line_pc_sends_no_expire_and_no_write(own_server, fleet_key):
    writer = RemoteStore(own_server.url, fleet_key, namespace="ro", timeout=5.0, ttl=60)
    blobs = seed(writer, 3)
    admin = _admin(own_server)
    admin.execute(("CONFIG", "RESETSTAT"))
    line_pc = RemoteStore(own_server.url, fleet_key, namespace="ro", timeout=5.0, ttl=60, mode="ro")
    for name in sorted(blobs):
        assert line_pc.get(name) == blobs[name]
    assert line_pc.get(name_of(9)) is None
    line_pc.record_uses()
    counted = _commands(admin)
    assert set(counted) <= {"config|resetstat", "auth", "getrange", "fcall_ro", "zrevrange"}, counted
    # The same with a rw store refreshes the values' TTL (the input is otherwise the same).
    RemoteStore(own_server.url, fleet_key, namespace="ro", timeout=5.0, ttl=60).get(name_of(0))
    assert _commands(admin).get("expire") == 1
    admin.close()


def test_without_the_library_the_working_set_comes_in_read_only_round_trips(own_server, fleet_key):
    blobs = seed(RemoteStore(own_server.url, fleet_key, namespace="nolib", timeout=5.0), 20)
    admin = _admin(own_server)
    admin.execute(("FUNCTION", "FLUSH"))  # a server no build box loaded it on (or Redis 6)
    admin.execute(("CONFIG", "RESETSTAT"))
    line_pc = RemoteStore(own_server.url, fleet_key, namespace="nolib", timeout=5.0, mode="ro")
    for name in sorted(blobs):
        assert line_pc.get(name) == blobs[name]
    # The lookup (and the refused FCALL_RO), the names, their values; nothing written.
    assert line_pc.requests == 3 and line_pc.prefetched == 19
    counted = _commands(admin)
    assert set(counted) <= {"config|resetstat", "function|flush", "auth", "getrange", "fcall_ro", "zrevrange"}
    # A later group of the same process: the names with the lookup, then the values: two round trips.
    other = "nvcc-13.0.88/compute_86"
    writer = RemoteStore(own_server.url, fleet_key, namespace="nolib", timeout=5.0)
    for i in range(3):
        writer.put("%s/%s/%s.ptx" % (other, key_of(i)[:2], key_of(i)), b"x%d" % i)
    before = line_pc.requests
    assert line_pc.get("%s/%s/%s.ptx" % (other, key_of(0)[:2], key_of(0))) == b"x0"
    assert line_pc.requests - before == 2 and line_pc.prefetched == 21
    admin.close()


def test_an_rw_machine_without_function_rights_still_records_its_uses(own_server, fleet_key):
    """A build-box user without FUNCTION LOAD or FCALL (an ACL from before 0.5) on a server with no
    library: the refused touch is sent again as plain ZADD, so the uses are not lost."""
    admin = _admin(own_server)
    admin.execute(("ACL", "SETUSER", "old-box", "on", ">old-box-password", "resetkeys", "~old:*", "-@all",
                   "+getrange", "+ping", "+set", "+get", "+del", "+eval", "+scan", "+zadd",
                   "+zremrangebyrank", "+zrevrange"))
    url = "redis://old-box:old-box-password@127.0.0.1:%d/0" % own_server.port
    box = RemoteStore(url, fleet_key, namespace="old", timeout=5.0)
    blobs = seed(box, 5)
    members = admin.execute(("ZRANGE", "old:ws:v4/" + PRODUCER_TARGET, 0, -1))[0]
    assert sorted(m.decode() for m in members) == sorted(blobs)  # every upload recorded, the first included
    assert box.state == "ok"
    reader = RemoteStore(url, fleet_key, namespace="old", timeout=5.0)
    for name in sorted(blobs):
        assert reader.get(name) == blobs[name]
    assert reader.prefetched == 4
    admin.close()


def test_a_large_value_read_into_its_own_buffer_passes_every_check_and_is_kept_locally(make_store, tmp_path):
    """Values of 64 KiB and more arrive as one bytearray (resp.BIG_BULK): an entry of 3 MiB goes through
    the working set and a single fetch, is decoded to bytes and written to the local cache."""
    from ptxbackend.cache import resp
    payload = os.urandom(3 << 20)
    big = entry_format.encode(payload, {"key": key_of(1), "kind": "ptx"})
    assert len(big) >= resp.BIG_BULK
    writer = make_store()
    writer.put(name_of(1), big)
    writer.put(name_of(2), entry_format.encode(payload[:1 << 17], {"key": key_of(2), "kind": "ptx"}))
    cache = EntryCache(DirectoryStore(str(tmp_path / "local"), 1 << 30, 5.0), make_store(mode="ro"))
    found = cache.read(name_of(1), key_of(1), "ptx")  # a single fetch (its own value)
    assert found is not None and isinstance(found[0], bytes) and found[0] == payload
    found = cache.read(name_of(2), key_of(2), "ptx")  # from the working set, in memory
    assert found is not None and found[0] == payload[:1 << 17] and cache.remote.requests == 1
    cache.flush()
    assert cache.local.get(name_of(1)) == big

"""The fleet store against a hostile or impersonated server, forged locks and loose settings (issue 25).

Each test's input is valid in every respect but the one its check is about, so removing the check
makes the test fail (docs/reliability.md lists them).  Misbehaving servers are tests/fake_resp.py on
loopback; everything else is the real valkey-server.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

import valkey_server
from conftest import REPO, figures
from fake_resp import FakeServer, bulk
from ptxbackend.cache import remote, resp, workingset
from ptxbackend.cache.resp import ReplyError
from ptxbackend.cache.remote import RemoteStore, open_remote, seal
from test_remote_store import ENTRY, KEY32, Settings, _assert_off, private_file
from test_remote_store import fleet_key, logged, namespace  # noqa: F401  (fixtures, shared)


# -- row 2: replies out of protocol, out of bounds, or too slow -----------------------------------

@pytest.mark.parametrize("reply", [b":5\r\n", b"*1\r\n$1\r\nx\r\n"])
def test_a_reply_of_the_wrong_type_is_a_fault_not_a_traceback(reply, fleet_key, logged):
    with FakeServer(lambda command: reply) as server:
        store = RemoteStore(server.url, fleet_key, timeout=2.0)
        assert store.get(ENTRY) is None
        assert "where a string was expected" in store.state
        _assert_off(store, logged, store.requests)  # nothing raises; the breaker tripped


def test_a_4_gib_bulk_length_is_refused_before_anything_is_read(fleet_key, logged):
    with FakeServer(lambda command: b"$4294967296\r\n") as server:
        store = RemoteStore(server.url, fleet_key, timeout=5.0)
        started = time.monotonic()
        assert store.get(ENTRY) is None
        assert time.monotonic() - started < 4.0  # refused at the length, not after waiting for the bytes
        assert "bulk string of 4294967296, over the bound" in store.state


def test_an_array_of_a_billion_items_is_refused(fleet_key, logged):
    with FakeServer(lambda command: b"*1000000000\r\n") as server:
        store = RemoteStore(server.url, fleet_key, timeout=5.0)
        assert store.list() == []
        assert "array of 1000000000, over the bound" in store.state


def test_replies_each_under_the_bound_are_bounded_together():
    """Three strings of 40000 bytes, each under a 50000-byte bound, are over what one operation may receive."""
    from ptxbackend.cache import resp
    page = b"*2\r\n$1\r\n0\r\n*3\r\n" + bulk(b"k" * 40000) * 3
    with FakeServer(lambda command: page) as server:
        client = resp.Client(resp.Endpoint(server.url), 5.0, max_reply=50000)
        with pytest.raises(resp.Fault, match="more than %d bytes for one operation" % (50000 + resp.MAX_LINE)):
            client.scan(b"*")


def test_a_status_line_without_end_is_bounded(fleet_key, logged):
    with FakeServer(lambda command: b"+" + b"x" * (200 << 10)) as server:
        store = RemoteStore(server.url, fleet_key, timeout=5.0)
        assert store.ping() is False
        assert "reply line is longer than" in store.state


def test_a_trickling_reply_meets_one_deadline_for_the_whole_operation(fleet_key, logged):
    """One byte every 0.1 s: each recv is quick, the operation is not (a 300-byte reply takes 30 s)."""
    reply = bulk(b"v" * 300)
    with FakeServer(lambda command: [reply[i:i + 1] for i in range(len(reply))], delay=0.1) as server:
        store = RemoteStore(server.url, fleet_key, timeout=0.5)
        started = time.monotonic()
        assert store.get(ENTRY) is None
        assert time.monotonic() - started < 5.0
        assert "deadline" in store.state


@pytest.mark.toolkit
def test_a_hostile_server_never_breaks_a_compile(nvcc13, monkeypatch, tmp_path):
    import ptxbackend
    key = private_file(tmp_path / "fleet.key", KEY32)
    with FakeServer(lambda command: b"$4294967296\r\n" if command[0] == b"GETRANGE" else b":1\r\n") as server:
        monkeypatch.setenv("PTXBACKEND_REMOTE", server.url)
        monkeypatch.setenv("PTXBACKEND_REMOTE_KEY_FILE", key)
        monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(tmp_path / "cache"))
        source = 'extern "C" __global__ void hostile_%s(float* y) { y[0] = 1.0f; }\n' % uuid.uuid4().hex[:8]
        art = ptxbackend.compile(source, target="compute_75")
        assert art.image and not art.cache_hit


# -- row 3: fleet locks are the fleet key's -------------------------------------------------------

@pytest.fixture
def store_and_raw(valkey, redis_module, namespace, fleet_key):
    raw = redis_module.Redis.from_url(valkey.url)
    yield RemoteStore(valkey.url, fleet_key, namespace=namespace, timeout=5.0), raw
    raw.close()


def _signed(key, lock_key, taken_ms):
    token = b"0" * 32
    taken = str(int(taken_ms)).encode()
    return b".".join((token, taken, remote._lock_mac(key, lock_key.encode(), token, taken)))


def _not_waited_for(store, lock_key_value, raw):
    raw.set(store.lock_key(ENTRY), lock_key_value, px=60000)
    before = store.requests
    with store.lock(ENTRY, 5) as held:
        assert held is False
    assert store.requests - before == 1  # one look, no polling
    assert store.stats()["entry"]["rejected"] == 1
    assert raw.get(store.lock_key(ENTRY)) == lock_key_value  # ignored, not removed


def test_a_lock_planted_by_a_password_holder_is_not_waited_for(store_and_raw):
    store, raw = store_and_raw
    _not_waited_for(store, b"planted by someone without the fleet key", raw)


def test_a_lock_signed_with_another_key_is_not_waited_for(store_and_raw):
    store, raw = store_and_raw
    _not_waited_for(store, _signed(os.urandom(32), store.lock_key(ENTRY), time.time() * 1000), raw)


def test_a_replayed_old_lock_is_not_waited_for(store_and_raw, fleet_key):
    store, raw = store_and_raw
    _not_waited_for(store, _signed(fleet_key, store.lock_key(ENTRY), (time.time() - 3600) * 1000), raw)


def test_a_lock_of_this_fleet_is_waited_for(store_and_raw, fleet_key):
    store, raw = store_and_raw
    raw.set(store.lock_key(ENTRY), _signed(fleet_key, store.lock_key(ENTRY), time.time() * 1000), px=60000)
    before = store.requests
    with store.lock(ENTRY, 0.3) as held:
        assert held is False
    assert store.requests - before >= 2


def test_a_server_answering_nil_to_every_lock_is_not_waited_for(fleet_key, logged):
    with FakeServer(lambda command: b"$-1\r\n") as server:
        store = RemoteStore(server.url, fleet_key, timeout=2.0)
        with store.lock(ENTRY, 30) as held:
            assert held is False
        assert store.requests == 1 and store.state == "ok"


def test_integer_replies_take_no_lock_and_are_no_pong(fleet_key, logged):
    """``:1`` equals True in Python: neither a taken lock nor a PONG may be read into it."""
    with FakeServer(lambda command: b":1\r\n") as server:
        store = RemoteStore(server.url, fleet_key, timeout=2.0)
        with store.lock(ENTRY, 30) as held:
            assert held is False
        assert store.ping() is False


# -- row 13: a slow server costs a bounded time per process ------------------------------------------

def test_a_server_just_under_the_timeout_trips_the_budget(fleet_key, logged):
    with FakeServer(lambda command: b"$0\r\n\r\n" if command[0] == b"GETRANGE" else b"*0\r\n", delay=0.15) as server:
        # Read-only: this fake delays each command, and a writer's first lookup pipelines the
        # working set's upkeep with it (four commands: over the timeout here, not just under it).
        store = RemoteStore(server.url, fleet_key, timeout=0.5, budget=1.0, mode="ro")
        for _ in range(30):
            store.get(ENTRY)
        assert "budget of 1.0 s" in store.state and "PTXBACKEND_REMOTE_BUDGET" in store.state
        assert store.requests <= 8
        assert len(logged.warnings()) == 1


def test_cache_push_is_not_held_to_the_budget(valkey, namespace, fleet_key):
    store = RemoteStore(valkey.url, fleet_key, namespace=namespace, timeout=5.0, budget=1e-9)
    with store.unbudgeted():
        store.put(ENTRY, b"kernel")
        assert store.get(ENTRY) == b"kernel"
    assert store.state == "ok"
    store.get(ENTRY)
    assert "budget" in store.state


# -- row 14: settings that would loosen the store -----------------------------------------------------

@pytest.mark.parametrize("query", ["socket_timeout=60", "socket_connect_timeout=60", "cluster=yes&socket_timeout=60",
                                   "ssl_cert_reqs=none", "health_check_interval=1"])
def test_url_arguments_cannot_loosen_the_timeout_or_tls(query, tmp_path):
    key = private_file(tmp_path / "fleet.key", KEY32)
    store, reason = open_remote(Settings(remote="rediss://:never-sent@127.0.0.1:9/0?" + query, remote_key_file=key))
    assert store is None and "PTXBACKEND_REMOTE_TIMEOUT" in reason and "never-sent" not in reason


@pytest.mark.parametrize("content", [b" " * 16, b" " * 40 + b"\n", b"a" * 32, b"abab" * 8])
def test_a_key_file_of_blanks_or_one_repeated_byte_is_refused(content, tmp_path):
    key = private_file(tmp_path / "fleet.key", content)
    store, reason = open_remote(Settings(remote="redis://127.0.0.1:9/0", remote_key_file=key))
    assert store is None and "random bytes" in reason


def _root_only():
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root to give a socket to another user")


def test_a_unix_socket_of_another_user_where_anyone_can_create_files_is_refused(server_binary, fleet_key,
                                                                                 namespace, logged):
    _root_only()
    base = tempfile.mkdtemp(prefix="ptxs", dir="/tmp")  # short: a socket path is at most 107 bytes
    try:
        shared = os.path.join(base, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)  # like /tmp
        path = os.path.join(shared, "v.sock")
        server = valkey_server.Server(server_binary, os.path.join(base, "w"),
                                      extra=["--unixsocket", path, "--unixsocketperm", "777"]).start()
        try:
            url = "unix://:%s@%s" % (server.password, path)
            os.chown(path, 65534, 65534)
            store = RemoteStore(url, fleet_key, namespace=namespace, timeout=5.0)
            assert store.get(ENTRY) is None
            assert "belongs to uid 65534" in store.state
            assert server.password not in logged.warnings()[0]
            os.chmod(shared, 0o755)  # root's, but root is not the socket's owner: not "its own" directory
            store = RemoteStore(url, fleet_key, namespace=namespace, timeout=5.0)
            assert store.get(ENTRY) is None and "belongs to uid 65534" in store.state
            os.chown(shared, 65534, 65534)
            os.chmod(shared, 0o1777)  # the owner's, but others may create files in it
            store = RemoteStore(url, fleet_key, namespace=namespace, timeout=5.0)
            assert store.get(ENTRY) is None and "belongs to uid 65534" in store.state
            os.chmod(shared, 0o755)  # a directory of the server's own user: only it can have made the socket
            store = RemoteStore(url, fleet_key, namespace=namespace, timeout=5.0)
            store.put(ENTRY, b"kernel")
            assert store.get(ENTRY) == b"kernel" and store.state == "ok"
        finally:
            server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_config_file_giving_the_password_to_everyone_is_warned_about(tmp_path, monkeypatch, logged):
    from ptxbackend import config
    path = tmp_path / "config.ini"
    path.write_text(u"[ptxbackend]\nremote = redis://:s3cret@cache.plant.local:6379/0\n")
    monkeypatch.setenv("PTXBACKEND_CONFIG", str(path))
    os.chmod(str(path), 0o600)
    config.load_settings()
    assert not [w for w in logged.warnings() if "password" in w]
    os.chmod(str(path), 0o644)
    assert config.load_settings().remote.endswith("cache.plant.local:6379/0")
    warned = [w for w in logged.warnings() if "password" in w]
    assert len(warned) == 1 and "chmod 600" in warned[0] and "s3cret" not in warned[0]


# -- row 7: the password is never printed ----------------------------------------------------------------

@pytest.mark.parametrize("url", ["redis://:s3cret@127.0.0.1:9/0", "redis://127.0.0.1:9/0?password=s3cret",
                                 "redis://:p@ss#s3cret@127.0.0.1:9/0"])
@pytest.mark.parametrize("with_key", [True, False])
def test_doctor_never_prints_the_password(url, with_key, tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_REMOTE=url, PTXBACKEND_CACHE_DIR=str(tmp_path / "c"),
               PTXBACKEND_CONFIG=str(tmp_path / "none.ini"))
    (tmp_path / "none.ini").write_text(u"")
    os.chmod(str(tmp_path / "none.ini"), 0o600)
    if with_key:
        env["PTXBACKEND_REMOTE_KEY_FILE"] = private_file(tmp_path / "fleet.key", KEY32)
    for extra in ([], ["--json"]):
        run = subprocess.run([sys.executable, "-m", "ptxbackend", "doctor"] + extra, env=env, cwd=str(tmp_path),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        out = run.stdout.decode("utf-8", "replace")
        assert "s3cret" not in out and "p@ss" not in out, out
        assert "127.0.0.1" in out  # a '#' in the password is the password's, not a fragment
        if extra:
            json.loads(out[out.index("{"):])


def test_redact_url_rebuilds_from_the_parsed_parts():
    assert remote.redact_url("rediss://user:p@ss@host:6380/2?password=x&db=1") == "rediss://user:***@host:6380/2?db=1"
    assert "s3" not in remote.redact_url("redis://:s3#cret@host/0")
    assert "s3cret" not in remote.redact_url("redis://:s3cret@[::1")


# -- row 11: the documented ACL, literally ---------------------------------------------------------------

def _documented_acl():
    text = open(os.path.join(REPO, "docs", "fleet.md")).read()
    lines = re.findall(r"^\s*(ACL SETUSER .+)$", text, re.M)
    assert len(lines) == 2, lines
    return lines


#: What the documented line-PC user may run, and nothing else: no write, no EXPIRE, no script of its own.
LINE_PC_COMMANDS = {"getrange", "zrevrange", "fcall_ro", "ping"}


def _dry_run(admin, user, command, key):
    """What the server says ``user`` may do with ``command`` (ACL DRYRUN: nothing runs), with as many
    arguments as the command's arity needs (a key of the namespace first)."""
    for count in range(0, 8):
        reply = admin.results(("ACL", "DRYRUN", user, command) + (key,) * min(count, 1)
                              + ("1",) * max(0, count - 1))[0]
        if isinstance(reply, ReplyError) and "wrong number of arguments" in str(reply):
            continue
        return reply
    return None


def test_the_documented_acl_lets_a_line_pc_read_and_nothing_else(valkey, redis_module, namespace, fleet_key):
    admin = redis_module.Redis.from_url(valkey.url)
    users = {"line-pc": "lp-" + uuid.uuid4().hex, "build-box": "bb-" + uuid.uuid4().hex}
    names = {"line-pc": "line-" + namespace, "build-box": "build-" + namespace}
    try:
        for line in _documented_acl():
            for user in users:
                line = line.replace(">%s-PASSWORD" % user.upper(), ">" + users[user])
                line = re.sub(r"\b%s\b" % user, names[user], line)
            admin.execute_command(*line.replace("line-a", namespace).split())

        def url(user):
            return "redis://%s:%s@127.0.0.1:%d/0" % (names[user], users[user], valkey.port)
        build_box = RemoteStore(url("build-box"), fleet_key, namespace=namespace, timeout=5.0, ttl=60)
        with build_box.lock(ENTRY, 1) as held:
            assert held is True
            build_box.put(ENTRY, b"kernel")  # loads the working set's functions, as a build box does
        assert build_box.list() == [ENTRY] and build_box.ping() and build_box.state == "ok"

        other = ENTRY.replace("/ab/" + "ab" * 32, "/cd/" + "cd" * 32)
        build_box.put(other, b"other kernel")  # recorded in the working set (FCALL) by the build box
        line_pc = RemoteStore(url("line-pc"), fleet_key, namespace=namespace, timeout=5.0, mode="ro", ttl=60)
        assert line_pc.get(ENTRY) == b"kernel" and line_pc.ping() and line_pc.state == "ok"
        # The working set came in the lookup's own round trip, through FCALL_RO.
        assert line_pc.prefetched == 1 and line_pc.get(other) == b"other kernel" and line_pc.requests == 2

        # The same user with a store set to rw by mistake: the server refuses every write and lock.
        misused = RemoteStore(url("line-pc"), fleet_key, namespace=namespace, timeout=5.0, mode="rw", ttl=60)
        misused.put(ENTRY, b"forged")
        misused.delete(ENTRY)
        with misused.lock(ENTRY, 1) as held:
            assert held is False
        assert misused.get(ENTRY) == b"kernel" and misused.state == "ok"
        raw = resp.Client(resp.Endpoint(url("line-pc")), 5.0, 1 << 20)
        value_key, set_key = build_box.redis_key(ENTRY), namespace + ":ws:v4/nvcc-13.0.88/compute_75"
        for attempt in (("SET", build_box.lock_key(ENTRY), "x", "NX", "PX", 1000), ("SET", value_key, "x"),
                        ("DEL", value_key), ("EXPIRE", value_key, 0), ("EXPIRE", set_key, 0),
                        ("EVAL", "while true do end", 0), ("EVAL_RO", "return 1", 0),
                        ("SCRIPT", "LOAD", "return 1"),
                        ("FUNCTION", "LOAD", "#!lua name=evil\nredis.register_function('evil', function() end)"),
                        ("FCALL", workingset.TOUCH_FUNCTION, 1, set_key, 1, 4096, "x"),
                        ("ZADD", set_key, 1, "x"), ("CONFIG", "SET", "maxmemory", "1")):
            reply = raw.results(attempt)[0]
            assert isinstance(reply, ReplyError) and "NOPERM" in str(reply), (attempt, reply)
        raw.close()
        assert admin.pttl(value_key) > 0 and admin.get(value_key) is not None  # all still there

        # Every command the server knows, asked of the server itself: the line PC may run these four.
        checker = resp.Client(resp.Endpoint(valkey.url), 5.0, 1 << 20)
        allowed = set()
        for command in checker.execute(("COMMAND", "LIST"))[0]:
            reply = _dry_run(checker, names["line-pc"], command, value_key)
            if reply == b"OK":
                allowed.add(command.decode().lower())
        checker.close()
        # Each layer alone, as the server states the user's rules: only these commands, only reading keys.
        rules = admin.acl_getuser(names["line-pc"])

        def words(field):  # redis-py 4 gives one string, later ones a list
            return field.split() if isinstance(field, str) else list(field)
        granted = set(word[1:] for word in words(rules["commands"]) if word.startswith("+"))
        assert granted == LINE_PC_COMMANDS and not rules.get("selectors"), rules
        assert rules["keys"] and all(pattern.startswith("%R~") for pattern in words(rules["keys"])), rules
        # (AUTH, HELLO, QUIT and RESET: every connection's own, which no ACL takes away.)
        assert allowed <= LINE_PC_COMMANDS | {"auth", "hello", "quit", "reset"}, allowed - LINE_PC_COMMANDS
        assert LINE_PC_COMMANDS - {"ping"} <= allowed
    finally:
        for name in names.values():
            admin.execute_command("ACL", "DELUSER", name)
        admin.close()


def test_seal_is_what_a_build_box_uploads(valkey, redis_module, namespace, fleet_key):
    """The documented value format still holds over the new client."""
    store = RemoteStore(valkey.url, fleet_key, namespace=namespace, timeout=5.0)
    store.put(ENTRY, b"kernel")
    raw = redis_module.Redis.from_url(valkey.url)
    key = store.redis_key(ENTRY)
    assert raw.get(key) == seal(fleet_key, key.encode(), b"kernel")
    raw.close()


# -- issue 38 row 11: a 256 MiB value, a socket in another user's directory, passwords with / ? # ----------

_PEAK_CHILD = r"""
import hashlib, json, os, sys, tracemalloc
def high_water():  # this process's peak resident size (VmHWM: ru_maxrss would carry the parent's over exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0
sys.path.insert(0, os.environ["REPO"])
from ptxbackend.cache.remote import RemoteStore
store = RemoteStore(os.environ["URL"], bytes.fromhex(os.environ["KEY"]), namespace=os.environ["NS"], timeout=120.0)
before = high_water()
tracemalloc.start()
blob = store.get(os.environ["NAME"])
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
grown = high_water() - before
print(json.dumps({"peak": peak, "rss": grown, "size": len(blob), "sha": hashlib.sha256(blob).hexdigest()}))
"""


def test_a_256_mib_value_costs_about_256_mib_to_read(valkey, namespace, fleet_key):
    name = "driver-jit/580.159.04/NVIDIA_H200-sm90.tgz"  # the largest values a fleet holds
    blob = os.urandom(1 << 20) * (remote.MAX_VALUE >> 20)
    digest = hashlib.sha256(blob).hexdigest()
    store = RemoteStore(valkey.url, fleet_key, namespace=namespace, timeout=120.0)
    store.put(name, blob)
    del blob
    env = dict(os.environ, REPO=REPO, URL=valkey.url, KEY=fleet_key.hex(), NS=namespace, NAME=name)
    run = subprocess.run([sys.executable, "-c", _PEAK_CHILD], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    figures("256 MiB get", traced_peak_mib=round(found["peak"] / 2.0 ** 20, 1),
            rss_growth_mib=round(found["rss"] / 2.0 ** 20, 1))
    assert found["size"] == remote.MAX_VALUE and found["sha"] == digest
    # One buffer of the value's size, read into in place (before: 791 MiB, three copies at once).
    assert found["peak"] < 1.3 * remote.MAX_VALUE, found
    assert found["rss"] < 1.6 * remote.MAX_VALUE, found
    store.delete(name)


def _listening_socket(path):
    import socket
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    listener.setblocking(False)
    return listener


def _accepted(listener):
    """What a client sent on a connection it made, or ``None`` when none was made."""
    import socket
    try:
        connection = listener.accept()[0]
    except (BlockingIOError, socket.timeout):
        return None
    connection.settimeout(2.0)
    try:
        return connection.recv(4096)
    finally:
        connection.close()


@pytest.mark.parametrize("how", ["made by another user", "writable by others"])
def test_a_socket_in_a_directory_another_user_controls_gets_no_password(how, fleet_key, tmp_path):
    """Our own (root's) socket, so the owner check passes, in a directory another user created or
    may write to: whoever controls the directory could swap in their own socket, so nothing is sent."""
    _root_only()
    base = tempfile.mkdtemp(prefix="ptxd", dir="/tmp")
    try:
        directory = os.path.join(base, "sockets")
        os.mkdir(directory)
        path = os.path.join(directory, "v.sock")
        listener = _listening_socket(path)
        try:
            url = "unix://:s3cret-password@%s" % path
            os.chmod(directory, 0o755)  # the same directory, ours: the password goes (the input is valid)
            store = RemoteStore(url, fleet_key, timeout=0.5)
            store.get(ENTRY)
            assert b"s3cret-password" in (_accepted(listener) or b"")
            if how == "made by another user":
                os.chown(directory, 65534, 65534)
            else:
                os.chmod(directory, 0o777)
            store = RemoteStore(url, fleet_key, timeout=0.5)
            assert store.get(ENTRY) is None
            assert _accepted(listener) is None  # no connection at all: no AUTH, no password
            assert "which belongs to uid 65534" in store.state or "others can write" in store.state
        finally:
            listener.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("password", ["Kq7/Zw3", "Kq7?Zw3", "Kq7#Zw3", "Kq7@Vx/Zw3?Pm8#Rt5"])
@pytest.mark.parametrize("encoded", [False, True])
def test_a_url_password_with_slash_question_mark_or_hash_is_parsed_and_never_printed(password, encoded, valkey,
                                                                                     redis_module, tmp_path):
    """As a user writes it (raw) or percent-encoded: it logs in as that password, and neither doctor,
    cache info nor the store's warning line shows any piece of it."""
    from urllib.parse import quote
    user = "pw-" + uuid.uuid4().hex[:8]
    admin = redis_module.Redis.from_url(valkey.url)
    admin.execute_command("ACL", "SETUSER", user, "on", ">" + password, "~*", "+@all")
    written = quote(password, safe="") if encoded else password
    pieces = set(re.split(r"[/?#@]", password)) | {password, written}
    try:
        url = "redis://%s:%s@127.0.0.1:%d/0" % (user, written, valkey.port)
        assert resp.Endpoint(url).password == password and resp.Endpoint(url).host == "127.0.0.1"
        store = RemoteStore(url, KEY32, timeout=5.0)
        assert store.ping() and store.state == "ok"
        assert not [piece for piece in pieces if piece in store.description], store.description
        # The warning line and doctor, when the server refuses: the same password with one more character.
        env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_REMOTE=url.replace(written, written + "x"),
                   PTXBACKEND_CACHE_DIR=str(tmp_path / "c"), PTXBACKEND_CONFIG=str(tmp_path / "none.ini"),
                   PTXBACKEND_REMOTE_KEY_FILE=private_file(tmp_path / "fleet.key", KEY32))
        (tmp_path / "none.ini").write_text(u"")
        os.chmod(str(tmp_path / "none.ini"), 0o600)
        for args in (["doctor"], ["doctor", "--json"], ["cache", "info"]):
            run = subprocess.run([sys.executable, "-m", "ptxbackend"] + args, env=env, cwd=str(tmp_path),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
            out = run.stdout.decode("utf-8", "replace")
            assert "127.0.0.1:%d" % valkey.port in out, out
            assert not [piece for piece in pieces if piece in out], out
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


# -- issue 38 row 12: checks no test failed without ---------------------------------------------------------

def test_a_fleet_lock_copied_under_another_kernels_name_is_not_waited_for(store_and_raw, fleet_key):
    """A live, validly signed lock of one kernel, copied to another kernel's lock key: the MAC covers
    the lock's name, so it does not verify there."""
    store, raw = store_and_raw
    other = ENTRY.replace("/ab/" + "ab" * 32, "/cd/" + "cd" * 32)
    genuine = _signed(fleet_key, store.lock_key(other), time.time() * 1000)
    _not_waited_for(store, genuine, raw)
    # The same value under its own name is a lock of this fleet, waited for (the input is valid).
    raw.set(store.lock_key(other), genuine, px=60000)
    with store.lock(other, 0.3) as held:
        assert held is False
    assert store.stats()["entry"]["rejected"] == 1


def test_replies_nested_deeper_than_the_bound_are_a_fault(fleet_key, logged):
    deep = b"*1\r\n" * 3 + b"$1\r\nx\r\n"
    with FakeServer(lambda command: deep) as server:
        client = resp.Client(resp.Endpoint(server.url), 2.0, 1 << 20)
        with pytest.raises(resp.Fault, match="nested deeper than 2"):
            client.execute(("ZREVRANGE", "k", 0, 1))
    # Two levels (a SCAN page) are read (the input is otherwise the same).
    with FakeServer(lambda command: b"*1\r\n" * 2 + b"$1\r\nx\r\n") as server:
        assert resp.Client(resp.Endpoint(server.url), 2.0, 1 << 20).execute(("ZREVRANGE", "k", 0, 1)) == [[[b"x"]]]


def _answers(value, later):
    """A fake server's answers: the working set's fetch as a server gives it, the first GETRANGE
    ``value`` alone, every later one ``later(value)``."""
    asked = []

    def answer(command):
        if command[0] != b"GETRANGE":
            return b"*0\r\n"
        asked.append(command)
        return value if len(asked) == 1 else later(value)
    return answer


@pytest.mark.parametrize("when", ["with the reply", "after it"])
def test_a_surplus_after_a_lone_reply_is_found_before_the_connection_is_used_again(fleet_key, logged, when):
    """One command, one reply, then bytes nobody asked for: in the same packet (seen at once), or a
    moment later (seen before the next request, which would otherwise read them as its answer)."""
    redis_key = "ptxbackend:v4/" + ENTRY
    kernel = b"kernel" * (resp.BIG_BULK // 3)  # read to its end straight off the socket, no further
    value = bulk(seal(fleet_key, redis_key.encode(), kernel))
    extra = bulk(seal(fleet_key, redis_key.encode(), b"not asked for"))
    later = (lambda v: v + extra) if when == "with the reply" else (lambda v: [v, extra])
    with FakeServer(_answers(value, later), delay=0.0 if when == "with the reply" else 0.2) as server:
        store = RemoteStore(server.url, fleet_key, timeout=2.0, mode="ro")
        assert store.get(ENTRY) == kernel  # with the working set's fetch
        second = store.get(ENTRY)  # GETRANGE alone
        if when == "with the reply":
            assert second is None
        else:
            assert second == kernel
            time.sleep(0.6)
            assert store.get(ENTRY) is None
        assert "more than was asked for" in store.state, store.state


def test_a_pipelined_reply_of_another_kind_than_its_command_gives_faults_the_whole_pipeline(fleet_key, logged):
    """The working set's fetch answered with a string: a reply shifted from another request, so the
    request's own reply before it cannot be trusted to be its own either."""
    redis_key = "ptxbackend:v4/" + ENTRY
    value = bulk(seal(fleet_key, redis_key.encode(), b"kernel"))
    with FakeServer(lambda command: value if command[0] == b"GETRANGE" else bulk(b"shifted")) as server:
        store = RemoteStore(server.url, fleet_key, timeout=2.0, mode="ro")
        assert store.get(ENTRY) is None
        assert "out of step" in store.state and "FCALL_RO answered with" in store.state, store.state


def test_a_reply_with_more_than_was_asked_for_is_a_fault_not_a_value(fleet_key, logged):
    """A valid sealed value followed by a reply nobody asked for: the connection is out of step (the
    next request would read that reply as its own), so the value is not taken and the store faults."""
    redis_key = "ptxbackend:v4/" + ENTRY
    value = bulk(seal(fleet_key, redis_key.encode(), b"kernel"))
    with FakeServer(lambda command: value + bulk(b"an answer to a question not asked")) as server:
        store = RemoteStore(server.url, fleet_key, timeout=2.0, mode="ro")
        # The surplus is found where it lies: after the last reply, or read as a later command's reply.
        assert store.get(ENTRY) is None
        assert "more than was asked for" in store.state or "out of step" in store.state, store.state
    # The same value alone (and the working set's fetch answered as a server does): a hit.
    with FakeServer(lambda command: value if command[0] == b"GETRANGE" else b"*0\r\n") as server:
        assert RemoteStore(server.url, fleet_key, timeout=2.0, mode="ro").get(ENTRY) == b"kernel"

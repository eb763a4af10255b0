"""The fleet store: one Valkey/Redis server shared by the machines of a fleet.

A build box compiles a kernel once and every line PC of the fleet loads it
from here instead of compiling it again.  Three properties matter more than
speed, because a fleet cache is a remote, shared, writable place:

* **Authenticated values.**  Whoever can write to the server could otherwise
  hand every machine a kernel of their choosing.  Each value is::

      b"PTXBR1" + HMAC-SHA256(fleet key, b"ptxbackend-remote-1\\0" + redis key + b"\\0" + blob) + blob

  The redis key (namespace and schema version included) is inside the MAC, so a
  value copied under another name or into another namespace fails its check.
  A value that fails is a miss (counted as ``rejected``), never returned.

* **Fail-open, bounded, half-open.**  A connection error, timeout or refusal
  (wrong password ...) opens the breaker: one warning, then every call returns
  at once without touching the network, and the program goes on with its local
  cache.  Unlike ccache's remote storage (or PyTorch's Redis cache) the store is
  not given up for the process's life: one call at most every ``remote_retry``
  seconds (30 s by default) is let through as a probe, so a restarted server is
  used again without restarting the program.  A dead server costs at most one
  timeout per probe (``remote_timeout``, 0.25 s by default, one deadline for a
  whole operation, connecting included; no retries), and every request, probes
  included, counts against ``remote_budget`` seconds per process: a store
  turned off by its budget stays off.  Every reply is bounded before it is read
  (:mod:`.resp`); a reply of the wrong type is a fault like a timeout.
  Nothing here raises from ``get``/``put``/``delete``/``lock``.

* **Authenticated locks.**  A fleet-wide compile lock's value carries an
  HMAC under the fleet key over the lock's name, its token and when it was
  taken: a lock planted by anyone without the key (or a server answering nil
  to every ``SET NX``) is ignored, and the machine compiles at once.

* **Lazy.**  Opening the store reads its key file but does not connect: a
  program whose kernels all hit locally never talks to the server.

* **One round trip for a new machine.**  A process's first lookup in a group
  (compiler/target[/GPU]) brings the fleet's working set of that group in the
  same pipeline (:mod:`.workingset`); each value authenticates before it is
  kept in memory, and a later lookup takes it from there.

* **Read-only means read-only.**  A ``ro`` store sends reads only: no write, no
  ``EXPIRE``, no script.  The working set comes through a server function an
  ``rw`` machine loads (``FUNCTION LOAD``) and every machine calls with
  ``FCALL_RO``, so a line PC's server user needs no script rights at all.

Keys on the server are ``<namespace>:v<schema>/<name>`` for values and
``<namespace>:lock:v<schema>/<name>`` for the fleet-wide compile locks, so one server
can hold several fleets and schema versions side by side.  Eviction is the
server's: run it with ``maxmemory`` and ``maxmemory-policy allkeys-lru``.
"""

import atexit
import contextlib
import errno
import hashlib
import hmac
import importlib
import importlib.util
import logging
import os
import re
import secrets
import stat as stat_module
import threading
import time

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from . import resp, workingset
from .base import Store
from .store import KIND_SUFFIXES, LAYOUT

log = logging.getLogger("ptxbackend")

MAGIC = b"PTXBR1"
_MAC_CONTEXT = b"ptxbackend-remote-1\0"
_LOCK_CONTEXT = b"ptxbackend-lock-1\0"
_MAC_SIZE = hashlib.sha256().digest_size
HEADER_SIZE = len(MAGIC) + _MAC_SIZE
#: The largest blob stored or accepted: a value the server sends is read only
#: up to this bound (GETRANGE), so a planted giant value costs no memory.
MAX_VALUE = 256 << 20
MIN_KEY_SIZE = 16
#: Seconds of requests a process may spend on the fleet store (PTXBACKEND_REMOTE_BUDGET).
DEFAULT_BUDGET = 10.0
#: A fleet key with fewer distinct bytes than this is no random key (16 spaces, "aaaa...").
MIN_KEY_DISTINCT = 8
_MAX_KEY_FILE = 64 << 10
SCHEMES = ("redis", "rediss", "unix")
LEVELS = ("entry", "jit", "other")
COUNTS = ("hits", "misses", "rejected", "errors", "puts")
_TRUE = ("yes", "1", "true", "on")
_FALSE = ("no", "0", "false", "off", "")
# ':' would let one namespace's value keys collide with another's lock keys;
# glob characters would break list()'s SCAN pattern.
_NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENTRY_SUFFIXES = tuple("." + kind for kind in KIND_SUFFIXES)
# Deletes the lock only if it still holds our value: a lock that expired and
# was taken by another machine is theirs now.
_RELEASE = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
            "return redis.call('del', KEYS[1]) else return 0 end")
# Renews the lock (a new stamp and MAC, the expiry again) only while it still holds our value.
_RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
          "return redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) else return 0 end")
# Lock values: <token hex>.<taken, ms since the epoch>.<HMAC hex>; nothing else is a lock of ours.
_LOCK_VALUE = re.compile(br"^([0-9a-f]{32})\.([0-9]{1,15})\.([0-9a-f]{64})$")
#: How far another machine's clock may be ahead of ours when it stamps a lock (seconds).
_CLOCK_SKEW = 30.0
_SKIP = object()  # "no answer": the store is off, or the call just failed
#: Seconds between probes of a failed store (PTXBACKEND_REMOTE_RETRY); 0: never again in this process.
DEFAULT_RETRY = 30.0

# Warnings given at most once per process (a bad fleet key rejects every value).
_warned = set()


def _level(name):
    if "/jit/" in name:
        return "jit"
    if name.endswith(_ENTRY_SUFFIXES):
        return "entry"
    return "other"


def _mac(key, redis_key, blob):
    mac = hmac.new(key, _MAC_CONTEXT, hashlib.sha256)
    mac.update(redis_key)
    mac.update(b"\0")
    mac.update(blob)
    return mac.digest()


def seal(key, redis_key, blob):
    """The value stored for ``blob`` under ``redis_key`` (bytes): magic, MAC, blob."""
    return b"".join((MAGIC, _mac(key, redis_key, blob), blob))


def redact_url(url):
    """``url`` without its password (in the user part or as a ``password=`` query argument).

    Rebuilt from the parsed parts rather than cut at an ``@``: a password holding ``@``, ``#`` or
    ``/`` cannot leak a piece of itself, and a URL that does not parse is not echoed at all.
    """
    try:
        parts = urlsplit(resp.normalize_url(url))
        host = parts.hostname or ""
        port = parts.port
        user = parts.username
        password = parts.password
    except ValueError:
        return "(a fleet store URL that does not parse)"
    netloc = ("[%s]" % host if ":" in host else host) + (":%d" % port if port else "")
    if user or password:
        netloc = "%s%s@%s" % (user or "", ":***" if password else "", netloc)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if "pass" not in k.lower()]
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), ""))


def _split_cluster(url):
    """``(url without the cluster argument, whether it asked for Redis Cluster)``."""
    parts = urlsplit(url)
    cluster = False
    kept = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name.lower() != "cluster":
            kept.append((name, value))
            continue
        word = value.strip().lower()
        if word in _TRUE:
            cluster = True
        elif word not in _FALSE:
            raise ValueError("the fleet store URL %s has cluster=%s: write cluster=yes or leave it out"
                             % (redact_url(url), value))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept), parts.fragment)), cluster


def _explain(exc):
    """One line for the log and ``stats()``: what went wrong, in words where we know them."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    lowered = text.lower()
    if any(word in lowered for word in ("wrongpass", "invalid username-password", "noauth",
                                        "authentication required", "already authenticated",
                                        "invalid password")):
        return "the server refused the password (%s: %s)" % (type(exc).__name__, text)
    if isinstance(exc, resp.Fault):
        return text  # already says what failed, in words
    return "%s: %s" % (type(exc).__name__, text)


def _write_refused(exc):
    """A write the server refuses while it keeps serving reads (full with noeviction, a replica,
    an ACL user without write rights)."""
    text = str(exc).lstrip()
    name = type(exc).__name__
    return (name in ("OutOfMemoryError", "ReadOnlyError", "NoPermissionError")
            or text.startswith(("OOM", "READONLY", "NOPERM", "command not allowed when used memory")))


def _string(reply):
    """``reply`` if it is a string (bytes); a hostile server's integer or array is a fault."""
    if not isinstance(reply, (bytes, bytearray)):  # bytearray: a large value (resp.BIG_BULK)
        raise resp.Fault("the server answered %s where a string was expected" % type(reply).__name__)
    return reply


#: What each command of a pipeline is answered with while the connection is in step (an error reply
#: fits any): a reply of another kind is the answer to some other request.
_REPLY_KINDS = {"GETRANGE": (bytes, bytearray), "SET": (bytes,), "EXPIRE": (int,), "FUNCTION": (bytes,),
                "FCALL_RO": (list,), "ZREVRANGE": (list,)}


def _main(replies, string=False, commands=()):
    """``replies`` whose first (the request itself) must have succeeded (and be a ``string``, when
    asked); the others are the working set's upkeep, which may fail alone (a full server refusing
    ZADD) without failing the request.  With ``commands``, a reply of the wrong kind for its command
    faults the whole pipeline: a surplus reply read as the next one's answer shifts every later one."""
    if isinstance(replies[0], resp.ReplyError):
        raise replies[0]
    if string:
        _string(replies[0])
    for command, reply in zip(commands[1:], replies[1:]):
        kind = _REPLY_KINDS.get(command[0])
        if kind is not None and not isinstance(reply, kind + (resp.ReplyError,)):
            raise resp.Fault("the server's replies are out of step with the requests (%s answered with %s)"
                             % (command[0], type(reply).__name__))
    return replies


def _lock_mac(key, lock_key, token, taken):
    mac = hmac.new(key, _LOCK_CONTEXT, hashlib.sha256)
    mac.update(lock_key)
    mac.update(b"\0" + token + b"\0" + taken)
    return mac.hexdigest().encode("ascii")


class RemoteStore(Store):
    """A :class:`~ptxbackend.cache.base.Store` on a Valkey/Redis server; see the module's doc."""

    writable = True

    def __init__(self, url, key, mode="rw", timeout=0.25, namespace="ptxbackend", password=None,
                 ttl=0, lock_expiry=120.0, budget=DEFAULT_BUDGET, retry=DEFAULT_RETRY):
        scheme = urlsplit(url).scheme.lower()
        if scheme not in SCHEMES:
            raise ValueError("the fleet store URL %s has scheme %r: use redis://, rediss:// (TLS) or unix://"
                             % (redact_url(url), scheme))
        if mode not in ("rw", "ro"):
            raise ValueError("the fleet store mode is %r: write rw or ro" % (mode,))
        if not isinstance(key, bytes) or not key:
            raise ValueError("the fleet key must be non-empty bytes")
        if not _NAMESPACE.match(namespace or ""):
            raise ValueError("the fleet store namespace %r is not allowed: use letters, digits, '.', '_' "
                             "and '-' (at most 64)" % (namespace,))
        if not timeout or timeout <= 0:
            raise ValueError("the fleet store timeout must be a positive number of seconds, not %r" % (timeout,))
        url = resp.normalize_url(url)  # a raw '/', '?' or '#' in the password: still the password
        self._url, self._cluster = _split_cluster(url)
        self._endpoint = resp.Endpoint(url, password)  # refuses query arguments that loosen anything
        self._key = key
        self.mode = mode
        self.writable = mode == "rw"
        self.timeout = float(timeout)
        #: Seconds of requests this process may spend on the server; past them the store turns off.
        self.budget = float(budget) if budget else None
        self.spent = 0.0
        #: Seconds between probes once the breaker is open (None: it stays open).
        self.retry = float(retry) if retry and float(retry) > 0 else None
        self.namespace = namespace
        self.ttl = int(-(-float(ttl or 0) // 1))  # whole seconds, rounded up: EX takes an integer
        self.lock_expiry = float(lock_expiry)
        self.url = redact_url(url)
        self.description = "fleet store %s (namespace %s, mode %s)" % (self.url, namespace, mode)
        self._prefix = "%s:%s/" % (namespace, LAYOUT)
        self._lock_prefix = "%s:lock:%s/" % (namespace, LAYOUT)
        self._set_prefix = "%s:ws:%s/" % (namespace, LAYOUT)
        #: The working set's values taken and verified, until a lookup asks for them (name -> blob).
        self._memory = {}
        self._fetched = set()  # groups whose working set this process asked for
        self._recent_group = None  # the group a dependency set's use is recorded in
        self._used = []  # (group, name) served from memory, recorded with the next request
        #: Whether the server has the working set's function library (None: not known yet).  A cluster
        #: never uses it (the set and the values live on different slots).
        self._functions = False if self._cluster else None
        self._load_sent = False  # this process (rw) asked the server to load the library
        self._exit_registered = False
        #: Values the working set brought in and that verified.
        self.prefetched = 0
        self._client = None
        self._failed = None
        self._failed_at = 0.0  # monotonic time of the last failure or probe
        self._final = False  # the budget ran out: no probe can bring the store back
        self._connected = False
        self._guard = threading.Lock()
        self._io = threading.Lock()  # one connection: one request at a time
        self._counts = dict((level, dict((name, 0) for name in COUNTS)) for level in LEVELS)
        #: Requests sent to the server (each lock poll, each get ...): stays put once the store is off.
        self.requests = 0

    # -- the connection and the circuit breaker ------------------------------------------------------

    #: Whether the first failure is a warning: a command that reports the failure itself turns it off.
    report_failures = True

    def _make_client(self):
        if not self._cluster:
            return resp.Client(self._endpoint, self.timeout, HEADER_SIZE + MAX_VALUE + 1)
        from .cluster import ClusterClient
        self.requests += 1  # a cluster client asks for the slot map as it is built
        return ClusterClient(self._url, self._endpoint, self.timeout)

    def _fail(self, exc, level, final=False, quiet=False):
        with self._guard:
            self._count(level, "errors")
            self._failed_at = time.monotonic()
            self._final = self._final or final
            client, self._client = self._client, None
            first = self._failed is None
            if first:
                self._failed = _explain(exc)
        if not first or quiet or not self.report_failures:
            log.debug("ptxbackend: the fleet store at %s is unusable (%s)", self.url, _explain(exc))
        elif self.retry is None or self._final:
            log.warning("ptxbackend: the fleet store at %s failed (%s); this program continues with its "
                        "local cache only and does not use the fleet store again until it restarts",
                        self.url, self._failed)
        else:
            log.warning("ptxbackend: the fleet store at %s failed (%s); this program continues with its "
                        "local cache only and tries the fleet store again at most every %g s",
                        self.url, self._failed, self.retry)
        try:
            if client is not None:
                client.close()
        except Exception:  # closing a dead connection may fail too; nothing to do about it
            pass

    def _off(self):
        """Whether the breaker is open and no probe is due: the caller returns at once."""
        if self._failed is None:
            return False
        return (self._final or self.retry is None
                or time.monotonic() - self._failed_at < self.retry)

    def _admit(self):
        """Whether a call may go to the server now: the breaker is closed, or this call is the one
        probe of the interval (claimed under the guard, so concurrent callers do not all probe)."""
        if self._failed is None:
            return True
        with self._guard:
            if self._off():
                return False
            self._failed_at = time.monotonic()
            return True

    def _recovered(self):
        with self._guard:
            was, self._failed = self._failed, None
        if was is not None:
            log.warning("ptxbackend: the fleet store at %s answers again; this program uses it again", self.url)

    def _call(self, level, operation, write=False, quiet=False):
        """``operation(client)``'s result, or ``_SKIP`` when the store is off or the call failed."""
        if not self._admit():
            return _SKIP
        started = None
        try:
            with self._io:
                started = time.monotonic()  # waiting for another thread's request is not the server's time
                if self._client is None:
                    self._client = self._make_client()
                client = self._client
                if client is None:
                    return _SKIP
                self.requests += 1
                result = operation(client)
        except Exception as exc:  # the store must never raise into a compile
            self._charge(started, level)
            if write and _write_refused(exc):
                with self._guard:
                    self._count(level, "errors")
                if self._failed is not None:
                    self._recovered()  # it answered: reachable again, only this write was refused
                log.debug("ptxbackend: the fleet store refused a write (%s)", _explain(exc))
                return _SKIP
            self._fail(exc, level, quiet=quiet)
            return _SKIP
        self._connected = True
        if self._failed is not None:
            self._recovered()
        self._charge(started, level)
        return result

    def _charge(self, started, level):
        """Count an operation's time against the budget; past it, the store turns off."""
        if started is None:
            return
        self.spent += time.monotonic() - started
        if self.budget is not None and self.spent > self.budget and not self._final:
            self._fail(resp.Fault("this process spent %.1f s waiting for it, over its budget of %.1f s "
                                  "(PTXBACKEND_REMOTE_BUDGET): it is too slow" % (self.spent, self.budget)),
                       level, final=True)

    @contextlib.contextmanager
    def unbudgeted(self):
        """A bulk job (``cache push``) that is meant to take long: no budget while it runs."""
        budget, self.budget = self.budget, None
        try:
            yield
        finally:
            self.budget = budget

    def _count(self, level, name):
        self._counts[level][name] += 1

    def _bump(self, level, name):
        with self._guard:
            self._count(level, name)

    def _reject(self, level, redis_key, why):
        self._bump(level, "rejected")
        if "rejected" in _warned:
            log.debug("ptxbackend: fleet store value %s ignored: %s", redis_key, why)
            return
        _warned.add("rejected")
        log.warning("ptxbackend: fleet store value %s ignored: %s; it is treated as a miss (further "
                    "rejected values are logged at debug level)", redis_key, why)

    # -- the Store interface ---------------------------------------------------------------------------

    def redis_key(self, name):
        """The key on the server that holds ``name`` (it is inside the value's MAC)."""
        return self._prefix + name

    def lock_key(self, name):
        """The key on the server of ``name``'s fleet-wide compile lock."""
        return self._lock_prefix + name

    def get(self, name):
        level = _level(name)
        group = self._group(name)
        if self._memory:
            with self._guard:
                held = self._memory.pop(name, None)
                if held is not None:
                    self._count(level, "hits")
                    if self.writable and group is not None and len(self._used) < workingset.FETCH_COUNT:
                        if not self._used and not self._exit_registered:
                            self._exit_registered = True
                            atexit.register(self.record_uses)
                        self._used.append((group, name))
            if held is not None:
                return held
        redis_key = self._prefix + name
        # One byte past the bound: a longer answer is refused without ever reading it all.
        commands = [("GETRANGE", redis_key, 0, HEADER_SIZE + MAX_VALUE)]
        if self.ttl and self.writable:
            # A hit keeps the value alive (a miss: no-op).  Not from a read-only line PC: its server
            # user has no EXPIRE, which would let it expire every value of the fleet at once.
            commands.append(("EXPIRE", redis_key, self.ttl))
        load_at = self._add_load(commands)
        fetch = self._claim_fetch(group)
        fetch_at = len(commands)
        if fetch is not None:
            commands.append(self._fetch_command(fetch))
        touch_at = len(commands)
        touches, used = self._touches(name, group)
        commands.extend(touches)
        replies = self._call(level, lambda client: _main(client.results(*commands), True, commands))
        if replies is _SKIP:
            if fetch is not None:
                self._fetched.discard(group)  # asked again once the store answers
            self._load_failed(load_at)
            return None
        self._upkeep(commands, replies, load_at, touch_at, used)
        if fetch is not None:
            self._take_working_set(name, fetch, commands[fetch_at], replies[fetch_at])
        return self._verify(level, redis_key, replies[0])

    def record_uses(self):
        """Record the uses served from memory that no request carried yet (at exit: a program whose
        every kernel came from the working set still refreshes their place in it): one command per
        group, whatever the number of kernels."""
        if not self._used or self._off():
            return
        commands = []
        load_at = self._add_load(commands)
        touches, used = self._touches(None, None)
        if touches:
            commands.extend(touches)
            # At exit: a server gone by then is not worth a warning the program's user would see last.
            replies = self._call("other", lambda client: client.results(*commands), write=True, quiet=True)
            if replies is _SKIP:
                self._load_failed(load_at)
            else:
                self._upkeep(commands, replies, load_at, len(commands) - len(touches), used)

    # -- the server's function library (workingset.LIBRARY) ---------------------------------------------

    def _add_load(self, commands):
        """Append the library's FUNCTION LOAD to ``commands`` once per rw process, before the first
        call of it (pipelined: no round trip of its own); its index, or ``None``.  Read-only line PCs
        never load anything: their server user may not."""
        if not self.writable or self._functions is not None:
            return None
        with self._guard:
            if self._load_sent:
                return None
            self._load_sent = True
        commands.append(("FUNCTION", "LOAD", workingset.LIBRARY))
        return len(commands) - 1

    def _load_failed(self, load_at):
        if load_at is not None:
            self._load_sent = False  # the request did not go through: the next one asks again

    def _upkeep(self, commands, replies, load_at, touch_at, used):
        """Learn from the library's load whether the server has it, and record again, as plain
        commands, uses whose FCALL the server refused (no library: Redis 6, or an ACL without it)."""
        if load_at is not None:
            reply = replies[load_at]
            # "already exists": loaded by another process (the name carries the version).
            self._functions = (isinstance(reply, bytes) or (isinstance(reply, resp.ReplyError)
                                                            and "already exists" in str(reply)))
            if not self._functions:
                log.debug("ptxbackend: the fleet store did not load the working set's functions: %s", reply)
        refused = [index for index in range(touch_at, len(commands))
                   if commands[index][0] == "FCALL" and isinstance(replies[index], resp.ReplyError)]
        if refused:
            self._functions = False
            with self._guard:
                self._used = used + self._used
            self.record_uses()

    def _group(self, name):
        group = workingset.group_of(name)
        if group is not None:
            self._recent_group = group
            return group
        return self._recent_group if name.startswith("depsets/") else None

    def _claim_fetch(self, group):
        """The set key to fetch with this request, once per group and process; else ``None``."""
        if group is None:
            return None
        with self._guard:
            if group in self._fetched:
                return None
            self._fetched.add(group)
        return self._set_prefix + group

    def _touches(self, name, group, companions=()):
        """``(commands, uses)``: the commands recording this use (and of ``companions``, in the same
        group) and those served from memory since the last request, one command per group where the
        server has the library (rw only: a read-only line PC writes nothing)."""
        if not self.writable:
            return [], []
        with self._guard:
            used, self._used = self._used, []
        if group is not None:
            used.append((group, name))
            used.extend((group, companion) for companion in companions)
        now = int(time.time() * 1000)
        by_group = {}
        for used_group, used_name in used:
            by_group.setdefault(used_group, []).append(used_name)
        functions = self._functions is not False  # unknown: the load is in this same pipeline
        commands = []
        for used_group in sorted(by_group):
            commands.extend(workingset.touch(self._set_prefix + used_group, by_group[used_group], now, functions))
        return commands, used

    def _fetch_command(self, set_key):
        """The command that fetches a working set: its names and values through the library's
        read-only function, or only its names (a cluster, or a server without the library)."""
        if self._functions is False:
            return ("ZREVRANGE", set_key, 0, workingset.FETCH_COUNT - 1)
        return ("FCALL_RO", workingset.FETCH_FUNCTION, 1, set_key, self._prefix, workingset.FETCH_COUNT,
                workingset.FETCH_BYTES, HEADER_SIZE + MAX_VALUE)

    def _take_working_set(self, name, set_key, command, reply):
        """Keep the working set's values that verify until a lookup asks for them."""
        for member, blob in self._working_set_values(set_key, command, reply, skip=name):
            with self._guard:
                self._memory[member] = blob

    def fetch_working_set(self, group):
        """``[(name, blob)]``: the working set of ``group`` whose values authenticate (the caller makes
        the entry checks); ``[]`` when the store is off.  One round trip on one server with the
        library (``warm --from-fleet``)."""
        set_key = self._set_prefix + group
        commands = []
        load_at = self._add_load(commands)
        commands.append(self._fetch_command(set_key))
        replies = self._call("other", lambda client: client.results(*commands))
        if replies is _SKIP:
            self._load_failed(load_at)
            return []
        self._upkeep(commands, replies, load_at, len(commands), [])
        return self._working_set_values(set_key, commands[-1], replies[-1])

    def _working_set_values(self, set_key, command, reply, skip=None):
        if command[0] == "FCALL_RO" and isinstance(reply, resp.ReplyError):
            # No library (Redis 6, not loaded yet by a build box, an ACL without FCALL_RO): the names,
            # then their values, in two round trips from here on.
            log.debug("ptxbackend: the fleet store's working-set function did not answer (%s); "
                      "fetching the names, then the values", reply)
            self._functions = False
            command = self._fetch_command(set_key)
            reply = self._call("other", lambda client: client.results(command)[0])
            if reply is _SKIP:
                return []
        if isinstance(reply, resp.ReplyError):
            log.debug("ptxbackend: the fleet store did not send the working set: %s", reply)
            return []
        if command[0] == "ZREVRANGE":
            names = [member for member in reply if workingset.valid_name(member)
                     and member.decode("ascii") != skip] if isinstance(reply, list) else []
            # Per key: a cluster keeps them on any slot.
            commands = [("GETRANGE", self._prefix + member.decode("ascii"), 0, HEADER_SIZE + MAX_VALUE)
                        for member in names]
            values = self._call("other", lambda client: client.results(*commands)) if commands else []
            if values is _SKIP:
                return []
            reply = [item for pair in zip(names, values) for item in pair]
        found = []
        for member, raw in workingset.pairs(reply):
            if not raw or member == skip:  # skip: the lookup that fetched the set read its own value
                continue
            blob = self._verify(_level(member), self._prefix + member, raw, count_hit=False)
            if blob is not None:
                found.append((member, blob))
                self.prefetched += 1
        return found

    def _verify(self, level, redis_key, raw, count_hit=True):
        """The blob inside ``raw`` (what GETRANGE sent for ``redis_key``) if it authenticates, else ``None``.

        A large value arrives as a ``bytearray`` (:data:`.resp.BIG_BULK`) and is handed on as one,
        its header cut off in place: no second copy of a value that may be 256 MiB.
        """
        if not isinstance(raw, (bytes, bytearray)):
            self._reject(level, redis_key, "the server sent something else than a value")
            return None
        if not raw:  # GETRANGE answers b"" for an absent key
            self._bump(level, "misses")
            return None
        if len(raw) > HEADER_SIZE + MAX_VALUE:
            self._reject(level, redis_key, "it is larger than %d MiB, more than ptxbackend ever stores: it "
                                           "was tampered with" % (MAX_VALUE >> 20))
            return None
        if len(raw) < HEADER_SIZE or raw[:len(MAGIC)] != MAGIC:
            self._reject(level, redis_key, "it is not a ptxbackend fleet value of this version (too short, "
                                           "or another magic): another program wrote it, or it was tampered "
                                           "with")
            return None
        view = memoryview(raw)
        try:
            expected = _mac(self._key, redis_key.encode("utf-8"), view[HEADER_SIZE:])
        finally:
            view.release()
        if not hmac.compare_digest(expected, bytes(raw[len(MAGIC):HEADER_SIZE])):
            self._reject(level, redis_key, "its authentication code does not match: the fleet key differs "
                                           "from the one that stored it, or the value was tampered with")
            return None
        if count_hit:
            self._bump(level, "hits")
        if isinstance(raw, bytearray):
            del raw[:HEADER_SIZE]  # in place: CPython moves the start, it copies nothing
            return raw
        return raw[HEADER_SIZE:]

    def put(self, name, blob, companions=()):
        """Store ``blob`` under ``name``; ``companions``: names a reader of ``name`` needs too (its
        dependency set), recorded in ``name``'s working set in the same request, so that a new
        machine's one fetch of that group brings them (the set of a JIT cubin's group included)."""
        if not self.writable or self._off():
            return
        level = _level(name)
        blob = bytes(blob)
        redis_key = self._prefix + name
        if len(blob) > MAX_VALUE:
            self._reject(level, redis_key, "it is larger than %d MiB, so it is not stored" % (MAX_VALUE >> 20))
            return
        command = ("SET", redis_key, seal(self._key, redis_key.encode("utf-8"), blob))
        if self.ttl:
            command += ("EX", self.ttl)
        commands = [command]
        load_at = self._add_load(commands)
        touch_at = len(commands)
        touches, used = self._touches(name, self._group(name), companions)
        commands.extend(touches)
        replies = self._call(level, lambda client: _main(client.results(*commands), False, commands),
                             write=True)
        if replies is _SKIP:
            self._load_failed(load_at)
            return
        self._bump(level, "puts")
        self._upkeep(commands, replies, load_at, touch_at, used)

    def delete(self, name):
        if not self.writable or self._off():
            return
        redis_key = self._prefix + name
        self._call(_level(name), lambda client: client.execute(("DEL", redis_key)), write=True)

    @contextlib.contextmanager
    def lock(self, name, timeout):
        """A fleet-wide lock on ``name``: one machine compiles, the others wait for its upload.

        Held for at most ``lock_expiry`` seconds (a holder that dies frees it then); waits at most
        ``timeout`` seconds for a lock that verifies, then yields ``False`` and the caller compiles
        anyway.  A lock that does not verify (no fleet key behind it) is not waited for.
        """
        if not self.writable or self._off():
            yield False
            return
        level = _level(name)
        lock_key = (self._lock_prefix + name).encode("utf-8")
        token = secrets.token_hex(16).encode("ascii")
        value = self._lock_value(lock_key, token)
        held = self._acquire(level, lock_key, value, timeout)
        keeper = _LockKeeper(self, level, lock_key, token, value) if held else None
        try:
            yield held
        finally:
            if keeper is not None:
                value = keeper.stop()
                self._call(level, lambda client: client.execute(("EVAL", _RELEASE, 1, lock_key, value)),
                           write=True)

    def _lock_value(self, lock_key, token):
        taken = str(int(time.time() * 1000)).encode("ascii")
        return b".".join((token, taken, _lock_mac(self._key, lock_key, token, taken)))

    def _renew(self, level, lock_key, token, value):
        """The lock's new value, stamped now, while it still holds ``value``; else ``None`` (lost)."""
        renewed = self._lock_value(lock_key, token)
        expiry_ms = max(1, int(self.lock_expiry * 1000))
        reply = self._call(level, lambda client: client.execute(("EVAL", _RENEW, 1, lock_key, value, renewed,
                                                                 expiry_ms))[0], write=True, quiet=True)
        return renewed if reply in (b"OK", True) else None

    def _verified_lock(self, lock_key, value):
        """Whether ``value`` (the lock's current value, or None) is a live lock of a fleet key holder."""
        match = _LOCK_VALUE.match(value) if isinstance(value, bytes) else None
        if match is None:
            return False
        token, taken, mac = match.groups()
        if not hmac.compare_digest(_lock_mac(self._key, lock_key, token, taken), mac):
            return False
        age = time.time() - int(taken) / 1000.0
        return -_CLOCK_SKEW <= age <= self.lock_expiry + _CLOCK_SKEW

    def _acquire(self, level, lock_key, value, timeout):
        expiry_ms = max(1, int(self.lock_expiry * 1000))
        deadline = time.monotonic() + max(0.0, float(timeout or 0))
        pause = 0.01
        take = ("SET", lock_key, value, "NX", "PX", expiry_ms)
        while True:
            # SET NX and a GET of whoever holds it, in one round trip.
            replies = self._call(level, lambda client: client.execute(take, ("GET", lock_key)), write=True)
            if replies is _SKIP:
                return False
            if replies[0] == b"OK" or replies[0] is True:  # True: redis-py's cluster client
                return True
            if not self._verified_lock(lock_key, replies[1]):
                self._bump(level, "rejected")
                log.debug("ptxbackend: the fleet lock %s does not verify; compiling without waiting for it",
                          lock_key.decode("utf-8", "replace"))
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.25)

    def list(self, prefix=""):
        """Names (without namespace and layout) starting with ``prefix``; ``[]`` when the store is off."""
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self._prefix + prefix) + "*"
        keys = self._call("other", lambda client: client.scan(pattern))
        if keys is _SKIP:
            return []
        names = []
        for key in keys:
            key = key.decode("utf-8", "replace")
            if key.startswith(self._prefix):
                names.append(key[len(self._prefix):])
        return sorted(names)

    def ping(self):
        """Whether the server answers now (for ``doctor`` and ``cache info``); a failure turns the
        store off for the process, as any other call's would."""
        reply = self._call("other", lambda client: client.execute(("PING",))[0])
        return reply == b"PONG" or reply is True  # True: redis-py's cluster client

    @property
    def state(self):
        failed = self._failed
        if failed is not None:
            return "failed: %s" % failed
        return "ok" if self._connected else "not connected yet"

    def stats(self):
        with self._guard:
            result = dict((level, dict(counts)) for level, counts in self._counts.items())
        result["state"] = self.state
        return result


class _LockKeeper(object):
    """Renews a held fleet lock every third of its expiry while the compile under it runs, so a
    compile longer than the expiry keeps it (waiters see a fresh stamp and keep waiting) and a
    holder that dies still frees it within one expiry."""

    def __init__(self, store, level, lock_key, token, value):
        self._store, self._level, self._key, self._token = store, level, lock_key, token
        self.value = value
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ptxbackend-fleet-lock", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self._store.lock_expiry / 3.0):
            renewed = self._store._renew(self._level, self._key, self._token, self.value)
            if renewed is None:
                return  # lost (expired and taken, or the store is off): nothing left to keep
            self.value = renewed

    def stop(self):
        """Stop renewing; the value the lock holds now (for the release)."""
        self._stop.set()
        self._thread.join()
        return self.value


# -- opening from settings ----------------------------------------------------------------------------

def _read_private_file(path, what, limit=_MAX_KEY_FILE):
    """``(bytes, None)`` or ``(None, reason)``: a regular file of yours (or root's) that only you can read.

    Checked through the descriptor read (no symlink followed), as the config file is, so nothing can be
    swapped in between the check and the read.
    """
    flags = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
             | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            return None, ("the %s %s is a symbolic link: name the file itself (a link could be pointed "
                          "elsewhere)" % (what, path))
        return None, "the %s %s cannot be read: %s" % (what, path, exc.strerror or exc)
    try:
        st = os.fstat(fd)
        if not stat_module.S_ISREG(st.st_mode):
            return None, "the %s %s is not a regular file" % (what, path)
        if hasattr(os, "getuid") and st.st_uid not in (os.getuid(), 0):
            return None, ("the %s %s belongs to uid %d, not to you (uid %d) or root: refusing to use it"
                          % (what, path, st.st_uid, os.getuid()))
        if st.st_mode & 0o077:
            return None, ("the %s %s can be read or written by group or others (mode %o): run chmod 600 %s"
                          % (what, path, st.st_mode & 0o777, path))
        chunks = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            return None, "the %s %s is larger than %d bytes: not a key file" % (what, path, limit)
        return b"".join(chunks), None
    finally:
        os.close(fd)


def read_fleet_key(path):
    """``(key, None)`` or ``(None, reason)``: the fleet key in the private file at ``path`` (its bytes
    without the trailing newline, at least :data:`MIN_KEY_SIZE` of them).  Used by the fleet store
    and by driver-JIT bundles, which it signs."""
    key, why = _read_private_file(path, "fleet key file")
    if why:
        return None, why
    key = key.rstrip(b"\r\n")
    # Counted without blanks, and its distinct bytes too: 16 spaces are no key anyone must guess.
    if len(key.strip()) < MIN_KEY_SIZE or len(set(key)) < MIN_KEY_DISTINCT:
        return None, ("the fleet key file %s holds %d bytes (%d distinct, blanks aside %d); a fleet key needs at "
                      "least %d random bytes with %d distinct (e.g. head -c 32 /dev/urandom | base64 > %s)"
                      % (path, len(key), len(set(key)), len(key.strip()), MIN_KEY_SIZE, MIN_KEY_DISTINCT, path))
    return key, None


def _find_spec(name):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a broken install, or sys.modules[name] set to None
        return None


def open_remote(settings):
    """``(store, None)``, ``(None, None)`` when no fleet store is configured, or ``(None, reason)``.

    ``reason`` is one sentence saying why the configured store cannot be used; the caller logs it and
    goes on with the local cache.  Nothing is sent to the server here.
    """
    url = resp.normalize_url((getattr(settings, "remote", None) or "").strip())
    if not url:
        return None, None
    try:
        shown = redact_url(url)
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        parts.port  # raises for a port that is not a number in range
    except ValueError as exc:
        # Not echoed: an unparseable URL cannot be redacted, and it may hold the password.
        return None, ("PTXBACKEND_REMOTE is not a valid URL (%s): write it as redis://host:6379/0, "
                      "rediss://host:6380/0 (TLS) or unix:///run/valkey.sock" % exc)
    if scheme not in SCHEMES:
        return None, ("PTXBACKEND_REMOTE=%s has an unsupported scheme %r: use redis://, rediss:// (TLS) or "
                      "unix://" % (shown, scheme))
    try:
        cluster = _split_cluster(url)[1]
        resp.Endpoint(url)
    except ValueError as exc:
        return None, str(exc)
    # One server is spoken to by ptxbackend's own client; only Redis Cluster needs redis-py.  Found,
    # not imported: importing it costs a tenth of a second, which all-local hits must not pay.
    if cluster and _find_spec("redis") is None:
        return None, ("the fleet store %s is a Redis Cluster (cluster=yes), which needs the redis-py client: "
                      "pip install 'ptxbackend[redis]'" % shown)
    key_file = getattr(settings, "remote_key_file", None)
    if not key_file:
        return None, ("the fleet store is not used without a fleet key: set PTXBACKEND_REMOTE_KEY_FILE to a "
                      "private file holding at least %d random bytes" % MIN_KEY_SIZE)
    key, why = read_fleet_key(key_file)
    if why:
        return None, why
    password = None
    password_file = getattr(settings, "remote_password_file", None)
    if password_file:
        data, why = _read_private_file(password_file, "fleet store password file")
        if why:
            return None, why
        try:
            password = data.decode("utf-8").strip()
        except UnicodeDecodeError:
            return None, "the fleet store password file %s is not UTF-8 text" % password_file
        if not password:
            return None, "the fleet store password file %s is empty" % password_file
    try:
        store = RemoteStore(url, key,
                            mode=getattr(settings, "remote_mode", "rw") or "rw",
                            timeout=getattr(settings, "remote_timeout", 0.25) or 0.25,
                            namespace=getattr(settings, "remote_namespace", "ptxbackend") or "ptxbackend",
                            password=password,
                            ttl=getattr(settings, "remote_ttl", 0) or 0,
                            budget=getattr(settings, "remote_budget", DEFAULT_BUDGET),
                            retry=getattr(settings, "remote_retry", DEFAULT_RETRY))
    except ValueError as exc:
        return None, str(exc)
    return store, None

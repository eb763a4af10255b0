"""The fleet store: one Valkey/Redis server shared by the machines of a fleet (redis-py).

A build box compiles a kernel once and every line PC of the fleet loads it
from here instead of compiling it again.  Three properties matter more than
speed, because a fleet cache is a remote, shared, writable place:

* **Authenticated values.**  Whoever can write to the server could otherwise
  hand every machine a kernel of their choosing.  Each value is::

      b"PTXBR1" + HMAC-SHA256(fleet key, b"ptxbackend-remote-1\\0" + redis key + b"\\0" + blob) + blob

  The redis key (namespace and schema version included) is inside the MAC, so a
  value copied under another name or into another namespace fails its check.
  A value that fails is a miss (counted as ``rejected``), never returned.

* **Fail-open, bounded.**  The first connection error, timeout or refusal
  (wrong password ...) turns the store off for the rest of the process, as
  ccache's remote storage does: one warning, then every call returns at once
  without touching the network, and the program goes on with its local cache.
  A dead server costs at most one timeout per process (``remote_timeout``,
  0.25 s by default, for connecting and for each operation; redis-py's own
  retries are turned off).  Nothing here raises from ``get``/``put``/
  ``delete``/``lock``.

* **Lazy.**  Opening the store reads its key file but does not connect: a
  program whose kernels all hit locally never talks to the server.

Keys on the server are ``<namespace>:v3/<name>`` for values and
``<namespace>:lock:v3/<name>`` for the fleet-wide compile locks, so one server
can hold several fleets and schema versions side by side.  Eviction is the
server's: run it with ``maxmemory`` and ``maxmemory-policy allkeys-lru``.
"""

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

from .base import Store
from .store import KIND_SUFFIXES, LAYOUT

log = logging.getLogger("ptxbackend")

MAGIC = b"PTXBR1"
_MAC_CONTEXT = b"ptxbackend-remote-1\0"
_MAC_SIZE = hashlib.sha256().digest_size
HEADER_SIZE = len(MAGIC) + _MAC_SIZE
#: The largest blob stored or accepted: a value the server sends is read only
#: up to this bound (GETRANGE), so a planted giant value costs no memory.
MAX_VALUE = 256 << 20
MIN_KEY_SIZE = 16
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
# Deletes the lock only if it still holds our token: a lock that expired and
# was taken by another machine is theirs now.
_RELEASE = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
            "return redis.call('del', KEYS[1]) else return 0 end")
_SKIP = object()  # "no answer": the store is off, or the call just failed

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
    """``url`` without its password (in the user part or as a ``password=`` query argument)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        netloc = "%s%s@%s" % (user, ":***" if colon and password else "", host)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if "pass" not in k.lower()]
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), ""))


def _url_has_password(url):
    parts = urlsplit(url)
    userinfo, at, _host = parts.netloc.rpartition("@")
    if at and userinfo.partition(":")[2]:
        return True
    return any(k.lower() == "password" for k, _v in parse_qsl(parts.query, keep_blank_values=True))


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
    return "%s: %s" % (type(exc).__name__, text)


def _write_refused(exc):
    """A write the server refuses while it keeps serving reads (full with noeviction, a replica)."""
    text = str(exc).lstrip()
    name = type(exc).__name__
    return (name in ("OutOfMemoryError", "ReadOnlyError")
            or text.startswith(("OOM", "READONLY", "command not allowed when used memory")))


class RemoteStore(Store):
    """A :class:`~ptxbackend.cache.base.Store` on a Valkey/Redis server; see the module's doc."""

    writable = True

    def __init__(self, url, key, mode="rw", timeout=0.25, namespace="ptxbackend", password=None,
                 ttl=0, lock_expiry=120.0):
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
        self._url, self._cluster = _split_cluster(url)
        self._scheme = scheme
        self._key = key
        self._password = password
        self.mode = mode
        self.writable = mode == "rw"
        self.timeout = float(timeout)
        self.namespace = namespace
        self.ttl = int(-(-float(ttl or 0) // 1))  # whole seconds, rounded up: EX takes an integer
        self.lock_expiry = float(lock_expiry)
        self.url = redact_url(url)
        self.description = "fleet store %s (namespace %s, mode %s)" % (self.url, namespace, mode)
        self._prefix = "%s:%s/" % (namespace, LAYOUT)
        self._lock_prefix = "%s:lock:%s/" % (namespace, LAYOUT)
        self._client = None
        self._failed = None
        self._connected = False
        self._guard = threading.Lock()
        self._counts = dict((level, dict((name, 0) for name in COUNTS)) for level in LEVELS)
        #: Requests sent to the server (each lock poll, each get ...): stays put once the store is off.
        self.requests = 0

    # -- the connection and the circuit breaker ------------------------------------------------------

    def _make_client(self):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        # No retries, said outright: the breaker's promise is one timeout per process, and
        # redis-py >= 6's Redis() retries three times with backoff unless told otherwise.
        kwargs = {"socket_timeout": self.timeout, "retry": Retry(NoBackoff(), 0)}
        if self._scheme != "unix" or hasattr(redis.connection, "AbstractConnection"):
            # redis-py 4.x's Unix socket connection takes no connect timeout (5.0 and later do);
            # a local socket refuses at once unless its server is stuck with a full backlog.
            kwargs["socket_connect_timeout"] = self.timeout
        if self._password is not None and not _url_has_password(self._url):
            kwargs["password"] = self._password
        if not self._cluster:
            return redis.Redis.from_url(self._url, **kwargs)
        import inspect
        from redis.cluster import RedisCluster
        if "retry" not in inspect.signature(RedisCluster.__init__).parameters:
            kwargs["cluster_error_retry_attempts"] = 1  # redis-py 4.x: attempts, not retries
        self.requests += 1  # unlike Redis(), a cluster client asks for the slot map as it is built
        return RedisCluster.from_url(self._url, **kwargs)

    def _fail(self, exc, level):
        with self._guard:
            self._count(level, "errors")
            if self._failed is not None:
                return
            self._failed = _explain(exc)
            client, self._client = self._client, None
        log.warning("ptxbackend: the fleet store at %s failed (%s); this program continues with its local "
                    "cache only and does not use the fleet store again until it restarts",
                    self.url, self._failed)
        try:
            if client is not None:
                client.close()
        except Exception:  # closing a dead connection may fail too; nothing to do about it
            pass

    def _call(self, level, operation, write=False):
        """``operation(client)``'s result, or ``_SKIP`` when the store is off or the call failed."""
        if self._failed is not None:
            return _SKIP
        try:
            client = self._client
            if client is None:
                with self._guard:
                    if self._client is None and self._failed is None:
                        self._client = self._make_client()
                    client = self._client
                if client is None:
                    return _SKIP
            self.requests += 1
            result = operation(client)
        except Exception as exc:  # the store must never raise into a compile
            if write and _write_refused(exc):
                with self._guard:
                    self._count(level, "errors")
                log.debug("ptxbackend: the fleet store refused a write (%s)", _explain(exc))
                return _SKIP
            self._fail(exc, level)
            return _SKIP
        self._connected = True
        return result

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
        redis_key = self._prefix + name
        # One byte past the bound: a longer answer is refused without ever reading it all.
        end = HEADER_SIZE + MAX_VALUE
        if self.ttl:
            def operation(client):
                pipe = client.pipeline(transaction=False)
                pipe.getrange(redis_key, 0, end)
                pipe.expire(redis_key, self.ttl)  # a hit keeps the value alive; a miss is a no-op
                return pipe.execute()[0]
        else:
            def operation(client):
                return client.getrange(redis_key, 0, end)
        raw = self._call(level, operation)
        if raw is _SKIP:
            return None
        if not raw:  # GETRANGE answers b"" for an absent key
            self._bump(level, "misses")
            return None
        if not isinstance(raw, bytes):
            raw = bytes(raw)
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
        blob = view[HEADER_SIZE:]
        expected = _mac(self._key, redis_key.encode("utf-8"), blob)
        if not hmac.compare_digest(expected, raw[len(MAGIC):HEADER_SIZE]):
            self._reject(level, redis_key, "its authentication code does not match: the fleet key differs "
                                           "from the one that stored it, or the value was tampered with")
            return None
        self._bump(level, "hits")
        return blob.tobytes()

    def put(self, name, blob):
        if not self.writable or self._failed is not None:
            return
        level = _level(name)
        blob = bytes(blob)
        redis_key = self._prefix + name
        if len(blob) > MAX_VALUE:
            self._reject(level, redis_key, "it is larger than %d MiB, so it is not stored" % (MAX_VALUE >> 20))
            return
        value = seal(self._key, redis_key.encode("utf-8"), blob)
        ttl = self.ttl or None
        if self._call(level, lambda client: client.set(redis_key, value, ex=ttl), write=True) is not _SKIP:
            self._bump(level, "puts")

    def delete(self, name):
        if not self.writable or self._failed is not None:
            return
        redis_key = self._prefix + name
        self._call(_level(name), lambda client: client.delete(redis_key), write=True)

    @contextlib.contextmanager
    def lock(self, name, timeout):
        """A fleet-wide lock on ``name``: one machine compiles, the others wait for its upload.

        Held for at most ``lock_expiry`` seconds (a holder that dies frees it then); waits at most
        ``timeout`` seconds, then yields ``False`` and the caller compiles anyway.
        """
        if not self.writable or self._failed is not None:
            yield False
            return
        level = _level(name)
        lock_key = self._lock_prefix + name
        token = secrets.token_hex(16)
        held = self._acquire(level, lock_key, token, timeout)
        try:
            yield held
        finally:
            if held:
                self._call(level, lambda client: client.eval(_RELEASE, 1, lock_key, token), write=True)

    def _acquire(self, level, lock_key, token, timeout):
        expiry_ms = max(1, int(self.lock_expiry * 1000))
        deadline = time.monotonic() + max(0.0, float(timeout or 0))
        pause = 0.01
        while True:
            taken = self._call(level, lambda client: client.set(lock_key, token, nx=True, px=expiry_ms),
                               write=True)
            if taken is _SKIP:
                return False
            if taken:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.25)

    def list(self, prefix=""):
        """Names (without namespace and layout) starting with ``prefix``; ``[]`` when the store is off."""
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self._prefix + prefix) + "*"
        keys = self._call("other", lambda client: list(client.scan_iter(match=pattern, count=1000)))
        if keys is _SKIP:
            return []
        names = []
        for key in keys:
            if isinstance(key, bytes):
                key = key.decode("utf-8", "replace")
            if key.startswith(self._prefix):
                names.append(key[len(self._prefix):])
        return sorted(names)

    def ping(self):
        """Whether the server answers now (for ``doctor`` and ``cache info``); a failure turns the
        store off for the process, as any other call's would."""
        return self._call("other", lambda client: client.ping()) is True

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
    if len(key) < MIN_KEY_SIZE:
        return None, ("the fleet key file %s holds %d bytes; a fleet key needs at least %d (e.g. "
                      "head -c 32 /dev/urandom | base64 > %s)" % (path, len(key), MIN_KEY_SIZE, path))
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
    url = (getattr(settings, "remote", None) or "").strip()
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
    # Found, not imported: importing redis-py costs a tenth of a second or more, which a program whose
    # kernels all hit locally must not pay.  It is imported at the first call that reaches the server.
    if _find_spec("redis") is None:
        return None, ("the fleet store %s needs the redis-py client, which is not installed: "
                      "pip install 'ptxbackend[redis]'" % shown)
    try:
        _split_cluster(url)
    except ValueError as exc:
        return None, str(exc)
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
                            ttl=getattr(settings, "remote_ttl", 0) or 0)
    except ValueError as exc:
        return None, str(exc)
    return store, None

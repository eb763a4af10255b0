"""A small, strict RESP2 client for the fleet store (one server: TCP, TLS or a Unix socket).

redis-py trusts its server: it allocates whatever bulk length it is sent and
its timeout applies to each ``recv``, so a hostile or impersonated server can
exhaust memory or trickle one byte at a time for ever.  Here:

* every reply is bounded before a byte of it is kept: a bulk string longer than
  ``max_reply``, an array longer than :data:`MAX_ITEMS`, a status line longer
  than :data:`MAX_LINE` or nested deeper than two levels is a :class:`Fault`,
  and so is an operation whose replies add up to more than ``max_reply`` and
  one line (an array of many strings each under the bound);
* one deadline (``timeout`` seconds, monotonic) covers a whole operation:
  connecting, the TLS handshake, AUTH and every reply of a pipeline;
* TLS always verifies the certificate and the host name (``ssl`` of the
  standard library, on every Python this package supports);
* a Unix socket is used only if no one but its owner could have put it there.

Only what the fleet store sends is supported: RESP2 (no HELLO), AUTH, SELECT,
and commands as lists of arguments, pipelined.
"""

import os
import select
import socket
import ssl
import stat as stat_module
import time

from urllib.parse import parse_qsl, quote, unquote, urlsplit

MAX_LINE = 64 << 10
MAX_ITEMS = 1 << 16
#: A bulk string at least this long is read straight into one buffer of its exact size (returned as a
#: ``bytearray``): a 256 MiB value then costs 256 MiB, not the three copies that growing a read buffer,
#: slicing it and making bytes of the slice would hold at once.
BIG_BULK = 1 << 16
_MAX_DEPTH = 2
#: Query arguments a fleet store URL may carry; any other (``socket_timeout=``, ``ssl_cert_reqs=none``
#: ...) is refused, so nothing in the URL loosens the configured timeout or the TLS checks.
QUERY = ("cluster", "db", "password", "username", "ssl_ca_certs")


class Fault(Exception):
    """The connection or the server misbehaved: a timeout, a closed socket, a reply out of bounds."""


class ReplyError(Exception):
    """The server answered an error reply (``-ERR ...``, ``-WRONGPASS ...``); the text is the server's."""


def normalize_url(url):
    """``url`` with a password (or user name) holding a raw ``/``, ``?`` or ``#`` percent-encoded, so
    that it parses as the password it is.

    Parsed as written, ``redis://:ab/cd@host/0`` would be the host ``""``, the password ``ab`` and
    the path ``/cd@host/0``: a login with the wrong password, and a redacted form that prints
    ``cd``.  A ``@`` after where the host would end means the user part went on: it runs to the last
    ``@`` (a host, port, database or query never holds one; an ``ssl_ca_certs`` path with ``@`` must
    be percent-encoded).
    """
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest or rest.startswith("/"):
        return url  # no user part (unix:///run/valkey@main/valkey.sock is a path, '@' and all)
    end = len(rest)
    for mark in "/?#":
        found = rest.find(mark)
        if 0 <= found < end:
            end = found
    # A socket's path starts with '/' and may hold '@' itself: the user part ends at the first "@/".
    at = rest.find("@/") if scheme.lower() == "unix" else rest.rfind("@")
    if at < end:
        return url  # the user part ends before the first '/', '?' or '#': it parses as it is
    userinfo, host = rest[:at], rest[at + 1:]
    user, colon, password = userinfo.partition(":")
    encoded = quote(unquote(user), safe="") + (colon + quote(unquote(password), safe="") if colon else "")
    return "%s://%s@%s" % (scheme, encoded, host)


class Endpoint(object):
    """Where the server is and how to log in, parsed from a ``redis://``, ``rediss://`` or ``unix://`` URL."""

    def __init__(self, url, password=None):
        parts = urlsplit(normalize_url(url))
        self.scheme = parts.scheme.lower()
        self.tls = self.scheme == "rediss"
        query = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name.lower() not in QUERY:
                raise ValueError("the fleet store URL has the query argument %r, which ptxbackend does not take "
                                 "(the timeout is PTXBACKEND_REMOTE_TIMEOUT; TLS always verifies): use only %s"
                                 % (name, ", ".join(QUERY)))
            query[name.lower()] = value
        self.username = unquote(parts.username) if parts.username else query.get("username") or None
        url_password = unquote(parts.password) if parts.password else query.get("password") or None
        self.password = url_password if url_password is not None else password
        self.ca_file = query.get("ssl_ca_certs") or None
        if self.scheme == "unix":
            self.path = unquote(parts.path)
            if not self.path:
                raise ValueError("the fleet store URL unix:// names no socket: write unix:///run/valkey.sock")
            self.host, self.port = None, None
            db = query.get("db", "0")
        else:
            self.path = None
            self.host = parts.hostname
            if not self.host:
                raise ValueError("the fleet store URL names no host: write redis://host:6379/0")
            self.port = parts.port or 6379
            db = (parts.path or "/").strip("/") or query.get("db", "0")
        if not db.isdigit():
            raise ValueError("the fleet store URL's database %r is not a number" % (db,))
        self.db = int(db)


def check_socket_owner(path, uid=None):
    """``None``, or why the Unix socket at ``path`` must not be trusted.

    Trusted: a socket of yours or root's, or one in a directory that only the socket's owner can
    write to (``/run/valkey`` of the ``valkey`` user).  Refused: another user's socket where others
    may create files (``/tmp``): whoever binds that path first receives the password.  And every
    directory on the way to it must be yours, root's or the socket owner's, and writable by no one
    else unless sticky (``/tmp``): whoever may rename entries in a directory on the path could put
    their own socket there between this check and the connect.  The caller connects to
    :func:`socket_path`, the path checked here with its directories' links resolved.
    """
    uid = os.getuid() if uid is None else uid
    real = socket_path(path)
    try:
        st = os.lstat(real)
        parent = os.stat(os.path.dirname(real))
    except OSError as exc:
        return "the socket %s cannot be examined: %s" % (path, exc.strerror or exc)
    if not stat_module.S_ISSOCK(st.st_mode):
        return "%s is not a Unix socket" % path
    if st.st_uid not in (uid, 0) and not (parent.st_uid == st.st_uid and not parent.st_mode & 0o022):
        return ("the socket %s belongs to uid %d, in a directory others can write to: anyone could have "
                "created it; run the server as yourself or root, or put its socket in a directory of its own"
                % (path, st.st_uid))
    trusted = (uid, 0, st.st_uid)
    directory = os.path.dirname(real)
    while True:
        try:
            info = os.lstat(directory)
        except OSError as exc:
            return "the directory %s of the socket %s cannot be examined: %s" % (directory, path, exc.strerror or exc)
        if info.st_uid not in trusted:
            return ("the socket %s lies in %s, which belongs to uid %d: that user could put a socket of "
                    "their own there and receive the password; move the socket to a directory of yours, "
                    "root's or the server's" % (path, directory, info.st_uid))
        if info.st_mode & 0o022 and not info.st_mode & stat_module.S_ISVTX:
            return ("the socket %s lies in %s, which others can write to (mode %o): anyone could put a "
                    "socket of their own there and receive the password" % (path, directory,
                                                                            info.st_mode & 0o7777))
        up = os.path.dirname(directory)
        if up == directory:
            return None
        directory = up


def socket_path(path):
    """``path`` with the links of its directories resolved (the socket itself is never followed)."""
    absolute = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute))


class _Reader(object):
    """Reads replies off one socket until ``deadline``; keeps no more than it was allowed."""

    def __init__(self, sock, deadline, max_reply):
        self.sock = sock
        self.deadline = deadline
        self.max_reply = max_reply
        self.buf = bytearray()
        self.pos = 0
        self.left = max_reply + MAX_LINE  # bytes this operation may still receive, all replies together
        self.straight = False  # whether a bulk string was read straight off the socket (:meth:`_big`)

    def _wait(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Fault("the operation ran past its deadline")
        self.sock.settimeout(left)

    def _received(self, count):
        if not count:
            raise Fault("the server closed the connection")
        self.left -= count
        if self.left < 0:
            raise Fault("the server sent more than %d bytes for one operation" % (self.max_reply + MAX_LINE))

    def _fill(self):
        self._wait()
        try:
            chunk = self.sock.recv(min(1 << 16, max(1, self.left + 1)))
        except socket.timeout:
            raise Fault("the operation ran past its deadline")
        self._received(len(chunk))
        if self.pos:
            del self.buf[:self.pos]
            self.pos = 0
        self.buf += chunk

    def _line(self):
        while True:
            end = self.buf.find(b"\r\n", self.pos)
            if end >= 0:
                line = bytes(self.buf[self.pos:end])
                self.pos = end + 2
                return line
            if len(self.buf) - self.pos > MAX_LINE:
                raise Fault("a reply line is longer than %d bytes" % MAX_LINE)
            self._fill()

    def _count(self, line, limit, what):
        try:
            number = int(line[1:])
        except ValueError:
            raise Fault("the server sent a %s length that is no number" % what)
        if number > limit:
            raise Fault("the server announced a %s of %d, over the bound of %d" % (what, number, limit))
        return number

    def _big(self, size):
        """A bulk string of ``size`` bytes read into one buffer of its own (what is buffered already
        first, then the socket straight into the rest), never past its end: the next reply's bytes
        stay on the socket."""
        self.straight = True
        data = bytearray(size + 2)
        view = memoryview(data)
        try:
            have = len(self.buf) - self.pos
            view[:have] = self.buf[self.pos:]
            self.buf, self.pos = bytearray(), 0
            while have < size + 2:
                self._wait()
                try:
                    count = self.sock.recv_into(view[have:], min(size + 2 - have, max(1, self.left + 1)))
                except socket.timeout:
                    raise Fault("the operation ran past its deadline")
                self._received(count)
                have += count
        finally:
            view.release()
        if data[size:] != b"\r\n":
            raise Fault("a bulk string does not end where its length says")
        del data[size:]
        return data

    def reply(self, depth=0):
        line = self._line()
        head = line[:1]
        if head == b"+":
            return line[1:]
        if head == b"-":
            return ReplyError(line[1:].decode("utf-8", "replace"))
        if head == b":":
            try:
                return int(line[1:])
            except ValueError:
                raise Fault("the server sent an integer reply that is no number")
        if head == b"$":
            size = self._count(line, self.max_reply, "bulk string")
            if size < 0:
                return None
            if size >= BIG_BULK and len(self.buf) - self.pos < size + 2:
                return self._big(size)
            while len(self.buf) - self.pos < size + 2:
                self._fill()
            data = bytes(self.buf[self.pos:self.pos + size])
            if self.buf[self.pos + size:self.pos + size + 2] != b"\r\n":
                raise Fault("a bulk string does not end where its length says")
            self.pos += size + 2
            return data
        if head == b"*":
            count = self._count(line, MAX_ITEMS, "array")
            if count < 0:
                return None
            if depth >= _MAX_DEPTH:
                raise Fault("the server sent arrays nested deeper than %d" % _MAX_DEPTH)
            return [self.reply(depth + 1) for _ in range(count)]
        raise Fault("the server sent a reply of unknown type %r" % head)


def _tcp(host, port, deadline):
    """A connected TCP socket; each address tried gets what is left of the deadline, not a timeout
    of its own (``create_connection`` would give ``localhost``'s two addresses two timeouts)."""
    error = Fault("%s resolves to no address" % host)
    for family, kind, proto, _name, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        left = deadline - time.monotonic()
        if left <= 0:
            raise Fault("connecting ran past the deadline")
        sock = socket.socket(family, kind, proto)
        sock.settimeout(left)
        try:
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error


def _encode(command):
    parts = [b"*%d\r\n" % len(command)]
    for arg in command:
        if not isinstance(arg, bytes):
            arg = str(arg).encode("utf-8")
        parts.append(b"$%d\r\n" % len(arg))
        parts.append(arg)
        parts.append(b"\r\n")
    return b"".join(parts)


def _ready(sock, write, timeout):
    """Whether ``sock`` is readable (or writable) within ``timeout`` seconds.  poll where there is one:
    select() cannot take a descriptor numbered past 1023, which a program with many files open has."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLOUT if write else select.POLLIN | select.POLLPRI)
        return bool(poller.poll(max(0, int(timeout * 1000 + 0.999))))
    readable, writable, _ = select.select([] if write else [sock], [sock] if write else [], [], timeout)
    return bool(readable or writable)


class Client(object):
    """One connection to one server; not thread-safe (the store serialises its calls)."""

    def __init__(self, endpoint, timeout, max_reply):
        self.endpoint = endpoint
        self.timeout = float(timeout)
        self.max_reply = int(max_reply)
        self._sock = None

    def execute(self, *commands):
        """The replies to ``commands`` (each a tuple of arguments), sent as one pipeline.

        Raises :class:`Fault` (the connection is then closed) or, after every reply was read, the
        first :class:`ReplyError`.
        """
        replies = self.results(*commands)
        for reply in replies:
            if isinstance(reply, ReplyError):
                raise reply
        return replies

    def results(self, *commands):
        """As :meth:`execute`, with error replies left in place as :class:`ReplyError` objects (for
        pipelines whose upkeep commands may fail alone); raises only :class:`Fault`."""
        deadline = time.monotonic() + self.timeout
        try:
            waiting = self._waiting() if self._sock is not None else None
            if waiting == "data":
                raise Fault("the server sent more than was asked for")
            if waiting == "closed":
                self.close()  # the server ended an idle connection (its `timeout`): a new one, not a fault
            if self._sock is None:
                self._connect(deadline)
            replies = self._exchange(commands, deadline)
        except (OSError, ssl.CertificateError, Fault) as exc:  # CertificateError: 3.6's host name check
            self.close()
            if isinstance(exc, Fault):
                raise
            raise Fault("%s: %s" % (type(exc).__name__, exc))
        return replies

    def scan(self, pattern, limit=MAX_ITEMS * 16):
        """Every key matching ``pattern`` (SCAN, each page its own operation), at most ``limit``."""
        cursor, keys = b"0", []
        while True:
            reply = self.execute(("SCAN", cursor, "MATCH", pattern, "COUNT", 1000))[0]
            if not (isinstance(reply, list) and len(reply) == 2 and isinstance(reply[0], bytes)
                    and isinstance(reply[1], list) and all(isinstance(k, bytes) for k in reply[1])):
                raise Fault("the server answered SCAN with something else than a cursor and keys")
            cursor = reply[0]
            keys.extend(reply[1])
            if len(keys) > limit:
                raise Fault("the server listed more than %d keys" % limit)
            if cursor == b"0":
                return keys

    def _exchange(self, commands, deadline):
        self._send(b"".join(_encode(command) for command in commands), deadline)
        reader = _Reader(self._sock, deadline, self.max_reply)
        replies = [reader.reply() for _ in commands]
        # A big bulk string is read to its end and no further, so bytes past the last reply may still be
        # on the socket: look there too.  Ones that arrive later are found before the connection's next use.
        if reader.pos != len(reader.buf) or (reader.straight and self._waiting() == "data"):
            raise Fault("the server sent more than was asked for")
        return replies

    def _waiting(self):
        """What waits on the connection between operations, seen without blocking: ``None``,
        ``"data"`` (a reply nobody asked for: the connection is out of step) or ``"closed"``."""
        sock = self._sock
        if isinstance(sock, ssl.SSLSocket):
            if sock.pending():
                return "data"
            if not _ready(sock, False, 0):
                return None
            # Readable may be TLS housekeeping (a session ticket), which yields no application byte.
            sock.settimeout(0)
            try:
                return "data" if sock.recv(1) else "closed"
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
                return None
            except (OSError, ssl.SSLError):
                return "closed"
        try:
            if not _ready(sock, False, 0):
                return None
            return "data" if sock.recv(1, socket.MSG_PEEK) else "closed"
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return "closed"

    def _send(self, data, deadline):
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Fault("the operation ran past its deadline")
            self._sock.settimeout(left)
            try:
                sent = self._sock.send(view)
            except socket.timeout:
                raise Fault("the operation ran past its deadline")
            view = view[sent:]

    def _connect(self, deadline):
        point = self.endpoint
        left = max(0.001, deadline - time.monotonic())
        if point.path is not None:
            why = check_socket_owner(point.path)
            if why:
                raise Fault(why)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(left)
            try:
                sock.connect(socket_path(point.path))
            except BaseException:
                sock.close()
                raise
        else:
            sock = _tcp(point.host, point.port, deadline)
        try:
            if point.tls:
                sock = self._handshake(sock, deadline)
            self._sock = sock
            login = []
            if point.password is not None:
                login.append(("AUTH", point.username, point.password) if point.username
                             else ("AUTH", point.password))
            if point.db:
                login.append(("SELECT", point.db))
            if login:
                for reply in self._exchange(login, deadline):
                    if isinstance(reply, ReplyError):
                        raise reply
        except BaseException:
            self.close()
            sock.close()
            raise

    def _handshake(self, sock, deadline):
        # create_default_context: CERT_REQUIRED and check_hostname on every Python >= 3.4.
        context = ssl.create_default_context(cafile=self.endpoint.ca_file)
        sock.setblocking(False)
        tls = context.wrap_socket(sock, server_hostname=self.endpoint.host, do_handshake_on_connect=False)
        while True:
            try:
                tls.do_handshake()
                return tls
            except ssl.SSLWantReadError:
                write = False
            except ssl.SSLWantWriteError:
                write = True
            left = deadline - time.monotonic()
            if left <= 0 or not _ready(tls, write, left):
                tls.close()
                raise Fault("the TLS handshake ran past the deadline")

    def close(self):
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

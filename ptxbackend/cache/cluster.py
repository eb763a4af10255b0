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
        """As :meth:`execute`, error replies in place (see :meth:`.resp.Client.results`).  Several
        commands go as redis-py's cluster pipeline: one request per node whose slots they touch."""
        from redis.exceptions import ResponseError
        if len(commands) == 1:
            try:
                return [self._client.execute_command(*commands[0])]
            except ResponseError as exc:
                return [ReplyError(str(exc))]
        pipe = self._client.pipeline()
        for command in commands:
            pipe.execute_command(*command)
        replies = []
        for reply in pipe.execute(raise_on_error=False):
            if isinstance(reply, ResponseError):
                replies.append(ReplyError(str(reply)))
            elif isinstance(reply, Exception):  # a node that did not answer: a fault like a timeout
                raise Fault("%s: %s" % (type(reply).__name__, reply))
            else:
                replies.append(reply)
        return replies

    def scan(self, pattern):
        keys = list(self._client.scan_iter(match=pattern, count=1000))
        if not all(isinstance(key, bytes) for key in keys):
            raise Fault("the cluster listed something else than keys")
        return keys

    def close(self):
        self._client.close()

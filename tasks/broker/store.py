"""A redis-py client for the broker's Redis, from a Celery/kombu broker URL.

Three kinds of URL, as kombu takes them: ``redis://`` / ``rediss://`` (TLS),
``redis+socket:///path`` (a Unix socket), and ``sentinel://host:26379;sentinel://...``
with the master's name, for a Redis that Sentinel fails over.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.connection import SENTINEL
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection, SentinelManagedSSLConnection

from tasks.broker import failover
from tasks.broker.outage import refusal_parser
from tasks.settings import settings

#: A broken connection (Redis restarted, a reset) is retried once on a new one; a
#: timeout never is: a Redis that does not answer must not hold its caller longer.
ONE_RECONNECT = Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))


class FollowingConnection(SentinelManagedConnection):
    """A connection to the primary the Sentinels name, closed after any error while
    reading a reply, a timeout included, as redis-py closes its other connections:
    redis-py's Sentinel connection stays open then, and the reply it did not read
    answers the next command (a frozen primary that wakes up). Closed, it asks the
    Sentinels for the primary again on its next command. A caller that polls (pub/sub)
    still says ``disconnect_on_error=False`` for itself."""

    def read_response(self, disable_decoding: bool = False, *, timeout: object = SENTINEL,
                      disconnect_on_error: bool = True, push_request: bool = False) -> object:
        return super().read_response(disable_decoding, timeout=timeout,
                                     disconnect_on_error=disconnect_on_error,
                                     push_request=push_request)


class FollowingSSLConnection(FollowingConnection, SentinelManagedSSLConnection):
    pass


def following(connection_class: type | None) -> type | None:
    """The connection class to use in place of redis-py's Sentinel-managed
    ``connection_class`` (any other is returned as it is)."""
    if connection_class is not None and issubclass(connection_class, FollowingConnection):
        return connection_class
    if connection_class is SentinelManagedSSLConnection:
        return FollowingSSLConnection
    if connection_class is SentinelManagedConnection:
        return FollowingConnection
    return connection_class


def redis_url(broker_url: str) -> str:
    """Translate kombu's ``redis+socket:///path`` into redis-py's ``unix:///path`` (the
    transport's ``gpulanes+`` left out)."""
    parts = urlsplit(bare(broker_url))
    if parts.scheme in ("redis+socket", "socket"):
        return f"unix://{parts.path}" + (f"?{parts.query}" if parts.query else "")
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"not a Redis URL: {broker_url!r}")
    return broker_url


def bare(broker_url: str) -> str:
    """A broker URL without the ``gpulanes+`` that names gpulanes' transport."""
    return broker_url.removeprefix(TRANSPORT_PREFIX)


#: What a broker URL starts with to name gpulanes' transport (``tasks.broker.lanes``).
TRANSPORT_PREFIX = "gpulanes+"


def result_url(url: str) -> str:
    """The result backend URL that names gpulanes' result backend for a Redis ``url``
    (Celery finds it by its ``celery.result_backends`` entry point); any other backend's
    URL as it is."""
    scheme = urlsplit(url).scheme
    if scheme in ("redis", "rediss"):
        return f"gpulanes+{url}"
    if scheme == "redis+socket":  # Celery's Redis backend reads a socket as socket://
        return f"gpulanes+{url.removeprefix('redis+')}"
    if scheme == "sentinel":
        return f"gpulanes-sentinel+{url}"
    return url


def app_redis_url(conf: Any) -> str:
    """The broker's Redis URL of a Celery app's settings: the transport's ``url`` option
    (a Sentinel URL whole), else the broker URL without its ``gpulanes+``."""
    return conf.broker_transport_options.get("url") or bare(conf.broker_url)


def sentinel_client(broker_url: str, master_name: str, **kwargs) -> redis.Redis:
    """A client of the master that the Sentinels of ``broker_url`` name ``master_name``;
    it follows a failover by asking them again."""
    nodes, password, db = [], None, 0
    for part in bare(broker_url).split(";"):
        url = urlsplit(part.strip())
        if url.scheme != "sentinel":
            raise ValueError(f"not a Sentinel URL: {part!r}")
        nodes.append((url.hostname or "localhost", url.port or 26379))
        password = url.password or password
        db = int(url.path.strip("/") or db)
    sentinel = Sentinel(nodes, socket_timeout=kwargs.get("socket_timeout"))
    kwargs.setdefault("connection_class", FollowingConnection)
    client = sentinel.master_for(master_name, password=password, db=db, **kwargs)
    failover.follow(client.connection_pool)
    return client


def connect(broker_url: str, master_name: str | None = None, timeout_s: float = 5.0,
            **kwargs) -> redis.Redis:
    """A client whose every call gives up after ``timeout_s`` (callers are on hot
    paths or in beat ticks), reconnecting once after a broken connection, never
    retrying a timeout (redis-py's own default retries ten times). A refusal (out of
    memory, MISCONF...) raises ``tasks.broker.outage.RedisRefused``.

    ``master_name``: for a ``sentinel://`` URL (``GPULANES_SENTINEL_MASTER``).
    """
    kwargs.setdefault("socket_timeout", timeout_s)
    kwargs.setdefault("socket_connect_timeout", timeout_s)
    kwargs.setdefault("retry", ONE_RECONNECT)
    kwargs.setdefault("decode_responses", True)
    kwargs.setdefault("parser_class", refusal_parser(kwargs.get("protocol")))  # an outage
    if bare(broker_url).startswith("sentinel://"):
        if not master_name:
            raise ValueError("a sentinel:// URL needs the master's name "
                             "(GPULANES_SENTINEL_MASTER)")
        return sentinel_client(broker_url, master_name, **kwargs)
    return redis.Redis.from_url(redis_url(broker_url), **kwargs)


def broker_client(**kwargs) -> redis.Redis:
    """A new client of the broker's Redis as the settings name it (inside
    ``tasks.broker.cell.within``, that cell's), every call giving up after
    ``GPULANES_REDIS_TIMEOUT_S`` (unless ``kwargs`` say otherwise)."""
    from tasks.broker.cell import url_now

    return connect(url_now(), settings.sentinel_master,
                   timeout_s=settings.redis_timeout_s, **kwargs)

"""A redis-py client for the broker's Redis, from a Celery/kombu broker URL."""
from __future__ import annotations

from urllib.parse import urlsplit

import redis


def redis_url(broker_url: str) -> str:
    """Translate kombu's ``redis+socket:///path`` into redis-py's ``unix:///path``."""
    parts = urlsplit(broker_url)
    if parts.scheme in ("redis+socket", "socket"):
        return f"unix://{parts.path}" + (f"?{parts.query}" if parts.query else "")
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"not a Redis URL: {broker_url!r}")
    return broker_url


def connect(broker_url: str, **kwargs) -> redis.Redis:
    """A client with short timeouts: callers are on hot paths or in beat ticks."""
    kwargs.setdefault("socket_timeout", 5)
    kwargs.setdefault("socket_connect_timeout", 5)
    kwargs.setdefault("decode_responses", True)
    return redis.Redis.from_url(redis_url(broker_url), **kwargs)

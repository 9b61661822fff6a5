"""The Celery app: configured from ``celeryconfig``, worker hooks wired once."""
from __future__ import annotations

from functools import lru_cache

import redis
from celery import Celery

from gpu_worker import hooks
from routing.store import connect
from tasks import backend, transport

transport.install()  # before the app makes any broker connection
backend.install()
app = Celery("gpulanes", include=["tasks.generate", "beat.heartbeat", "beat.movers"],
             control="tasks.control:LanesControl")  # revokes kept in Redis
app.config_from_object("celeryconfig")
hooks.install()


@lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    """A redis-py client on the broker's Redis, for gpulanes' own keys."""
    return connect(app.conf.broker_url, app.conf.broker_transport_options.get("master_name"),
                   timeout_s=app.conf.redis_socket_timeout)

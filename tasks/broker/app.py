"""The Celery app, configured from ``celeryconfig`` on gpulanes' transport.

The worker's task and beat's tasks are named in ``include``: a worker or beat
imports them when it starts (``tasks.worker.generate`` wires the worker's hooks);
a process that only submits never does."""
from __future__ import annotations

from functools import lru_cache

import redis
from celery import Celery

from tasks.broker import backend, transport
from tasks.broker.store import broker_client

transport.install()  # before the app makes any broker connection
backend.install()
app = Celery("gpulanes", include=["tasks.worker.generate", "beat.heartbeat", "beat.movers"],
             control="tasks.broker.control:LanesControl")  # revokes kept in Redis
app.config_from_object("celeryconfig")


@lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    """A redis-py client on the broker's Redis, for gpulanes' own keys."""
    return broker_client()

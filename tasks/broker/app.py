"""The Celery app, configured from ``celeryconfig`` on gpulanes' transport
(``tasks.broker.lanes``, named by the broker URL) and result backend
(``tasks.broker.backend``, named by the result backend URL).

The worker's task is named in ``include``: a worker imports it when it starts
(``tasks.worker.generate`` wires the worker's hooks); a process that only submits never
does. Beat's tasks are not: only beat's scheduler (``beat.scheduler``) imports them, so
a GPU worker refuses a control task sent to it (dead-lettered) instead of running it."""
from __future__ import annotations

from functools import lru_cache

import redis
from celery import Celery
from celery.backends.redis import RedisBackend, SentinelBackend

from tasks.broker import backend, lanes  # noqa: F401  registers the transport
from tasks.broker.cell import url_now
from tasks.broker.store import broker_client

#: Members of Celery's Redis result backends that gpulanes' overrides or reads, pinned
#: like kombu's (tests/test_kombu_hooks.py): public ones it overrides, and the one private
#: method it calls (never overrides): the entry Celery's own store writes, which a run's
#: script writes in its step. The backend is chosen by its URL
#: (``celeryconfig.result_backend``, a ``celery.result_backends`` entry point).
CELERY_HOOKS = {RedisBackend: ("client", "connparams", "exception_safe_to_retry", "ensure",
                               "mark_as_done", "get_key_for_task", "_get_result_meta"),
                SentinelBackend: ("client",)}

app = Celery("gpulanes", include=["tasks.worker.generate"],
             control="tasks.broker.control:LanesControl")  # revokes in Redis
app.config_from_object("celeryconfig")


def redis_client() -> redis.Redis:
    """A redis-py client on the broker's Redis, for gpulanes' own keys (inside
    ``tasks.broker.cell.within``, on that cell's)."""
    return _client(url_now())


@lru_cache(maxsize=None)
def _client(url: str) -> redis.Redis:
    return broker_client()  # (url: the cell in force, which broker_client reads too)

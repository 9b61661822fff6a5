"""The Celery app, configured from ``celeryconfig`` on gpulanes' transport
(``tasks.broker.lanes``, named by the broker URL).

The worker's task is named in ``include``: a worker imports it when it starts
(``tasks.worker.generate`` wires the worker's hooks); a process that only submits never
does. Beat's tasks are not: only beat's scheduler (``beat.scheduler``) imports them, so
a GPU worker refuses a control task sent to it (dead-lettered) instead of running it."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import redis
from celery import Celery
from celery.app import backends
from celery.backends.redis import SentinelBackend

from tasks.broker import backend, lanes  # noqa: F401  lanes: registers the transport
from tasks.broker.store import broker_client

#: Celery members the app below overrides (pinned like kombu's: tests/test_kombu_hooks.py).
CELERY_HOOKS = {Celery: ("_get_backend", "backend_cls", "loader"),
                SentinelBackend: ("_get_pool", "connparams")}


class LanesCelery(Celery):
    """Celery, on gpulanes' result backend for Redis URLs: this app only, never another
    app of the process (Celery's names are left alone)."""

    def _get_backend(self) -> Any:
        cls, url = backends.by_url(self.backend_cls or self.conf.result_backend, self.loader)
        return backend.ours(cls)(app=self, url=url)


app = LanesCelery("gpulanes", include=["tasks.worker.generate"],
                  control="tasks.broker.control:LanesControl")  # revokes in Redis
app.config_from_object("celeryconfig")


@lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    """A redis-py client on the broker's Redis, for gpulanes' own keys."""
    return broker_client()

"""Revokes that survive restarts: every revoke is also kept in Redis.

Celery tells running workers of a revoke by broadcast and each keeps it in
memory, so a worker that starts later (a restart, a new host) never hears of
it and runs the job. gpulanes keeps every revoke in a Redis sorted set (job
id -> when, trimmed after ``revoke_ttl_s``, the result TTL): written by the app's
control (``AsyncResult.revoke()``, ``app.control.revoke()``, Flower and
``celery control revoke`` all go through it), loaded by each worker when it
starts, and checked in the Lua call that begins every run (``tasks.broker.runs``).
"""
from __future__ import annotations

import time
from typing import Any, Iterable

from celery.app.control import Control
from celery.worker import state as worker_state

from tasks.broker.keys import REVOKED_KEY, revoked_key
from tasks.settings import settings

#: The most revokes a worker loads when it starts (Celery keeps 50,000 in memory);
#: the begin check in Redis covers any beyond.
LOAD_AT_MOST = 50_000


def record_revokes(job_ids: Iterable[str]) -> int:
    """Keep ``job_ids`` as revoked in Redis (and trim those past their time): each in the
    cell its id names (``tasks.broker.cell``), where its job runs; with one Redis, ours."""
    from tasks.broker.app import redis_client
    from tasks.broker.cell import named_by, within

    ids, now = [str(i) for i in job_ids], time.time()
    by_cell: dict[str | None, list[str]] = {}
    for job_id in ids:
        by_cell.setdefault(named_by(job_id), []).append(job_id)
    for name, named in by_cell.items():
        with within(name):
            client = redis_client()
        with client.pipeline() as pipe:
            pipe.zadd(REVOKED_KEY, dict.fromkeys(named, now))
            pipe.zremrangebyscore(REVOKED_KEY, "-inf", now - settings.revoke_ttl_s)
            pipe.expire(REVOKED_KEY, settings.revoke_ttl_s)
            for job_id in named:
                pipe.set(revoked_key(job_id), 1, ex=settings.revoke_ttl_s)
            pipe.execute()
    return len(ids)


def load_revokes() -> int:
    """Add the revokes kept in Redis to this worker's own (Celery drops them on receipt)."""
    from tasks.broker.app import redis_client

    ids = redis_client().zrevrangebyscore(REVOKED_KEY, "+inf", time.time() - settings.revoke_ttl_s,
                                          start=0, num=LOAD_AT_MOST)
    worker_state.revoked.update(ids)
    return len(ids)


class LanesControl(Control):
    """Celery's control, with every revoke also kept in Redis before it is broadcast."""

    def broadcast(self, command: str, arguments: dict | None = None, *args: Any,
                  **kwargs: Any) -> Any:
        if command == "revoke":
            ids = (arguments or {}).get("task_id")
            record_revokes([ids] if isinstance(ids, str) else ids or [])
        return super().broadcast(command, arguments, *args, **kwargs)

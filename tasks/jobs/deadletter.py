"""Jobs that failed for good: kept with their reason, listed and requeued by operators."""
from __future__ import annotations

import json
import time
import traceback
from typing import Any

import redis

from tasks.broker.app import app
from tasks.broker.enqueue import enqueue
from tasks.broker.keys import DEAD_KEY, attempts_key, lease_key
from tasks.jobs.schema import check_job

#: Lines of traceback kept per dead job: enough to see where, not a log dump.
TRACEBACK_LINES = 12


def summary(exc: BaseException) -> str:
    """The last lines of ``exc``'s traceback, causes included."""
    lines = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    return "\n".join(lines[-TRACEBACK_LINES:])


def dead_entry(job_id: str, kwargs: dict[str, Any], reason: str, exc: BaseException,
               attempts: int, message: dict[str, Any] | None = None) -> str:
    """The JSON a dead letter keeps: the job, its route, why, where it broke."""
    entry = {"job_id": job_id, "job": kwargs["job"], "route": kwargs["route"],
             "reason": reason, "error": f"{type(exc).__name__}: {exc}",
             "traceback": summary(exc), "attempts": attempts, "failed_at": time.time()}
    if message is not None:
        entry["message"] = message
    return json.dumps(entry)


def bury(client: redis.Redis, job_id: str, kwargs: dict[str, Any], reason: str,
         exc: BaseException, attempts: int, message: dict[str, Any] | None = None) -> None:
    """Record a job that failed for good, under its id (a rerun replaces it);
    ``message`` describes a message the worker refused (``tasks.worker.rejects``)."""
    client.hset(DEAD_KEY, job_id, dead_entry(job_id, kwargs, reason, exc, attempts, message))


def dead_jobs(client: redis.Redis) -> list[dict[str, Any]]:
    """Every dead job, oldest failure first."""
    entries = [json.loads(raw) for raw in client.hvals(DEAD_KEY)]
    return sorted(entries, key=lambda entry: entry["failed_at"])


def requeue(client: redis.Redis, job_id: str) -> Any:
    """Submit a dead job again under the same id, routed like a new one
    (policy, fast time and lane limits apply), with a fresh attempt count."""
    raw = client.hget(DEAD_KEY, job_id)
    if raw is None:
        raise KeyError(f"no dead job {job_id!r}")
    job = json.loads(raw)["job"]
    check_job(job)  # a refused message (tasks.worker.rejects) would only be refused again
    # Before the publish: a worker that took the job at once would find it dead.
    client.pipeline().hdel(DEAD_KEY, job_id).delete(attempts_key(job_id), lease_key(job_id)) \
        .execute()
    app.AsyncResult(job_id).forget()  # else .get() would see the old failure
    try:
        return enqueue(job, job_id)
    except BaseException:
        client.hset(DEAD_KEY, job_id, raw)  # not requeued after all: still dead
        raise

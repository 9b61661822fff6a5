"""Jobs that failed for good: kept with their reason, listed, requeued and purged by
operators, dropped by beat after ``DEAD_TTL_S`` (``tasks.broker.keys``).

Every write of a letter changes ``DEAD_KEY`` and its index ``DEAD_INDEX_KEY`` (job id ->
when it failed) in one step, so expiry reads the oldest letters from the index,
a bounded number per Lua call, and never scans the hash."""
from __future__ import annotations

import json
import time
import traceback
from typing import Any

import redis

from tasks.broker import leader, scripts
from tasks.broker.app import app
from tasks.broker.enqueue import enqueue
from tasks.broker.keys import BEAT_EPOCH_KEY, DEAD_INDEX_KEY, DEAD_KEY, attempts_key, lease_key
from tasks.broker.runs import failed_at
from tasks.jobs.schema import check_job

#: Lines of traceback kept per dead job: enough to see where, not a log dump.
TRACEBACK_LINES = 12
#: Letters dropped per Lua call at most: one call never holds Redis long, and beat's
#: round drops no more than this (a backlog goes over a few rounds).
EXPIRE_BATCH = 500


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
    _record(client, job_id, dead_entry(job_id, kwargs, reason, exc, attempts, message))


def _record(client: redis.Redis, job_id: str, entry: str | bytes) -> None:
    """Write one letter and its index entry in one transaction (MULTI)."""
    client.pipeline().hset(DEAD_KEY, job_id, entry) \
        .zadd(DEAD_INDEX_KEY, {job_id: failed_at(entry)}).execute()


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
    # checked: a refused message (tasks.worker.rejects) would only be refused again
    job = check_job(json.loads(raw)["job"])
    # Before the publish: a worker that took the job at once would find it dead.
    client.pipeline().hdel(DEAD_KEY, job_id).zrem(DEAD_INDEX_KEY, job_id) \
        .delete(attempts_key(job_id), lease_key(job_id)).execute()
    app.AsyncResult(job_id).forget()  # else .get() would see the old failure
    try:
        return enqueue(job, job_id)
    except BaseException:
        _record(client, job_id, raw)  # not requeued after all: still dead
        raise


def drop_dead(client: redis.Redis, cutoff: float | str, calls: int | None = 1) -> int:
    """Drop the letters of jobs that failed before ``cutoff`` (unix s; ``"+inf"``: all),
    ``EXPIRE_BATCH`` per Lua call, in at most ``calls`` calls (None: until none is due);
    how many were dropped. Letters the index lacks are indexed on the way."""
    dropped, made = 0, 0
    while True:
        taken, strays = scripts.run(client, "dead_expire",
                                    [DEAD_KEY, DEAD_INDEX_KEY, BEAT_EPOCH_KEY],
                                    [cutoff, EXPIRE_BATCH, leader.epoch()])
        dropped, made = dropped + taken, made + 1
        if strays > 0 and index_strays(client):
            continue  # they may be due as well: one more call, whatever ``calls`` says
        if taken < EXPIRE_BATCH or (calls is not None and made >= calls):
            return dropped


def index_strays(client: redis.Redis) -> int:
    """Index the letters the index lacks, as of when each says it failed; how many.
    Only letters written before the index existed are missing: one pass over the hash
    after an upgrade, never part of a normal round."""
    letters = [item for job_id, raw in client.hscan_iter(DEAD_KEY, count=EXPIRE_BATCH)
               for item in (job_id, repr(failed_at(raw)))]
    step = 2 * EXPIRE_BATCH
    return sum(scripts.run(client, "dead_index", [DEAD_KEY, DEAD_INDEX_KEY],
                           letters[i:i + step]) for i in range(0, len(letters), step))

"""Where a job stands, from its result and else from what the broker records of accepted
jobs (``lanes job``, ``lanes cancel``): a lane's list, a worker's held records, its
run's lease and counters, a coalesced run it follows.

An operator's question, not the per-job path: a job with no result and in no list costs
a read of every holder's records and of the coalesced runs' keys.
"""
from __future__ import annotations

from typing import Any, Callable

import redis

from tasks.broker import envelope
from tasks.broker.handover import holders
from tasks.broker.keys import (
    DEAD_KEY,
    RUN_KEY_PREFIX,
    attempts_key,
    done_key,
    held_key,
    lease_key,
    parse_entry,
    revoked_key,
)

#: Keys read per round trip while looking through a hash or the coalesced runs.
BATCH = 1000


def describe(app: Any, client: redis.Redis, job_id: str) -> dict[str, Any]:
    """A job's state: its result, its progress, where it waits, or what else the broker
    holds of it. ``state`` stays ``PENDING`` only for a job nothing records: never
    submitted (or not yet), or its records expired."""
    from tasks.broker.queued import place

    result = app.AsyncResult(job_id)
    state, info = result.state, result.info
    if state == "PROGRESS" and not (isinstance(info, dict) and "step" in info):
        state, info = result.state, result.info  # it ended between the two reads
    found: dict[str, Any] = {"id": job_id, "state": state}
    if state == "SUCCESS" and isinstance(info, dict):
        found["result"] = info
    elif state == "PROGRESS" and isinstance(info, dict):
        found["progress"] = info
    elif state in ("FAILURE", "REVOKED", "RETRY"):
        found["error"] = f"{type(info).__name__}: {info}" if info else state.lower()
    elif (waiting := place(client, job_id)) is not None:
        found.update(state="QUEUED", **waiting)
    elif running(client, job_id):
        found["state"] = "STARTED"  # taken, no step reported yet
    elif state == "PENDING":
        found.update(unlisted(client, job_id) or {})
    return found


def running(client: redis.Redis, job_id: str) -> bool:
    """Whether a run holds the job's lease (one it handed back reads ``released#...``)."""
    from tasks.broker.publish import RELEASED

    lease = client.get(lease_key(job_id))
    return bool(lease) and not _text(lease).startswith(RELEASED)


def unlisted(client: redis.Redis, job_id: str) -> dict[str, Any] | None:
    """What the broker holds of a job in no list and without a result: its message
    taken (``TAKEN``), a run it follows (``FOLLOWING``), a revoke (``REVOKED``) or run
    records (``ACCEPTED``); None: nothing."""
    with client.pipeline(transaction=False) as pipe:
        pipe.exists(revoked_key(job_id))
        pipe.exists(attempts_key(job_id), done_key(job_id))
        pipe.hexists(DEAD_KEY, job_id)
        revoked, ran, dead = pipe.execute()
    if any(holds(client, held_key(who), job_id, _held) for who in holders(client)):
        return {"state": "TAKEN"}
    if leader := leader_of(client, job_id):
        return {"state": "FOLLOWING", "leader": leader}
    if revoked:
        return {"state": "REVOKED", "error": "cancelled"}
    return {"state": "ACCEPTED"} if ran or dead else None


def _held(raw: str) -> Any:
    """The envelope of a held record: ``<list>\n<message>``."""
    return envelope.decode(parse_entry(raw)[1])


def holds(client: redis.Redis, key: str, job_id: str, read: Callable[[str], Any]) -> bool:
    """Whether hash ``key`` holds a message of ``job_id`` (``read``: its envelope)."""
    for _, raw in client.hscan_iter(key, count=BATCH):
        text = _text(raw)
        if job_id not in text:  # cheap first: a message names its job's id
            continue
        try:
            if envelope.job_id(read(text)) == job_id:
                return True
        except (ValueError, IndexError, KeyError, TypeError):
            continue
    return False


def leader_of(client: redis.Redis, job_id: str) -> str | None:
    """The job whose coalesced run ``job_id`` follows (``tasks.jobs.cache``), if any."""
    keys = list(client.scan_iter(match=f"{RUN_KEY_PREFIX}*", count=BATCH))
    for start in range(0, len(keys), BATCH):
        batch = keys[start:start + BATCH]
        with client.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.hexists(key, f"f:{job_id}")
            answers = pipe.execute(raise_on_error=False)
        for key, follows in zip(batch, answers):
            if follows is True:
                return _text(key)[len(RUN_KEY_PREFIX):]
    return None


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value

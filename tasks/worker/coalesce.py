"""In-flight coalescing, worker side: a run that ends settles every caller attached to it.

``tasks.jobs.cache.claim`` registers the callers of an identical seeded job as
followers in the run's hash (``tasks.broker.keys.run_key(leader id)``). Each has
its own job id and result, so a caller's revoke or timeout concerns its own
id only and never the run the others wait for. Wired to Celery signals in the
worker and called by ``tasks.worker.generate``, this module closes a run:

- **success** (before the leader's own result is stored, so no caller that
  has seen a result can join the finished run): one Lua script drops the run
  and its in-flight pointer, admits the result to the cache when its digest
  had been seen before (with its TTL, and the LRU budget trimmed in the same
  script), and returns the followers; each gets a copy of the result
  (``cached``, ``coalesced``), or REVOKED when its own caller revoked it;
- **failure for good** (a retry keeps the run open): every follower fails with
  ``JobFailed`` naming the run, once: the task's own give-up and Celery's
  ``task_failure`` signal that follows it both settle the run, and only the first
  settle of a run returns its followers (a settle retried after a lost reply is the
  same settle: same token, same followers);
- **the leader's own caller revoked it while it ran**: the run goes on while a
  follower still wants it (its step guard asks once, ``wanted_by_followers``); the
  followers get the result and the leader's caller REVOKED;
- **the leader's own caller revoked it before it ran**: the follower of the
  fastest tier inherits the run (the pointer and the other followers move over) and
  its job is published under its own id and tier; that publish confirms the run and
  gives it the rank of the lane the heir is sent to, and nobody joins it before. With
  no follower the run is dropped, so later identical jobs start afresh.

Followers get their result in the result backend only: no message carries a
follower's id (an heir's does, and it then leads and finishes like any job),
so the per-id done keys of ``tasks.worker.generate`` are not needed for them.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

import redis
from celery import signals, states
from celery.worker.state import revoked as revoked_ids

from routing.names import JOB_TASK_NAMES
from tasks.broker import scripts
from tasks.broker.app import app, redis_client
from tasks.broker.enqueue import enqueue
from tasks.broker.keys import CACHE_LRU_KEY, RUN_KEY_PREFIX, run_key
from tasks.broker.message import Job
from tasks.broker.outage import persist
from tasks.errors import JobFailed
from tasks.jobs.cache import copy_for, provisional_s
from tasks.settings import settings

log = logging.getLogger(__name__)
#: How long a settled run stays, marked, for a retried settle to find (``settle``).
SETTLED_KEPT_S = 300
#: The settle token of a run that succeeded (a failure's names its reason: ``_failed``).
SUCCEEDED = "ok"


def settle(leader_id: str, result: dict[str, Any] | None,
           token: str = SUCCEEDED) -> list[tuple[str, dict]]:
    """Close the run led by ``leader_id`` (admitting ``result`` if it earned it);
    its followers as (job id, {"job", "submitted_at"}). Only the first settle of a run,
    or the same settle (``token``) tried again, gets them: none is told twice."""
    keys, args = settle_call(leader_id, token)
    flat = scripts.run(redis_client(), "run_settle", keys,
                       [args[0], json.dumps(result) if result is not None else "", *args[1:]])
    return followers_of(zip(flat[::2], flat[1::2]))


def settle_call(leader_id: str, token: str = SUCCEEDED) -> tuple[list[str], list[Any]]:
    """The keys and arguments of settling ``leader_id``'s run (``lua/settle.lua``), the
    result apart: a run's finish settles it with the result it records."""
    return [run_key(leader_id), CACHE_LRU_KEY], [
        leader_id, settings.cache_ttl_s, settings.cache_max_entries, time.time(),
        SETTLED_KEPT_S, token]


def followers_of(flat: Any) -> list[tuple[str, dict]]:
    """(job id, {"job", "submitted_at"}) of each (job id, entry JSON) a settle returned."""
    return [(job_id, json.loads(entry)) for job_id, entry in flat]


def _failed(why: str) -> str:
    """The settle token of a failure: a call tried again after a lost reply passes the
    same ``why``; another caller (the ``task_failure`` signal after the task's own
    give-up) words it otherwise, and finds the followers already told."""
    return "failed:" + hashlib.blake2b(why.encode(), digest_size=8).hexdigest()


def deliver(followers: list[tuple[str, dict]], result: dict[str, Any]) -> None:
    """Write each follower's copy of ``result``; a follower revoked by its caller gets REVOKED."""
    for job_id, entry in followers:
        if job_id in revoked_ids:
            app.backend.mark_as_revoked(job_id, "revoked by its caller")
            continue
        queued_s = max(0.0, result["started_at"] - entry["submitted_at"])
        app.backend.store_result(job_id, copy_for(result, entry["job"], job_id, coalesced=True,
                                                  queued_ms=round(queued_s * 1000, 1)),
                                 states.SUCCESS)


def wanted_by_followers(leader_id: str) -> bool:
    """Whether a caller other than the leader's own still waits for its run (a follower
    its own caller has not revoked): then a running leader revoked runs on for them."""
    try:
        fields = redis_client().hkeys(run_key(leader_id))
    except redis.RedisError:  # not known: the revoke is honoured, an heir takes the run
        return False
    return any(f.startswith("f:") and f[2:] not in revoked_ids for f in fields)


def fail_followers(leader_id: str, why: str) -> int:
    """Fail every follower of the run led by ``leader_id``; how many there were."""
    followers = settle(leader_id, None, _failed(why))
    for job_id, _ in followers:
        app.backend.mark_as_failure(job_id, JobFailed(
            f"job {job_id} shared the run of job {leader_id}, which failed: {why}"))
    return len(followers)


def promote(leader_id: str) -> str | None:
    """Hand a revoked leader's run to its first follower and publish that one's job."""
    heir = scripts.run(redis_client(), "run_promote", [run_key(leader_id)],
                       [leader_id, RUN_KEY_PREFIX, settings.result_ttl_s, provisional_s()])
    if not heir:
        return None
    job_id, entry, pointer = heir[0], json.loads(heir[1]), heir[2]
    # Routed like any job (lane policy, fast places, the router's count); accepted
    # already, so no lane limit refuses it. Its publish confirms the run, ranked by
    # the lane it lands in, as a new leader's does.
    persist(lambda: enqueue(Job.decode(entry["job"]).leading(), job_id,
                            (pointer, run_key(job_id)), submitted_at=entry["submitted_at"],
                            accepted=True),
            f"the heir {job_id} of revoked job {leader_id}")
    log.info("job %s revoked by its caller; its run goes on as job %s", leader_id, job_id)
    return job_id


def _ours(sender: Any) -> bool:
    return getattr(sender, "name", None) in JOB_TASK_NAMES


# ``tasks.worker.generate`` closes its runs itself; these catch what it cannot: an
# unexpected error escaping the task, and a message revoked before it ran.
@signals.task_failure.connect(weak=False)
def _on_failure(sender: Any = None, task_id: str = "", exception: Any = None,
                kwargs: dict | None = None, **_: Any) -> None:
    if _ours(sender) and Job.leads(kwargs):
        fail_followers(task_id, f"{type(exception).__name__}: {exception}")


@signals.task_revoked.connect(weak=False)
def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if _ours(sender) and request is not None:
        promote(request.id)

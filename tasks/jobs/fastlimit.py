"""Per-account limit on the fast lane: one account cannot flood it.

An account may have at most ``GPULANES_FAST_JOBS_PER_ACCOUNT`` fast jobs
waiting to start. Each one is a member of the account's sorted set in Redis
(``tasks.broker.keys.fast_queued_key``), added by ``submit()`` in the Lua call that
publishes the job (``tasks.broker.publish``: no round trip of its own, and a publish
refused or lost takes no place) and removed when the job leaves the fast lane's
queue: by the worker in the
script that starts it, by beat when it moves it down a lane, or when it
is revoked. A fast job over the limit runs in the standard lane
(``downgrade_reason: fast_account_limit``), so it is accepted and still runs
soon, but the fast lane holds at most that many of one account's jobs ahead
of anyone else's.

A place lapses after ``tasks.broker.enqueue.PLACE_LAPSE_S`` (scored on Redis' clock), so a place
never given back (a job lost with its message some other way) cannot be held
for ever.
"""
from __future__ import annotations

import contextlib
from typing import Any

import redis
from celery import signals

from routing.names import FAIR_LANES, JOB_TASK_NAMES
from tasks.broker.app import redis_client
from tasks.broker import scripts
from tasks.broker.keys import queued_key, waiting_accounts_key


def release_queued(account: str, job_id: str) -> None:
    """A job that left its lane's queue without starting (revoked, past its Cancel-After)
    leaves its account's jobs waiting there: its fast place, its weight on the level of
    the account's next jobs (``routing.fair.queued_level``)."""
    keys = [key for lane in FAIR_LANES
            for key in (queued_key(lane, account), waiting_accounts_key(lane))]
    with contextlib.suppress(redis.RedisError):  # they lapse anyway
        scripts.run(redis_client(), "fair_leave", keys, [account, job_id])


@signals.task_revoked.connect(weak=False)
def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A job revoked before it started gives its places back."""
    if getattr(sender, "name", None) not in JOB_TASK_NAMES or request is None:
        return
    kwargs = request.kwargs or {}
    release_queued(str((kwargs.get("job") or {}).get("account")), request.id)

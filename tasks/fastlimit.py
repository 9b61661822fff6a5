"""Per-account limit on the fast lane: one account cannot flood it.

An account may have at most ``GPULANES_FAST_JOBS_PER_ACCOUNT`` fast jobs
waiting to start. Each one is a member of the account's sorted set in Redis
(``routing.names.fast_queued_key``), added by ``submit()`` in one atomic Lua
call and removed when the job leaves the fast lane's queue: by the worker in
the script that starts it, by beat when it moves it down a lane, or when it
is revoked. A fast job over the limit runs in the standard lane
(``downgrade_reason: fast_account_limit``), so it is accepted and still runs
soon, but the fast lane holds at most that many of one account's jobs ahead
of anyone else's.

Only jobs routed to the fast lane pay this round trip. A place lapses after
``PLACE_LAPSE_S`` (scored on Redis' clock), so a job whose place was never
given back (its submitter died between the admission and the publish)
cannot hold it for ever. If Redis does not answer, the job is admitted
without a place and the publish decides, as for any other job.
"""
from __future__ import annotations

import contextlib
import logging
from functools import lru_cache
from typing import Any

import redis
from celery import signals

import celeryconfig as cfg
from routing.names import FAST, GENERATE_TASK, fast_queued_key
from tasks.celeryapp import redis_client

log = logging.getLogger(__name__)
#: Seconds after which a place not given back lapses.
PLACE_LAPSE_S = 3600

# KEYS: the account's set. ARGV: limit, lapse seconds, job id.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 60)
return 1
"""


@lru_cache(maxsize=1)
def _admit_script() -> Any:
    return redis_client().register_script(_ADMIT)


def admit_fast(account: str, job_id: str) -> bool:
    """Take one of ``account``'s fast places for ``job_id``; False when all are taken."""
    if not cfg.FAST_JOBS_PER_ACCOUNT:
        return True
    try:
        return bool(_admit_script()(keys=[fast_queued_key(account)],
                                    args=[cfg.FAST_JOBS_PER_ACCOUNT, PLACE_LAPSE_S, job_id]))
    except redis.RedisError as exc:
        log.warning("fast places unreachable (%s): job %s admitted without one", exc, job_id)
        return True


def release_fast(account: str, job_id: str) -> None:
    """Give back the place of a job that left the fast lane's queue without starting."""
    with contextlib.suppress(redis.RedisError):  # it lapses anyway
        redis_client().zrem(fast_queued_key(account), job_id)


def fast_waiting(account: str) -> int:
    """How many of ``account``'s fast jobs hold a place now (lapsed ones excluded)."""
    client = redis_client()
    now_s, now_us = client.time()
    return client.zcount(fast_queued_key(account), now_s + now_us / 1e6, "+inf")


@signals.task_revoked.connect(weak=False)
def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A fast job revoked before it started gives its place back."""
    if getattr(sender, "name", None) != GENERATE_TASK or request is None:
        return
    kwargs = request.kwargs or {}
    if (kwargs.get("route") or {}).get("requested_tier") == FAST:
        release_fast(str((kwargs.get("job") or {}).get("account")), request.id)

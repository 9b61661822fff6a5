"""Per-account limit on the fast lane: one account cannot flood it.

An account may have at most ``GPULANES_FAST_JOBS_PER_ACCOUNT`` fast jobs
waiting to start. Each one is a member of the account's sorted set in Redis
(``routing.names.fast_queued_key``), added by ``submit()`` in one atomic Lua
call and removed by the worker in the script that starts the job. A fast job
over the limit runs in the standard lane (``downgrade_reason:
fast_account_limit``), so it is accepted and still runs soon, but the fast
lane holds at most that many of one account's jobs ahead of anyone else's.

Only jobs routed to the fast lane pay this round trip. A member lapses after
the broker's visibility timeout, so a job that never starts (revoked, or its
publish failed after the admission) cannot hold a place for ever.
"""
from __future__ import annotations

import time
from functools import lru_cache
from typing import Any

import celeryconfig as cfg
from routing.names import fast_queued_key
from tasks.celeryapp import redis_client

# KEYS: the account's set. ARGV: now, limit, lapse time, job id, key ttl.
_ADMIT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


@lru_cache(maxsize=1)
def _admit_script() -> Any:
    return redis_client().register_script(_ADMIT)


def admit_fast(account: str, job_id: str) -> bool:
    """Take one of ``account``'s fast places for ``job_id``; False when all are taken."""
    if not cfg.FAST_JOBS_PER_ACCOUNT:
        return True
    now, hold_s = time.time(), cfg.VISIBILITY_TIMEOUT_S
    return bool(_admit_script()(keys=[fast_queued_key(account)],
                                args=[repr(now), cfg.FAST_JOBS_PER_ACCOUNT,
                                      repr(now + hold_s), job_id, int(hold_s) + 1]))


def release_fast(account: str, job_id: str) -> None:
    """Give back a place taken for a job that was not published after all."""
    redis_client().zrem(fast_queued_key(account), job_id)


def fast_waiting(account: str) -> int:
    """How many of ``account``'s fast jobs hold a place now (lapsed ones excluded)."""
    return redis_client().zcount(fast_queued_key(account), repr(time.time()), "+inf")

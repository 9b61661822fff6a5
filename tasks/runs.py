"""The Redis side of one run of a job: begin it, then record its outcome, fenced.

- :func:`begin` is one Lua call: a finished job answers with its result; a
  revoked job is not run; a job another run holds is left to it; otherwise the
  job's run counter goes up and the new run takes the lease
  (``gpu_worker.lease``), its number the run's fencing token.
- :func:`finish`, :func:`give_up` and :func:`release` each check, in the same
  Lua call as their writes, that the run still holds its job; a stale run (a
  newer one took over) writes nothing. So do a retry's publish
  (``tasks.publish``, ``fence``) and the lease's extensions.
- Outcome writes go through ``tasks.outage.persist``, tried until Redis answers:
  a worker keeps a job's outcome through an outage and records it then, never
  reports a false failure.
"""
from __future__ import annotations

import json
import logging
import time
from functools import lru_cache
from typing import Any

import celeryconfig as cfg
from routing.names import (DEAD_KEY, FAST_BALANCE_KEY, FAST_EXHAUSTED_KEY, HOLDERS_KEY,
                           METRICS_KEY, REVOKED_KEY, USAGE_BUCKET_S, attempts_key, done_key,
                           fast_queued_key, lease_key, usage_key)
from tasks.accounts import ADD_FUNCTION
from tasks.celeryapp import redis_client
from tasks.publish import HOLDS, RELEASED

log = logging.getLogger(__name__)

# KEYS: done, lease, run counter, revoked set, dead letters, holders[, the account's
# fast places]. ARGV: holder, lease ttl, counter ttl, job id, delivery tag, '1' for a
# copy deferred earlier (it steps aside from a released lease: another copy exists).
# The lease is "<holder>#<run number>#<delivery tag>"; one marked released is free.
# A call retried after a lost reply finds its own lease and carries on as that run.
# A lease held by another run: 'busy' while that run's own message is recorded as
# held (it comes back if that run dies), else 'defer': this copy may be the last one.
_BEGIN = """
if KEYS[7] then redis.call('ZREM', KEYS[7], ARGV[4]) end
local done = redis.call('GET', KEYS[1])
if done then return {'done', done} end
local letter = redis.call('HGET', KEYS[5], ARGV[4])
if letter then return {'dead', letter} end
if redis.call('ZSCORE', KEYS[4], ARGV[4]) then return {'revoked', ''} end
local lease = redis.call('GET', KEYS[2])
local released = lease and string.sub(lease, 1, %(n)d) == '%(released)s'
if released and ARGV[6] == '1' then return {'superseded', ''} end
if lease and not released then
  local head, tail = ARGV[1] .. '#', '#' .. ARGV[5]
  if ARGV[5] ~= '' and string.sub(lease, 1, #head) == head
      and string.sub(lease, -#tail) == tail then
    return {'run', string.sub(lease, #head + 1, -#tail - 1)}
  end
  local twin = string.match(lease, '#([^#]*)$')
  if twin and twin ~= '' and redis.call('HEXISTS', KEYS[6], twin) == 1 then
    return {'busy', ''}
  end
  return {'defer', ''}
end
local n = redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ARGV[3])
redis.call('SET', KEYS[2], ARGV[1] .. '#' .. n .. '#' .. ARGV[5], 'EX', ARGV[2])
return {'run', tostring(n)}
""" % {"released": RELEASED, "n": len(RELEASED)}
# KEYS: lease, run counter, done, usage bucket, metrics[, fast balances, exhausted].
# ARGV: token, run number, result, result ttl, account, run s, usage ttl, starting fast
# balance, then (metric field, amount) pairs. A call retried after a lost reply finds
# its own result ('earlier') and counts nothing twice.
_FINISH = HOLDS + ADD_FUNCTION + """
if not holds(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return {'stale', ''} end
local earlier = redis.call('GET', KEYS[3])
redis.call('DEL', KEYS[1])
if earlier then return {'earlier', earlier} end
redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[4])
redis.call('HINCRBYFLOAT', KEYS[4], ARGV[5], ARGV[6])
redis.call('EXPIRE', KEYS[4], ARGV[7])
for i = 9, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[5], ARGV[i], ARGV[i + 1]) end
if KEYS[6] then add(KEYS[6], KEYS[7], ARGV[5], -tonumber(ARGV[6]), ARGV[8]) end
return {'stored', ''}
"""
# KEYS: lease, run counter, dead letters, metrics. ARGV: token, run number, job id,
# dead letter, metric field. A call retried after a lost reply finds its letter (first:
# the lease may have been marked released meanwhile, by a put-back of a copy).
_GIVE_UP = HOLDS + """
if redis.call('HEXISTS', KEYS[3], ARGV[3]) == 1 then return 1 end
if not holds(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return 0 end
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
redis.call('DEL', KEYS[1])
redis.call('HINCRBY', KEYS[4], ARGV[5], 1)
return 1
"""
# KEYS: lease, run counter. ARGV: token, run number.
_RELEASE = HOLDS + """
if holds(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then redis.call('DEL', KEYS[1]) end
"""
@lru_cache(maxsize=4)
def _script(source: str) -> Any:
    return redis_client().register_script(source)


def token(holder: str, attempt: int, tag: str) -> str:
    """The lease value of run ``attempt`` taken by ``holder`` from message ``tag``."""
    return f"{holder}#{attempt}#{tag}"


def begin(job_id: str, holder: str, tag: str, fast_account: str | None,
          deferred: bool = False) -> tuple[str, str]:
    """(``run``, its number) | (``done``, the result JSON) | (``dead``, the dead letter)
    | (``revoked``|``busy``|``defer``|``superseded``, '').

    A fast job gives back its account's fast place (``tasks.fastlimit``) here."""
    keys = [done_key(job_id), lease_key(job_id), attempts_key(job_id), REVOKED_KEY, DEAD_KEY,
            HOLDERS_KEY]
    if fast_account is not None:
        keys.append(fast_queued_key(fast_account))
    return tuple(_script(_BEGIN)(keys=keys, args=[holder, cfg.LEASE_TTL_S, cfg.RUNS_KEPT_S,
                                                  job_id, tag, "1" if deferred else ""]))


def finish(job_id: str, token: str, attempt: int, result: dict[str, Any], account: str,
           counts: dict[str, float], charge_fast: bool) -> tuple[str, str]:
    """Store ``result`` as the job's, count it, add its GPU time to ``account``'s usage
    and (``charge_fast``) charge it fast seconds, if the run still holds the job:
    (``stored``|``stale``, '') or (``earlier``, the result stored before)."""
    run_s = result["run_ms"] / 1000
    bucket = usage_key(int(time.time()) // USAGE_BUCKET_S)
    keys = [lease_key(job_id), attempts_key(job_id), done_key(job_id), bucket, METRICS_KEY]
    if charge_fast:
        keys += [FAST_BALANCE_KEY, FAST_EXHAUSTED_KEY]
    args = [token, attempt, json.dumps(result), cfg.result_expires, account, repr(run_s),
            cfg.FAIR_WINDOW_S + USAGE_BUCKET_S, repr(cfg.FAST_SECONDS_DEFAULT),
            *(item for field, amount in counts.items() for item in (field, repr(amount)))]
    return tuple(_script(_FINISH)(keys=keys, args=args))


def give_up(job_id: str, token: str, attempt: int, entry: str, failures_field: str) -> bool:
    """Dead-letter the job (``entry``) if the run still holds it; False: stale."""
    return bool(_script(_GIVE_UP)(
        keys=[lease_key(job_id), attempts_key(job_id), DEAD_KEY, METRICS_KEY],
        args=[token, attempt, job_id, entry, failures_field]))


def release(job_id: str, token: str, attempt: int) -> None:
    """Drop the run's lease if it still holds it."""
    _script(_RELEASE)(keys=[lease_key(job_id), attempts_key(job_id)], args=[token, attempt])

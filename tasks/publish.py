"""The publish script: one Lua call that pushes a job message and writes its ledger
entry, and first checks what the publisher asked for (``tasks.transport`` runs it).

It checks, before it writes anything, what the publisher asked for in
:func:`publishing` and refuses the whole publish if one fails:

- a lane's maximum depth for new jobs (``submit()``): it sums the lengths of
  every list of the lane and pushes only below the limit, else
  :class:`LaneAtLimit`. Any number of submitters together never pass the
  limit. Messages published outside it (retries, restores) are never refused:
  a job once accepted is not dropped for want of room;
- a deadline (``submit()``): a publish that reaches Redis after its caller gave
  up (a Redis frozen for a while executes what was sent meanwhile) writes
  nothing (:class:`PublishRefused`, ``late``);
- the account's fast place (a fast job, ``tasks.fastlimit``): taken in the
  same step, so a refused or failed publish leaves no place behind;
- the run of a result-cache claim is confirmed (``tasks.cache``): a claim whose
  job was never published lapses by itself and no caller waits on it;
- a fence (a worker's retry of its job, ``tasks.generate``): only the run that
  still holds the job may publish its next copy, and the same step marks the
  run's lease released.

A refusal is raised as the :func:`publishing` block ends, not from inside the
publish: kombu replaces a pooled connection whenever an error crosses its
producer, and a refusal is routine (a full lane, a flooding account).
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

import redis

from routing.names import LEDGER_KEY, lists_key

#: A lease a run handed over (its retry published, or its message put back) reads
#: ``RELEASED`` + the run number: the old run can never take it again, and the next
#: run begins as if it were free. Kept as long as a job's run counter.
RELEASED = "released#"
#: Lua: whether the run ``token`` (run number ``n``) still holds its job: the lease
#: is its own, or lapsed with no newer run begun (``gpu_worker.lease``).
HOLDS = """
local function holds(lease_key, counter_key, token, n)
  local lease = redis.call('GET', lease_key)
  if lease then return lease == token end
  return tonumber(redis.call('GET', counter_key) or '0') == tonumber(n)
end
"""

# KEYS: list, ledger, the lane's lists, then (or '' when unused) the account's fast
# places, a claimed run's pointer and hash, the job's lease and run counter.
# ARGV: message, delivery tag, the lane's maximum depth (0: none), deadline (Redis'
# unix s, 0: none), fast places allowed (0: take none), place lapse s, job id, run ttl
# s, fence token ('' : none), the fenced run's number, how long a released lease is
# kept.
# Returns 1 (pushed), or a refusal having written nothing: 0 the lane is full,
# -1 too late, -2 the account's fast places are taken, -3 the fence does not hold.
# The lane's lists are read by name from its set: a standalone Redis allows it.
# The same message published again (same delivery tag) before a worker took it finds
# its own ledger entry and does nothing. (Celery gives every publish a new tag: a
# retry's publish tried again is stopped by its fence instead, the lease released.)
_PUT = HOLDS + """
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return 1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if tonumber(ARGV[4]) > 0 and now > tonumber(ARGV[4]) then return -1 end
if ARGV[9] ~= '' and not holds(KEYS[7], KEYS[8], ARGV[9], ARGV[10]) then return -3 end
local limit = tonumber(ARGV[3])
if limit > 0 then
  local depth = 0
  for _, key in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    depth = depth + redis.call('LLEN', key)
  end
  if depth >= limit then return 0 end
end
local places = tonumber(ARGV[5])
if places > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  if redis.call('ZCARD', KEYS[4]) >= places then return -2 end
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[6]), ARGV[7])
  redis.call('EXPIRE', KEYS[4], math.ceil(tonumber(ARGV[6])) + 60)
end
if KEYS[5] ~= '' and redis.call('GET', KEYS[5]) == ARGV[7] then
  redis.call('EXPIRE', KEYS[5], ARGV[8])
  redis.call('HSET', KEYS[6], 'confirmed', '1')
  redis.call('EXPIRE', KEYS[6], ARGV[8])
end
if ARGV[9] ~= '' then
  redis.call('SET', KEYS[7], '%s' .. ARGV[10], 'EX', ARGV[11])
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[2], KEYS[1] .. '\\n' .. ARGV[1])
redis.call('SADD', KEYS[3], KEYS[1])
return 1
""" % RELEASED

_put_script: list[Any] = []
@dataclass(frozen=True)
class Conditions:
    """What a publish must satisfy, checked in the same step as the push."""

    limit: int = 0                    #: the lane's maximum depth (0: none)
    deadline: float = 0.0             #: unix s after which the publish is refused (0: none)
    fast_places: tuple[str, int, float] | None = None  #: (key, allowed, lapse s)
    run: tuple[str, str, int] | None = None  #: a claimed run: (pointer, hash, ttl s)
    #: (lease, counter, token, run number, seconds a released lease is kept)
    fence: tuple[str, str, str, int, int] | None = None


@dataclass
class _Outcome:
    """A refusal the publish script returned, raised once the publish has left kombu."""

    refusal: Exception | None = None


_conditions: ContextVar[tuple[Conditions, _Outcome]] = ContextVar(
    "gpulanes_publish", default=(Conditions(), _Outcome()))


class LaneAtLimit(Exception):
    """A publish inside :func:`publishing` found its lane at its maximum depth."""

    def __init__(self, lane: str, limit: int) -> None:
        super().__init__(f"lane {lane!r} holds {limit} queued jobs, its maximum")
        self.lane, self.limit = lane, limit


class PublishRefused(Exception):
    """A publish inside :func:`publishing` failed a condition; nothing was written.
    ``why``: ``late``, ``fast_places`` or ``fence``."""

    def __init__(self, why: str) -> None:
        super().__init__(f"publish refused: {why}")
        self.why = why


_REFUSALS = {-1: "late", -2: "fast_places", -3: "fence"}


@contextmanager
def publishing(**conditions: Any) -> Iterator[None]:
    """Publishes to a lane made in this block meet :class:`Conditions` or write nothing:
    :class:`LaneAtLimit` or :class:`PublishRefused` is raised as the block ends (see
    the module's docstring: not from inside kombu's publish)."""
    outcome = _Outcome()
    token = _conditions.set((Conditions(**conditions), outcome))
    try:
        yield
    finally:
        _conditions.reset(token)
    if outcome.refusal is not None:
        raise outcome.refusal


def lane_limit(depth: int) -> Any:
    """Publishes to a lane made in this block raise :class:`LaneAtLimit` instead of
    passing ``depth`` jobs queued in that lane (every list of it, every worker's)."""
    return publishing(limit=depth)


def current() -> tuple[Conditions, _Outcome]:
    """The conditions of the publish under way, and where to leave its refusal."""
    return _conditions.get()


def refusal(verdict: int, lane: str, limit: int) -> Exception:
    """What a refusing verdict of the script means."""
    return LaneAtLimit(lane, limit) if verdict == 0 else PublishRefused(_REFUSALS[verdict])


def _put_call(key: str, lane: str, payload: str, tag: str, job_id: str,
              when: Conditions) -> tuple[list[str], list[Any]]:
    """The KEYS and ARGV of ``_PUT``."""
    places, allowed, lapse_s = when.fast_places or ("", 0, 0)
    pointer, run, run_ttl_s = when.run or ("", "", 0)
    lease, counter, token, attempt, kept_s = when.fence or ("", "", "", 0, 0)
    return ([key, LEDGER_KEY, lists_key(lane), places, pointer, run, lease, counter],
            [payload, tag, when.limit, when.deadline, allowed, lapse_s, job_id, run_ttl_s,
             token, attempt, kept_s])


def _put(client: redis.Redis, lane: str, key: str, payload: str, tag: str, job_id: str,
         when: Conditions) -> int:
    if not _put_script:  # registered once per process, run on any client
        _put_script.append(client.register_script(_PUT))
    keys, args = _put_call(key, lane, payload, tag, job_id, when)
    return int(_put_script[0](keys=keys, args=args, client=client))

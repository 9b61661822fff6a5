"""In-flight coalescing, worker side: a run that ends settles every caller attached to it.

``tasks.cache.claim`` registers the callers of an identical seeded job as
followers in the run's hash (``routing.names.run_key(leader id)``). Each has
its own job id and result, so a caller's revoke or timeout concerns its own
id only and never the run the others wait for. Wired to Celery signals in the
worker and called by ``tasks.generate``, this module closes a run:

- **success** (before the leader's own result is stored, so no caller that
  has seen a result can join the finished run): one Lua script drops the run
  and its in-flight pointer, admits the result to the cache when its digest
  had been seen before (with its TTL, and the LRU budget trimmed in the same
  script), and returns the followers; each gets a copy of the result
  (``cached``, ``coalesced``), or REVOKED when its own caller revoked it;
- **failure for good** (a retry keeps the run open): every follower fails with
  ``JobFailed`` naming the run;
- **the leader's own caller revoked it before it ran**: the follower of the
  fastest tier inherits the run (the pointer and the other followers move over, and the
  run takes the heir's tier) and its job is published under its own id and
  tier; with no follower the run is
  dropped, so later identical jobs start afresh.

Followers get their result in the result backend only: no message carries a
follower's id (an heir's does, and it then leads and finishes like any job),
so the per-id done keys of ``tasks.generate`` are not needed for them.
"""
from __future__ import annotations

import json
import logging
import time
from functools import lru_cache
from typing import Any

from celery import signals, states
from celery.worker.state import revoked as revoked_ids

import celeryconfig as cfg
from routing.lanes import route
from routing.names import CACHE_LRU_KEY, GENERATE_TASK, RUN_KEY_PREFIX, run_key
from tasks.cache import LEADS_RUN, copy_for
from tasks.celeryapp import app, redis_client
from tasks.errors import JobFailed
from tasks.outage import persist

log = logging.getLogger(__name__)
#: How long a settled run stays, marked, for a retried settle to find (``_SETTLE``).
SETTLED_KEPT_S = 300

# KEYS: the run, the LRU set. ARGV: leader id, result JSON ('' = no admission), ttl s,
# max entries, now, seconds a settled run is kept. Returns the followers as id, JSON,
# id, JSON... A settled run is kept a while, marked: a call retried after a lost reply
# gets the same followers again (writing their results twice is harmless), and
# nothing else (no admission twice, no promotion of a finished run).
_SETTLE = """
local run = redis.call('HGETALL', KEYS[1])
if #run == 0 then return {} end
local meta, followers = {}, {}
for i = 1, #run, 2 do
  if string.sub(run[i], 1, 2) == 'f:' then
    followers[#followers + 1] = string.sub(run[i], 3)
    followers[#followers + 1] = run[i + 1]
  else meta[run[i]] = run[i + 1] end
end
if meta.settled then return followers end
redis.call('HSET', KEYS[1], 'settled', '1')
redis.call('EXPIRE', KEYS[1], ARGV[6])
if redis.call('GET', meta.pointer) == ARGV[1] then redis.call('DEL', meta.pointer) end
if ARGV[2] ~= '' and meta.admit == '1' then
  redis.call('SET', meta.entry, ARGV[2], 'EX', ARGV[3])
  redis.call('ZADD', KEYS[2], ARGV[5], meta.entry)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (tonumber(ARGV[5]) - tonumber(ARGV[3])))
  local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
  if over > 0 then
    local gone = redis.call('ZPOPMIN', KEYS[2], over)
    for i = 1, #gone, 2 do redis.call('DEL', gone[i]) end
  end
end
return followers
"""

# KEYS: the revoked leader's run. ARGV: its id, run key prefix, ttl s.
# The heir is the follower of the fastest tier (a tie: any); the run takes its tier.
# Returns {heir id, heir JSON}, or nil when no follower is left.
_PROMOTE = """
local run = redis.call('HGETALL', KEYS[1])
if #run == 0 or redis.call('HEXISTS', KEYS[1], 'settled') == 1 then return false end
redis.call('DEL', KEYS[1])
local heir, job, best, pointer = nil, nil, nil, nil
for i = 1, #run, 2 do
  if string.sub(run[i], 1, 2) == 'f:' then
    local rank = cjson.decode(run[i + 1])['rank']
    if best == nil or rank < best then heir, job, best = string.sub(run[i], 3), run[i + 1], rank end
  elseif run[i] == 'pointer' then pointer = run[i + 1] end
end
local ours = redis.call('GET', pointer) == ARGV[1]
if heir == nil then
  if ours then redis.call('DEL', pointer) end
  return false
end
local rest = {'rank', tostring(best)}
for i = 1, #run, 2 do
  if run[i] ~= 'rank' and run[i] ~= 'f:' .. heir then
    rest[#rest + 1] = run[i]
    rest[#rest + 1] = run[i + 1]
  end
end
redis.call('HSET', ARGV[2] .. heir, unpack(rest))
redis.call('EXPIRE', ARGV[2] .. heir, ARGV[3])
if ours then redis.call('SET', pointer, heir, 'EX', ARGV[3]) end
return {heir, job}
"""


@lru_cache(maxsize=2)
def _script(source: str) -> Any:
    return redis_client().register_script(source)


def settle(leader_id: str, result: dict[str, Any] | None) -> list[tuple[str, dict]]:
    """Close the run led by ``leader_id`` (admitting ``result`` if it earned it);
    its followers as (job id, {"job", "submitted_at"})."""
    flat = _script(_SETTLE)(
        keys=[run_key(leader_id), CACHE_LRU_KEY],
        args=[leader_id, json.dumps(result) if result is not None else "",
              cfg.CACHE_TTL_S, cfg.CACHE_MAX_ENTRIES, time.time(), SETTLED_KEPT_S])
    return [(flat[i], json.loads(flat[i + 1])) for i in range(0, len(flat), 2)]


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


def close_run(leader_id: str, result: dict[str, Any]) -> None:
    """The run of ``leader_id`` succeeded: cache ``result`` if admitted, serve its followers."""
    deliver(settle(leader_id, result), result)


def fail_followers(leader_id: str, why: str) -> int:
    """Fail every follower of the run led by ``leader_id``; how many there were."""
    followers = settle(leader_id, None)
    for job_id, _ in followers:
        app.backend.mark_as_failure(job_id, JobFailed(
            f"job {job_id} shared the run of job {leader_id}, which failed: {why}"))
    return len(followers)


def promote(leader_id: str) -> str | None:
    """Hand a revoked leader's run to its first follower and publish that one's job."""
    heir = _script(_PROMOTE)(keys=[run_key(leader_id)],
                             args=[leader_id, RUN_KEY_PREFIX, cfg.result_expires])
    if not heir:
        return None
    job_id, entry = heir[0], json.loads(heir[1])
    from tasks.generate import generate  # here: tasks.generate imports this module

    where = route(entry["job"]["tier"])
    persist(lambda: generate.apply_async(kwargs={"job": {**entry["job"], LEADS_RUN: True},
                                                 "route": where.as_dict(),
                                                 "submitted_at": entry["submitted_at"]},
                                         task_id=job_id, queue=where.lane),
            f"the heir {job_id} of revoked job {leader_id}")
    log.info("job %s revoked by its caller; its run goes on as job %s", leader_id, job_id)
    return job_id


def _ours(sender: Any) -> bool:
    return getattr(sender, "name", None) == GENERATE_TASK


# ``tasks.generate`` closes its runs itself; these catch what it cannot: an
# unexpected error escaping the task, and a message revoked before it ran.
@signals.task_failure.connect(weak=False)
def _on_failure(sender: Any = None, task_id: str = "", exception: Any = None,
                kwargs: dict | None = None, **_: Any) -> None:
    if _ours(sender) and (kwargs or {}).get("job", {}).get(LEADS_RUN):
        fail_followers(task_id, f"{type(exception).__name__}: {exception}")


@signals.task_revoked.connect(weak=False)
def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if _ours(sender) and request is not None:
        promote(request.id)

"""``submit()``: validate, route, enqueue. No network round trip but the publish
(which also enforces the lane's maximum depth and, for a fast job, its account's
fast places: ``tasks.publish``), plus one for a seeded job (result cache and
coalescing, ``tasks.cache``). Every round trip gives up after
``GPULANES_REDIS_TIMEOUT_S`` and leaves nothing behind."""
from __future__ import annotations

import time
import uuid
from dataclasses import replace
from functools import lru_cache

import redis
from celery.result import AsyncResult

import celeryconfig as cfg
from routing.lanes import Route
from routing.names import FAST, RELAXED, SNAPSHOT_KEY, fast_queued_key
from routing.policy import PolicyView, decide
from routing.snapshot import SnapshotCache
from routing.store import connect
from tasks import fastlimit
from tasks.backend import no_subscription
from tasks.cache import LEADS_RUN, RunClaim, claim, release
from tasks.errors import BrokerUnavailable, LaneFull
from tasks.generate import generate
from tasks.outage import OUTAGE
from tasks.schema import validate
from tasks.publish import LaneAtLimit, PublishRefused, publishing


#: The view routing falls back on without a fresh snapshot: every tier in its own
#: lane, nothing known to be overloaded or full, no worker queues.
TIER_LANES_ONLY = PolicyView()


#: Redis' clock minus this process's (seconds), measured with each quick snapshot read
#: (under ``CLOCK_READ_S``): a publish's deadline is stated on Redis' clock, which is
#: what its script reads.
_redis_clock_offset_s = [0.0]
CLOCK_READ_S = 0.05


def _read_snapshot(client: redis.Redis) -> str | None:
    """The snapshot, and by the way how far Redis' clock is from ours."""
    sent = time.time()
    with client.pipeline(transaction=False) as pipe:
        raw, (seconds, micros) = pipe.get(SNAPSHOT_KEY).time().execute()
    received = time.time()
    if received - sent < CLOCK_READ_S:  # a slow read would blur the estimate
        _redis_clock_offset_s[0] = seconds + micros / 1e6 - (sent + received) / 2
    return raw


def publish_deadline() -> float:
    """The Redis time after which a publish sent now must not happen: the caller gives
    up at ``GPULANES_REDIS_TIMEOUT_S``; the margin leaves room for the reply."""
    margin_s = min(1.0, cfg.REDIS_TIMEOUT_S / 4)
    return time.time() + _redis_clock_offset_s[0] + cfg.REDIS_TIMEOUT_S - margin_s


@lru_cache(maxsize=1)
def snapshot_cache() -> SnapshotCache:
    """This process's copy of the lane snapshot (refreshed in the background)."""
    client = connect(cfg.broker_url, cfg.SENTINEL_MASTER, socket_timeout=1,
                     socket_connect_timeout=1)
    return SnapshotCache(lambda: _read_snapshot(client), refresh_s=cfg.HEARTBEAT_S / 2,
                         stale_s=cfg.SNAPSHOT_STALE_S, max_depth=cfg.MAX_DEPTH,
                         epsilon=cfg.HASH_EPSILON)


def submit(prompt: str, *, tier: str = "standard", account: str = "anonymous",
           model: str = "demo", seed: int | None = None, steps: int = 20,
           width: int = 256, height: int = 256,
           downgradable: bool | None = None) -> AsyncResult:
    """Enqueue one image job and return its ``AsyncResult``.

    ``.get()`` returns a dict with ``image`` (PNG path), ``lane`` (where it
    ran), ``requested_tier``, ``worker``, ``device``, ``queued_ms``,
    ``run_ms``, ``attempts``, ``cached`` and the job's parameters; when the
    job was moved down, also ``downgraded_from`` and ``downgrade_reason``.
    Without a ``seed`` one is drawn here, so the result can be reproduced.
    With a ``seed``, an identical finished job may answer from the result
    cache, or a run of it in flight may serve this call too (``cached: True``
    in the result, no GPU run of its own; see ``tasks.cache``).

    ``downgradable`` (default: True for standard, False for fast) lets the
    job move down a lane while its lane is overloaded.

    Raises :class:`tasks.errors.InvalidJob` naming the bad field, or
    :class:`tasks.errors.LaneFull` when the relaxed lane is full, before
    anything is enqueued; :class:`tasks.errors.BrokerUnavailable` when Redis
    does not answer within ``GPULANES_REDIS_TIMEOUT_S``, leaving nothing behind
    (no job, no cache claim, no fast place): submitting again is safe.
    """
    job = validate(prompt, tier=tier, account=account, model=model, seed=seed,
                   steps=steps, width=width, height=height, downgradable=downgradable)
    body, job_id = job.as_dict(), str(uuid.uuid4())
    try:
        if seed is None or not cfg.CACHE:  # a drawn seed is never shared: no extra round trip
            return enqueue(body, job_id)
        shared = claim(body, job_id)  # one round trip: a cached result, a run to join, or ours
        if isinstance(shared, AsyncResult):
            return shared
        if shared is None:  # an identical run is being claimed right now: run alone
            return enqueue(body, job_id)
        try:
            return enqueue({**body, LEADS_RUN: True}, job_id, run=shared)
        except OUTAGE:
            raise  # Redis is away: asking it to drop the claim would wait again; it lapses
        except BaseException:
            release(shared)  # refused (a full lane...): others need not wait for the lapse
            raise
    except BrokerUnavailable:
        raise
    except OUTAGE as exc:
        raise BrokerUnavailable(f"Redis did not answer within GPULANES_REDIS_TIMEOUT_S="
                                f"{cfg.REDIS_TIMEOUT_S:g}s ({type(exc).__name__}: {exc}); "
                                "nothing was enqueued, submit again later") from exc


def enqueue(job: dict, job_id: str, run: RunClaim | None = None) -> AsyncResult:
    """Route a validated job dict with the cached view and publish it under ``job_id``.

    The view's lane depths are an estimate; the publish itself checks the lane's
    depth in Redis. A lane found full there is held full in the view and the job
    routed again, down the lanes, until one takes it or none can. A fast job
    takes one of its account's fast places in the same publish; with all of
    them taken it is routed again, as over its account's limit.
    """
    cache = snapshot_cache()
    view = cache.view() or TIER_LANES_ONLY  # stale snapshot: each tier its own lane
    if refused := cache.refused():
        view = replace(view, full=view.full | refused)
    where, over_fast_limit = _route(job, view), False
    while where is not None:
        try:
            result = _publish(job, job_id, where, run, over_fast_limit)
        except LaneAtLimit:
            cache.note_full(where.lane)
            view = replace(view, full=view.full | {where.lane})
        except PublishRefused as refused:
            if refused.why == "late":
                raise BrokerUnavailable("Redis ran the publish only after it was given up "
                                        "on (too late): nothing was enqueued") from refused
            over_fast_limit = True  # all of its account's fast places are taken
        else:
            cache.note_sent(where.lane, where.node, job["model"])
            return result
        where = _route(job, view, over_fast_limit)
    raise LaneFull(RELAXED, view.retry_after_s)


def _route(job: dict, view: PolicyView, over_fast_limit: bool = False) -> Route | None:
    model = job["model"] if cfg.ROUTE_HASHING else None
    return decide(job["tier"], job["account"], job["downgradable"], view, model,
                  over_fast_limit)


def _publish(job: dict, job_id: str, where: Route, run: RunClaim | None,
             over_fast_limit: bool) -> AsyncResult:
    options = {"priority": where.priority} if where.priority else {}
    if where.node:  # a worker's own queue: addressed by its exchange, bound by that worker
        options.update(exchange=where.queue, routing_key=where.queue)
    else:
        options["queue"] = where.lane
    places = None
    if where.lane == FAST and cfg.FAST_JOBS_PER_ACCOUNT and not over_fast_limit:
        places = (fast_queued_key(job["account"]), cfg.FAST_JOBS_PER_ACCOUNT,
                  fastlimit.PLACE_LAPSE_S)
    # retry=False: a broken connection is retried once by the client itself; a
    # Redis that does not answer must not hold the caller for several timeouts.
    # no_subscription: ``.get()`` subscribes to the result itself; a publish refused
    # or failed leaves no subscription behind, and no outage of it holds the caller.
    with publishing(limit=cfg.MAX_DEPTH[where.lane], fast_places=places,
                    deadline=publish_deadline(),
                    run=(run.pointer, run.run, cfg.result_expires) if run else None), \
            no_subscription():
        return generate.apply_async(
            kwargs={"job": job, "route": where.as_dict(), "submitted_at": time.time()},
            task_id=job_id, retry=False, **options)

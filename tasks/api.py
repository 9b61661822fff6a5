"""``submit()``: validate, route, enqueue. No network round trip but the publish
(which also enforces the lane's maximum depth, ``tasks.transport``), plus one for
a seeded job (result cache and coalescing, ``tasks.cache``) and one for a job
routed to the fast lane (its account's limit, ``tasks.fastlimit``)."""
from __future__ import annotations

import time
import uuid
from dataclasses import replace
from functools import lru_cache

from celery.result import AsyncResult

import celeryconfig as cfg
from routing.lanes import Route
from routing.names import FAST, RELAXED, SNAPSHOT_KEY
from routing.policy import PolicyView, decide
from routing.snapshot import SnapshotCache
from routing.store import connect
from tasks.cache import LEADS_RUN, claim, release
from tasks.errors import LaneFull
from tasks.fastlimit import admit_fast, release_fast
from tasks.generate import generate
from tasks.schema import validate
from tasks.transport import LaneAtLimit, lane_limit


#: The view routing falls back on without a fresh snapshot: every tier in its own
#: lane, nothing known to be overloaded or full, no worker queues.
TIER_LANES_ONLY = PolicyView()


@lru_cache(maxsize=1)
def snapshot_cache() -> SnapshotCache:
    """This process's copy of the lane snapshot (refreshed in the background)."""
    client = connect(cfg.broker_url, cfg.SENTINEL_MASTER, socket_timeout=1,
                     socket_connect_timeout=1)
    return SnapshotCache(lambda: client.get(SNAPSHOT_KEY), refresh_s=cfg.HEARTBEAT_S / 2,
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
    anything is enqueued.
    """
    job = validate(prompt, tier=tier, account=account, model=model, seed=seed,
                   steps=steps, width=width, height=height, downgradable=downgradable)
    body, job_id = job.as_dict(), str(uuid.uuid4())
    if seed is None or not cfg.CACHE:  # a drawn seed is never shared: no extra round trip
        return enqueue(body, job_id)
    shared = claim(body, job_id)  # one round trip: a cached result, a run to join, or ours
    if shared is not None:
        return shared
    try:
        return enqueue({**body, LEADS_RUN: True}, job_id)
    except BaseException:
        release(job_id)  # callers that joined meanwhile must not wait for a run never sent
        raise


def enqueue(job: dict, job_id: str) -> AsyncResult:
    """Route a validated job dict with the cached view and publish it under ``job_id``.

    The view's lane depths are an estimate; the publish itself checks the lane's
    depth in Redis. A lane found full there is held full in the view and the job
    routed again, down the lanes, until one takes it or none can.
    """
    cache = snapshot_cache()
    view = cache.view() or TIER_LANES_ONLY  # stale snapshot: each tier its own lane
    if refused := cache.refused():
        view = replace(view, full=view.full | refused)
    where = _route(job, view)
    fast_place = over_fast_limit = tried = False
    if where is not None and where.lane == FAST:  # one round trip, fast only
        fast_place = admit_fast(job["account"], job_id)
        over_fast_limit = not fast_place
        if over_fast_limit:
            where = _route(job, view, over_fast_limit=True)
    try:
        while where is not None:
            try:
                tried = True
                result = _publish(job, job_id, where)
            except LaneAtLimit:
                cache.note_full(where.lane)
                view = replace(view, full=view.full | {where.lane})
                where = _route(job, view, over_fast_limit)
                continue
            if fast_place and where.lane != FAST:
                release_fast(job["account"], job_id)
            cache.note_sent(where.lane, where.node, job["model"])
            return result
        raise LaneFull(RELAXED, view.retry_after_s)
    except BaseException:
        if fast_place:
            release_fast(job["account"], job_id)
        if tried:  # Celery subscribed to the job's result before publishing it
            _forget_result(job_id)
        raise


def _forget_result(job_id: str) -> None:
    """Drop the result subscription of a job that was never published."""
    consumer = getattr(generate.backend, "result_consumer", None)
    if consumer is not None:
        consumer.cancel_for(job_id)


def _route(job: dict, view: PolicyView, over_fast_limit: bool = False) -> Route | None:
    model = job["model"] if cfg.ROUTE_HASHING else None
    return decide(job["tier"], job["account"], job["downgradable"], view, model,
                  over_fast_limit)


def _publish(job: dict, job_id: str, where: Route) -> AsyncResult:
    options = {"priority": where.priority} if where.priority else {}
    if where.node:  # a worker's own queue: addressed by its exchange, bound by that worker
        options.update(exchange=where.queue, routing_key=where.queue)
    else:
        options["queue"] = where.lane
    with lane_limit(cfg.MAX_DEPTH[where.lane]):
        return generate.apply_async(
            kwargs={"job": job, "route": where.as_dict(), "submitted_at": time.time()},
            task_id=job_id, **options)

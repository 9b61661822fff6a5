"""``submit()``: validate, claim a cached result or a run in flight, enqueue. No
network round trip but the publish
(which also enforces the lane's maximum depth and, for a fast job, its account's
fast places: ``tasks.broker.publish``), plus one for a seeded job (result cache and
coalescing, ``tasks.jobs.cache``). Every round trip gives up after
``GPULANES_REDIS_TIMEOUT_S`` and leaves nothing behind."""
from __future__ import annotations

import uuid

from celery.result import AsyncResult

from tasks.broker.enqueue import enqueue
from tasks.broker.outage import OUTAGE
from tasks.errors import BrokerUnavailable
from tasks.jobs.cache import claim, release
from tasks.jobs.schema import validate
from tasks.settings import settings


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
    in the result, no GPU run of its own; see ``tasks.jobs.cache``).

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
    job_id = str(uuid.uuid4())
    try:
        if seed is None or not settings.cache:  # a drawn seed is never shared: no extra round trip
            return enqueue(job, job_id)
        shared = claim(job.encode(), job_id)  # one round trip: a cached result, a run to join,
        if isinstance(shared, AsyncResult):   # or ours
            return shared
        if shared is None:  # an identical run is being claimed right now: run alone
            return enqueue(job, job_id)
        try:
            return enqueue(job.leading(), job_id, run=(shared.pointer, shared.run))
        except OUTAGE:
            raise  # Redis is away: asking it to drop the claim would wait again; it lapses
        except BaseException:
            release(shared)  # refused (a full lane...): others need not wait for the lapse
            raise
    except BrokerUnavailable:
        raise
    except OUTAGE as exc:
        raise BrokerUnavailable(f"Redis did not answer within GPULANES_REDIS_TIMEOUT_S="
                                f"{settings.redis_timeout_s:g}s ({type(exc).__name__}: {exc}); "
                                "nothing was enqueued, submit again later") from exc



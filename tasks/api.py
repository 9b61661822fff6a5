"""``submit()``: validate, claim a cached result or a run in flight, enqueue. No
network round trip but the publish
(which also enforces the lane's maximum depth and, for a fast job, its account's
fast places: ``tasks.broker.publish``), plus one for a job whose output can be
shared (result cache and coalescing, ``tasks.jobs.cache``). Every round trip gives up after
``GPULANES_REDIS_TIMEOUT_S`` and leaves nothing behind."""
from __future__ import annotations

import uuid
from typing import Any

from celery.result import AsyncResult

from tasks.broker.enqueue import ClaimAnswered, enqueue
from tasks.broker.outage import OUTAGE, refused
from tasks.broker.scripts import NotReplicated
from tasks.errors import BrokerRefused, BrokerUnavailable
from tasks.jobs.cache import answered, cacheable, claim_in_publish, release
from tasks.jobs.schema import validate
from tasks.settings import settings


def submit(prompt: str | None = None, *, tier: str = "standard",
           account: str = "anonymous", model: str = "demo", downgradable: bool | None = None,
           **inputs: Any) -> AsyncResult:
    """Enqueue one job of ``model`` and return its ``AsyncResult``.

    ``tier``, ``account``, ``downgradable`` and ``model`` route the job; every other
    keyword is an input of the model, checked by its ``Input`` before anything is
    enqueued. An image model (the built-in ``demo`` family) takes ``prompt`` (it may
    come first), ``seed``, ``steps`` (20), ``width`` and ``height`` (256); without a
    ``seed`` one is drawn, so the result can be reproduced.

    ``.get()`` returns a dict with ``lane`` (where it ran), ``requested_tier``,
    ``worker``, ``device``, ``queued_ms``, ``run_ms``, ``attempts``, ``cached``, and
    ``image`` (PNG) and the image's parameters for an image model, or ``output`` (the
    model's dict, images and bytes replaced by artifact references) for a class
    model; when the job was moved down, also ``downgraded_from`` and
    ``downgrade_reason``. A job whose model is deterministic for its inputs (an image
    model given a ``seed``; a class model with ``deterministic = True``) may answer
    from the result cache, or share a run of it in flight (``cached: True``, no GPU
    run of its own; see ``tasks.jobs.cache``).

    ``downgradable`` (default: True for standard, False for fast) lets the
    job move down a lane while its lane is overloaded.

    Raises :class:`tasks.errors.InvalidJob` naming the bad field (an unknown model
    or input, a bad value), or :class:`tasks.errors.LaneFull` when the relaxed lane
    is full, before anything is enqueued; :class:`tasks.errors.BrokerUnavailable`
    when Redis does not answer within ``GPULANES_REDIS_TIMEOUT_S``, leaving nothing
    behind (no job, no cache claim, no fast place): submitting again is safe. When
    Redis answers but refuses (out of memory, its disk failing, a read-only replica),
    that error is :class:`tasks.errors.BrokerRefused` (a ``BrokerUnavailable``), its
    message saying what Redis said. With ``GPULANES_REDIS_REPLICAS`` set, a job counts
    as accepted once that many replicas hold it; else ``BrokerRefused`` with ``code``
    ``NOREPLICAS``: the primary holds the job unconfirmed (it may still run, once).
    """
    job = validate(prompt, tier=tier, account=account, model=model,
                   downgradable=downgradable, **inputs)
    shareable = settings.cache and cacheable(job, inputs)
    job_id = str(uuid.uuid4())
    try:
        if not shareable:  # no extra round trip
            return enqueue(job, job_id)
        # one round trip: the publish claims the digest first, and is answered with a
        # cached result or a run to join, or pushes the job that leads a run of its own
        found = claim_in_publish(job.encode(), job_id)
        try:
            try:
                return enqueue(job.leading(), job_id, run=(found.run.pointer, found.run.run),
                               claim=found.publish)
            except ClaimAnswered as answer:
                shared = answered(found, answer.verdict, answer.value, job.encode())
            if isinstance(shared, AsyncResult):
                return shared
            if shared is None:  # an identical run is being claimed right now: run alone
                return enqueue(job, job_id)
            return enqueue(job.leading(), job_id, run=(shared.pointer, shared.run))
        except OUTAGE:
            raise  # Redis is away: asking it to drop the claim would wait again; it lapses
        except BaseException:
            release(found.run)  # refused (a full lane...): others need not wait for the lapse
            raise
    except BrokerUnavailable:
        raise
    except OUTAGE as exc:
        raise unavailable(exc, job_id) from exc


def unavailable(exc: BaseException, job_id: str = "") -> BrokerUnavailable:
    """What a caller hears of an outage that stopped a submit: Redis refused it
    (:class:`BrokerRefused`, saying what Redis said), or did not answer."""
    if isinstance(refusal := refused(exc), NotReplicated):
        return BrokerRefused(f"the job was not accepted: {refusal.said}. The primary may "
                             f"still run it as job {job_id}, or lose it if it fails over; "
                             "submit again once its replicas are back", refusal.code)
    if refusal is not None:
        return BrokerRefused(f"Redis {refusal.reason} and refused the job ({refusal.said}); "
                             "nothing was enqueued, submit again once it recovers",
                             refusal.code)
    return BrokerUnavailable(f"Redis did not answer within GPULANES_REDIS_TIMEOUT_S="
                             f"{settings.redis_timeout_s:g}s ({type(exc).__name__}: {exc}); "
                             "nothing was enqueued, submit again later")



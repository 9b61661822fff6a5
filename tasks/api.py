"""``submit()``: validate, claim a cached result or a run in flight, enqueue. No
network round trip but the publish
(which also enforces the lane's maximum depth and, for a fast job, its account's
fast places: ``tasks.broker.publish``), plus one for a job whose output can be
shared (result cache and coalescing, ``tasks.jobs.cache``). Every round trip gives up after
``GPULANES_REDIS_TIMEOUT_S`` and leaves nothing behind."""
from __future__ import annotations

import hashlib
import math
import time
import uuid
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable, Iterator

from celery.result import AsyncResult

from routing.policy import PolicyView
from tasks.broker import cell, cells
from tasks.broker.enqueue import Caller, ClaimAnswered, Placed, enqueue, place
from tasks.broker.view import snapshot_cache
from tasks.broker.keys import idempotency_key as same_key
from tasks.broker.message import Job
from tasks.broker.outage import OUTAGE, refused
from tasks.broker.scripts import NotReplicated
from tasks.errors import BrokerRefused, BrokerUnavailable, InvalidJob, ModelError
from tasks.jobs import admission, predictions, webhooks
from tasks.jobs.cache import answered, cacheable, claim_in_publish, release
from tasks.jobs.fits import check_fits
from tasks.jobs.plans import Plan
from tasks.jobs.predictions import Prediction
from tasks.jobs.schema import validate
from tasks.settings import settings


def submit(prompt: str | None = None, *, tier: str = "standard",
           account: str = "anonymous", model: str = "demo", downgradable: bool | None = None,
           idempotency_key: str | None = None, cancel_after: float | None = None,
           plan: Plan | None = None, **inputs: Any) -> AsyncResult:
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

    ``idempotency_key``: the same key of the same account within
    ``IDEMPOTENCY_S`` returns the first job's ``AsyncResult`` and enqueues nothing, even
    from two processes at once. ``cancel_after``: seconds after which the job, if it has
    not started, is not run (its state REVOKED) and not charged. ``plan``: the
    account's plan (``tasks.jobs.plans``, the HTTP front door's callers): its limits
    hold (``tasks.jobs.admission``; :class:`tasks.errors.OverLimit` past them), its
    fast time is its own, renewed each period (spent, on a plan without relax:
    :class:`tasks.errors.FastTimeSpent`), and the job's record says whose it is
    (``tasks.jobs.predictions``).

    With the pools on several Redis (cells: ``GPULANES_BROKER_URL`` names them), the
    job goes to the cell where its model is warm (``tasks.broker.cells``; with an
    ``idempotency_key``, to the model's first cell, where the key is always claimed),
    and its id names that cell: ``.get()``, and ``tasks.result(job_id)``, read it there.

    Raises :class:`tasks.errors.InvalidJob` naming the bad field (an unknown model
    or input, a bad value), :class:`tasks.errors.ModelError` when the model is larger
    than every worker's budget (``tasks.jobs.fits``), or :class:`tasks.errors.LaneFull`
    when the relaxed lane is full, before anything is enqueued;
    :class:`tasks.errors.BrokerUnavailable` when Redis does not answer within
    ``GPULANES_REDIS_TIMEOUT_S``, leaving nothing behind (no job, no cache claim, no
    fast place): submitting again is safe. When
    Redis answers but refuses (out of memory, its disk failing, a read-only replica),
    that error is :class:`tasks.errors.BrokerRefused` (a ``BrokerUnavailable``), its
    message saying what Redis said. With ``GPULANES_REDIS_REPLICAS`` set, a job counts
    as accepted once that many replicas hold it; else ``BrokerRefused`` with ``code``
    ``NOREPLICAS``: the primary holds the job unconfirmed (it may still run, once).
    """
    job = validate(prompt, tier=tier, account=account, model=model,
                   downgradable=downgradable, **inputs)
    if not settings.cells:
        return _submit(job, str(uuid.uuid4()), idempotency_key, cancel_after, plan, inputs)
    name = _cell_of(job, idempotency_key)  # with cells: its id names it
    with cell.within(name):
        found = _submit(job, cell.new_job_id(name), idempotency_key, cancel_after, plan, inputs)
    return cells.bound(found, name)


def _submit(job: Job, job_id: str, idempotency_key: str | None, cancel_after: float | None,
            plan: Plan | None, inputs: dict[str, Any]) -> AsyncResult:
    """:func:`submit` of a validated job, on the Redis of its cell."""
    check_fits(job.model, snapshot_cache().members())
    caller = _caller(job, job_id, idempotency_key, cancel_after, plan)
    if plan is not None:
        job = replace(job, admitted=True)
    # a plan's job may wait in its account's line: no other caller joins its run
    shareable = settings.cache and plan is None and cacheable(job, inputs)
    with _outage_named(job_id):
        if not shareable:  # no extra round trip
            return enqueue(job, job_id, caller=caller)
        # one round trip: the publish claims the digest first, and is answered with a
        # cached result or a run to join, or pushes the job that leads a run of its own
        found = claim_in_publish(job.encode(), job_id)
        try:
            try:
                return enqueue(job.leading(), job_id, run=(found.run.pointer, found.run.run),
                               claim=found.publish, caller=caller)
            except ClaimAnswered as answer:
                shared = answered(found, answer.verdict, answer.value, job.encode())
            if isinstance(shared, AsyncResult):
                return shared
            if shared is None:  # an identical run is being claimed right now: run alone
                return enqueue(job, job_id, caller=caller)
            return enqueue(job.leading(), job_id, run=(shared.pointer, shared.run),
                           caller=caller)
        except OUTAGE:
            raise  # Redis is away: asking it to drop the claim would wait again; it lapses
        except BaseException:
            release(found.run)  # refused (a full lane...): others need not wait for the lapse
            raise


def submit_placed(prompt: str | None = None, *, plan: Plan, tier: str = "standard",
                  account: str = "anonymous", model: str = "demo",
                  downgradable: bool | None = None, idempotency_key: str | None = None,
                  cancel_after: float | None = None, webhook: str | None = None,
                  webhook_events_filter: list[str] | None = None, api_url: str | None = None,
                  **inputs: Any
                  ) -> tuple[Placed, Prediction | None]:
    """:func:`submit` of a plan's job (the HTTP front door's), answered with where its
    publish put it and the prediction it recorded, so that the caller can show the
    prediction without reading it back. The prediction is None when an idempotency key
    answered a job made earlier (``Placed.job_id``: that one), which was not recorded
    now. ``webhook``: the URL its events are sent to, those ``webhook_events_filter``
    names (``tasks.jobs.webhooks``); ``api_url``: the API's address as the caller
    reached it, for the URLs of their bodies. Raises as :func:`submit` does."""
    job = validate(prompt, tier=tier, account=account, model=model,
                   downgradable=downgradable, **inputs)
    name = _cell_of(job, idempotency_key) if settings.cells else None
    job_id = str(uuid.uuid4()) if name is None else cell.new_job_id(name)
    with cell.within(name):
        check_fits(job.model, snapshot_cache().members())
        hook = None if webhook is None else (
            *webhooks.checked(webhook, webhook_events_filter), api_url)
        caller = replace(_caller(job, job_id, idempotency_key, cancel_after, plan, hook),
                         placed=True)
        with _outage_named(job_id):
            where = place(replace(job, admitted=True), job_id, caller=caller)
    if where.job_id != job_id or caller.record is None:
        return where, None
    return where, predictions.recorded(caller.record, where.lane, where.parked)


def _cell_of(job: Job, idempotency_key: str | None) -> str:
    """With cells, the cell a new job goes to (``tasks.broker.cells.cell_of_job``): of
    those its model fits, where it is warm; with a key, the one its key is claimed in."""
    return cells.cell_of_job(job.model, idempotency_key is not None, _fits(job.model))


def _fits(model: str) -> Callable[[PolicyView | None], bool]:
    """Whether ``model`` fits a worker of the cell a members view is of (``check_fits``)."""
    def fits(view: PolicyView | None) -> bool:
        try:
            check_fits(model, view)
        except ModelError:
            return False
        return True
    return fits


@contextmanager
def _outage_named(job_id: str) -> Iterator[None]:
    """Redis away or refusing within: :class:`BrokerUnavailable` (or
    :class:`BrokerRefused`) naming the job (:func:`unavailable`)."""
    try:
        yield
    except BrokerUnavailable:
        raise
    except OUTAGE as exc:
        raise unavailable(exc, job_id) from exc


#: Seconds an idempotency key keeps the job it made.
IDEMPOTENCY_S = 24 * 3600
#: The longest ``cancel_after``.
CANCEL_AFTER_MAX_S = 7 * 24 * 3600.0


def _caller(job: Any, job_id: str, idempotency_key: Any, cancel_after: Any,
            plan: Any, hook: tuple[str, tuple[str, ...], str | None] | None = None
            ) -> Caller:
    """What the caller's keywords add to the publish, each checked (:class:`InvalidJob`)."""
    same = None
    if idempotency_key is not None:
        if not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= 256:
            raise InvalidJob("idempotency_key", "must be a string of 1 to 256 characters")
        digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]
        same = (same_key(job.account, digest), IDEMPOTENCY_S)
    if cancel_after is not None and (
            isinstance(cancel_after, bool) or not isinstance(cancel_after, (int, float))
            or not math.isfinite(cancel_after) or not 0 < cancel_after <= CANCEL_AFTER_MAX_S):
        raise InvalidJob("cancel_after", "must be a number of seconds above 0 and at most "
                         f"{CANCEL_AFTER_MAX_S:.0f}, got {cancel_after!r}")
    if plan is None:
        return Caller(same=same, expires_s=cancel_after)
    if not isinstance(plan, Plan):
        raise InvalidJob("plan", f"must be a tasks.jobs.plans.Plan, got {type(plan).__name__}")
    period = int(time.time() // plan.period_s)
    return Caller(same=same, expires_s=cancel_after,
                  record=predictions.record(job_id, job.account, job.model, job.tier,
                                            job.inputs, cancel_after, hook),
                  plan=admission.plan_args(job.account, plan),
                  period=f"{period} {plan.period_s} {cell.share(plan.fast_seconds)!r}",
                  relax=plan.relax, renews_at=float((period + 1) * plan.period_s))


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



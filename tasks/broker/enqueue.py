"""The one publish path of a job: route it with this process's copy of the lane
snapshot (no round trip), then publish it with the lane's conditions (limits, deadline,
fast place, fast time, claimed run) as arguments of the broker's publish
(``tasks.broker.publish``), down the lanes until one takes it. ``submit()``, a coalesced
run's heir and ``lanes dead requeue`` all publish here; a job is sent by its task's
name (the submitting process never imports the worker)."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from celery.result import AsyncResult

from routing.lanes import Route
from routing.names import FAST, JOB_TASK, RELAX_LEVEL_PRIORITIES, RELAXED
from routing.fair import QUEUED_LEVEL_MIN, QUEUED_LEVEL_RATIOS, fair_level
from routing.policy import (
    FAST_TIME_EXHAUSTED,
    MOVED_BY_LOAD,
    Admission,
    PolicyView,
    decide,
    goes_first,
    publish_limits,
)
from tasks.broker.app import app, redis_client
from tasks.broker.bindings import PRIORITY_STEPS, Bindings, list_of
from tasks.broker.cell import share, url_now
from tasks.broker.envelope import Envelope
from tasks.broker.keys import (
    FAST_BALANCE_KEY,
    FAST_EXHAUSTED_KEY,
    FAST_PERIOD_KEY,
    fast_queued_key,
    queued_key,
    waiting_accounts_key,
)
from tasks.broker.memory import MEMORY_LIMIT
from tasks.broker.message import Job, JobMessage, JobRoute
from tasks.broker.publish import (
    Answered,
    ClaimArgs,
    Conditions,
    Fair,
    Message,
    Parked,
    PlanArgs,
    Pushed,
    Record,
    Refusal,
    Refused,
    Verdict,
    envelope_of,
    publish,
)
from tasks.errors import (
    BrokerRefused,
    BrokerUnavailable,
    FastTimeSpent,
    InvalidJob,
    LaneFull,
    OverLimit,
)
from tasks.broker.view import publish_deadline, snapshot_cache
from tasks.settings import settings

#: Seconds after which a fast place not given back lapses (``tasks.jobs.fastlimit``).
PLACE_LAPSE_S = 3600
#: Route a job to the worker that holds its model (consistent hashing with bounded
#: loads); False: every job through its lane's shared list.
ROUTE_HASHING = True


@dataclass(frozen=True)
class Caller:
    """What a caller's account and request add to a new job's publish (the HTTP front
    door, or ``submit()``'s keywords)."""

    #: (key, seconds): the request's idempotency key, taken by the push
    same: tuple[str, int] | None = None
    #: the prediction's record (``tasks.jobs.predictions``)
    record: Record | None = None
    #: the account's plan limits (``tasks.jobs.admission``), and its fast time's
    #: period, "index period_s fast_s" (a new one renews the balance to fast_s)
    plan: PlanArgs | None = None
    period: str = ""
    #: the plan includes the relaxed lane; else a job its spent fast time would send
    #: there is refused (:class:`FastTimeSpent`, renewed at ``renews_at``)
    relax: bool = True
    renews_at: float = 0.0
    #: seconds after which the job, still queued, is not run (Celery's ``expires``)
    expires_s: float | None = None
    #: learn the pushed job's place in its lane from the publish (``Placed.position``)
    placed: bool = False


@dataclass(frozen=True)
class Placed:
    """Where a new job's publish put it: its lane, and its place there (the jobs of the
    lane that entered before it, when its caller asked: ``Caller.placed``), or parked in
    its account's own line. ``job_id``: another job's, made earlier under the same
    idempotency key (nothing was published, no lane)."""

    job_id: str
    lane: str = ""
    position: int | None = None
    parked: bool = False


#: Seconds a refused caller is told to wait before submitting again.
OVER_LIMIT_RETRY_S = 5.0


#: The view routing falls back on without a fresh snapshot: every tier in its own
#: lane, nothing known to be overloaded or full, no worker queues.
TIER_LANES_ONLY = PolicyView()


def enqueue(job: Job, job_id: str, run: tuple[str, str] | None = None, *,
            submitted_at: float | None = None, accepted: bool = False,
            claim: ClaimArgs | None = None, caller: Caller = Caller()) -> AsyncResult:
    """Route a validated job with the cached view and publish it under ``job_id``.

    The view's lane depths are an estimate; the publish itself checks the lane's
    depth in Redis. A lane found full there is held full in the view and the job
    routed again, down the lanes, until one takes it or none can. A job that may move
    down enters a budgeted lane only while the work queued ahead of it there, by the
    live depths, is under the lane's admission (``routing.policy.over_budget``, the
    snapshot's bound): else it is routed as if the lane were overloaded, down a lane,
    keeping its place in time; beat's snapshot would say so a heartbeat later. A fast job
    takes one of its account's fast places in the same publish; with all of
    them taken it is routed again, as over its account's limit, and the account's
    next fast job goes over the limit at once, published only while every place is
    still taken (``_places_taken``). Its account's
    fast time is read there too: found spent, the job is routed again as the
    snapshot would route it once beat has seen the balance (exhausted).

    ``run``: the (pointer, hash) of the result-cache run this job leads, confirmed
    by the publish. ``claim``: claim that run in the publish itself (``Conditions.claim``):
    a digest already taken raises :class:`ClaimAnswered` with nothing pushed; a
    publish refused after its claim led confirms the claim when it is tried again.
    ``accepted``: a job accepted earlier (a coalesced run's heir): no lane limit
    refuses it, a job once accepted is not dropped for want of room. Any other job is
    refused (:class:`BrokerRefused`) while Redis is over ``MEMORY_LIMIT`` of its
    ``maxmemory``, as the snapshot says.
    """
    return AsyncResult(place(job, job_id, run, submitted_at=submitted_at, accepted=accepted,
                             claim=claim, caller=caller).job_id, app=app)


def place(job: Job, job_id: str, run: tuple[str, str] | None = None, *,
          submitted_at: float | None = None, accepted: bool = False,
          claim: ClaimArgs | None = None, caller: Caller = Caller()) -> Placed:
    """:func:`enqueue`, answered with where the job went."""
    cache = snapshot_cache()
    view = cache.view() or TIER_LANES_ONLY  # stale snapshot: each tier its own lane
    if not accepted:
        _refuse_near_maxmemory(view)
    if accepted:  # no lane is full for it
        view = replace(view, full=frozenset())
    elif refused := cache.refused():
        view = replace(view, full=view.full | refused)
    if shut := cache.shut():
        view = view.shut(shut)
    over_fast_limit = hinted = _hinted_over_fast_limit(job, view)
    where = _route(job, view, over_fast_limit)
    while where is not None:
        _check_relax(where, caller)
        admit = None if accepted or not job.downgradable else view.admit.get(where.lane)
        level = None if accepted else fair_level(where, job.account, view)
        verdict = _publish(job, job_id, where, run, over_fast_limit, submitted_at, accepted,
                           claim, places_taken=hinted, admit=admit, caller=caller,
                           level=level)
        match verdict:
            case Pushed(position):
                cache.note_sent(where.lane, where.node, job.model,
                                goes_first(where, job.account, view))
                return Placed(job_id, where.lane, position)
            case Parked():  # in its account's own line, entering its lane in turn
                return Placed(job_id, where.lane, parked=True)
            case Answered("same", value):  # its idempotency key made this job before
                return Placed(value)
            case Refused(Refusal.QUEUED_JOBS):
                raise OverLimit(Refusal.QUEUED_JOBS.value, OVER_LIMIT_RETRY_S)
            case Answered(answer, value):  # nothing pushed: the result cache answered
                raise ClaimAnswered(answer, value)
            case Refused(Refusal.FULL):
                cache.note_full(where.lane)
                view = replace(view, full=view.full | {where.lane})
            case Refused(Refusal.FULL_LEVEL):  # full to this job, not to lighter accounts'
                view = replace(view, full=view.full | {where.lane})
            case Refused(Refusal.OVER_BUDGET):  # as the snapshot says once beat sees it
                cache.note_over_budget(where.lane, view.admit[where.lane])
                view = view.shut({where.lane})
            case Refused(Refusal.OVER_LEVEL):  # shut to this job, not to lighter accounts'
                view = view.shut({where.lane})
            case Refused(why):
                view, over_fast_limit = _after_refusal(why, job, view, over_fast_limit)
                hinted = False
        claim = None  # the claim led (a refusal comes after it)
        where = _route(job, view, over_fast_limit)
    raise LaneFull(RELAXED, view.retry_after_s)


class ClaimAnswered(Exception):
    """The publish's claim found the job's digest taken (``tasks.broker.publish.Answered``):
    ``verdict`` ``hit`` (``value``: the stored result), ``follow`` (``value``: the
    leader's id) or ``solo``; nothing was pushed."""

    def __init__(self, verdict: str, value: str) -> None:
        super().__init__(f"claim answered: {verdict}")
        self.verdict, self.value = verdict, value


def _check_relax(where: Route, caller: Caller) -> None:
    """A plan without the relaxed lane sends no job of its own choice there: spent fast
    time is :class:`FastTimeSpent`, a relaxed tier :class:`InvalidJob`. A job the
    cluster's load moves there goes."""
    if caller.relax or where.lane != RELAXED or where.downgrade_reason in MOVED_BY_LOAD:
        return
    if where.downgrade_reason == FAST_TIME_EXHAUSTED:
        raise FastTimeSpent(caller.renews_at)
    raise InvalidJob("tier", "the relaxed lane is not part of the account's plan; "
                     "choose fast or standard")


def _refuse_near_maxmemory(view: PolicyView) -> None:
    """:class:`BrokerRefused` for a new job while Redis is over its memory limit."""
    if view.memory_share > MEMORY_LIMIT:
        raise BrokerRefused(f"Redis uses {view.memory_share:.0%} of its maxmemory, over "
                            f"the {MEMORY_LIMIT:.0%} limit: new jobs are refused to keep room "
                            "for the jobs accepted; nothing was enqueued, submit again later "
                            "(or raise Redis' maxmemory)", "OOM")


def _after_refusal(why: Refusal, job: Job, view: PolicyView,
                   over_fast_limit: bool) -> tuple[PolicyView, bool]:
    """The view and fast-limit flag to route a job again with after a refused publish."""
    if why == Refusal.LATE:
        raise BrokerUnavailable("Redis ran the publish only after it was given up "
                                "on (too late): nothing was enqueued")
    if why == Refusal.FAST_TIME:  # spent, and beat's snapshot does not say so yet
        return replace(view, exhausted=view.exhausted | {job.account}), over_fast_limit
    if why == Refusal.PLACE_FREE:  # a place came back since the hint: take it
        _places_taken.discard(job.account)
        return view, False
    if len(_places_taken) >= PLACES_TAKEN_KEPT:
        _places_taken.clear()
    _places_taken.add(job.account)
    return view, True  # all of its account's fast places are taken


#: Accounts whose fast places a publish of this process last found all taken: their next
#: fast job goes straight over the limit, on condition that every place is still taken
#: (the publish refuses it otherwise, ``place_free``), so a flooding account's fast jobs
#: cost one publish each, not two, and a place given back is never passed over.
_places_taken: set[str] = set()
#: Accounts remembered at most (then forgotten all at once: each costs one publish more).
PLACES_TAKEN_KEPT = 4096


def _hinted_over_fast_limit(job: Job, view: PolicyView) -> bool:
    """Whether to route ``job`` over its account's fast limit on the word of an earlier
    refusal (a fast job of an account not out of fast time, while places are limited)."""
    return (job.tier == FAST and job.account in _places_taken
            and job.account not in view.exhausted and bool(settings.fast_jobs_per_account))


def _route(job: Job, view: PolicyView, over_fast_limit: bool = False) -> Route | None:
    model = job.model if ROUTE_HASHING else None
    return decide(job.tier, job.account, job.downgradable, view, model, over_fast_limit,
                  job.route_key)


def _fast_conditions(job: Job, where: Route, over_fast_limit: bool,
                     places_taken: bool = False, caller: Caller = Caller()) -> dict[str, Any]:
    """A fast publish's conditions: one of its account's fast places (unless over its
    limit already), and its fast time, read exactly in the round trip it pays anyway.
    ``places_taken``: a fast job routed over its account's limit on the word of an
    earlier refusal: published only if every place is still taken."""
    if where.lane != FAST:
        if not places_taken:
            return {}
        return {"fast_places": (fast_queued_key(job.account), -settings.fast_jobs_per_account,
                                PLACE_LAPSE_S)}
    if caller.period:  # a plan's own fast time, and its concurrent fast jobs for places
        return {"fast_time": (FAST_BALANCE_KEY, job.account,
                              float(caller.period.split()[2])),
                "period": (FAST_PERIOD_KEY, FAST_EXHAUSTED_KEY, caller.period)}
    places = None
    if settings.fast_jobs_per_account and not over_fast_limit:
        places = (fast_queued_key(job.account), settings.fast_jobs_per_account, PLACE_LAPSE_S)
    return {"fast_places": places,
            "fast_time": (FAST_BALANCE_KEY, job.account,
                          share(settings.fast_seconds_default))}


def _publish(job: Job, job_id: str, where: Route, run: tuple[str, str] | None,
             over_fast_limit: bool, submitted_at: float | None, accepted: bool,
             claim: ClaimArgs | None = None, places_taken: bool = False,
             admit: Admission | None = None, caller: Caller = Caller(),
             level: int | None = None) -> Verdict:
    """The broker's verdict on ``job`` published to ``where`` with its conditions;
    ``level``: the least level it enters a fast or standard lane at (``fair_level``)."""
    message = JobMessage(job, JobRoute.of(where),
                         time.time() if submitted_at is None else submitted_at)
    # argsrepr/kwargsrepr (what Flower and the events show of the call): a short line,
    # not Celery's saferepr of the whole job (a third of a publish's CPU)
    sent = envelope_of(app, job_id, JOB_TASK, message.kwargs(), where.queue, where.priority or 0,
                       argsrepr="()", kwargsrepr=repr({"model": job.model, "tier": job.tier,
                                                       "lane": where.lane,
                                                       "account": job.account}),
                       **({"expires": caller.expires_s} if caller.expires_s else {}))
    when = Conditions(
        limits=publish_limits(where.lane, 0 if accepted else settings.max_depth[where.lane],
                              admit),
        deadline=publish_deadline(), run=(*run, settings.result_ttl_s) if run else None,
        claim=claim, same=caller.same, record=caller.record, plan=caller.plan,
        account=job.account, placed=caller.placed,
        **_fast_conditions(job, where, over_fast_limit, places_taken, caller))
    addressed_to = addressed(where.queue, sent, message.lane_clock)
    if level is not None:
        when = replace(when, fair=_fair(addressed_to.queue, job.account, where.lane, level))
    return publish(redis_client(), addressed_to, when)


def _fair(queue: str, account: str, lane: str, level: int) -> Fair:
    """The publish's choice of ``queue``'s list for a new job of ``account`` at ``level``
    or above, by its jobs waiting in ``lane`` (``routing.fair.queued_level``)."""
    ratios = " ".join(map(repr, QUEUED_LEVEL_RATIOS))
    return Fair(queued_key(lane, account),
                tuple(list_of(queue, p, priority_steps()) for p in RELAX_LEVEL_PRIORITIES),
                f"{level} {lane} {QUEUED_LEVEL_MIN} {ratios} {PLACE_LAPSE_S}",
                waiting_accounts_key(lane))


def bindings() -> Bindings:
    """The bindings this process's publishes are addressed by (a cell's, inside
    ``tasks.broker.cell.within``)."""
    return _bindings(url_now())


@lru_cache(maxsize=None)
def _bindings(url: str) -> Bindings:
    return Bindings(redis_client())




def addressed(exchange: str, sent: Envelope, entered_at: float) -> Message:
    """``sent``, published to lane exchange ``exchange`` (a lane, or a worker's own queue
    of one): to the queue its bindings name, in the list of its priority."""
    queue = bindings().queue_of(exchange)
    return Message(queue, list_of(queue, sent["properties"]["priority"], priority_steps()),
                   sent, entered_at)


@lru_cache(maxsize=1)
def priority_steps() -> tuple[int, ...]:
    """The priority levels of the app's lists, as its transport reads them."""
    return tuple(app.conf.broker_transport_options.get("priority_steps", PRIORITY_STEPS))

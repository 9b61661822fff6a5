"""The broker's publish: a job's message pushed to its list in one Lua step, with the
conditions its publisher states checked in that step, answered with a typed verdict.

Two publishes, one per kind of publisher, each a script a reader can hold in mind:

- :func:`publish` (``lua/publish.lua``), a new job (``tasks.broker.enqueue``), checked
  for what :class:`Conditions` names, in this order:

  - a deadline: a publish that reaches Redis after its caller gave up (a Redis frozen
    for a while runs what was sent meanwhile) is ``late``;
  - a claim of the result cache (a seeded job, ``tasks.jobs.cache``): a digest already
    taken is :class:`Answered`, with nothing pushed; a claim the job leads is confirmed
    by the push, and one whose job was never published lapses by itself;
  - the account's fast time (a fast job, ``tasks.jobs.accounts``): a balance at zero or
    below is ``fast_time``, exactly when it is spent, where the routers' copy of the
    exhausted accounts lags a beat behind;
  - depth limits (``routing.policy.DepthLimit``): the lane's maximum depth (``full``)
    and its admission (``over_budget``). The policy computes the numbers; the script
    adds up the live depths and compares. Any number of submitters together never pass
    a limit;
  - the account's fast places (a fast job, ``tasks.jobs.fastlimit``): taken in the same
    step, so a refused or failed publish leaves no place behind (``fast_places`` when
    all are taken); a job routed over its account's limit on the word of an earlier
    refusal goes there only while every place is still taken (``place_free``).
  - the account's plan (``tasks.jobs.admission``): over its concurrent jobs the job is
    :class:`Parked` in the account's own line, over its queued jobs too it is refused
    (``queued_jobs``); an idempotency key found taken answers the job it made
    (``Answered("same", ...)``); the prediction's record is written with the push.

  The run the job leads takes the rank of its lane (never faster than it was), so no
  caller joins a run waiting in a lane slower than its own.
- :func:`publish_copy` (``lua/copy.lua``), a run's next copy of its job (a worker's
  retry, a job stepping aside for a fast one): pushed only while that run still holds
  the job (:class:`Fence`), its lease released in the same step; else ``fence``.

Both push through ``lua/enter.lua``: counted, indexed, announced, and not pushed twice
when redis-py sends the same call again after a broken connection. A message published
outside them (kombu's own, ``tasks.broker.lanes``) goes through :func:`publish` with no
conditions, which never refuses: a job once accepted is not dropped for want of room.
"""
from __future__ import annotations

import base64
import enum
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple, Union

import redis
from kombu import serialization
from kombu.utils.json import dumps

from routing.names import LANES, RELAX_LEVEL_PRIORITIES, lane_of
from routing.fair import LEVEL_ROOM
from routing.policy import DepthLimit
from tasks.broker import scripts
from tasks.broker.envelope import Envelope
from tasks.broker.keys import (
    DUE_PREFIX,
    FAST_NEWS_PREFIX,
    HEAVIER_SCORE,
    LANE_DEPTHS_KEY,
    LIST_DEPTHS_KEY,
    PREEMPTIBLE_KEY,
    WAKE_PREFIX,
    due_clock,
    lists_key,
    run_key,
)

#: A lease a run handed over (its retry published, or its message put back) reads
#: ``RELEASED`` + the run number: the old run can never take it again, and the next
#: run begins as if it were free. Kept as long as a job's run counter.
RELEASED = "released#"

#: A result-cache claim the publish makes first (``Conditions.claim``): the cache's
#: (entry, LRU, metrics) keys and (admit flag, follower JSON, now, tier rank, claim
#: lifetime s, run keys' prefix).
ClaimArgs = tuple[tuple[str, str, str], tuple[Any, ...]]


@dataclass(frozen=True)
class Message:
    """A job's message on its way into a list."""

    queue: str          #: the lane, or a worker's own queue of one
    key: str            #: the list (the queue's, at the message's priority level)
    envelope: Envelope  #: kombu's envelope (``tasks.broker.envelope``)
    #: when the job's wait in its lane began (unix s): its place in the lane's due index
    entered_at: float

    @property
    def job_id(self) -> str:
        return (self.envelope.get("headers") or {}).get("id") or ""


class Record(NamedTuple):
    """A prediction's record (``lua/record.lua``)."""

    key: str       #: the record's hash
    listed: str    #: the account's predictions
    json: str      #: what it holds: model, tier, input, when...
    kept_s: int    #: how long both are kept
    kept: int      #: how many of the account's latest stay listed
    #: its webhook's "outbox kinds gap_ms" ('': none; ``tasks.jobs.events``)
    hook: str = ""


class PlanArgs(NamedTuple):
    """An account's plan limits as the publish checks them (``lua/admit.lua``)."""

    admitted: str          #: its jobs admitted to the lanes (sorted set)
    admitted_fast: str     #: its fast ones
    parked: str            #: its parked jobs (list)
    parked_accounts: str   #: accounts with parked jobs
    spec: str              #: "concurrent concurrent_fast queued lapse_s"


class Fair(NamedTuple):
    """Where a new job of a fast or standard lane enters (``lua/fair.lua``)."""

    waiting: str                #: its account's jobs waiting in the lane (sorted set)
    lists: tuple[str, ...]      #: the queue's list at each level, level 0 first
    spec: str                   #: "level lane min ratio ratio ratio lapse_s"
    accounts: str = ""          #: the lane's accounts with jobs waiting (a set)


@dataclass(frozen=True)
class Conditions:
    """What a new job's publish must satisfy, checked in the step that pushes it."""

    #: the depth limits of its lane (``routing.policy.publish_limits``)
    limits: tuple[DepthLimit, ...] = ()
    deadline: float = 0.0  #: Redis' unix s after which the publish is refused (0: none)
    #: (key, allowed, lapse s): take one of the account's fast places; with allowed
    #: below 0, take none and refuse (``place_free``) unless all -allowed are taken
    fast_places: tuple[str, int, float] | None = None
    #: a fast job's fast time: (balances hash, account, an uncharged account's balance)
    fast_time: tuple[str, str, float] | None = None
    #: the result-cache run the job leads: (pointer, hash, seconds a confirmed one lives)
    run: tuple[str, str, int] | None = None
    #: a claim of the result cache made in the same step (``run`` names its pointer and
    #: hash): answered (:class:`Answered`) when the digest is taken
    claim: ClaimArgs | None = None
    #: (key, seconds): an idempotency key, taken by the push; found taken, the publish
    #: is answered ``Answered("same", <its job id>)`` with nothing pushed
    same: tuple[str, int] | None = None
    #: the prediction's record, written by the push (``tasks.jobs.predictions``)
    record: Record | None = None
    #: the account's plan limits (``tasks.jobs.admission``): over them the job is parked
    #: (:class:`Parked`), or refused (``queued_jobs``)
    plan: PlanArgs | None = None
    #: (fast periods hash, exhausted set, "index period_s fast_s"): with ``fast_time``,
    #: the plan's period, whose start renews the balance to fast_s
    period: tuple[str, str, str] | None = None
    #: the job's account (with ``plan`` or ``fast_time``)
    account: str = ""
    #: the level it enters a fast or standard lane at, raised by its account's jobs
    #: waiting there (``routing.fair.fair_level``): the message goes to that level's list
    fair: Fair | None = None
    #: answer a pushed job with its place in its lane (``Pushed.position``)
    placed: bool = False


@dataclass(frozen=True)
class Fence:
    """The run a copy of its job is published by: (lease key, run counter key, the run's
    lease token, its number, seconds a released lease is kept)."""

    lease: str
    counter: str
    token: str
    run: int
    kept_s: int


class Refusal(str, enum.Enum):
    """Why a publish wrote nothing."""

    FULL = "full"                #: the lane holds its maximum depth
    #: so for a job at its level (``routing.fair.at_level``): lighter ones may still enter
    FULL_LEVEL = "full_level"
    OVER_BUDGET = "over_budget"  #: the work queued ahead is at or past the admission
    #: so for a job at its level: those of the levels before it may still enter
    OVER_LEVEL = "over_level"
    LATE = "late"                #: Redis ran it after its caller gave up
    FAST_TIME = "fast_time"      #: the account's fast time is spent
    FAST_PLACES = "fast_places"  #: every fast place of the account is taken
    PLACE_FREE = "place_free"    #: routed over the fast limit, but a place is free
    FENCE = "fence"              #: a newer run holds the job
    QUEUED_JOBS = "queued_jobs"  #: the account's plan has that many jobs parked already


@dataclass(frozen=True)
class Pushed:
    """The message is in its list; asked (``Conditions.placed``), ``position``: how many
    jobs of its lane entered before it (None where that is not kept)."""

    position: int | None = None


@dataclass(frozen=True)
class Parked:
    """The job waits in its account's own line for one of its jobs to be over."""


@dataclass(frozen=True)
class Refused:
    why: Refusal


@dataclass(frozen=True)
class Answered:
    """The publish's claim found the job's digest taken: ``verdict`` ``hit`` (``value``:
    the stored result), ``follow`` (``value``: the leader's id) or ``solo``; or its
    idempotency key: ``same`` (``value``: the job it made)."""

    verdict: str
    value: str


Verdict = Union[Pushed, Parked, Refused, Answered]


def publish(client: redis.Redis, message: Message, when: Conditions = Conditions()) -> Verdict:
    """Push a new job's ``message`` if it meets ``when`` (``lua/publish.lua``)."""
    places, allowed, lapse_s = when.fast_places or ("", 0, 0.0)
    pointer, run, ttl_s = when.run or ("", "", 0)
    balances, account, balance = when.fast_time or ("", "", 0.0)
    (entry, lru, metrics), claim = when.claim or (("", "", ""), ())
    same, same_s = when.same or ("", 0)
    record = when.record or Record("", "", "", 0, 0)
    plan = when.plan or PlanArgs("", "", "", "", "")
    periods, exhausted, period = when.period or ("", "", "")
    fair = when.fair or Fair("", ("",) * 4, "")
    keys, args = _entering(message)
    keys += [places, pointer, run, balances, entry, lru, metrics, same, record.key,
             record.listed, *plan[:4], periods, exhausted, fair.waiting, *fair.lists,
             fair.accounts]
    args += named(deadline=when.deadline or None, account=account or when.account or None,
                  balance=repr(balance) if balances else None, period=period or None,
                  same_s=same_s or None, plan=plan.spec or None, fair=fair.spec or None,
                  fair_steps=" ".join(map(str, RELAX_LEVEL_PRIORITIES)) if fair.spec else None,
                  fair_room=" ".join(map(repr, LEVEL_ROOM)) if fair.spec else None,
                  record=record.json or None, record_s=record.kept_s or None,
                  kept=record.kept or None, hook=record.hook or None,
                  lane=lane_of(message.queue) if record.key else None,
                  limits=";".join(map(_limit, when.limits)) or None,
                  places=allowed or None, lapse=lapse_s if allowed else None,
                  ttl=ttl_s if pointer else None, placed="1" if when.placed else None,
                  **dict(zip(_CLAIM_ARGS, claim)))
    return _verdict(scripts.run(client, "publish", keys, args))


def publish_copy(client: redis.Redis, message: Message, fence: Fence,
                 front: bool = False) -> Verdict:
    """Push a run's next copy of its job while the run still holds it (``lua/copy.lua``);
    ``front``: where it is taken next (a job that stepped aside)."""
    keys, args = _entering(message)
    keys += [fence.lease, fence.counter, run_key(message.job_id)]
    args += named(token=fence.token, run=fence.run, released=RELEASED, kept_s=fence.kept_s,
                  front="1" if front else None)
    return _verdict(scripts.run(client, "copy", keys, args))


def named(**values: Any) -> list[Any]:
    """Name/value pairs for a script's ARGV (``lua/named.lua``); None is left out."""
    return [part for name, value in values.items() if value is not None
            for part in (name, value)]


def envelope_of(app: Any, job_id: str, name: str, kwargs: dict[str, Any], exchange: str,
                priority: int = 0, **options: Any) -> Envelope:
    """kombu's envelope of a call of task ``name``, as a producer's publish to
    ``exchange`` writes it: Celery's task message (``app.amqp.as_task_v2``, protocol 2,
    with ``options``: countdown, retries, argsrepr...) serialized as JSON."""
    headers, properties, body, _ = app.amqp.as_task_v2(job_id, name, (), kwargs,
                                                       reply_to=app.thread_oid, **options)
    content_type, content_encoding, data = serialization.dumps(body, serializer="json")
    return {"body": base64.b64encode(data.encode()).decode(),
            "content-encoding": content_encoding, "content-type": content_type,
            "headers": headers,
            "properties": {**properties, "delivery_mode": 2, "priority": priority,
                           "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
                           "delivery_info": {"exchange": exchange, "routing_key": exchange}}}


_CLAIM_ARGS = ("claim_admit", "claim_follower", "claim_now", "claim_rank", "claim_s",
               "claim_runs")


def _entering(message: Message) -> tuple[list[str], list[Any]]:
    """The KEYS and ARGV both publishes share (``lua/enter.lua``)."""
    lane = lane_of(message.queue)
    return ([message.key, lists_key(lane), LANE_DEPTHS_KEY, LIST_DEPTHS_KEY, PREEMPTIBLE_KEY],
            [dumps(message.envelope),
             *named(job=message.job_id, entered=repr(due_clock(message.key, message.entered_at)),
                    rank=LANES.index(lane), due=DUE_PREFIX, wake=WAKE_PREFIX,
                    news=FAST_NEWS_PREFIX, heavier=HEAVIER_SCORE)])


#: The position in the publish's KEYS of the hash a depth limit counts (depths per lane).
_DEPTHS_AT = 3


def _limit(limit: DepthLimit) -> str:
    """A depth limit as ``lua/limits.lua`` reads it: its terms count the lanes' fields
    of the depths per lane."""
    return " ".join([limit.why, repr(limit.bound),
                     *(part for lane, weight in limit.weights
                       for part in (str(_DEPTHS_AT), lane, repr(weight)))])


def _verdict(answer: Any) -> Verdict:
    if isinstance(answer, list):
        said, value = _text(answer[0]), answer[1]
        if said == "pushed":  # with its place, as asked
            return Pushed(None if int(value) < 0 else int(value))
        return Answered(said, _text(value))
    answer = _text(answer)
    if answer == "pushed":
        return Pushed()
    return Parked() if answer == "parked" else Refused(Refusal(answer))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)



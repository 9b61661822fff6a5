"""The publish script: one Lua call that pushes a job message, counted, indexed and
announced (``lua/queue.lua``), and first checks what the publisher asked for
(``tasks.broker.lanes`` runs it).

It checks, before it writes anything, what the publisher asked for in
:func:`publishing` and refuses the whole publish if one fails:

- a lane's maximum depth for new jobs (``submit()``): it reads the lane's depth
  counter (every list of the lane: ``lua/queue.lua``) and
  pushes only below the limit, else
  :class:`LaneAtLimit`. Any number of submitters together never pass the
  limit. Messages published outside it (retries, restores) are never refused:
  a job once accepted is not dropped for want of room;
- a lane's admission (``submit()``, a job that may move down): the work queued
  ahead of it, each lane's depth counter priced per job, under the bound beat stated
  (``routing.policy.over_budget``), else :class:`PublishRefused` (``over_budget``);
- a deadline (``submit()``): a publish that reaches Redis after its caller gave
  up (a Redis frozen for a while executes what was sent meanwhile) writes
  nothing (:class:`PublishRefused`, ``late``);
- the account's fast place (a fast job, ``tasks.jobs.fastlimit``): taken in the
  same step, so a refused or failed publish leaves no place behind; a fast job this
  process routes over its account's limit on the word of an earlier refusal goes there
  only while every place is still taken (``place_free`` otherwise), so that word costs
  a flooding account no second publish and nobody a fast place;
- the account's fast time (a fast job, ``tasks.jobs.accounts``): a balance at zero or
  below refuses the publish (:class:`PublishRefused`, ``fast_time``), exactly when it is
  spent, where the routers' copy of the exhausted accounts lags a beat behind;
- the run of a result-cache claim is confirmed (``tasks.jobs.cache``): a claim whose
  job was never published lapses by itself and no caller waits on it;
- a coalesced run led by the job takes the rank of the lane its leader is published to
  (never faster than it was), so no caller joins a run waiting in a lane slower than
  its own. A worker's retry (a fenced publish, maybe down a lane) names the run of its
  job too: it exists only if that job leads one;
- a fence (a worker's retry of its job, ``tasks.worker.generate``): only the run that
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

from routing.names import LANES
from routing.policy import Admission
from tasks.broker import scripts
from tasks.broker.keys import (
    DUE_PREFIX,
    FAST_NEWS_PREFIX,
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
class Conditions:
    """What a publish must satisfy, checked in the same step as the push."""

    limit: int = 0                    #: the lane's maximum depth (0: none)
    deadline: float = 0.0             #: unix s after which the publish is refused (0: none)
    #: (key, allowed, lapse s): take one of the account's fast places; with allowed
    #: below 0, take none and refuse (``place_free``) unless all -allowed are taken
    fast_places: tuple[str, int, float] | None = None
    run: tuple[str, str, int] | None = None  #: a claimed run: (pointer, hash, ttl s)
    #: a fast job's fast time: (balances hash, account, an uncharged account's balance)
    fast_time: tuple[str, str, float] | None = None
    #: (lease, counter, token, run number, seconds a released lease is kept)
    fence: tuple[str, str, str, int, int] | None = None
    #: at the front of its list, taken next (a preempted job's copy)
    front: bool = False
    #: when the job's wait in its lane began (its due index's clock; 0: read from the
    #: message, ``tasks.broker.moves.lane_clock_of``)
    entered_at: float = 0.0
    #: a claim of the result cache made in the same step (``run`` names its pointer and
    #: run); answered by :class:`ClaimAnswered`
    claim: ClaimArgs | None = None
    #: the lane's admission (``routing.policy.Admission``): refused (``over_budget``)
    #: when the work queued ahead, by the live depths, is at or past its bound
    admit: Admission | None = None


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
    ``why``: ``late``, ``fast_places``, ``fence``, ``fast_time``, ``place_free`` or
    ``over_budget``."""

    def __init__(self, why: str) -> None:
        super().__init__(f"publish refused: {why}")
        self.why = why


class ClaimAnswered(Exception):
    """A publish inside :func:`publishing` with a claim found the job's digest taken:
    ``verdict`` ``hit`` (``value``: the stored result), ``follow`` (``value``: the
    leader's id) or ``solo``; nothing was pushed."""

    def __init__(self, verdict: str, value: str) -> None:
        super().__init__(f"claim answered: {verdict}")
        self.verdict, self.value = verdict, value


_REFUSALS = {-1: "late", -2: "fast_places", -3: "fence", -4: "fast_time", -5: "place_free",
             -6: "over_budget"}


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


def _led_run(job_id: str, when: Conditions) -> tuple[str, str]:
    """(pointer to confirm, run hash to rank) of a publish: a claim's; a worker's retry
    names its job's run, which exists only if the job leads one; else none."""
    if when.run:
        return when.run[0], when.run[1]
    return "", run_key(job_id) if when.fence and job_id else ""


def _put_call(key: str, lane: str, payload: str, job_id: str,
              when: Conditions) -> tuple[list[str], list[Any]]:
    """The KEYS and ARGV of the publish script (``lua/put.lua``)."""
    places, allowed, lapse_s = when.fast_places or ("", 0, 0)
    pointer, run = _led_run(job_id, when)
    run_ttl_s = when.run[2] if when.run else 0
    lease, counter, token, attempt, kept_s = when.fence or ("", "", "", 0, 0)
    balances, account, start_s = when.fast_time or ("", "", 0.0)
    claim_keys, claim_args = when.claim or (("", "", ""), ("", "", 0, 0, 0, ""))
    return ([key, "", lists_key(lane), places, pointer, run, lease, counter, balances,
             LANE_DEPTHS_KEY, LIST_DEPTHS_KEY, PREEMPTIBLE_KEY, *claim_keys],
            [payload, WAKE_PREFIX, when.limit, when.deadline, allowed, lapse_s, job_id, run_ttl_s,
             token, attempt, kept_s, RELEASED, LANES.index(lane), account, repr(start_s),
             "1" if when.front else "0", FAST_NEWS_PREFIX,
             repr(due_clock(key, when.entered_at)), DUE_PREFIX, *claim_args,
             *_admission_args(when.admit)])


def _admission_args(admission: Admission | None) -> list[str]:
    """The publish script's last arguments: the admission bound ('' : none), then each
    lane's name and seconds per queued job."""
    if admission is None:
        return [""]
    return [repr(admission.bound_s),
            *(part for lane, job_s in admission.per_job_s for part in (lane, repr(job_s)))]


def put(client: redis.Redis, lane: str, key: str, payload: str, job_id: str,
        when: Conditions) -> int | ClaimAnswered:
    """The publish script's verdict (see :func:`refusal`), or its claim's answer."""
    keys, args = _put_call(key, lane, payload, job_id, when)
    verdict = scripts.run(client, "put", keys, args)
    if isinstance(verdict, list):
        return ClaimAnswered(*(v.decode() if isinstance(v, bytes) else v for v in verdict))
    return int(verdict)

"""The job message, typed: what a job carries from ``submit()`` to a worker.

A call of the ``generate`` task has three keyword arguments: ``job`` (the
validated parameters), ``route`` (the lane it was sent to and, when it was moved,
from where, why and since when) and ``submitted_at``. They are decoded once where
a message is read (the worker's task, beat's movers) and encoded once where one
is written (the publish path, a retry, a move). The objects are frozen: a change
is a new object, never an edit of a message in place.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any, Mapping

from routing.lanes import Route
from routing.names import lane_of
from routing.policy import RETRY

#: A job's routing fields; every other field of a job is an input of its model.
ROUTING: tuple[str, ...] = ("tier", "account", "model", "downgradable")
#: Bookkeeping a job may carry beside them (``leads_run``, ``route_key``, ``cost``).
BOOKKEEPING: tuple[str, ...] = ("leads_run", "route_key", "cost", "admitted")


def is_cost(value: Any) -> bool:
    """Whether ``value`` can be a job's cost: a positive number a float holds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return 0 < float(value) < math.inf
    except OverflowError:  # an integer of hundreds of digits
        return False


@dataclass(frozen=True)
class Job:
    """A validated job (``tasks.jobs.schema``): how to route it, and its model's inputs.

    On the wire it is one flat mapping, the inputs beside the routing fields (an image
    job: ``prompt``, ``seed``, ``steps``, ``width``, ``height``). ``leads_run``: callers
    may have joined its run (``tasks.jobs.cache``): its worker closes the run."""

    tier: str
    account: str
    model: str
    downgradable: bool
    inputs: Mapping[str, Any]
    leads_run: bool = False
    #: The model's ``route_key(inputs)``: the job's point on the hash ring, if any.
    route_key: str | None = None
    #: The model's ``cost(inputs)``: its work relative to a typical job (1.0), which
    #: the expected-wait estimate weighs queued jobs by (``beat.costs``).
    cost: float = 1.0
    #: Counted against its account's plan while in flight (``tasks.jobs.admission``):
    #: its worker says when it is over.
    admitted: bool = False

    def encode(self) -> dict[str, Any]:
        encoded = {"tier": self.tier, "account": self.account, "model": self.model,
                   "downgradable": self.downgradable, **self.inputs}
        if self.leads_run:  # only a run's leader carries the flag
            encoded["leads_run"] = True
        if self.route_key:
            encoded["route_key"] = self.route_key
        if self.cost != 1.0:
            encoded["cost"] = self.cost
        if self.admitted:
            encoded["admitted"] = True
        return encoded

    @classmethod
    def decode(cls, job: dict[str, Any]) -> "Job":
        """From a message's ``job`` (checked by ``tasks.jobs.schema.check_job`` first)."""
        inputs = {k: v for k, v in job.items() if k not in ROUTING and k not in BOOKKEEPING}
        return cls(**{k: job[k] for k in ROUTING}, inputs=MappingProxyType(inputs),
                   leads_run=bool(job.get("leads_run")), route_key=job.get("route_key"),
                   cost=job.get("cost", 1.0), admitted=bool(job.get("admitted")))

    def leading(self) -> "Job":
        return replace(self, leads_run=True)

    @staticmethod
    def leads(kwargs: Any) -> bool:
        """Whether a raw ``generate`` call (as Celery's signals hand it) leads a run."""
        job = kwargs.get("job") if isinstance(kwargs, dict) else None
        return isinstance(job, dict) and bool(job.get("leads_run"))

    @staticmethod
    def model_and_cost(kwargs: Any) -> tuple[str, float]:
        """(model, cost) of a raw ``generate`` call, unchecked: ("", 1.0) where a field
        is missing or malformed (estimates only read them)."""
        job = kwargs.get("job") if isinstance(kwargs, dict) else None
        if not isinstance(job, dict):
            return "", 1.0
        model, cost = job.get("model"), job.get("cost", 1.0)
        return (model if isinstance(model, str) else ""), float(cost) if is_cost(cost) else 1.0


@dataclass(frozen=True)
class JobRoute:
    """Where a job's message was sent: its lane (a worker's own queue counts as the
    lane), the tier asked for, and when it was moved down, from where, why and since
    when. ``worker_faults``: runs it lost to workers' own faults; ``deferred``: a copy
    sent back because another run held the job."""

    lane: str
    requested_tier: str
    downgraded_from: str | None = None
    downgrade_reason: str | None = None
    lane_since: float | None = None
    worker_faults: int = 0
    deferred: bool = False
    #: Times a running copy stepped aside for a fast job (``gpu_worker.preempt``).
    preempted: int = 0
    #: Where a copy handed over by a stopping worker resumes: step, URL and sha256 of
    #: the state (``tasks.worker.handoff``).
    resume: dict[str, Any] | None = None

    @classmethod
    def of(cls, decision: Route) -> "JobRoute":
        """The route a routing decision sends a new job on."""
        return cls(decision.lane, decision.requested_tier, decision.downgraded_from,
                   decision.downgrade_reason)

    def encode(self) -> dict[str, Any]:
        """Only what is set: a route as the message and the result carry it."""
        return {k: v for k, v in self.__dict__.items() if v is not None and v is not False
                and not (k in ("worker_faults", "preempted") and v == 0)}

    @classmethod
    def decode(cls, route: dict[str, Any]) -> "JobRoute":
        return cls(**{f.name: route[f.name] for f in fields(cls) if f.name in route})

    def moved(self, lane: str, reason: str, since: float) -> "JobRoute":
        """Moved down to ``lane`` for ``reason`` at ``since``."""
        return replace(self, lane=lane, downgraded_from=self.requested_tier,
                       downgrade_reason=reason, lane_since=since)

    def retried(self, lane: str, since: float) -> "JobRoute":
        """A retry's route: ``lane`` (one down, or the same), its wait from ``since``."""
        if lane == self.requested_tier:
            return replace(self, lane=lane, lane_since=since)
        return self.moved(lane, RETRY, since)

    def back_to_shared(self, since: float) -> "JobRoute":
        """Back to the shared lane after a worker's own fault (not a try of the job)."""
        return replace(self, lane=lane_of(self.lane), worker_faults=self.worker_faults + 1,
                       lane_since=since)

    def preempted_copy(self, resume: dict[str, Any] | None = None) -> "JobRoute":
        """A preempted run's next copy (to the front of its lane, or of the worker's own
        queue of it), its wait in the lane counted as it was; ``resume``: the state a
        stopping worker handed over."""
        return replace(self, preempted=self.preempted + 1, resume=resume)

    def deferred_copy(self) -> "JobRoute":
        return replace(self, deferred=True)

    def reported(self) -> dict[str, Any]:
        """What a result says of its route."""
        return {k: v for k, v in self.encode().items() if k not in ("lane_since", "resume")}


@dataclass(frozen=True)
class JobMessage:
    """The keyword arguments of a ``generate`` call."""

    job: Job
    route: JobRoute
    submitted_at: float

    def kwargs(self) -> dict[str, Any]:
        return {"job": self.job.encode(), "route": self.route.encode(),
                "submitted_at": self.submitted_at}

    @classmethod
    def decode(cls, kwargs: dict[str, Any]) -> "JobMessage":
        return cls(Job.decode(kwargs["job"]), JobRoute.decode(kwargs["route"]),
                   float(kwargs["submitted_at"]))

    def with_route(self, route: JobRoute) -> "JobMessage":
        return replace(self, route=route)

    @property
    def lane_clock(self) -> float:
        """When its wait in its lane began (moved in, retried), else when it was submitted."""
        return self.route.lane_since if self.route.lane_since is not None else self.submitted_at

    @staticmethod
    def lane_clock_of(kwargs: Any) -> float | None:
        """:attr:`lane_clock` of a raw ``generate`` call, unchecked: None where it is
        missing or malformed, or for a copy sent back while another run held the job
        (estimates only read it)."""
        if not isinstance(kwargs, dict):
            return None
        route = kwargs.get("route")
        route = route if isinstance(route, dict) else {}
        since = route.get("lane_since", kwargs.get("submitted_at"))
        if route.get("deferred") or isinstance(since, bool) or not isinstance(since, (int, float)):
            return None
        return float(since)


@dataclass(frozen=True)
class Result:
    """What a job's caller gets from ``.get()`` (as a dict: :meth:`encode`): the image
    or the output, where and how it ran and, when moved down, from where and why."""

    job_id: str
    lane: str
    requested_tier: str
    model: str
    #: An image model's PNG (a local path, or the artifact store's URL) and its inputs.
    image: str | None = None
    seed: int | None = None
    steps: int | None = None
    width: int | None = None
    height: int | None = None
    #: A model's returned dict, its images and bytes replaced by artifact references.
    output: dict[str, Any] | None = None
    worker: str = ""
    device: str = ""
    started_at: float = 0.0
    queued_ms: float = 0.0
    run_ms: float = 0.0
    attempts: int = 0
    cached: bool = False
    bytes: int | None = None
    sha256: str | None = None
    cold_start: bool = False
    load_ms: float = 0.0
    batch_size: int = 1
    batch_wait_ms: float = 0.0
    downgraded_from: str | None = None
    downgrade_reason: str | None = None
    worker_faults: int = 0
    deferred: bool = False
    #: Times the job stepped aside for a fast one while it ran.
    preempted: int = 0
    #: A copy (a cache hit, a coalesced run's follower): the job whose run made it.
    source_job_id: str | None = None
    coalesced: bool = False

    def encode(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()
                if v is not None and not (k in _ONLY_WHEN_SET and not v)}

    @classmethod
    def decode(cls, result: dict[str, Any]) -> "Result":
        return cls(**{name: result[name] for name in _RESULT_FIELDS if name in result})

    def copied_for(self, tier: str, job_id: str, **changes: Any) -> "Result":
        """This result as another caller's (``tier``, ``job_id``): no GPU run of its own
        (``cached``, ``attempts`` 0), the job that made it named, its route's moves not."""
        return replace(self, job_id=job_id, requested_tier=tier, cached=True, attempts=0,
                       source_job_id=self.source_job_id or self.job_id, downgraded_from=None,
                       downgrade_reason=None, preempted=0, **changes)


_RESULT_FIELDS = tuple(f.name for f in fields(Result))
_ONLY_WHEN_SET = frozenset({"worker_faults", "deferred", "coalesced"})

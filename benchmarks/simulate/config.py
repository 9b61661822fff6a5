"""The settings a simulated run uses: the real ones (``tasks.settings``), so that the
simulator and a cluster started in the same environment run the same policy."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from beat.health import MISSES_ALLOWED
from beat.heartbeat import DEFAULT_SERVICE_S, PUSH_GRACE_S
from routing.policy import FAIR_UNIT_S, RELEASE_RATIO, RELEASE_SAMPLES
from tasks.broker.enqueue import ROUTE_HASHING
from tasks.broker.view import HASH_EPSILON
from tasks.broker.keys import FAIR_WINDOW_S
from tasks.settings import RETRY_CAP_S, settings

#: Start of the virtual clock: a unix time, as the real code's clocks are (a due index
#: treats 0 as "not indexed").
EPOCH_S = 1_700_000_000.0


def _max_wait() -> dict[str, float]:
    return dict(settings.max_wait_s)


def _max_depth() -> dict[str, int]:
    return dict(settings.max_depth)


@dataclass(frozen=True)
class SimConfig:
    """Beat's and the router's settings, and what only the simulator needs."""

    heartbeat_s: float = settings.heartbeat_s
    heartbeat_reply_s: float = PUSH_GRACE_S
    budgets_s: Mapping[str, float] = field(default_factory=_max_wait)
    release_ratio: float = RELEASE_RATIO
    release_samples: int = RELEASE_SAMPLES
    max_depth: Mapping[str, int] = field(default_factory=_max_depth)
    default_service_s: float = DEFAULT_SERVICE_S
    misses_allowed: int = MISSES_ALLOWED
    stale_s: float = settings.snapshot_stale_s
    epsilon: float = HASH_EPSILON
    route_hashing: bool = ROUTE_HASHING
    fast_jobs_per_account: int = settings.fast_jobs_per_account
    fast_seconds: float = settings.fast_seconds_default
    fair_window_s: float = FAIR_WINDOW_S
    fair_unit_s: float = FAIR_UNIT_S
    fair_aging_s: float = settings.fair_aging_s
    preempt: bool = settings.preempt
    max_preemptions: int = settings.max_preemptions
    #: A run steps aside only while it expects this much or more still to run.
    preempt_min_left_s: float = settings.preempt_min_left_s
    #: A dead runner's lease lapses after this (``Settings.lease_ttl_s``): only then
    #: does the health check put its job back.
    lease_s: float = float(settings.lease_ttl_s)
    #: Plain lanes' redelivery of a dead worker's job (kombu's visibility timeout, set
    #: past the longest job and its backoff).
    visibility_s: float = float(2 * settings.max_job_s + RETRY_CAP_S)
    #: The relaxed tier has no lane budget; "within budget" is counted against this.
    relaxed_budget_s: float = 600.0
    #: Seconds a worker spends per job beyond its run (ack, result write, next fetch);
    #: a run that steps aside for a fast job costs it too.
    overhead_s: float = 0.0
    #: Seconds from a publish to the start of the job on an idle worker (the take's
    #: wake-up, the task's set-up): part of ``overhead_s`` when jobs run back to back.
    pickup_s: float = 0.0
    #: Measured pickups (``pickup_s``'s spread), drawn in turn in a seeded order; empty:
    #: ``pickup_s`` for every job.
    pickups_s: tuple[float, ...] = ()
    #: Workers push their stats at this many different phases of a heartbeat.
    push_phases: int = 10
    #: Seconds of each job a worker spends outside the span it measures as the job's
    #: service time (prerun to postrun: the message's fetch and ack, the consumer's
    #: loop): it keeps the worker busy but is not in the service time it reports, of
    #: which beat's expected waits are made.
    unmeasured_s: float = 0.0

    def budget_of(self, tier: str) -> float:
        """The wait a job of ``tier`` should not exceed."""
        return self.budgets_s.get(tier, self.relaxed_budget_s)

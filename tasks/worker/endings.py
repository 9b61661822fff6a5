"""The ends of a job's run that leave no next copy of the job: taken over by a newer run
(stale: it stops and writes nothing), revoked, or failed for good (dead-lettered, with
the followers of a coalesced run it led), each recorded through Redis outages
(``tasks.broker.outage.persist``). ``tasks.worker.generate`` sorts a stopped run into one
of these, a retry or a preemption; the entries a run's own scripts store are made here.
"""
from __future__ import annotations

import logging
from typing import Any, NoReturn

from celery import signals, states
from celery.exceptions import Ignore

from gpu_worker.lease import Lease
from gpu_worker.preempt import SUSPENDED
from routing.names import lane_of
from tasks.broker import runs
from tasks.broker.app import app, redis_client
from tasks.broker.backend import Entry, run_entries
from tasks.broker.keys import METRICS_KEY, metric_field
from tasks.broker.message import JobMessage, JobRoute
from tasks.broker.outage import persist
from tasks.errors import JobFailed
from tasks.jobs.deadletter import dead_entry
from tasks.worker.coalesce import fail_followers
from tasks.worker.revokes import how_far, tell_revoked
from tasks.worker.steps import StepGuard

log = logging.getLogger(__name__)
#: ``METRICS_KEY`` field: runs stopped because a newer run had taken their job over.
STALE_FIELD = metric_field("stale_runs")
#: The result backend is on the broker's Redis: a run's begin and finish scripts store
#: its STARTED and SUCCESS entries in their own step (no read, transaction and publish
#: of Celery's store for each).
RUN_ENTRIES = run_entries(app)


def run_entry(task: Any, result: Any, state: str) -> Entry | None:
    """The job's ``state`` entry for a run's script to store; None: Celery stores it."""
    return app.backend.entry(task.request.id, result, state, task.request) \
        if RUN_ENTRIES else None


def run_lane(task: Any, route: JobRoute) -> str:
    """The lane this run was taken from (a worker's own queue counts as its lane)."""
    return lane_of((task.request.delivery_info or {}).get("routing_key") or route.lane)


def stop_stale(task: Any, lease: Lease) -> NoReturn:
    log.warning("job %s: run %d was taken over by a newer run while frozen or cut off; "
                "it stops and writes nothing", task.request.id, lease.attempt)
    persist(lambda: redis_client().hincrby(METRICS_KEY, STALE_FIELD, 1), "a stale run")
    raise Ignore()


def stop_revoked(task: Any, lease: Lease | None, guard: StepGuard | None = None,
             fast_charge: tuple[str, float] | None = None) -> NoReturn:
    """A revoked job: not run, or stopped at a step of ``guard``'s run (a fast one
    charged only the seconds it ran, ``fast_charge``); REVOKED for its caller and in
    Flower (which last heard of it as received, started or in progress)."""
    job_id = task.request.id
    SUSPENDED.take(job_id)  # a preempted job's state, if it waited here
    if lease is not None:
        persist(lambda: runs.release(job_id, lease.token, lease.attempt, fast_charge),
                f"the release of revoked job {job_id}")
    app.backend.mark_as_revoked(job_id, "revoked")  # never over a stored success
    tell_revoked(task)
    signals.task_revoked.send(sender=task, request=task.request, terminated=False,
                              signum=None, expired=False)  # fast place, coalesced run
    log.info("job %s revoked %s", job_id, how_far(guard))
    raise Ignore()


def give_up(task: Any, message: JobMessage, lease: Lease, reason: str, exc: BaseException,
             what: str) -> NoReturn:
    job_id = task.request.id
    entry = dead_entry(job_id, message.kwargs(), reason, exc, lease.attempt)
    failures = metric_field("failures", run_lane(task, message.route))
    failed = run_entry(task, JobFailed(what), states.FAILURE)  # the one Celery stores after
    if not persist(lambda: runs.give_up(job_id, lease.token, lease.attempt, entry, failures,
                                        failed), f"the failure of job {job_id}"):
        stop_stale(task, lease)
    if message.job.leads_run:
        persist(lambda: fail_followers(job_id, what), f"the followers of job {job_id}")
    raise JobFailed(what) from exc

"""What a run does between two steps of its model.

At every step boundary the run's :class:`StepGuard` stops it (raises) past
``GPULANES_MAX_JOB_S``, once its job is revoked, once a newer run took its job over,
or, for a preemptible run, once a fast job waits for its worker, or a first-level
standard job for a heavier run (``gpu_worker.preempt``), or, for any run on its own,
once its worker is stopping (``tasks.worker.handoff``); else it reports the step
(``tasks.worker.progress``). A model that can resume hands its state with each step
(``keep``): the state of the boundary it stopped at travels with
:class:`~gpu_worker.preempt.Preempted`. A revoked job that leads a coalesced run others
still wait for runs on for them.
"""
from __future__ import annotations

import time
from typing import Any

from celery.worker.state import revoked as revoked_ids

from gpu_worker.lease import Lease
from gpu_worker.preempt import PREEMPTION, Preempted
from routing.names import heavier
from tasks.broker.outage import stopping
from tasks.errors import JobRevoked, JobTimeout
from tasks.settings import settings
from tasks.worker.coalesce import wanted_by_followers
from tasks.worker.progress import Progress


class StepGuard:
    """``guard(step, steps)`` between steps of one run; see the module docstring."""

    def __init__(self, job_id: str, lease: Lease, lane: str, preempted: int,
                 report: Progress, leads_run: bool = False, step: int = 0) -> None:
        self.job_id, self.lease, self.lane, self.preempted = job_id, lease, lane, preempted
        #: The priority step the run was taken at; a run past standard's first level (or
        #: a relaxed one) steps aside for a first-level job of its worker's own queue too.
        self.step = step
        self.heavier = heavier(lane, step)
        self.report, self.leads_run = report, leads_run
        #: Revoked by its own caller while it ran, it runs on for its run's followers.
        self.for_followers = False
        self.deadline = time.monotonic() + settings.max_job_s
        #: When the model began its work (set by the runner once it is loaded).
        self.began = time.monotonic()
        #: Set by the runner once it knows the model may stop here (and run alone).
        self.preemptible = False
        #: Set by the runner when the job runs on its own (not in a batch): it steps
        #: aside when its worker stops (``tasks.worker.handoff``).
        self.alone = False
        self.state: Any = None
        #: The last step the model reported done, of how many (None: not said).
        self.step: int = 0
        self.steps: int | None = None

    def keep(self, step: int, state: Any) -> None:
        """A resumable model's state after ``step`` steps (what resuming starts from)."""
        self.state = (step, state)

    def __call__(self, step: int, steps: int | None = None) -> None:
        self.step, self.steps = step, steps
        if time.monotonic() > self.deadline:
            raise JobTimeout(f"ran past GPULANES_MAX_JOB_S={settings.max_job_s:g}s at step {step}")
        if self.job_id in revoked_ids and not self.for_followers:
            if not (self.leads_run and wanted_by_followers(self.job_id)):
                raise JobRevoked(f"job {self.job_id} was revoked at step {step}")
            self.for_followers = True
        self.lease.check()
        if steps is None or step < steps:
            if self.alone and stopping():
                raise Preempted(step, steps, self._kept(step), leaving=True)
            left_s = self._left_s(step, steps)
            if (left_s is None or left_s >= settings.preempt_min_left_s) and \
                    PREEMPTION.wanted(self.lane, self.preempted, self.preemptible, left_s,
                                      self.heavier):
                raise Preempted(step, steps, self._kept(step))
        self.report(step, steps)

    def _kept(self, step: int) -> tuple[int, Any] | None:
        """The state kept at ``step``, if the model handed one there."""
        return self.state if self.state and self.state[0] == step else None

    def _left_s(self, step: int, steps: int | None) -> float | None:
        """Seconds the run expects still to run, from its pace so far; None: unknown (no
        total, no step done yet), which counts as long. One expecting less than
        ``preempt_min_left_s`` is never preempted."""
        done = step - self.report.from_step
        if steps is None or done <= 0:
            return None
        return (time.monotonic() - self.began) / done * (steps - step)

"""A running job's progress, where its caller and Flower look for it.

Every finished step reaches the run's :class:`Progress`; at most one every
:data:`PROGRESS_S` goes out (none for a job done within the first), as Celery
users know them:

- the result backend's state ``PROGRESS`` with ``.info`` = ``step``, ``steps``,
  ``lane``, ``worker``, ``eta_s`` (and ``preempted``): ``AsyncResult.state`` and
  ``AsyncResult.info`` read it, ``celery -A tasks lanes job ID`` shows it;
- a ``task-progress`` event: Flower shows the task as PROGRESS, its result field
  saying how far it is.

Progress is advisory: one Lua call that never writes over a final state
(``tasks.broker.backend.store_progress``: no PUBLISH, only a finished job wakes
``.get()``) and one event, never retried, on a client that gives up within half a
second: a Redis that does not answer costs a job that short wait and then no report
for ``PAUSE_S``.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

from tasks.broker.backend import store_progress

log = logging.getLogger(__name__)
#: Least time between two progress reports of one job (state PROGRESS, an event).
PROGRESS_S = 0.25
#: After a report that could not be written, none for this long.
PAUSE_S = 10.0


class Progress:
    """Reports of one run of one job, from whichever thread runs its steps (the task's,
    or the batcher's: the job's id and worker are taken as the run begins)."""

    def __init__(self, task: Any, lane: str, preempted: int = 0, from_step: int = 0) -> None:
        self.app, self.job_id = task.app, task.request.id
        self.hostname, self.lane, self.preempted = task.request.hostname, lane, preempted
        self.from_step = from_step  #: where the run began (a resumed one: past step 0)
        # the first report after PROGRESS_S: a job done sooner costs no write
        self.began = time.monotonic()
        self.next_at = self.began + PROGRESS_S

    def __call__(self, step: int, steps: int | None) -> None:
        """``step`` of ``steps`` (None: unknown) are done."""
        now = time.monotonic()
        if now < self.next_at or (steps is not None and step >= steps):
            return  # too soon, or the last step: the result follows at once
        self._report(step, steps)

    def paused(self, step: int, steps: int | None, leaving: bool = False) -> None:
        """The run steps aside at ``step`` for a fast job, or (``leaving``) as its worker
        stops (``preempted`` counts it): the job waits to resume; reported at once,
        whatever the last report's time."""
        self.preempted += 1
        self._report(step, steps, paused=True, **({"leaving": True} if leaving else {}))

    def _report(self, step: int, steps: int | None, **extra: Any) -> None:
        now = time.monotonic()
        self.next_at = now + PROGRESS_S
        info = {**self.info(step, steps, now), **extra}
        try:
            if store_progress(self.app, self.job_id, info):
                with self.app.events.default_dispatcher(hostname=self.hostname) as events:
                    events.send("task-progress", uuid=self.job_id, result=line(info),
                                retry=False)
        except Exception as exc:  # noqa: BLE001  advisory: any broker or backend error
            self.next_at = now + PAUSE_S
            log.info("job %s: progress not reported (%s: %s)", self.job_id,
                     type(exc).__name__, exc)

    def info(self, step: int, steps: int | None, now: float) -> dict[str, Any]:
        """What ``AsyncResult.info`` holds while the job runs."""
        elapsed_s, done = now - self.began, step - self.from_step
        eta_s = elapsed_s / done * (steps - step) if steps and done > 0 else None
        return {"step": step, "steps": steps, "lane": self.lane, "worker": self.hostname,
                "hostname": self.hostname, "pid": os.getpid(),  # as in Celery's STARTED
                "eta_s": None if eta_s is None else round(eta_s, 2),
                "running_s": round(elapsed_s, 2), "preempted": self.preempted}


def line(info: dict[str, Any]) -> str:
    """One line of a job's progress: ``step 7/20, eta 1.3 s, standard on gpu0@host``."""
    of = f"/{info['steps']}" if info.get("steps") else ""
    if info.get("leaving"):
        return f"step {info['step']}{of}, handed on by {info['worker']} (stopping)"
    if info.get("paused"):
        return f"step {info['step']}{of}, preempted: waits to resume on {info['worker']}"
    eta = f", eta {info['eta_s']:.1f} s" if info.get("eta_s") is not None else ""
    return f"step {info['step']}{of}{eta}, {info['lane']} on {info['worker']}"

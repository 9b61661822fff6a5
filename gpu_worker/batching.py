"""Dynamic batching: compatible jobs held in a worker run as one forward pass.

How jobs get here. With ``GPULANES_MAX_BATCH`` above 1 for some model, the
supervisor gives each worker as many pool threads as the largest batch (unless
``--concurrency`` says otherwise), so prefetch 1 per thread leaves that many
jobs in hand. Each ``generate`` task thread keeps its own lease, attempt count,
retry and result, and only hands the model call to this process's
:data:`BATCHER`, blocking until its own image (or its own error) comes back.
One runner thread per worker process (one device) forms the groups.

Grouping. Jobs with the same (model, steps, width, height) may share a pass.
A group is *ready* when it holds ``max_batch`` jobs, when its oldest job has
waited ``max_queue_delay_ms``, or when every pool thread is waiting here (no
more jobs can arrive). As soon as any group is ready, the runner takes the
group whose best job ranks highest (fast > standard > relaxed, then oldest),
ready or not: a fast job never waits out a delay while a lower group is
ready, and never waits behind a lower group that has not started. Within a
group, higher lanes and older jobs go first when it holds more than fits.

What is guaranteed, and what is not. Among the jobs a worker holds, a fast
job waits at most for the pass already running, plus its own
``max_queue_delay_ms`` while no group is ready (it may gain company). A fast
job still in the broker waits until one of the worker's threads frees: with
``max_batch`` 8 a worker may hold 8 relaxed jobs, and if they form one pass,
a fast job that arrives then waits for that whole pass (it has started); if
they form several
passes, the fast job enters when the first one ends and runs next. So the
worst case for a fast job is one pass (today: one job) plus a round trip, not
the relaxed backlog. Jobs of different shapes never share a pass.

Failures. A job whose own check fails between steps (revoked, or its run
taken over by a newer one) drops out: the rest of its pass runs again without
it. A failed batched pass is retried one job at a time, so only the
jobs that fail alone fail. Out of GPU memory, the group is split in halves
(cache freed first) down to single jobs, whose OOM then goes to the task's
retry like any transient error. ``GPULANES_MAX_JOB_S`` still applies between
steps, from the moment each job reached the batcher.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from routing.names import LANES
from tasks.broker.message import Job
from tasks.jobs import catalog
from tasks.settings import settings

log = logging.getLogger(__name__)
#: The worker's pool size, set by the supervisor: the batcher's "house is full".
CONCURRENCY_ENV = "GPULANES_WORKER_CONCURRENCY"
Key = tuple[Any, ...]


def job_key(job: Job) -> Key:
    """Jobs with equal keys can share a forward pass: the model first, then an image
    model's steps and size, or what a class model's ``batch_key(inputs)`` says (all of
    its jobs, without one)."""
    found = catalog.spec(job.model)
    if found.cls is None:
        return job.model, job.inputs["steps"], job.inputs["width"], job.inputs["height"]
    batch_key = getattr(found.cls, "batch_key", None)
    if batch_key is None:
        return (job.model,)
    return job.model, repr(batch_key(found.Input.model_validate(dict(job.inputs))))


def worker_concurrency(max_batch: dict[str, int]) -> int:
    """Pool threads a worker needs so that its largest batch can be in hand at once."""
    return max(max_batch.values())


@dataclass
class Ran:
    """What running one job produced: an image model's pixels or a model's returned dict
    (``output``), and how it ran."""

    pixels: Any
    run_ms: float
    load_ms: float | None = None
    batch_size: int = 1
    wait_ms: float = 0.0
    output: dict | None = None


@dataclass(eq=False)
class Pending:
    """One job waiting in the batcher for its pass, and then for its outcome."""

    job: Job
    lane: str
    seq: int
    deadline: float  # monotonic; GPULANES_MAX_JOB_S from arrival
    #: The job's own check between steps (revoked? taken over?): raises to drop out;
    #: else reports the step (of how many) as the job's progress.
    check: Callable[[int, int | None], None] = lambda step, steps=None: None
    arrived: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    ran: Ran | None = None
    error: BaseException | None = None
    #: Its group's key (``job_key``), worked out once as it arrives.
    key: Key = ()

    @property
    def rank(self) -> tuple[int, int]:
        """Lower runs first: the lane, then arrival order."""
        return (LANES.index(self.lane) if self.lane in LANES else len(LANES)), self.seq


def pick(pending: list[Pending], now: float, max_batch: Callable[[str], int],
         delay_s: Callable[[str], float], capacity: int | None) -> tuple[list[Pending], float]:
    """The group to run now and 0, or ``([], seconds until some group is ready)``."""
    groups: dict[Key, list[Pending]] = {}
    for item in sorted(pending, key=lambda p: p.rank):
        groups.setdefault(item.key or job_key(item.job), []).append(item)
    if not groups:
        return [], float("inf")
    house_full = capacity is not None and len(pending) >= capacity
    ready_in = min(0.0 if len(g) >= max_batch(key[0])
                   else min(p.arrived for p in g) + delay_s(key[0]) - now
                   for key, g in groups.items())
    if ready_in > 0 and not house_full:
        return [], ready_in
    key, best = min(groups.items(), key=lambda item: item[1][0].rank)
    return best[:max_batch(key[0])], 0.0


class Batcher:
    """Per-process: task threads :meth:`run` jobs; one runner thread makes passes."""

    def __init__(self, execute: Callable[[list[Pending]], None], capacity: int | None = None,
                 max_batch: Callable[[str], int] | None = None,
                 delay_s: Callable[[str], float] | None = None) -> None:
        self.execute, self.capacity = execute, capacity
        self._max_batch = max_batch or (lambda model: settings.for_model(settings.max_batch, model))
        self._delay_s = delay_s or (
            lambda model: settings.for_model(settings.max_queue_delay_ms, model) / 1000)
        self._cond = threading.Condition()
        self._pending: list[Pending] = []
        self._seq = itertools.count()
        self._runner: threading.Thread | None = None
        self.passes = self.jobs = 0

    def run(self, job: Job, lane: str,
            check: Callable[[int, int | None], None] | None = None) -> Ran:
        """Run ``job`` in some pass and return its own outcome (or raise its own error);
        ``check`` runs between steps and drops the job out of its pass when it raises."""
        with self._cond:
            item = Pending(job, lane, next(self._seq), time.monotonic() + settings.max_job_s,
                           check or (lambda step, steps=None: None), key=job_key(job))
            self._pending.append(item)
            self._start_runner()
            self._cond.notify()
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item.ran

    def stats(self) -> dict[str, int]:
        """For the heartbeat: jobs waiting for a pass, passes made, jobs they ran."""
        with self._cond:
            return {"pending": len(self._pending), "passes": self.passes, "jobs": self.jobs}

    def _start_runner(self) -> None:
        if self._runner is None:
            self._runner = threading.Thread(target=self._loop, daemon=True, name="batcher")
            self._runner.start()

    def _next_group(self) -> list[Pending]:
        with self._cond:
            while True:
                group, wait_s = pick(self._pending, time.monotonic(), self._max_batch,
                                     self._delay_s, self.capacity)
                if group:
                    self._pending = [p for p in self._pending if p not in group]
                    self.passes, self.jobs = self.passes + 1, self.jobs + len(group)
                    return group
                self._cond.wait(None if wait_s == float("inf") else wait_s)

    def _loop(self) -> None:
        while True:
            group = self._next_group()
            error: BaseException | None = None
            try:
                self.execute(group)
            except BaseException as exc:  # noqa: BLE001  never strand a waiting task
                log.exception("batch runner failed")
                error = exc
            for item in group:  # whatever happened, every job of the pass gets an outcome
                if not item.done.is_set():
                    item.error = error or RuntimeError("the pass settled no outcome for it")
                    item.done.set()


def capacity_from_env() -> int | None:
    """The worker's thread count, as the supervisor set it (None: not set)."""
    raw = os.environ.get(CONCURRENCY_ENV, "")
    return int(raw) if raw.isdigit() else None

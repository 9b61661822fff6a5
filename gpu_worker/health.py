"""A worker's own health: failures of its own making, and stepping aside when they repeat.

Some failures say nothing about the job and everything about the worker: a
disk that is full or read-only, a folder that vanished, a device that errors.
:func:`is_worker_fault` tells them apart; ``tasks.worker.generate`` reports every run
to :data:`HEALTH` and sends a job that failed so back to its shared lane, for
another worker, without spending its retries (``gpu_worker.faults`` sorts
failures and holds the self-checks). After ``SICK_AFTER`` such
failures in a row, or at once when the artifact store refuses a finished run's
output (``tasks.worker.saving``), the worker stops consuming (heartbeats report
``sick``, so routers and beat leave it out) and checks itself until the cause is
gone; then it consumes again. The checks back off while they fail: the first after
:data:`FIRST_PROBE_S`, each next one twice as late, up to :data:`PROBE_CAP_S`, and
the back-off starts over only once a job succeeds here: a worker whose disk stays full
comes back at most once a minute, however often it tries.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterator

from celery import signals
from celery.utils.dispatch import Signal

from gpu_worker.faults import is_worker_fault, self_check
from gpu_worker.hook import Hook
from routing.names import CONSUME_COMMAND, worker_queues
from tasks.jobs.expiry import Sweeper
from tasks.settings import SICK_AFTER

__all__ = ["FIRST_PROBE_S", "HEALTH", "HEALTH_HOOK", "PROBE_CAP_S", "HealthHook", "Lever",
           "SelfHealth", "is_worker_fault", "probe_delays_s"]
log = logging.getLogger(__name__)
#: A worker that stepped aside checks itself this soon, then ever less often.
FIRST_PROBE_S = 0.25
#: Longest wait between two self-checks of a worker that keeps failing them.
PROBE_CAP_S = 60.0


def probe_delays_s(first_s: float, cap_s: float = PROBE_CAP_S) -> Iterator[float]:
    """Waits before each self-check while they fail: ``first_s``, then doubling up to
    ``cap_s`` (a first wait above the cap stays as it is)."""
    delay_s = first_s
    while True:
        yield delay_s
        delay_s = max(first_s, min(2 * delay_s, cap_s))


class Lever:
    """Stops and restarts this worker's consuming with a control command sent to this
    worker only (``gpu_worker.control.lanes_consume``): it runs in the consumer
    thread (kombu's consumer is not thread-safe), whichever thread pulls the lever."""

    def __init__(self, app: Any, hostname: str, queues: list[str]) -> None:
        self.app, self.hostname = app, hostname
        order = worker_queues(hostname)  # kombu's priority cycle follows consume order
        self.queues = sorted(queues, key=lambda q: order.index(q) if q in order else len(order))

    def _consume(self, queues: list[str]) -> None:
        self.app.control.broadcast(CONSUME_COMMAND, arguments={"queues": queues},
                                   destination=[self.hostname])

    def step_aside(self) -> None:
        self._consume([])

    def resume(self) -> None:
        self._consume(self.queues)


class SelfHealth:
    """Counts this worker's own faults in a row; ``sick`` says why it stepped aside."""

    def __init__(self, sick_after: int | None = None, probe_s: float | None = None) -> None:
        self.sick_after = sick_after or SICK_AFTER
        self.probe_s = probe_s or FIRST_PROBE_S
        self.faults_in_a_row = 0
        self.sick: str | None = None
        self.lever: Lever | None = None  # set once the worker consumes (HealthHook)
        self._check: Callable[[], None] = lambda: None
        self._lock = threading.Lock()
        self._delays_s = probe_delays_s(self.probe_s)  # kept across sick spells
        self._wake = threading.Event()

    def succeeded(self) -> None:
        """A run finished: the faults before it were not in a row, and the checks'
        back-off starts over."""
        with self._lock:
            self.faults_in_a_row = 0
            self._delays_s = probe_delays_s(self.probe_s)

    def failed(self, exc: BaseException) -> None:
        """Every failed run; only worker faults count. The one that makes the worker
        sick stops its consuming and starts the self-checks."""
        if not is_worker_fault(exc):
            return
        with self._lock:
            self.faults_in_a_row += 1
            if self.faults_in_a_row < self.sick_after:
                return
            reason = f"{self.faults_in_a_row} jobs in a row failed here"
        self._step_aside(reason, exc)

    def store_refused(self, exc: BaseException) -> None:
        """The artifact store refused a finished run's output: step aside at once
        (another job taken now would run its model for an output it cannot store)."""
        self._step_aside("the artifact store refused a finished job's output", exc)

    def store_took(self) -> None:
        """A refused output was written after all: check now, not at the back-off's
        next turn (whether the store has room for more is the check's to say)."""
        with self._lock:
            if self.sick is not None:  # a wake-up left set would cut the next spell's wait
                self._wake.set()

    def _step_aside(self, reason: str, exc: BaseException) -> None:
        with self._lock:
            if self.sick is not None:
                return
            self.sick = f"{reason}: {type(exc).__name__}: {exc}"
            self._check = self_check(exc)
        log.error("stepping aside (no more jobs until a self-check passes): %s", self.sick)
        if self.lever is not None:
            self._pull(self.lever.step_aside)
            threading.Thread(target=self._probe_until_well, name="self-check",
                             daemon=True).start()

    def probe(self) -> bool:
        """Run the self-check once; when it passes, consume again. True when well."""
        with self._lock:
            if self.sick is None:
                return True
            check = self._check
        try:
            check()
        except Exception as exc:  # noqa: BLE001  any failure: the cause is still there
            log.warning("self-check failed, still stepping aside: %s: %s",
                        type(exc).__name__, exc)
            return False
        if self.lever is not None and not self._pull(self.lever.resume):
            return False  # Redis away: consume again at the next check
        with self._lock:
            self.sick, self.faults_in_a_row = None, 0
        log.warning("self-check passed: serving again")
        return True

    def _probe_until_well(self) -> None:
        while True:
            with self._lock:
                delay_s = next(self._delays_s)
            log.info("next self-check in %.2fs", delay_s)
            self._wake.wait(delay_s)
            self._wake.clear()
            if self.probe():
                return

    @staticmethod
    def _pull(lever: Callable[[], None]) -> bool:
        try:
            lever()
            return True
        except Exception:  # noqa: BLE001  never fail the job's own handling for it
            log.warning("could not reach this worker's consumer", exc_info=True)
            return False

    def stats(self) -> dict[str, Any]:
        """The heartbeat's part: ``sick`` (the reason, or None) and ``worker_faults``."""
        with self._lock:
            return {"sick": self.sick, "worker_faults": self.faults_in_a_row}


#: The one health record of this worker process.
HEALTH = SelfHealth()


class HealthHook(Hook):
    """Gives :data:`HEALTH` its lever once the worker consumes, and starts sweeping
    expired artifacts from its store (``tasks.jobs.expiry``): what would fill the disk."""

    def __init__(self, health: SelfHealth = HEALTH, sweeper: Sweeper | None = None) -> None:
        self.health, self.sweeper = health, sweeper or Sweeper()

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.worker_ready: self.on_ready}

    def on_ready(self, sender: Any = None, **_: Any) -> None:
        # In the consumer thread: its queue list is safe to read here.
        queues = [queue.name for queue in sender.task_consumer.queues]
        self.health.lever = Lever(sender.app, sender.hostname, queues)
        self.sweeper.start()


HEALTH_HOOK = HealthHook()

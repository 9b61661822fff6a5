"""A worker's own health: failures of its own making, and stepping aside when they repeat.

Some failures say nothing about the job and everything about the worker: a
disk that is full or read-only, a folder that vanished, a device that errors.
:func:`is_worker_fault` tells them apart; ``tasks.worker.generate`` reports every run
to :data:`HEALTH` and sends a job that failed so back to its shared lane, for
another worker, without spending its retries (``gpu_worker.faults`` sorts
failures and holds the self-checks). After ``GPULANES_SICK_AFTER`` such
failures in a row the worker stops consuming (heartbeats report ``sick``, so
routers and beat leave it out) and checks itself every ``GPULANES_SICK_PROBE_S``
until the cause is gone; then it consumes again.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from celery import signals
from celery.utils.dispatch import Signal

from gpu_worker.faults import is_worker_fault, self_check
from gpu_worker.hook import Hook
from routing.names import CONSUME_COMMAND, worker_queues
from tasks.settings import settings

__all__ = ["HEALTH", "HEALTH_HOOK", "HealthHook", "Lever", "SelfHealth", "is_worker_fault"]
log = logging.getLogger(__name__)


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
        self.sick_after = sick_after or settings.sick_after
        self.probe_s = probe_s or settings.sick_probe_s
        self.faults_in_a_row = 0
        self.sick: str | None = None
        self.lever: Lever | None = None  # set once the worker consumes (HealthHook)
        self._check: Callable[[], None] = lambda: None
        self._lock = threading.Lock()

    def succeeded(self) -> None:
        """A run finished: the faults before it were not in a row."""
        with self._lock:
            self.faults_in_a_row = 0

    def failed(self, exc: BaseException) -> None:
        """Every failed run; only worker faults count. The one that makes the worker
        sick stops its consuming and starts the self-checks."""
        if not is_worker_fault(exc):
            return
        with self._lock:
            self.faults_in_a_row += 1
            if self.faults_in_a_row < self.sick_after or self.sick is not None:
                return
            self.sick = (f"{self.faults_in_a_row} jobs in a row failed here: "
                         f"{type(exc).__name__}: {exc}")
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
            time.sleep(self.probe_s)
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
    """Gives :data:`HEALTH` its lever once the worker consumes."""

    def __init__(self, health: SelfHealth = HEALTH) -> None:
        self.health = health

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.worker_ready: self.on_ready}

    def on_ready(self, sender: Any = None, **_: Any) -> None:
        # In the consumer thread: its queue list is safe to read here.
        queues = [queue.name for queue in sender.task_consumer.queues]
        self.health.lever = Lever(sender.app, sender.hostname, queues)


HEALTH_HOOK = HealthHook()

"""A worker pushes its own stats every heartbeat, from a thread of its own.

Beat reads the stats changed since its last round (``tasks.broker.stats``: the same
stats as the last push are only stamped), so a round costs what changed, not the number
of workers, and never waits on replies. The
thread runs beside the jobs (threads pool): a busy worker keeps reporting, a frozen or
dead one stops, and beat counts its missed rounds.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from celery import signals
from celery.utils.dispatch import Signal

from gpu_worker.control import stats_of
from gpu_worker.hook import Hook
from gpu_worker.runtime import RUNTIME
from gpu_worker.stuck import WATCHDOG
from tasks.broker.stats import push_stats
from tasks.jobs.usage import COUNTS
from tasks.settings import settings

log = logging.getLogger(__name__)


class StatsPush(Hook):
    """Push :func:`gpu_worker.control.stats_of` every ``GPULANES_HEARTBEAT_S``."""

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.worker_ready: self.on_ready,
                signals.worker_shutdown: self.on_shutdown}

    def on_ready(self, sender: Any = None, **_: Any) -> None:
        from tasks.broker.store import broker_client

        client = broker_client(socket_timeout=settings.heartbeat_s,
                               socket_connect_timeout=settings.heartbeat_s)
        threading.Thread(target=self._loop, args=(client, sender), name="gpulanes-stats",
                         daemon=True).start()

    def _loop(self, client: Any, consumer: Any) -> None:
        self._client, self._consumer = client, consumer
        while True:
            self.push()
            time.sleep(settings.heartbeat_s)

    def push(self) -> None:
        """This worker's stats, and its finished jobs' counts since the last push."""
        batch = COUNTS.batch()
        WATCHDOG.check(time.monotonic())
        try:
            push_stats(self._client, RUNTIME.hostname, stats_of(self._consumer),
                       (RUNTIME.incarnation, *batch) if batch else None)
        except Exception:  # noqa: BLE001  Redis away: beat counts the missed round
            log.debug("could not push this worker's stats", exc_info=True)
            WATCHDOG.answered(time.monotonic(), took_writes=False)
            return
        if batch:
            COUNTS.pushed(batch[0])
        WATCHDOG.answered(time.monotonic(), took_writes=True)

    def on_shutdown(self, **_: Any) -> None:
        """The counts of the last jobs, before the process ends (unless Redis took none
        of this worker's writes lately: a stopping worker does not wait on it)."""
        if getattr(self, "_client", None) is not None and WATCHDOG.takes_writes:
            self.push()

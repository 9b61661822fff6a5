"""A worker whose finished run never settled its message (acked or rejected: until then
Celery gives its pool slot no other job) while Redis took the worker's writes reports
``stuck`` in its heartbeats and, stuck for :data:`STUCK_HEARTBEATS` of them, exits for its
supervisor to start it again; beat puts back what it held. Waiting out an outage is
not being stuck: time while Redis refuses or does not answer does not count."""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from tasks.broker.holder import was_settled
from tasks.settings import settings

log = logging.getLogger(__name__)
#: Seconds after a run's end by which its message is surely settled (an ack is a
#: few milliseconds; a result write that waits out an outage stops the clock).
SETTLE_GRACE_S = 10.0
#: Exit status of a worker that gave up on itself as stuck (EX_TEMPFAIL): restarted.
EXIT_STUCK = 75
#: Settled marks older than this are forgotten unread (a tag no run of this process ended).
FORGET_SETTLED_S = 600.0
#: Heartbeats a worker reports itself stuck, while Redis takes its writes, before it
#: exits (beat and ``lanes status`` have shown it by then).
STUCK_HEARTBEATS = 3


class Watchdog:
    """Runs that ended here, until their messages are settled; ``stuck`` says why not."""

    def __init__(self, exit_after_s: float | None = None,
                 exit: Callable[[int], Any] = os._exit) -> None:
        self.exit_after_s = exit_after_s
        self._exit = exit
        self._ended: dict[str, tuple[str, float]] = {}  # tag -> (job id, ended at)
        self._lock = threading.Lock()
        self.stuck: str | None = None
        self._since: float | None = None  # stuck while Redis answered, since then
        #: Whether Redis took this worker's last heartbeat write.
        self.takes_writes = True

    def ended(self, tag: str, job_id: str, now: float) -> None:
        """A run of ``job_id`` from message ``tag`` ended at ``now`` (monotonic)."""
        with self._lock:
            self._ended[tag] = (job_id, now)

    def check(self, now: float) -> str | None:
        """Forget the runs whose messages were settled; ``stuck`` (the reason, or None)
        from those left unsettled past :data:`SETTLE_GRACE_S`."""
        with self._lock:
            for tag in [t for t in self._ended if was_settled(t, now - FORGET_SETTLED_S)]:
                del self._ended[tag]
            overdue = [(job_id, now - at) for job_id, at in self._ended.values()
                       if now - at > SETTLE_GRACE_S]
        if not overdue:
            self.stuck, self._since = None, None
        else:
            job_id, late_s = max(overdue, key=lambda item: item[1])
            self.stuck = (f"{len(overdue)} finished run(s) never released their job slot "
                          f"(job {job_id}, ended {late_s:.0f}s ago)")
        return self.stuck

    def answered(self, now: float, took_writes: bool) -> None:
        """Redis took this worker's writes at ``now`` or not: stuck long enough while it
        did, the worker exits."""
        self.takes_writes = took_writes
        if not took_writes:
            self._since = None  # an outage: waiting it out is not being stuck
            return
        if self.stuck is None:
            return
        self._since = now if self._since is None else self._since
        limit_s = (STUCK_HEARTBEATS * settings.heartbeat_s if self.exit_after_s is None
                   else self.exit_after_s)
        if now - self._since >= limit_s:
            log.critical("this worker is stuck (%s) for %.0fs while Redis answers: it exits "
                         "(status %d) for its supervisor to start it again", self.stuck,
                         now - self._since, EXIT_STUCK)
            logging.shutdown()
            self._exit(EXIT_STUCK)

    def stats(self) -> dict[str, Any]:
        """The heartbeat's part: ``stuck`` (the reason, or None)."""
        return {"stuck": self.stuck}


#: The one watchdog of this worker process.
WATCHDOG = Watchdog()

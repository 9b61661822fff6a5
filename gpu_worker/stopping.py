"""A worker told to stop while Redis is away stops within a bound.

A warm shutdown lets each run finish and then settles its messages in Redis. With
Redis away, a run's next write would wait the outage out (``tasks.broker.outage``):
once the worker is told to stop, writes no longer wait (the run gives up at its next
step, its job back in its lane or left to recovery), and once no run is left, a
worker whose Redis does not answer exits at once rather than meet a Redis timeout
in each step of Celery's own shutdown. What it held stays recorded in Redis as
held by a process that is gone: beat puts it back in its lanes, nothing is lost.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable

import redis
from celery import signals
from celery.utils.dispatch import Signal

from gpu_worker.hook import Hook
from tasks.broker.outage import stop_waiting, stopped_by_outage

log = logging.getLogger(__name__)
#: How long a stopping worker waits for Redis to answer a PING before leaving.
PING_TIMEOUT_S = 0.5


class BoundedStop(Hook):
    """On ``worker_shutting_down``: writes stop waiting out outages; once no run is in
    flight, exit at once if Redis is away (``running``: the runs in flight)."""

    def __init__(self, running: Callable[[], int], exit: Callable[[int], Any] = os._exit
                 ) -> None:
        self.running, self._exit = running, exit

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.worker_shutting_down: self.on_shutting_down}

    def on_shutting_down(self, **_: Any) -> None:
        stop_waiting()  # in the signal handler: the rest in a thread of its own
        threading.Thread(target=self.watch, name="gpulanes-stop", daemon=True).start()

    def watch(self) -> None:
        while self.running():
            time.sleep(0.05)
        if stopped_by_outage() or not redis_answers():
            log.warning("stopping with Redis away: leaving now; beat puts back what this "
                        "worker held once it sees it gone")
            logging.shutdown()
            self._exit(0)


def redis_answers() -> bool:
    """Whether the broker's Redis answers a PING within :data:`PING_TIMEOUT_S`."""
    from tasks.broker.store import broker_client

    try:
        return bool(broker_client(socket_timeout=PING_TIMEOUT_S,
                                  socket_connect_timeout=PING_TIMEOUT_S).ping())
    except (redis.RedisError, OSError):
        return False

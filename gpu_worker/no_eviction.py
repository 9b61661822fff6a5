"""A worker refuses to start on a Redis that may evict keys (``tasks.broker.eviction``)."""
from __future__ import annotations

import logging
from typing import Any, Callable

from celery import signals
from celery.utils.dispatch import Signal

from gpu_worker.hook import Hook
from gpu_worker.launcher import EXIT_CONFIG  # the supervisor stops restarting on it
from tasks.broker.eviction import check_when_answered
from tasks.errors import ConfigError

log = logging.getLogger(__name__)


class NoEviction(Hook):
    """Check Redis' ``maxmemory-policy`` in ``worker_init``, before the models load and
    before the consumer starts: a worker that refuses never takes a job."""

    def handlers(self) -> dict[Signal, Callable[..., Any]]:
        return {signals.worker_init: self.on_worker_init}

    def on_worker_init(self, **_: Any) -> None:
        from tasks.broker.app import redis_client

        try:
            check_when_answered(redis_client)
        except ConfigError as exc:
            # Celery swallows exceptions from signal handlers: leave for real.
            log.error("this worker will not start: %s: %s", type(exc).__name__, exc)
            raise SystemExit(EXIT_CONFIG) from exc

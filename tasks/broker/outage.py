"""What a Redis outage looks like to a caller, whichever client met it, and how a
write that must not be lost waits one out."""
from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

import redis
from kombu.exceptions import LimitExceeded, OperationalError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Redis did not answer (timeout), the connection broke, Redis is loading its
#: data or is a read-only replica after a failover, or every pooled connection
#: is stuck on it: the call may be tried again later. Errors in a command itself
#: (a bad script) are not among them.
OUTAGE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError, OperationalError, LimitExceeded, OSError,
)
#: Longest wait between two tries of a write while Redis does not answer.
PERSIST_BACKOFF_MAX_S = 2.0


def persist(write: Callable[[], T], what: str) -> T:
    """``write()``, tried again until Redis answers (an outcome is never dropped);
    ``what`` names it in the log."""
    delay_s, warned = 0.05, False
    while True:
        try:
            return write()
        except OUTAGE as exc:
            if not warned:
                log.warning("cannot record %s yet (%s: %s); trying until Redis answers",
                            what, type(exc).__name__, exc)
                warned = True
            time.sleep(delay_s)
            delay_s = min(PERSIST_BACKOFF_MAX_S, delay_s * 2)

"""What a Redis outage looks like to a caller, whichever client met it."""
from __future__ import annotations

import redis
from kombu.exceptions import OperationalError

#: Redis did not answer (timeout), the connection broke, Redis is loading its
#: data or is a read-only replica after a failover: the call may be tried again
#: later. Errors in a command itself (a bad script) are not among them.
OUTAGE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError, OperationalError, OSError,
)

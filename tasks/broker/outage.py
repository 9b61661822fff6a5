"""What a Redis outage looks like to a caller, whichever client met it, and how a
write that must not be lost waits one out.

Redis can answer and still refuse: out of memory (``maxmemory`` with
``noeviction``), its disk failing (MISCONF), a replica demoted by a failover
(READONLY), loading its data (LOADING), busy with a script (BUSY), too few
replicas (NOREPLICAS, MASTERDOWN). Every client gpulanes makes parses such a reply
as :class:`RedisRefused`, a ``ConnectionError``: redis-py, kombu and Celery then
treat it as they treat a lost connection (retried, waited out), never as a bug in
the command. READONLY stays redis-py's ``ReadOnlyError`` (among :data:`OUTAGE`): on
it a Sentinel-managed connection drops itself and asks the Sentinels again. A refused command, script or MULTI transaction wrote nothing (a script's
first write is the one refused); in a pipeline without MULTI, the commands Redis does
not refuse (under OOM: those that free memory) may still have run.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Callable, TypeVar

import redis
from kombu.exceptions import LimitExceeded, OperationalError
from redis._parsers import _RESP2Parser, _RESP3Parser

from tasks.errors import WorkerStopping
from tasks.settings import settings

log = logging.getLogger(__name__)
T = TypeVar("T")

#: What each refusal means, by the code Redis starts its reply with.
REFUSALS: dict[str, str] = {
    "OOM": "is out of memory (maxmemory reached)",
    "MISCONF": "cannot write to its disk (MISCONF)",
    "READONLY": "is a read-only replica (a failover demoted it)",
    "LOADING": "is loading its data",
    "BUSY": "is busy running a script",
    "NOREPLICAS": "has too few replicas to take writes",
    "MASTERDOWN": "lost its link to its primary",
}
#: A refusal's code, at the start of a reply or inside the error of a script that met
#: it (Redis 6 wraps it: ``ERR Error running script (...): @user_script:9: ... -OOM ...``).
_REFUSAL_CODE = re.compile(r"(?:^|: -)(%s) " % "|".join(REFUSALS))


class RedisRefused(redis.exceptions.ConnectionError):
    """Redis answered, but refused the command (``code``: OOM, MISCONF, READONLY,
    LOADING, BUSY, NOREPLICAS, MASTERDOWN); the command did not run."""

    def __init__(self, reply: str, code: str) -> None:
        super().__init__(reply)
        self.code = code
        #: What Redis said, from its code on (a script's wrapping left out).
        self.said = reply[reply.find(code):]

    @property
    def reason(self) -> str:
        """What Redis said, in words: ``out of memory (maxmemory reached)``..."""
        return REFUSALS[self.code]


def refusal_code(reply: str) -> str | None:
    """The refusal code of an error reply, or None for any other error."""
    found = _REFUSAL_CODE.search(reply or "")
    return found.group(1) if found else None


class _Refusals:
    """redis-py's parser, raising :class:`RedisRefused` for a refusal."""

    @classmethod
    def parse_error(cls, response: str) -> redis.exceptions.RedisError:
        code = refusal_code(response)
        if code == "READONLY":  # redis-py's own class, a script's refusal included: on
            # it a Sentinel-managed connection drops itself and asks for the new primary
            return redis.exceptions.ReadOnlyError(response)
        if code is not None:
            return RedisRefused(response, code)
        return super().parse_error(response)  # type: ignore[misc]


class _RESP2Refusals(_Refusals, _RESP2Parser):
    pass


class _RESP3Refusals(_Refusals, _RESP3Parser):
    pass


def refusal_parser(protocol: int | str | None = None) -> type:
    """The parser class for a connection of ``protocol`` (redis-py's default: 3) that
    raises :class:`RedisRefused` for a refusal."""
    return _RESP2Refusals if str(protocol) == "2" else _RESP3Refusals


#: Redis did not answer (timeout), the connection broke, it refused the command
#: (:class:`RedisRefused`, a ``ConnectionError``), or every pooled connection is
#: stuck on it: the call may be tried again later. Errors in a command itself (a bad
#: script) are not among them.
OUTAGE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError, OperationalError, LimitExceeded, OSError,
)
#: Longest wait between two tries of a write while Redis does not answer.
PERSIST_BACKOFF_MAX_S = 2.0


def refused(exc: BaseException) -> RedisRefused | None:
    """The refusal behind ``exc`` (itself, or what it was raised from), if any."""
    while exc is not None:
        if isinstance(exc, RedisRefused):
            return exc
        if isinstance(exc, redis.exceptions.ReadOnlyError):
            return RedisRefused(f"READONLY {exc}", "READONLY")
        exc = exc.__cause__ or exc.__context__
    return None


def watched(client: redis.Redis, func: Callable[[Any], T], *keys: str) -> T:
    """``func(pipe)``'s value, run as redis-py's ``client.transaction`` runs it (again
    while a watched key changes), except that an outage met while watching raises:
    redis-py would try again at once, a busy loop for as long as Redis refuses."""
    with client.pipeline(True) as pipe:
        while True:
            try:
                pipe.watch(*keys)
                value = func(pipe)
                pipe.execute()
                return value
            except redis.exceptions.WatchError as exc:
                if isinstance(exc.__context__, OUTAGE):  # not a change: the connection
                    raise exc.__context__ from None
                continue


#: Set once this process stops (a worker's warm shutdown): an outage is no longer
#: waited out, so the process stops within a Redis timeout or two.
_stopping = threading.Event()
#: Set when a write gave up on an outage because the process is stopping.
_gave_up = threading.Event()


#: Called once as the process starts stopping (:func:`when_stopping`).
_wakers: list[Callable[[], Any]] = []


def stop_waiting() -> None:
    """This process is stopping: :func:`persist` raises :class:`WorkerStopping` at its
    next outage instead of waiting it out, and what waits for work is woken
    (:func:`when_stopping`)."""
    _stopping.set()
    for wake in list(_wakers):
        wake()


def when_stopping(wake: Callable[[], Any]) -> None:
    """Call ``wake`` as this process starts stopping (e.g. a consumer's wait for work,
    so that it ends at once)."""
    _wakers.append(wake)


def stopping() -> bool:
    """Whether this process is stopping (:func:`stop_waiting`)."""
    return _stopping.is_set()


def _stop_grace_s() -> float:
    """How long a stopping process still waits for Redis to take a write: a blip of
    refusals does not throw a finished run's outcome away, a frozen Redis is given up
    on after one timeout."""
    return settings.redis_timeout_s


def stopped_by_outage() -> bool:
    """Whether a write of this stopping process gave up on an outage."""
    return _gave_up.is_set()


def persist(write: Callable[[], T], what: str) -> T:
    """``write()``, tried again until Redis answers and takes it (an outcome is never
    dropped); ``what`` names it in the log. In a process that is stopping, an outage
    that lasts ``GPULANES_REDIS_TIMEOUT_S`` raises :class:`WorkerStopping` instead: what
    the write was about stays in Redis' records for the cluster's recovery."""
    delay_s, warned, failing_since = 0.05, False, None
    while True:
        tried_at = time.monotonic()  # a timeout's wait counts as outage
        try:
            return write()
        except OUTAGE as exc:
            failing_since = failing_since or tried_at
            if _stopping.is_set() and time.monotonic() - failing_since >= _stop_grace_s():
                _gave_up.set()
                raise WorkerStopping(f"cannot record {what} ({type(exc).__name__}: {exc}) "
                                     "and this worker is stopping") from exc
            if not warned:
                log.warning("cannot record %s yet (%s: %s); trying until Redis takes it",
                            what, type(exc).__name__, exc)
                warned = True
            time.sleep(delay_s)
            delay_s = min(PERSIST_BACKOFF_MAX_S, delay_s * 2)

"""Every error gpulanes raises, under one base class.

This module is a leaf (stdlib only) so that every layer, including
``celeryconfig`` and the GPU worker, can raise from the same tree.
"""
from __future__ import annotations


class GpulanesError(Exception):
    """Base class of every gpulanes error."""


class ConfigError(GpulanesError, ValueError):
    """A ``GPULANES_*`` setting is missing or malformed."""

    def __init__(self, variable: str, message: str) -> None:
        self.variable = variable
        super().__init__(f"{variable}: {message}")


class InvalidJob(GpulanesError, ValueError):
    """A job was refused before anything was enqueued; ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")

    def __reduce__(self):  # keep (field, message) through pickling/copying
        return (type(self), (self.field, str(self).split(": ", 1)[1]))


class BrokerUnavailable(GpulanesError, ConnectionError):
    """Redis did not answer within ``GPULANES_REDIS_TIMEOUT_S``; nothing was enqueued.

    Nothing of the call is left behind (no job, no cache claim, no fast place):
    submitting again later is safe.
    """


class BrokerRefused(BrokerUnavailable):
    """Redis answered but refused the write (out of memory, its disk failing, a
    read-only replica...: ``code`` is what it said), or is too near its ``maxmemory``
    to take new jobs; nothing was enqueued. Submitting again once it recovers is safe.
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self):
        return (type(self), (str(self), self.code))


class LaneFull(GpulanesError):
    """Every lane that could take the job is at its maximum depth; try again later."""

    def __init__(self, lane: str, retry_after_s: float) -> None:
        self.lane, self.retry_after_s = lane, retry_after_s
        super().__init__(f"the {lane} lane is full; retry after about {retry_after_s:.0f}s")

    def __reduce__(self):
        return (type(self), (self.lane, self.retry_after_s))


class OverLimit(GpulanesError):
    """A limit of the account's plan refused the job (``limit`` names it: ``queued_jobs``);
    nothing was enqueued. Submit again after ``retry_after_s``."""

    def __init__(self, limit: str, retry_after_s: float, message: str = "") -> None:
        self.limit, self.retry_after_s = limit, retry_after_s
        super().__init__(message or f"the account's plan allows no more jobs now ({limit}); "
                         f"submit again in {retry_after_s:g} s")

    def __reduce__(self):
        return (type(self), (self.limit, self.retry_after_s, str(self)))


class FastTimeSpent(GpulanesError):
    """The account's fast time is spent and its plan has no relaxed lane to run the job
    in; nothing was enqueued. Its fast time is renewed at ``renews_at`` (unix s)."""

    def __init__(self, renews_at: float, message: str = "") -> None:
        self.renews_at = renews_at
        super().__init__(message or "the account's fast time for this period is spent and "
                         "its plan does not include the relaxed lane; it is renewed at "
                         f"{renews_at:.0f} (unix s)")

    def __reduce__(self):
        return (type(self), (self.renews_at, str(self)))


class ModelError(GpulanesError):
    """A model could not be found, built or loaded."""


class ShardError(ModelError):
    """A checkpoint shard is missing, corrupt or does not match its manifest."""


class TransientJobError(GpulanesError):
    """A failure worth retrying: out of memory, a lost connection, a lost worker.

    ``retry_after_s``: the retry waits at least this long (a model that knows when
    its trouble clears, say a throttled store, can say so); otherwise the backoff.
    """

    def __init__(self, message: str = "", retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self):
        return (type(self), (str(self), self.retry_after_s))


class WorkerFault(GpulanesError):
    """A failure of this worker, not of the job (disk, device, local files): the job
    runs again on another worker, and a worker whose jobs keep failing so steps aside."""


class ArtifactError(WorkerFault):
    """A job's output could not be written where this worker keeps artifacts."""


class LeaseLost(GpulanesError):
    """This run no longer holds its job: a newer run took it over while this one was
    frozen or cut off. The run stops and writes nothing (never reaches a caller)."""


class WorkerStopping(GpulanesError):
    """This worker is stopping while Redis is away: the run gives up, writing nothing,
    and its job goes back to its lane (or to the cluster's recovery, which puts a gone
    worker's jobs back)."""


class JobRevoked(GpulanesError):
    """The job was revoked before or while it ran: it stops, charged only the fast
    seconds it ran."""


class JobTimeout(GpulanesError):
    """A job ran past ``GPULANES_MAX_JOB_S``."""


class OutputError(GpulanesError):
    """A model returned what a result cannot carry (not a dict, not JSON): the job
    fails with that reason; the worker goes on serving."""


class JobFailed(GpulanesError):
    """A job failed for good; the message says why and after how many attempts."""

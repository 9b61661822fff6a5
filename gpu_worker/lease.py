"""One run's hold on its job: a lease in Redis, fenced by the run's number.

A job's runs are numbered by its run counter (``tasks.broker.keys.attempts_key``),
which each run that starts increments. The run holds the job's lease,
``"<worker incarnation>#<run number>#<take token>"``, for ``settings.lease_ttl_s`` seconds
(three keep-alive periods), and its worker extends it (``gpu_worker.hooks.KeepLeases``).
Every write a run makes about its job (its result, its retry, its dead letter,
its charge) checks in the same Lua call that the run still holds the job: the
lease is its own, or lapsed with no newer run begun (``tasks/broker/lua/holds.lua``).
A run that fails that check is *stale*: a newer run took over while it was
frozen or cut off. It stops and writes nothing (:class:`LeaseLost`).

The worker also knows, without asking Redis, until when its lease surely
holds: an extension sent at ``t`` keeps the lease at least until ``t + ttl``
(Redis counts from when it runs the command, later). Between steps a run
compares the clock with that moment; once it has passed (its process was
frozen, or Redis did not answer) the run asks Redis before its next step, and
stops if a newer run holds the job. A newer run starts only after the lease
lapsed, so two runs of one job never compute past one step together.
"""
from __future__ import annotations

import threading
import time
from functools import lru_cache

import redis

from tasks.broker import scripts
from tasks.broker.keys import attempts_key, lease_key
from tasks.broker.outage import persist, stopping
from tasks.broker.store import broker_client
from tasks.errors import LeaseLost
from tasks.settings import settings


@lru_cache(maxsize=1)
def _client() -> redis.Redis:
    return broker_client()


class Lease:
    """Run number ``attempt`` of ``job_id``, held by this worker process as ``token``;
    taken by a call sent at ``sent_at`` (monotonic)."""

    def __init__(self, job_id: str, attempt: int, token: str, sent_at: float) -> None:
        self.job_id, self.attempt, self.token = job_id, attempt, token
        self.keys = (lease_key(job_id), attempts_key(job_id))
        self._valid_until = sent_at + settings.lease_ttl_s  # monotonic
        self._hung_at = sent_at + settings.run_hung_s
        self._lost = False
        self.abandoned = False
        self._lock = threading.Lock()

    def renewed(self, sent_at: float, held: bool) -> None:
        """An extension sent at ``sent_at`` (monotonic) found the job ``held`` or not."""
        with self._lock:
            if not held:
                self._lost = True
            elif not self._lost:
                self._valid_until = max(self._valid_until, sent_at + settings.lease_ttl_s)

    def overdue(self) -> bool:
        """Whether the run has held its job longer than any run may (``settings.run_hung_s``)."""
        return time.monotonic() > self._hung_at

    def abandon(self) -> None:
        """Stop extending the lease (the run is given up as hung): lost at its next step."""
        with self._lock:
            self.abandoned = self._lost = True

    def check(self) -> None:
        """Between steps: return if the run still holds its job, else raise :class:`LeaseLost`.

        Free while the lease surely holds; past that, one round trip to Redis,
        waited out for as long as Redis does not answer (nothing else can take
        the job meanwhile but a newer run, which the answer then reveals). In a worker
        that is stopping, as soon as an extension is late (a keep-alive period): an
        outage then ends the run (``tasks.broker.outage.persist``), not the wait.
        """
        early_s = settings.lease_ttl_s - settings.keepalive_s if stopping() else 0.0
        with self._lock:
            if not self._lost and time.monotonic() < self._valid_until - early_s:
                return
        if not self._lost:  # nothing else can take the job meanwhile but a newer run
            persist(lambda: renew([self]), f"the lease of job {self.job_id}")
        if self._lost:
            raise LeaseLost(f"run {self.attempt} of job {self.job_id} was taken over by a "
                            "newer run: it stops here and writes nothing")


def renew(leases: list[Lease]) -> list[int]:
    """Extend every lease still held, in one round trip; 1 or 0 per lease (each lease is
    told)."""
    sent_at = time.monotonic()
    keys = [key for lease in leases for key in lease.keys]
    args = [settings.lease_ttl_s,
            *(value for lease in leases for value in (lease.token, lease.attempt))]
    held = scripts.run(_client(), "lease_renew", keys, args)
    for lease, ok in zip(leases, held):
        lease.renewed(sent_at, bool(ok))
    return held

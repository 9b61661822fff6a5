"""This beat's leadership: a lease in Redis renewed from its own thread.

Any number of beats run (``celery -A tasks beat``, each its own process); the one
holding the lease leads and runs the rounds, the others stand by and take over
within ``beat_lease_s`` (two heartbeats) of the leader's last renewal (killed, paused,
cut off). The lease is renewed four times per lease from a thread of its own, never
from the schedule's tick, so a long round does not lose it. What a leader writes is
fenced by its epoch (``tasks.broker.leader``): a leader that was paused past its
lease and wakes up changes nothing.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

import redis

from tasks.broker import leader
from tasks.broker.app import redis_client
from tasks.settings import settings

log = logging.getLogger(__name__)


class Leadership:
    """Whether this beat leads (``epoch``: its fencing token; 0 while standing by)."""

    def __init__(self, client: redis.Redis | None = None, lease_s: float | None = None,
                 clock=time.monotonic) -> None:
        self.identity = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self.client, self.clock = client, clock
        self.lease_s = settings.beat_lease_s if lease_s is None else lease_s
        self.epoch, self._renewed_at, self._answered = 0, 0.0, True
        self.highest = 0  # the highest epoch this beat has seen: a new lead goes above it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def renew(self) -> int:
        """Take or keep the lead once; the epoch led (0: another beat leads)."""
        started = self.clock()
        try:
            epoch, seen = leader.lead(self.client or redis_client(), self.identity,
                                      self.lease_s, self.highest)
        except redis.RedisError as exc:  # unreachable: lead no longer once the lease lapsed
            self._answered = False
            if self.epoch and self.clock() - self._renewed_at >= self.lease_s:
                log.warning("beat %s cannot renew its lease (%s): standing by",
                            self.identity, exc)
                self.epoch = 0
            return self.epoch
        if epoch != self.epoch or not self._renewed_at:  # a change, or the first answer
            log.warning("beat %s %s", self.identity,
                        f"leads (epoch {epoch})" if epoch else "stands by: another beat leads")
        self.epoch, self._renewed_at, self._answered = epoch, started, True
        self.highest = max(self.highest, seen)
        return epoch

    def current(self) -> int:
        """The epoch to run a round under: 0 unless the lead was renewed within the
        lease (a renewal thread that stalled never leaves this beat leading)."""
        if self.epoch and self.clock() - self._renewed_at < self.lease_s:
            return self.epoch
        return 0

    def _loop(self) -> None:
        while not self._stop.wait(self.lease_s / 4 if self._answered else self.lease_s / 20):
            try:
                self.renew()  # after an outage, tried again soon: a failover's new primary
            except Exception:  # noqa: BLE001  a bad answer must not end the renewals
                self._answered = False
                log.exception("beat %s: renewing its lease failed", self.identity)

    def start(self) -> None:
        """Try to lead now, then keep renewing (or trying) from a daemon thread."""
        if self._thread is None:
            self.renew()
            self._thread = threading.Thread(target=self._loop, name="gpulanes-beat-lease",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop renewing and give the lead up, so that a standby leads at once."""
        self._stop.set()
        if self.epoch:
            try:
                leader.step_down(self.client or redis_client(), self.identity)
            except redis.RedisError:
                pass  # it lapses by itself
        self.epoch = 0

"""Which workers are idle and which serve no more, kept up to date a worker at a time
from the records that changed (``beat.record.Record.changed``): a round costs what
changed, not the number of workers."""
from __future__ import annotations

from typing import Iterable, Mapping

from routing.balance import idle
from routing.placement import serving


class Standing:
    """The idle workers (``idle``: ``routing.balance.idle``) and those that serve no
    more, dead or sick (``unserved``)."""

    def __init__(self) -> None:
        self.idle: set[str] = set()
        self.unserved: set[str] = set()

    def update(self, workers: Mapping[str, Mapping], hosts: Iterable[str] | None) -> None:
        """Take the records of ``hosts`` as they are now (None: every worker, afresh)."""
        if hosts is None:
            self.idle, self.unserved, hosts = set(), set(), workers
        for host in hosts:
            worker = workers.get(host)
            _put(self.idle, host, worker is not None and bool(idle({host: worker})))
            _put(self.unserved, host, worker is not None and not serving(worker))


def _put(found: set[str], host: str, belongs: bool) -> None:
    if belongs:
        found.add(host)
    else:
        found.discard(host)

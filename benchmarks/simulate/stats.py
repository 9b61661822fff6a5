"""The workers' pushed stats as Redis keeps them (``tasks.broker.stats``), and beat's
read of a round.

Each push is stamped; stats the same as the last are only stamped (``lua/stats_push.
lua``), others are stored with when they changed and the push before (``quiet_since``).
A round reads the stats changed since the round before, those of the workers beat
counts silent that pushed again within the window, and the workers whose last push
fell out of the window since (``lua/stats_read.lua``): what changed, not the number of
workers.
"""
from __future__ import annotations

from typing import Iterable

from tasks.broker.stats import Round


class Pushed:
    """Every worker's last stats (``stats``: with ``at``, when they changed, and
    ``quiet_since``), its last push (``stamps``), the workers whose stats changed since
    the last read (``news``: True where only their busy time moved), and those that
    skipped a push (``stopped``: a dead worker pushes nothing)."""

    def __init__(self) -> None:
        self.stats: dict[str, dict] = {}
        self.stamps: dict[str, float] = {}
        self.news: dict[str, bool] = {}
        self.stopped: set[str] = set()
        #: Of the workers the last read heard, those whose busy time alone moved.
        self.busy_only: set[str] = set()

    def push(self, host: str, stats: dict | None, busy_only: bool, now: float) -> None:
        """``host`` pushed at ``now``: ``stats`` when they changed (None: only stamped;
        ``busy_only``: only their busy time changed, and ``stats`` holds only that)."""
        before = self.stamps.get(host)
        self.stamps[host] = now
        self.stopped.discard(host)
        if stats is not None:
            self.stats[host] = {**(self.stats[host] if busy_only else {}), **stats,
                                "at": now, "quiet_since": before or 0.0}
            self.news[host] = busy_only and self.news.get(host, True)

    def skipped(self, host: str) -> None:
        """``host`` did not push (it is dead): its stamp ages."""
        if host in self.stamps:
            self.stopped.add(host)

    def read_round(self, now: float, fresh_s: float, last_cutoff: float, forget_s: float,
                   asked: Iterable[str]) -> Round:
        """``tasks.broker.stats.read_round`` at ``now``: the stats changed since the last
        read and those of the workers ``asked`` about (silent so far) that pushed within
        ``fresh_s``, the workers whose last push fell out of the window since
        ``last_cutoff``; stats silent for ``forget_s`` are dropped."""
        cutoff, silent = now - fresh_s, []
        for host in sorted(self.stopped):  # only a worker that skipped a push falls silent
            at = self.stamps[host]
            if at < now - forget_s:
                del self.stamps[host]
                self.stats.pop(host, None)
                self.stopped.discard(host)
            elif last_cutoff <= at < cutoff:
                silent.append(host)
        heard = {host: self.stats[host] for host in self.news}
        self.busy_only = {host for host, only in self.news.items() if only}
        for host in asked:
            if self.stamps.get(host, -1.0) >= cutoff and host in self.stats:
                heard[host] = self.stats[host]
        self.news = {}
        return Round(now, "", heard, silent, cutoff)

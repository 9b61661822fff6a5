"""The worker record beat keeps in memory while it leads, brought up to date each round
from what changed, and written back the same way.

A leader whose own mark is on the stored record (``WORKERS_BY_KEY``: it wrote it last,
the round before) folds in only the stats changed since its last round, the workers that
fell silent since (found by the score of their last push) and those still silent
(``tasks.broker.stats.read_round``), and writes back the workers whose record changed.
Any other (it has just taken the lead, another beat or a restore wrote the record since,
its last round failed or was long ago) reads the record and every worker's stats whole,
once (``merge``), and writes the record whole: a standby that takes over works from
Redis, never from what it held before.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import redis

from beat.tally import Tally
from tasks.broker.keys import WORKERS_KEY
from tasks.broker.stats import read_all, read_round

#: A worker silent this long is dropped from the record altogether.
FORGET_AFTER_S = 600.0
#: Weight of the newest round in a worker's busy slots (``busy_slots``): a lane's
#: share of the pool moves the wait estimates of the lanes below it, and a round's
#: share alone swings with the few jobs a worker finishes in it.
BUSY_ALPHA = 0.3
#: This process, in the marks it leaves on the record it writes.
PROCESS = uuid.uuid4().hex[:12]


def merge(previous: dict[str, dict], replies: dict[str, dict], now: float,
          misses_allowed: int, count_misses: bool = True) -> dict[str, dict]:
    """Fold this round's replies into the record: pure, so tests drive it directly.
    ``count_misses`` False: the first round after a gap, where silence is no miss."""
    record: dict[str, dict] = {}
    for host, old in previous.items():
        if host not in replies and now - old["last_seen"] < FORGET_AFTER_S:
            record[host] = missed(old, misses_allowed, count_misses)
    for host, stats in replies.items():
        record[host] = heard(previous.get(host), stats, now)
    return record


def heard(old: Mapping[str, Any] | None, stats: Mapping[str, Any], now: float) -> dict:
    """A worker's record after a round that heard ``stats`` from it."""
    return {**stats, "last_seen": now, "missed": 0, "alive": True,
            "busy": busy_slots(old, stats)}


def missed(old: Mapping[str, Any], misses_allowed: int, count_misses: bool) -> dict:
    """A worker's record after a round that did not hear from it."""
    misses = old.get("missed", 0) + (1 if count_misses else 0)
    return {**old, "missed": misses, "alive": misses < misses_allowed and not old.get("unheard")}


def busy_slots(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, float]:
    """The job slots of a worker each lane's jobs hold on average: the growth of their
    time in flight (``busy_s``, ``gpu_worker.runtime.Runtime.busy_until``) since its last
    reply ``old`` over the time between (from ``quiet_since`` when later: the stats were
    the same until then), averaged with the rounds before. A first reply, or a
    restarted worker's, has measured nothing yet."""
    if not old or old.get("incarnation") != new.get("incarnation"):
        return {}
    before = old.get("busy") or {}
    span_s = (new.get("at") or 0.0) - max(old.get("at") or 0.0, new.get("quiet_since") or 0.0)
    if span_s <= 0:
        return dict(before)
    then, busy = old.get("busy_s") or {}, {}
    for lane, busy_s in (new.get("busy_s") or {}).items():
        share = max(0.0, (busy_s - then.get(lane, 0.0)) / span_s)
        last = before.get(lane)
        busy[lane] = round(share if last is None else last + BUSY_ALPHA * (share - last), 3)
    return busy


def _idle_round(busy: Mapping[str, float]) -> dict[str, float]:
    """Busy slots after a round a worker spent as before: no time in flight."""
    return {lane: round(last * (1 - BUSY_ALPHA), 3) for lane, last in busy.items()}


@dataclass
class Record:
    """The worker record (``workers``) and what a round needs to bring it up to date: the
    mark it bears in Redis ("": none, read it whole), Redis' time of the last read and
    the freshness cutoff then, the workers not heard (``silent``), those heard whose
    busy slots still wane (``waning``), the workers whose record changed this round
    (``changed``; None: write it whole), and the figures added up over them
    (``tally``)."""

    workers: dict[str, dict] = field(default_factory=dict)
    mark: str = ""
    since: float = 0.0
    cutoff: float = 0.0
    silent: set[str] = field(default_factory=set)
    waning: set[str] = field(default_factory=set)
    changed: set[str] | None = None
    tally: Tally = field(default_factory=Tally)

    def round(self, client: redis.Redis, now: float, fresh_s: float, misses_allowed: int,
              steady: bool) -> dict[str, dict]:
        """This round's record: brought up to date from what changed when this beat's
        mark is on the stored one and ``steady`` (its last round was the one before),
        else read whole (``steady`` False: silence counts no miss)."""
        mark, self.mark = self.mark, ""  # until this round is written
        if steady and mark:
            found = read_round(client, self.since, fresh_s, self.cutoff, FORGET_AFTER_S,
                               sorted(self.silent))
            if found.writer == mark:
                self._fold(found, now, misses_allowed)
                return self.workers
        return self._load(client, now, fresh_s, misses_allowed, steady)

    def _load(self, client: redis.Redis, now: float, fresh_s: float, misses_allowed: int,
              steady: bool) -> dict[str, dict]:
        previous = {_text(h): json.loads(v) for h, v in client.hgetall(WORKERS_KEY).items()}
        found = read_all(client, fresh_s, FORGET_AFTER_S)
        self.workers = merge(previous, found.heard, now, misses_allowed, steady)
        self.since, self.cutoff, self.changed = found.now, found.cutoff, None
        self.silent = set(self.workers) - set(found.heard)
        self.waning = {host for host in found.heard if any(self.workers[host]["busy"].values())}
        return self.workers

    def _fold(self, found: Any, now: float, misses_allowed: int) -> None:
        workers, self.changed = self.workers, set(found.heard)
        for host, stats in found.heard.items():
            workers[host] = heard(workers.get(host), stats, now)
            self.silent.discard(host)
            if any(workers[host]["busy"].values()):
                self.waning.add(host)
        self.silent.update(h for h in found.silent if h in workers and h not in found.heard)
        for host in sorted(self.silent):
            old = workers.get(host)
            if old is not None and now - old["last_seen"] < FORGET_AFTER_S:
                workers[host] = missed(old, misses_allowed, True)
            else:
                workers.pop(host, None)
                self.silent.discard(host)
            self.changed.add(host)
        for host in self.waning - self.changed:
            workers[host]["busy"] = _idle_round(workers[host]["busy"])
            self.changed.add(host)
        self.waning = {h for h in self.waning if h in workers and h not in self.silent
                       and any(workers[h]["busy"].values())}
        self.since, self.cutoff = found.now, found.cutoff

    def add(self, records: Mapping[str, dict]) -> None:
        """Records beat made itself this round (workers not heard yet)."""
        self.workers.update(records)
        self.silent.update(records)
        self.mark_changed(records)

    def tallied(self) -> Tally:
        """The figures of this round's record: only the changed workers counted anew."""
        if self.changed is None:
            self.tally = Tally.of(self.workers)
        else:
            self.tally.update(self.workers, self.changed)
        return self.tally

    def mark_changed(self, hosts: Iterable[str]) -> None:
        if self.changed is not None:
            self.changed.update(hosts)

    def written(self, mark: str) -> None:
        """The round was written under ``mark``: the next may start from memory."""
        self.mark = mark

    def new_mark(self, epoch: Any) -> str:
        return f"{PROCESS}/{epoch}/{uuid.uuid4().hex[:8]}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


#: The record of this beat process.
RECORD = Record()

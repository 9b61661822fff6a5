"""The split snapshot (``routing.compact.split``) kept up to date from round to round.

Beat names the hosts whose record changed since its last round, and only theirs are
worked out again: each host's part (its membership, work and load times) is kept, and
its drain code and order rank once a slice carried them; the members doc and its
version are made anew only when a changed host's membership differs (serving or not,
memory budget, warm and loading models, model sizes); the mean load times are exact
running sums per model. The result is the one ``split`` gives for the same snapshot.
"""
from __future__ import annotations

import math
from typing import Any, Collection, Iterable, Mapping, NamedTuple

from routing.compact import (WORK_OVER, compact_of, drain_code, drain_s_of, load_s_of,
                             members_of, packed_work, rank_of, sizes_of, slice_of, warm_of,
                             work_code, work_of)
from routing.placement import serving


class Part(NamedTuple):
    """One host's share of the split."""

    member: tuple | None  # serving: (budget MB, sorted warm models, model sizes), else None
    work: tuple[int, int, int] = (0, 0, 0)  # ``work_of``
    load_s: tuple[tuple[str, float], ...] = ()  # ``load_s_of``


#: The part of a host that serves no jobs, or is gone.
NO_PART = Part(None)
#: 1 in units of the smallest float step: sums of floats so scaled are exact, and their
#: quotient by it is the sum rounded once, as ``math.fsum`` gives it.
EXACT_ONE = 1 << 1074


def exact(value: float) -> int:
    """``value`` in units of the smallest float step."""
    numerator, denominator = value.as_integer_ratio()
    return numerator << (1075 - denominator.bit_length())


def part_of(worker: Mapping[str, Any]) -> Part:
    """``worker``'s share of the split."""
    if not serving(worker):
        return NO_PART
    ordered = warm_of(worker)
    warm = tuple(sorted(ordered))
    sizes = tuple((model, math.ceil(mb)) for model, mb in worker.get("model_mb", {}).items())
    return Part((int(worker.get("memory_mb", 0)), warm, sizes), work_of(worker),
                load_s_of(worker))


def slow_of(worker: Mapping[str, Any]) -> tuple[int, int]:
    """(drain code, order rank) of a serving ``worker``: the figures a slice carries."""
    ordered = warm_of(worker)
    return drain_code(drain_s_of(worker)), rank_of(sorted(ordered), ordered)


class Splitter:
    """``split`` of the snapshots of one worker record, round after round: each host's
    part (``parts``), the serving ones in order (``hosts``, their place in ``index``),
    their work codes (``codes``, the figures of those over a byte in ``over``), their
    slow figures once a slice asked for them (``slow``), the members doc, and the exact
    sum (``exact``) and count of each model's load seconds (``loads``)."""

    def __init__(self) -> None:
        self.reset(None)

    def reset(self, workers: Mapping[str, Any] | None) -> None:
        """Forget every part: the next call works out all of ``workers``."""
        self.workers = workers
        self.parts: dict[str, Part] = {}
        self.hosts: list[str] = []
        self.index: dict[str, int] = {}
        self.codes = bytearray()
        self.over: dict[int, tuple[int, int, int]] = {}
        self.slow: dict[str, tuple[int, int]] = {}
        self.members: dict[str, Any] = {}
        self.loads: dict[str, tuple[int, int]] = {}
        self.cold_s: dict[str, float] | None = None

    def split(self, snapshot: Mapping[str, Any],
              changed: Collection[str] | None = None) -> tuple[dict, dict]:
        """(compact, members) of ``snapshot``, as ``split`` makes them, given the hosts
        whose record ``changed`` since the last call (gone ones included; None: any, or
        another record than the last call's: all are worked out)."""
        workers = snapshot.get("workers", {})
        if changed is None or workers is not self.workers:
            self.reset(workers)
            changed = workers
        moved = self._take(workers, changed)
        if len(self.parts) != len(workers):  # changed behind its back: start over
            return self.split(snapshot)
        if moved or not self.members:
            self._rebuild(workers)
        else:
            for host in changed:
                if (at := self.index.get(host)) is not None:
                    self._place(at, self.parts[host])
        return self._compact(snapshot), self.members

    def _take(self, workers: Mapping[str, Any], hosts: Iterable[str]) -> bool:
        """Take the records of ``hosts`` as they are now; whether the membership moved."""
        moved = False
        for host in hosts:
            old = self.parts.pop(host, NO_PART)
            self.slow.pop(host, None)
            if (worker := workers.get(host)) is not None:
                self.parts[host] = part_of(worker)
            new = self.parts.get(host, NO_PART)
            moved = moved or old.member != new.member
            if old.load_s != new.load_s:
                self._count(old.load_s, -1)
                self._count(new.load_s, 1)
        return moved

    def _count(self, samples: Iterable[tuple[str, float]], sign: int) -> None:
        for model, load_s in samples:
            total, count = self.loads.get(model, (0, 0))
            if count + sign:
                self.loads[model] = (total + sign * exact(load_s), count + sign)
            else:
                del self.loads[model]
            self.cold_s = None

    def _rebuild(self, workers: Mapping[str, Any]) -> None:
        """The members doc and the hosts' places, anew."""
        self.hosts = sorted(host for host, part in self.parts.items() if part.member)
        self.index = {host: at for at, host in enumerate(self.hosts)}
        members = [self.parts[host].member for host in self.hosts]
        self.members = members_of(self.hosts, [member[0] for member in members],
                                  [list(member[1]) for member in members],
                                  sizes_of([workers[host] for host in self.hosts]))
        self.codes, self.over = bytearray(len(self.hosts)), {}
        for at, host in enumerate(self.hosts):
            self._place(at, self.parts[host])

    def _place(self, at: int, part: Part) -> None:
        """The work code of the host at ``at``."""
        self.codes[at] = work_code(*part.work)
        if self.codes[at] == WORK_OVER:
            self.over[at] = part.work
        else:
            self.over.pop(at, None)

    def _compact(self, snapshot: Mapping[str, Any]) -> dict:
        start, stop = slice_of(len(self.hosts), snapshot.get("at", 0))
        slow = [self._slow(host) for host in self.hosts[start:stop]]
        if self.cold_s is None:
            self.cold_s = {model: round(total / EXACT_ONE / count, 3)
                           for model, (total, count) in sorted(self.loads.items())}
        over = [figure for at in sorted(self.over) for figure in self.over[at]]
        return compact_of(snapshot, self.members["version"], packed_work(self.codes, over),
                          start, [drain for drain, _ in slow], [rank for _, rank in slow],
                          dict(self.cold_s))

    def _slow(self, host: str) -> tuple[int, int]:
        if host not in self.slow:
            self.slow[host] = slow_of(self.workers[host])
        return self.slow[host]

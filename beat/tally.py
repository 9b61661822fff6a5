"""What beat adds up over the workers each round, per pool, kept up to date a worker at
a time: the serving workers' figures per lane (``beat.snapshot.Sums``), the models the
living ones hold or load and the members' load times (``beat.scaling``). A round adds
in only the workers whose record changed (``beat.record.Record.changed``): it costs
what changed, not the number of workers."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple

from beat.snapshot import Sums, lane_sums
from routing.placement import serving

#: The pool of a worker that names none.
DEFAULT_POOL = "default"


class Part(NamedTuple):
    """One worker's share of its pool's figures."""

    pool: str
    sums: Sums | None  # serving: its figures per lane
    alive: bool
    models: tuple[str, ...]  # alive: the models it holds or loads
    load_s: float | None  # the seconds its models took to load, as it measured them


def part_of(worker: Mapping[str, Any]) -> Part:
    load_ms = worker.get("load_ms")
    return Part(worker.get("pool") or DEFAULT_POOL,
                lane_sums([worker]) if serving(worker) else None, bool(worker.get("alive")),
                tuple({*worker.get("warm_models", ()), *worker.get("loading_models", ())})
                if worker.get("alive") else (),
                sum(load_ms.values()) / 1000 if load_ms else None)


@dataclass
class Pool:
    """A pool's members (how many), serving (``live``) and living ones, the serving
    ones' figures, and how many living members hold or load each model, and how many
    members took each load time."""

    members: int = 0
    live: int = 0
    alive: int = 0
    sums: Sums = field(default_factory=Sums)
    models: Counter = field(default_factory=Counter)
    load_s: Counter = field(default_factory=Counter)


class Tally:
    """Every pool's figures, and each worker's part in them."""

    def __init__(self) -> None:
        self.pools: dict[str, Pool] = {}
        self.parts: dict[str, Part] = {}

    @classmethod
    def of(cls, workers: Mapping[str, Mapping[str, Any]]) -> Tally:
        tally = cls()
        tally.update(workers, workers)
        return tally

    def update(self, workers: Mapping[str, Mapping[str, Any]], hosts: Iterable[str]) -> None:
        """Take the records of ``hosts`` (gone from ``workers``: dropped) as they are now."""
        for host in hosts:
            self._count(self.parts.pop(host, None), -1)
            if (worker := workers.get(host)) is not None:
                self.parts[host] = part_of(worker)
                self._count(self.parts[host], 1)

    def serving(self) -> Sums:
        """The figures of every serving worker."""
        total = Sums()
        for pool in self.pools.values():
            total.add(pool.sums)
        return total

    def _count(self, part: Part | None, sign: int) -> None:
        if part is None:
            return
        pool = self.pools.setdefault(part.pool, Pool())
        pool.members += sign
        pool.alive += sign * part.alive
        if part.sums is not None:
            pool.live += sign
            pool.sums.add(part.sums, sign)
        _add(pool.models, part.models, sign)
        _add(pool.load_s, () if part.load_s is None else (part.load_s,), sign)
        if not pool.members:
            del self.pools[part.pool]


def _add(counts: Counter, keys: Iterable[Any], sign: int) -> None:
    for key in keys:
        counts[key] += sign
        if not counts[key]:
            del counts[key]

"""Per-worker mappings computed on access, so that a routing view is O(1) to make.

A view of 1,000 workers used to copy a dict per worker for every job (loads with this
process's sends and the drain since the snapshot, warm models after its sends). These
mappings share the snapshot's arrays (indexed by ``members["hosts"]``) and the small
overlays of this process's own sends; a job reads the few workers it looks at. The
overlays are replaced whole, never changed in place: a view handed out stays as it was.
"""
from __future__ import annotations

from itertools import chain
from typing import AbstractSet, Any, Iterable, Iterator, Mapping, Sequence

from routing.compact import in_order
from routing.busy import BusyRun, next_run, resumed

_EMPTY: Mapping[str, Any] = {}
_NONE: frozenset[str] = frozenset()


class _ByHost(Mapping[str, Any]):
    """A mapping over the hosts of ``_index`` (host -> its place in the arrays)."""

    __slots__ = ("_index",)
    _index: Mapping[str, int]

    def __contains__(self, host: object) -> bool:
        return host in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


class HostMap(_ByHost):
    """host -> ``values[index[host]]`` (budgets, drain seconds); empty without values."""

    __slots__ = ("_values",)

    def __init__(self, index: Mapping[str, int], values: Sequence[Any]) -> None:
        self._index, self._values = (index, values) if values else (_EMPTY, ())

    def __getitem__(self, host: str) -> Any:
        return self._values[self._index[host]]

    def get(self, host: str, default: Any = None) -> Any:
        i = self._index.get(host)
        return default if i is None else self._values[i]


class Loads(_ByHost):
    """Each worker's load now: as measured, plus this process's sends since, less the
    jobs it has had time to finish (``elapsed_s`` over its drain: a fluid estimate)."""

    __slots__ = ("_measured", "_drain", "_sent", "_elapsed_s", "_sends", "_busy")

    def __init__(self, index: Mapping[str, int], measured: Sequence[int],
                 drain_s: Sequence[float], sent: Mapping[str, int] = _EMPTY,
                 elapsed_s: float = 0.0, sends: int = 0, busy: dict | None = None) -> None:
        self._index, self._measured, self._drain = index, measured, drain_s
        self._sent, self._elapsed_s, self._sends = sent, elapsed_s, sends
        # key -> the run of its busy holders (``routing.busy.BusyRun``): a hot model's
        # long run of busy holders is read once, not per job. Shared by the views of one
        # snapshot.
        self._busy: dict[str, BusyRun] = {} if busy is None else busy

    def at(self, sent: Mapping[str, int], elapsed_s: float, sends: int = 0) -> Loads:
        """The same workers ``elapsed_s`` after the measurement, with ``sent`` (host ->
        jobs) added: ``sends`` in all, counted in order since the snapshot."""
        return Loads(self._index, self._measured, self._drain, sent, elapsed_s, sends,
                     self._busy)

    def get(self, host: str, default: Any = None) -> Any:
        i = self._index.get(host)
        if i is None:
            return default
        drain = self._drain[i] if self._drain else 0.0
        load = self._measured[i] + self._sent.get(host, 0)
        return max(0.0, load - (self._elapsed_s / drain if drain else 0))

    def first_below(self, hosts: Iterable[str], cap: float,
                    key: str | None = None) -> str | None:
        """The first of ``hosts`` whose load is under ``cap`` (> 0), in one loop; for a
        model's holders in ring order (a sequence) and its ``key``, from the first
        holder not known to be busy, after those of the busy run that may have drained
        since or came in among them (``routing.busy``)."""
        if key is None or not isinstance(hosts, (tuple, list)):
            for host, load in self._each(hosts):
                if load < cap:
                    return host
            return None
        known = self._busy.get(key)
        count, ends, fresh, known_cap = resumed(known, hosts, cap, self._elapsed_s, self._sends)
        index, measured, drain = self._index, self._measured, self._drain
        sent, elapsed_s, new = self._sent, self._elapsed_s, []
        found = None
        for at in chain(fresh, range(count, len(hosts))) if fresh else range(count, len(hosts)):
            host = hosts[at]
            i = index[host]
            load = measured[i] + sent.get(host, 0)
            seconds = drain[i] if drain else 0.0
            if (load - elapsed_s / seconds if seconds else load) < cap:
                found = at
                break
            if seconds:  # busy until its drain takes it under the cap (a margin for rounding)
                new.append(((load - cap) * seconds - 1e-9, host))
        if new or fresh or found != count or known is None or ends is not known.ends or \
                hosts is not known.order:  # else (the common case) the run stays as it is
            run = next_run(known, hosts, count, ends, fresh, found, new)
            if run is not None:
                self._busy[key] = BusyRun(hosts, known_cap, *run, self._sends)
        return None if found is None else hosts[found]

    def _each(self, hosts: Iterable[str]) -> Iterator[tuple[str, float]]:
        """(host, :meth:`get` of it) for each of ``hosts``, with the lookups hoisted."""
        index, measured, drain = self._index, self._measured, self._drain
        sent, elapsed_s = self._sent, self._elapsed_s
        for host in hosts:
            i = index.get(host)
            if i is None:
                yield host, 0
                continue
            seconds = drain[i] if drain else 0.0
            load = measured[i] + sent.get(host, 0)
            yield host, max(0.0, load - elapsed_s / seconds if seconds else load)

    def waits_s(self, hosts: Iterable[str], drain_s: Mapping[str, float]) -> list[float]:
        """Each host's load times its ``drain_s``: how long a job queued there waits."""
        return [load * drain_s.get(host, 0.0) for host, load in self._each(hosts)]

    def __getitem__(self, host: str) -> float:
        if host not in self._index:
            raise KeyError(host)
        return self.get(host)


class Warm(_ByHost):
    """Each worker's warm models, least recently used first: the members' sorted set
    put in the snapshot's order, or what this process's sends since made of it."""

    __slots__ = ("_sets", "_ranks", "_after")

    def __init__(self, index: Mapping[str, int], sets: Sequence[Sequence[str]],
                 ranks: Sequence[int], after: Mapping[str, tuple[str, ...]] = _EMPTY) -> None:
        self._index, self._sets, self._ranks, self._after = index, sets, ranks, after

    def sent(self, after: Mapping[str, tuple[str, ...]]) -> Warm:
        """The same workers, with ``after`` (host -> models) in place of the snapshot's."""
        return Warm(self._index, self._sets, self._ranks, after)

    def __getitem__(self, host: str) -> tuple[str, ...]:
        if host in self._after:
            return self._after[host]
        i = self._index[host]
        return in_order(self._sets[i], self._ranks[i]) if self._ranks[i] else \
            tuple(self._sets[i])


class Holders(Mapping[str, AbstractSet[str]]):
    """model -> the workers holding it warm: the members' index, with the models this
    process's sends added to or evicted from a worker in ``changed``."""

    __slots__ = ("_base", "_changed")

    def __init__(self, base: Mapping[str, frozenset[str]],
                 changed: Mapping[str, frozenset[str]] = _EMPTY) -> None:
        self._base, self._changed = base, changed

    def sent(self, changed: Mapping[str, frozenset[str]]) -> Holders:
        """The same index with ``changed`` (model -> holders) in place of the members'."""
        return Holders(self._base, changed)

    def get(self, model: str, default: Any = _NONE) -> Any:
        found = self._changed.get(model)
        return found if found is not None else self._base.get(model, default)

    def __getitem__(self, model: str) -> AbstractSet[str]:
        found = self.get(model, None)
        if found is None:
            raise KeyError(model)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter({**self._base, **self._changed})

    def __len__(self) -> int:
        return len({**self._base, **self._changed})

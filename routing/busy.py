"""The run of a key's busy holders, remembered between the jobs of one snapshot.

Bounded-load hashing sends a job to the first of its model's warm holders, in ring
order, under the load cap. For a hot model the first few hundred are at the cap most of
the time (this process fills each as it drains), so every job would read them all.
:class:`BusyRun` remembers, per key, how many first holders were at or over the cap and,
for each that drains, the moment it may fall under it: a job reads only the holders
that may have drained since, and those past the run.
"""
from __future__ import annotations

import heapq
from typing import NamedTuple, Sequence

from routing.ringorder import carried_prefix


class BusyRun(NamedTuple):
    """For ``order`` (a key's holders in ring order): each of its first ``count`` holders
    is at or over any cap up to ``cap``, for a view with ``sends`` or more of this
    process's sends counted, until its time in ``ends`` (seconds after the measurement;
    a holder that does not drain has none), but those at the positions of ``fresh``
    (to be read again). Loads only grow with sends and fall with time within a
    snapshot, which is what keeps this true."""

    order: Sequence[str]
    cap: float
    count: int
    #: A heap of (the moment the holder may fall under the cap, holder).
    ends: list[tuple[float, str]]
    #: Positions (ascending, under ``count``) of holders to read again.
    fresh: tuple[int, ...]
    sends: int


def resumed(known: BusyRun | None, hosts: Sequence[str], cap: float, elapsed_s: float,
            sends: int) -> tuple[int, list[tuple[float, str]], Sequence[int], float]:
    """What a job reading ``hosts`` may skip from ``known``: (how many first holders
    are known busy, their heap of drain moments, the positions among them to read
    again (ascending), the cap the knowledge holds under); none when it does not apply
    (another lineage of orders, a higher cap, a view with fewer sends)."""
    if known is None or cap > known.cap or sends < known.sends:
        return 0, [], (), cap
    if known.order is hosts:  # the common case: the same order
        if not known.ends or known.ends[0][0] > elapsed_s:
            return known.count, known.ends, known.fresh, min(cap, known.cap)
        count, fresh = known.count, known.fresh
    else:
        carried = carried_prefix(hosts, known.order, known.count, known.fresh)
        if carried is None:
            return 0, [], (), cap
        count, fresh = carried
    ends = known.ends
    if ends and ends[0][0] <= elapsed_s:
        ends, drained = ends.copy(), []
        while ends and ends[0][0] <= elapsed_s:
            drained.append(heapq.heappop(ends)[1])
        fresh = sorted({*fresh, *_positions(hosts, drained, count)})
    return count, ends, fresh, min(cap, known.cap)


def _positions(hosts: Sequence[str], drained: list[str], count: int) -> list[int]:
    """Where each of ``drained`` is among the first ``count`` of ``hosts`` (the ones that
    left the order since are left out)."""
    found = []
    for host in drained:
        try:
            found.append(hosts.index(host, 0, count))
        except ValueError:
            pass
    return found


def next_run(known: BusyRun | None, hosts: Sequence[str], count: int,
             ends: list[tuple[float, str]], fresh: Sequence[int], found: int | None,
             new: list[tuple[float, str]],
             ) -> tuple[int, list[tuple[float, str]], tuple[int, ...]] | None:
    """(count, ends, fresh) of the run once a job read ``hosts`` from what ``resumed``
    gave it and stopped at position ``found`` (None: every holder busy), ``new`` the
    drain moments of the holders it read busy; None when ``known`` stays as it is."""
    if new:
        ends = _with_ends(ends, new, known is None or ends is not known.ends)
    if found is None:
        count, fresh = len(hosts), ()
    elif found < count:  # a holder that drained: the ones after it are still to read
        fresh = tuple(fresh[fresh.index(found):])
    else:
        count, fresh = found, ()
    if known is not None and ends is known.ends and count == known.count and \
            fresh == known.fresh and hosts is known.order:
        return None
    return count, ends, fresh


def _with_ends(ends: list[tuple[float, str]], new: list[tuple[float, str]],
               owned: bool) -> list[tuple[float, str]]:
    """``ends`` with ``new`` drain moments pushed (into a copy unless ``owned``: a job in
    another thread may read the last one)."""
    if len(new) > 16:
        ends = [*ends, *new]
        heapq.heapify(ends)
        return ends
    ends = ends if owned else ends.copy()
    for end in new:
        heapq.heappush(ends, end)
    return ends

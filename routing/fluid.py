"""The fleet's total load as time passes: a sum kept as it drains, not summed per job.

Each worker's estimated load is ``max(0, x - t * r)``: ``x`` its measured jobs plus
the ones this process sent it since, ``r`` the jobs it finishes per second, ``t`` the
seconds since the measurement. Bounded-load hashing needs the mean of those over the
fleet for every job; summing them is a pass over every worker. :class:`DrainingSum`
keeps the sum of the workers still above zero (``sum(x) - t * sum(r)``) and a heap of
the moments each reaches zero, so a read or a send costs O(log n), amortized.
"""
from __future__ import annotations

import heapq
import math
from array import array
from itertools import compress
from operator import and_, truediv, truth
from typing import Sequence


class DrainingSum:
    """``sum(max(0, x[i] - t * r[i]))`` while ``t`` only grows (one snapshot's life) and
    ``x[i]`` only grows (sends); not thread-safe: the caller holds its lock."""

    def __init__(self, values: Sequence[float], rates: Sequence[float]) -> None:
        self._x, self._r = list(values), list(rates)
        self._t = 0.0
        self._live = [x > 0 for x in self._x]
        self._sum_x = sum(x for x, live in zip(self._x, self._live) if live)
        self._sum_r = sum(r for r, live in zip(self._r, self._live) if live)
        # (when it reaches zero, index, its x then): an entry whose x has grown since is
        # out of date and skipped
        self._ends = [(x / r, i, x) for i, (x, r, live) in
                      enumerate(zip(self._x, self._r, self._live)) if live and r > 0]
        heapq.heapify(self._ends)

    def at(self, t: float) -> float:
        """The sum ``t`` seconds after the measurement (an earlier ``t`` than the last
        read is read as that one: time only moves on)."""
        t = max(t, self._t)
        ends = self._ends
        while ends and ends[0][0] <= t:
            _, i, x = heapq.heappop(ends)
            if self._live[i] and x == self._x[i]:
                self._live[i] = False
                self._sum_x -= x
                self._sum_r -= self._r[i]
        self._t = t
        return max(0.0, self._sum_x - t * self._sum_r)

    def add(self, i: int, amount: float = 1.0) -> None:
        """Worker ``i`` got ``amount`` more jobs (counted in full, as the estimate of
        each worker does, from the measurement on)."""
        x = self._x[i] = self._x[i] + amount
        r = self._r[i]
        if self._live[i]:
            self._sum_x += amount
        elif x - self._t * r > 0:
            self._live[i] = True
            self._sum_x += x
            self._sum_r += r
        else:
            return
        if r > 0:
            heapq.heappush(self._ends, (x / r, i, x))


class Draining(DrainingSum):
    """:class:`DrainingSum` made for a whole snapshot at once: the workers in the order
    they reach zero (a sort of plain numbers, which allocates no object the garbage
    collector tracks; the ones that reach it within ``SORTED_S`` first, the others when
    that time has passed), and the heap only for the ones this process's sends re-time
    (``add``)."""

    def __init__(self, values: Sequence[float], rates: Sequence[float]) -> None:
        # arrays and bytes, not lists: numbers the garbage collector need not walk
        self._x, self._r, self._t = array("d", values), rates, 0.0
        self._live = bytearray(map(truth, self._x))  # loads are never negative
        self._sum_x = sum(self._x)
        self._sum_r = sum(compress(self._r, self._live))
        self._ends: list[tuple[float, int, float]] = []
        self._first_x = array("d", self._x)
        try:  # (a rate of 0, a worker never measured, is rare: not looked for first)
            self._end_at = array("d", map(truediv, self._x, self._r))
        except ZeroDivisionError:
            self._end_at = array("d", (x / r if r else math.inf
                                       for x, r in zip(self._x, self._r)))
        self._order: list[int] = []  # the workers reaching zero by _sorted_s, in turn
        self._sorted_s, self._next = -1.0, 0
        self._sort_to(SORTED_S)

    def _sort_to(self, t: float) -> None:
        """Put in order the live workers that reach zero after ``_sorted_s`` and by ``t``
        (or by twice ``_sorted_s``, whichever is later)."""
        low, high = self._sorted_s, max(t, 2 * self._sorted_s)
        chosen = map(and_, self._live, map(high.__ge__, self._end_at))
        if low >= 0:
            chosen = map(and_, chosen, map(low.__lt__, self._end_at))
        self._order += sorted(compress(range(len(self._x)), chosen),
                              key=self._end_at.__getitem__)
        self._sorted_s = high

    def at(self, t: float) -> float:
        """The sum ``t`` seconds after the measurement (see ``DrainingSum.at``)."""
        if t > self._sorted_s:
            self._sort_to(t)
        order, end_at, first_x, x, live = (self._order, self._end_at, self._first_x,
                                           self._x, self._live)
        at = self._next
        while at < len(order) and end_at[order[at]] <= t:
            i = order[at]
            at += 1
            if live[i] and x[i] == first_x[i]:  # else a send re-timed it (in the heap)
                live[i] = False
                self._sum_x -= x[i]
                self._sum_r -= self._r[i]
        self._next = at
        return super().at(t)


#: Seconds after the measurement by which :class:`Draining` first puts in order the
#: workers that reach zero (a router reads a new snapshot twice a second).
SORTED_S = 1.0

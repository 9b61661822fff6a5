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

"""The virtual clock: a heap of timed events, run in time order (ties: in the order
they were scheduled, so that a run is deterministic for its seed)."""
from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable


class Clock:
    """Events at virtual times; ``now`` is the time of the event being run.

    ``time()`` is what the real code gets as its clock (``SnapshotCache(clock=...)``),
    so that its notion of "how long since the snapshot" is the simulated one.
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        """The current virtual time (unix-like seconds)."""
        return self.now

    def at(self, when: float, action: Callable[..., Any], *args: Any) -> None:
        """Run ``action(*args)`` at ``when`` (never before now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), action, args))

    def after(self, delay_s: float, action: Callable[..., Any], *args: Any) -> None:
        """Run ``action(*args)`` ``delay_s`` from now."""
        self.at(self.now + delay_s, action, *args)

    def every(self, period_s: float, action: Callable[[], Any], first: float,
              until: Callable[[], bool]) -> None:
        """Run ``action()`` at ``first`` and every ``period_s`` after, while not ``until()``."""
        def tick() -> None:
            if until():
                return
            action()
            self.after(period_s, tick)
        self.at(first, tick)

    def run(self, stop: Callable[[], bool] | None = None) -> None:
        """Run events in time order until none is left (or ``stop()`` says so)."""
        heap = self._heap
        while heap:
            when, _, action, args = heapq.heappop(heap)
            self.now = when
            action(*args)
            if stop is not None and stop():
                return

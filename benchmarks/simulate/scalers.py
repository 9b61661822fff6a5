"""The scalers an elastic pool is run with (``benchmarks.simulate.elastic``).

- :class:`Signal`: gpulanes' own, ``routing.scaling.scale_round`` as beat runs it every
  heartbeat, on what beat measures (busy time, service times, queued jobs).
- :class:`QueueLength`: KEDA's Redis-list scaler as Kubernetes' HPA applies it: every
  15 s, ``ceil((queued + running) / target)`` workers, unless that is within the HPA's
  10 % tolerance of the workers it has; up by at most double (or 4) at a time, down to
  the most it asked for over the last ``cooldown_s`` (the HPA's stabilization window).
- :class:`Clairvoyant`: the signal's queueing model with every lane held to a budget
  (the relaxed one to ten minutes, no backlog planned: ``needed`` as the reference
  sizes it), fed ahead of time with the trace's own arrivals per minute; each worker
  starts exactly one warm-up before the minute that needs it (its warm-up is paid) and
  stops at the end of the last one.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

from beat.scaling import DOWN_AFTER_S, WITHIN
from routing.names import LANES
from routing.scaling import LaneDemand, LaneMeasure, needed, scale_round

from benchmarks.simulate.day import Trace, rates
from benchmarks.simulate.elastic import View


@dataclass
class Signal:
    """gpulanes' scaling signal, every ``period_s`` (beat's heartbeat)."""

    budgets_s: Mapping[str, float]
    warm_s: float
    least: int
    most: int
    period_s: float = 1.0
    name: str = "gpulanes"
    state: dict[str, Any] = field(default_factory=dict)
    _busy: list[float] = field(default_factory=lambda: [0.0] * len(LANES))

    def wanted(self, view: View) -> int:
        span_s = view.now - self.state["at"] if self.state.get("at") else 0.0
        measures = {}
        for i, lane in enumerate(LANES):
            busy = (view.busy_s[i] - self._busy[i]) / span_s if span_s > 0 else view.running[i]
            measures[lane] = LaneMeasure(busy, view.service_s[i], view.queued[i])
        self._busy = list(view.busy_s)
        self.state = scale_round(self.state, measures, self.budgets_s, WITHIN, 1.0,
                                 self.warm_s, view.now, DOWN_AFTER_S, self.least, self.most)
        return self.state["wanted"]


#: The HPA's tolerance: no change while the metric is this close to its target.
HPA_TOLERANCE = 0.1


@dataclass
class QueueLength:
    """KEDA's queue-length scaler: ``target`` jobs (queued plus running) per worker."""

    target: float
    cooldown_s: float
    period_s: float = 15.0
    name: str = "queue-length"
    _asked: deque = field(default_factory=deque)  # (time, workers asked)

    def wanted(self, view: View) -> int:
        have = view.serving + view.starting
        jobs = sum(view.queued) + sum(view.running)
        asked = math.ceil(jobs / self.target - 1e-9)
        if have and abs(jobs / (have * self.target) - 1) <= HPA_TOLERANCE:
            asked = have
        asked = min(asked, max(2 * have, have + 4))
        self._asked.append((view.now, asked))
        while self._asked[0][0] < view.now - self.cooldown_s:
            self._asked.popleft()
        return max(n for _, n in self._asked)


class Clairvoyant:
    """Workers per minute from the trace's real arrivals, started ahead of time."""

    name = "clairvoyant"

    def __init__(self, trace: Trace, budgets_s: Mapping[str, float], warm_s: float,
                 least: int, most: int, window_s: float = 60.0) -> None:
        self.period_s, self.warm_s, self.window_s = window_s, warm_s, window_s
        self.plan = [max(least, min(most, math.ceil(needed(
            [LaneDemand(arrivals, run_s or trace.mean_run_s, 0.0, budgets_s.get(lane),
                        WITHIN.get(lane, 0.95))
             for lane, arrivals, run_s in zip(LANES, per_s, mean_s)]) - 1e-9)))
            for per_s, mean_s in rates(trace, window_s)]

    def wanted(self, view: View) -> int:
        minute = int(view.now / self.window_s + 1e-9)
        return self.plan[min(minute, len(self.plan) - 1)]

    def warm_up_s(self) -> float:
        """The warm-up it pays for the workers it starts, though they serve at once."""
        starts = sum(max(0, after - before)
                     for before, after in zip([0] + self.plan, self.plan))
        return starts * self.warm_s

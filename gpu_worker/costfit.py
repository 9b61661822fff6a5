"""A model's service time as a line in its jobs' cost: ``base_ms + unit_ms * cost``.

Each worker fits the line per model from the jobs it ran, recent ones weighing
more (each job's sums forget ``FORGET`` of the older ones), so that beat can price
a queued job by its cost (``beat.snapshot``). A part of every job does not grow
with its cost (reading inputs, storing outputs, the task's own bookkeeping): a
line through the origin would price a big job by a small one's overhead, ten
times too high for a tiny model. Until the jobs seen differ in cost there is
nothing to tell the two parts apart, and the line goes through the origin.
"""
from __future__ import annotations

from dataclasses import dataclass

#: Weight the older jobs' sums lose with each new one (about the last 20 jobs count).
FORGET = 0.05
#: Costs that vary less than this (relative to their mean) cannot separate the parts.
MIN_SPREAD = 0.05


@dataclass
class CostFit:
    """Weighted least squares of service ms on cost, with exponential forgetting."""

    n: float = 0.0
    c: float = 0.0
    cc: float = 0.0
    y: float = 0.0
    cy: float = 0.0

    def add(self, cost: float, ms: float) -> None:
        keep = 1 - FORGET
        self.n, self.c, self.cc = self.n * keep + 1, self.c * keep + cost, \
            self.cc * keep + cost * cost
        self.y, self.cy = self.y * keep + ms, self.cy * keep + cost * ms

    def line(self) -> tuple[float, float]:
        """(base_ms, unit_ms): a job of cost ``c`` takes ``base_ms + unit_ms * c``."""
        if self.n <= 0 or self.c <= 0:  # nothing seen (costs are positive)
            return 0.0, 0.0
        mean_c, mean_y = self.c / self.n, self.y / self.n
        variance = self.cc / self.n - mean_c ** 2
        if variance > (MIN_SPREAD * mean_c) ** 2:
            unit = (self.cy / self.n - mean_c * mean_y) / variance
            base = mean_y - unit * mean_c
            if unit >= 0 and base >= 0:
                return base, unit
            if unit < 0:  # noise: bigger jobs are no slower here
                return mean_y, 0.0
        return 0.0, mean_y / mean_c

"""A day of jobs for one pool: a load that follows the hours of a day (a night trough,
a working day, an evening peak) with a flash crowd on top, as a multiple of what the
largest fleet serves.

A trace is columns (arrival times, lanes, run seconds), drawn once per seed and shared
by every scaler that runs on it, so that each sees the very same jobs.
"""
from __future__ import annotations

import bisect
import itertools
import math
import random
from array import array
from dataclasses import dataclass

from routing.names import LANES

from benchmarks.simulate.workload import Profile, mean_run_s, model_specs

#: Load at each hour 0..24 (linear in between), as a share of the largest fleet.
HOURS = (0.30, 0.22, 0.16, 0.12, 0.10, 0.10, 0.12, 0.18, 0.27, 0.35, 0.40, 0.43, 0.45,
         0.46, 0.46, 0.47, 0.50, 0.55, 0.62, 0.70, 0.74, 0.70, 0.58, 0.44, 0.30)


@dataclass(frozen=True)
class Day:
    """The shape of a day, compressed into ``hours`` (24: a real day)."""

    hours: float = 24.0
    #: The flash crowd: from this hour of the day, for so many minutes of it, this much
    #: more load, reached within ``crowd_rise_s`` (real seconds, not compressed).
    crowd_at_h: float = 14.0
    crowd_min: float = 20.0
    crowd_extra: float = 0.35
    crowd_rise_s: float = 60.0

    @property
    def seconds(self) -> float:
        return self.hours * 3600.0

    def load(self, t: float) -> float:
        """Offered load ``t`` seconds into the run, as a share of the largest fleet."""
        hour = t / self.seconds * 24.0
        i = min(int(hour), 23)
        base = HOURS[i] + (HOURS[i + 1] - HOURS[i]) * (hour - i)
        start = self.crowd_at_h / 24.0 * self.seconds
        end = start + self.crowd_min * 60.0 * self.hours / 24.0
        if start <= t < end:
            return base + self.crowd_extra * min(1.0, (t - start) / self.crowd_rise_s)
        return base

    def peak(self) -> float:
        return max(HOURS) + self.crowd_extra


@dataclass
class Trace:
    """Every job of a run, by columns: arrival time (s), lane (index into ``LANES``),
    run seconds on a warm worker."""

    at: array
    lane: bytearray
    run_s: array
    #: Mean seconds of a job and the jobs/s the largest fleet serves.
    mean_run_s: float
    capacity_jobs_s: float

    def __len__(self) -> int:
        return len(self.at)


def trace(day: Day, gpus: int, seed: int, profile: Profile | None = None) -> Trace:
    """A Poisson stream at ``day.load(t)`` x the jobs/s of ``gpus`` workers (thinned from
    the day's peak); each job's lane by the profile's tier mix, its run time by its
    model's line (Zipf popularity), size and jitter (``benchmarks.simulate.workload``)."""
    profile = profile or Profile()
    specs = model_specs(profile, seed)
    mean_s = mean_run_s(profile, specs)
    capacity = gpus / mean_s
    rng = random.Random(f"day-{seed}")
    weights = [1 / (r + 1) ** profile.zipf_s for r in range(len(specs))]
    model_cum = _cumulative(weights)
    size_cum = _cumulative([w for _, w in profile.sizes])
    tier_cum = _cumulative(profile.tier_mix)
    model_total, size_total, tier_total = sum(weights), sum(w for _, w in profile.sizes), \
        sum(profile.tier_mix)
    sizes = [c for c, _ in profile.sizes]
    mu, sigma = -profile.jitter ** 2 / 2, profile.jitter
    peak = day.peak()
    top, end = peak * capacity, day.seconds
    at, lanes, runs = array("d"), bytearray(), array("d")
    t, random_, gauss, expo = 0.0, rng.random, rng.gauss, rng.expovariate
    while True:
        t += expo(top)
        if t >= end:
            break
        if random_() * peak >= day.load(t):
            continue
        spec = specs[bisect.bisect(model_cum, random_() * model_total)]
        cost = sizes[bisect.bisect(size_cum, random_() * size_total)]
        at.append(t)
        lanes.append(bisect.bisect(tier_cum, random_() * tier_total))
        runs.append(spec.run_s(cost) * math.exp(gauss(mu, sigma)))
    return Trace(at, lanes, runs, mean_s, capacity)


def _cumulative(weights: list[float]) -> list[float]:
    """Cumulative weights, the last a hair above their sum: a draw of ``random() x sum``
    always lands inside."""
    found = list(itertools.accumulate(weights))
    found[-1] = math.nextafter(found[-1], math.inf)
    return found


def rates(trace: Trace, window_s: float) -> list[tuple[list[float], list[float]]]:
    """Per window of ``window_s`` seconds from 0: each lane's arrivals/s and its jobs'
    mean run seconds (0 where none arrived), as they came in the trace."""
    count = int(math.ceil((trace.at[-1] if len(trace) else 0.0) / window_s)) + 1
    jobs = [[0] * len(LANES) for _ in range(count)]
    work = [[0.0] * len(LANES) for _ in range(count)]
    for t, lane, run_s in zip(trace.at, trace.lane, trace.run_s):
        window = int(t / window_s)
        jobs[window][lane] += 1
        work[window][lane] += run_s
    return [([n / window_s for n in counts], [w / n if n else 0.0 for w, n in zip(sums, counts)])
            for counts, sums in zip(jobs, work)]

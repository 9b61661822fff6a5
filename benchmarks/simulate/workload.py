"""What the simulated callers send: models by Zipf popularity, job sizes, light and
heavy accounts, and an arrival rate that follows a load shape over time.

Everything is drawn from one ``random.Random(seed)``, so a seed names a workload: the
gpulanes run and the plain-lanes run of a scenario see the very same jobs.
"""
from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass
from typing import Callable, Sequence

from routing.names import LANES

#: A load shape: seconds since the start -> offered load as a multiple of capacity.
Shape = Callable[[float], float]


@dataclass(frozen=True)
class ModelSpec:
    """A model's job time, ``base_s + unit_s * cost``, what loading it costs, and what it
    holds loaded (MB, against a worker's budget: ``Fleet.memory_mb``)."""

    name: str
    base_s: float
    unit_s: float
    load_s: float
    memory_mb: int = 1

    def run_s(self, cost: float) -> float:
        """Seconds one job of ``cost`` runs on a worker holding the model warm."""
        return self.base_s + self.unit_s * cost


@dataclass(frozen=True)
class Arrival:
    """One job as submitted: when, by whom, of which model and size, how long it runs."""

    at: float
    tier: str
    account: str
    heavy: bool
    model: str
    cost: float
    run_s: float
    #: Denoising steps: a run may step aside for a fast job at each boundary.
    steps: int = 30


@dataclass(frozen=True)
class Profile:
    """The population the jobs come from (defaults: an image-generation service)."""

    models: int = 200
    zipf_s: float = 1.1
    tier_mix: tuple[float, float, float] = (0.2, 0.3, 0.5)
    heavy_accounts: int = 20
    light_accounts: int = 2000
    #: Share of all jobs sent by the heavy accounts.
    heavy_share: float = 0.7
    #: (cost, weight) of job sizes: cost 1 is e.g. 30 steps at 768 px.
    sizes: tuple[tuple[float, float], ...] = ((0.5, 0.3), (1.0, 0.5), (2.0, 0.2))
    #: Spread of one job's run time around its model's line (log-normal sigma).
    jitter: float = 0.1


def model_specs(profile: Profile, seed: int) -> list[ModelSpec]:
    """The catalogue, most popular first: job lines of 0.5-1.5 s plus 3-6 s per cost
    unit, cold loads of 4-20 s (bigger models load longer)."""
    rng = random.Random(f"models-{seed}")
    specs = []
    for rank in range(profile.models):
        unit_s = rng.uniform(3.0, 6.0)
        specs.append(ModelSpec(f"model-{rank:03d}", rng.uniform(0.5, 1.5), unit_s,
                               round(4.0 + (unit_s - 3.0) / 3.0 * 16.0, 3)))
    return specs


def _cumulative(weights: Sequence[float]) -> list[float]:
    return list(itertools.accumulate(weights))


class Drawer:
    """Draws jobs' attributes: one bisect per choice (``rng.choices`` rebuilds its
    cumulative weights per call: too slow for 300,000 jobs)."""

    def __init__(self, profile: Profile, specs: Sequence[ModelSpec], rng: random.Random) -> None:
        self.profile, self.specs, self.rng = profile, list(specs), rng
        self.model_cum = _cumulative([1 / (r + 1) ** profile.zipf_s for r in range(len(specs))])
        self.tier_cum = _cumulative(profile.tier_mix)
        self.size_cum = _cumulative([w for _, w in profile.sizes])
        # jitter with mean 1: exp(N(-sigma^2/2, sigma))
        self.mu = -profile.jitter ** 2 / 2

    def _pick(self, cum: list[float]) -> int:
        return min(bisect.bisect(cum, self.rng.random() * cum[-1]), len(cum) - 1)

    def account(self) -> tuple[str, bool]:
        """(account, heavy): heavy accounts send ``heavy_share`` of the jobs between them."""
        p = self.profile
        if self.rng.random() < p.heavy_share:
            return f"heavy-{self.rng.randrange(p.heavy_accounts):02d}", True
        return f"light-{self.rng.randrange(p.light_accounts):04d}", False

    def job(self, at: float) -> Arrival:
        """One arrival at ``at``."""
        spec = self.specs[self._pick(self.model_cum)]
        cost = self.profile.sizes[self._pick(self.size_cum)][0]
        account, heavy = self.account()
        run_s = spec.run_s(cost) * math.exp(self.rng.gauss(self.mu, self.profile.jitter))
        return Arrival(at, LANES[self._pick(self.tier_cum)], account, heavy, spec.name, cost,
                       run_s)


def mean_run_s(profile: Profile, specs: Sequence[ModelSpec]) -> float:
    """Expected warm run time of a job: what capacity is measured in."""
    weights = [1 / (r + 1) ** profile.zipf_s for r in range(len(specs))]
    sizes = sum(w for _, w in profile.sizes)
    mean_cost = sum(c * w for c, w in profile.sizes) / sizes
    return sum(w * s.run_s(mean_cost) for w, s in zip(weights, specs)) / sum(weights)


def arrivals(shape: Shape, peak: float, capacity_jobs_s: float, duration_s: float,
             drawer: Drawer) -> list[Arrival]:
    """A Poisson stream at ``shape(t) * capacity`` (thinned from ``peak`` x capacity)."""
    rng, top = drawer.rng, peak * capacity_jobs_s
    jobs, t = [], 0.0
    while True:
        t += rng.expovariate(top)
        if t >= duration_s:
            return jobs
        if rng.random() * peak < shape(t):
            jobs.append(drawer.job(t))


# --- load shapes -------------------------------------------------------------------------
def constant(factor: float) -> Shape:
    """The same load all along."""
    return lambda _t: factor


def flash_crowd(base: float, peak: float, start_s: float, length_s: float) -> Shape:
    """``base`` load with a burst of ``peak`` for ``length_s`` from ``start_s``."""
    return lambda t: peak if start_s <= t < start_s + length_s else base


def noisy(mean: float, spread: float, step_s: float, seed: int, duration_s: float) -> Shape:
    """A load that jumps every ``step_s`` to ``mean +- spread`` (uniform): it keeps
    crossing the point where the standard lane's wait meets its budget."""
    rng = random.Random(f"noise-{seed}")
    levels = [max(0.0, mean + rng.uniform(-spread, spread))
              for _ in range(int(duration_s / step_s) + 2)]
    return lambda t: levels[int(t / step_s)]

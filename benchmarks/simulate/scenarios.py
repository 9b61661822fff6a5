"""The named scenarios: steady load at 0.5x, 1x and 2x of capacity, a flash crowd,
worker deaths, and noisy load around the standard lane's threshold."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

from benchmarks.simulate.config import SimConfig
from benchmarks.simulate.run import MODES, Fault, Fleet, Run
from benchmarks.simulate.workload import (
    Drawer,
    Profile,
    Shape,
    arrivals,
    constant,
    flash_crowd,
    mean_run_s,
    model_specs,
    noisy,
)


@dataclass(frozen=True)
class Scenario:
    """A load shape over the window (its peak, for thinning) and worker faults."""

    name: str
    shape: Callable[[float, int], Shape]
    peak: float
    #: (share of workers, seconds into the window, seconds until back or None)
    faults: tuple[tuple[float, float, float | None], ...] = ()


def _shape(factor: float) -> Callable[[float, int], Shape]:
    return lambda _window_s, _seed: constant(factor)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("load-0.5x", _shape(0.5), 0.5),
    Scenario("load-1x", _shape(1.0), 1.0),
    Scenario("load-2x", _shape(2.0), 2.0),
    # 0.8x, and 3x for a minute from the third minute
    Scenario("flash-crowd", lambda w, _s: flash_crowd(0.8, 3.0, 0.3 * w, 60.0), 3.0),
    # 0.9x; a tenth of the workers die at 20% of the window, back 3 minutes later
    Scenario("worker-deaths", _shape(0.9), 0.9, faults=((0.1, 0.2, 180.0),)),
    # 0.85x-1.25x, a new level every 20 s
    Scenario("noisy", lambda w, s: noisy(1.05, 0.2, 20.0, s, w), 1.25),
)}


def capacity_jobs_s(gpus: int, profile: Profile, seed: int, overhead_s: float = 0.0) -> float:
    """Jobs/s the fleet finishes with every model warm: one job at a time per GPU."""
    return gpus / (mean_run_s(profile, model_specs(profile, seed)) + overhead_s)


def faults_for(scenario: Scenario, hosts: list[str], window_s: float, seed: int) -> list[Fault]:
    rng, faults = random.Random(f"faults-{seed}"), []
    for share, at, back in scenario.faults:
        chosen = tuple(sorted(rng.sample(hosts, max(1, round(share * len(hosts))))))
        faults.append(Fault(at * window_s, chosen, back))
    return faults


def run_scenario(scenario: Scenario, gpus: int, window_s: float, seed: int,
                 config: SimConfig | None = None, profile: Profile | None = None,
                 modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    """Both modes of ``scenario`` on the same jobs: {mode: Outcome}, and its capacity."""
    config, profile = config or SimConfig(), profile or Profile()
    specs = model_specs(profile, seed)
    capacity = capacity_jobs_s(gpus, profile, seed, config.overhead_s)
    jobs = arrivals(scenario.shape(window_s, seed), scenario.peak, capacity, window_s,
                    Drawer(profile, specs, random.Random(f"jobs-{seed}")))
    fleet = Fleet(gpus)
    faults = faults_for(scenario, fleet.host_names(), window_s, seed)
    outcomes = {mode: Run(jobs, specs, fleet, mode, config, window_s, seed, faults).go()
                for mode in modes}
    return {"capacity_jobs_s": round(capacity, 2), "outcomes": outcomes}

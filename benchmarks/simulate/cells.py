"""A scenario on a fleet spread over cells (``tasks.settings_cells``):
``python -m benchmarks.simulate --cells N``.

A cell is a whole cluster on its own Redis: its workers, lists, beat and routing, and
the models its pools keep warm; a submit sends a model's jobs to the cell where it is
warm (``tasks.broker.cells.cell_of_job``). The models are dealt to the cells by their
share of the load, heaviest first, each to the cell with the least load so far, and
each cell gets workers in proportion to its load, as an operator sizes pools; then each
cell runs the scenario on its models' jobs (the same jobs in both modes), its worker
faults drawn among its own workers. An account's fast seconds are split as beat's
spread settles them (``beat.fastsplit``): each cell's part is its share of the load.
The figures are those of every cell's jobs together; mode changes are summed.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import Any, Sequence

from benchmarks.simulate.config import SimConfig
from benchmarks.simulate.metrics import Recorder, figures, waits_over_time
from benchmarks.simulate.run import MODES, Fleet, Outcome, Run
from benchmarks.simulate.scenarios import Scenario, capacity_jobs_s, faults_for
from benchmarks.simulate.workload import (
    Drawer,
    ModelSpec,
    Profile,
    arrivals,
    model_specs,
)


def deal(specs: Sequence[ModelSpec], profile: Profile, cells: int
         ) -> list[tuple[list[ModelSpec], float]]:
    """The models of each cell, most loaded first, and its share of the load."""
    mean_cost = sum(c * w for c, w in profile.sizes) / sum(w for _, w in profile.sizes)
    load = {spec.name: spec.run_s(mean_cost) / (rank + 1) ** profile.zipf_s
            for rank, spec in enumerate(specs)}
    dealt: list[list[ModelSpec]] = [[] for _ in range(cells)]
    loads = [0.0] * cells
    for spec in sorted(specs, key=lambda spec: -load[spec.name]):
        least = loads.index(min(loads))
        dealt[least].append(spec)
        loads[least] += load[spec.name]
    total = sum(loads)
    return [(models, share / total) for models, share in zip(dealt, loads) if models]


def workers_for(shares: Sequence[float], gpus: int) -> list[int]:
    """``gpus`` shared out by ``shares`` (largest remainders), at least one each."""
    exact = [share * gpus for share in shares]
    given = [max(1, int(x)) for x in exact]
    for i in sorted(range(len(shares)), key=lambda i: int(exact[i]) - exact[i]):
        if sum(given) >= gpus:
            break
        given[i] += 1
    while sum(given) > gpus:  # the ones given to the smallest: from the largest
        given[given.index(max(given))] -= 1
    return given


def run_cells(scenario: Scenario, gpus: int, window_s: float, seed: int, cells: int,
              config: SimConfig | None = None, profile: Profile | None = None,
              modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    """Both modes of ``scenario`` over ``cells`` cells: as ``run_scenario``, and each
    cell's models, workers and load share."""
    config, profile = config or SimConfig(), profile or Profile()
    specs = model_specs(profile, seed)
    capacity = capacity_jobs_s(gpus, profile, seed, config.overhead_s)
    jobs = arrivals(scenario.shape(window_s, seed), scenario.peak, capacity, window_s,
                    Drawer(profile, specs, random.Random(f"jobs-{seed}")))
    dealt = deal(specs, profile, cells)
    sizes = workers_for([share for _, share in dealt], gpus)
    outcomes = {}
    for mode in modes:
        parts = []
        for (models, share), size in zip(dealt, sizes):
            names = {spec.name for spec in models}
            fleet = Fleet(size)
            parts.append(Run([job for job in jobs if job.model in names], models, fleet, mode,
                             replace(config, fast_seconds=config.fast_seconds * share),
                             window_s, seed,
                             faults_for(scenario, fleet.host_names(), window_s, seed)).go())
        outcomes[mode] = merged(parts, config, window_s)
    return {"capacity_jobs_s": round(capacity, 2), "outcomes": outcomes,
            "cells": [{"models": len(models), "workers": size, "load_share": round(share, 4)}
                      for (models, share), size in zip(dealt, sizes)]}


def merged(parts: Sequence[Outcome], config: SimConfig, window_s: float) -> Outcome:
    """One outcome of the cells' runs: the figures of all their jobs."""
    recorder = Recorder(parts[0].recorder.start,
                        [job for part in parts for job in part.recorder.done])
    found = figures(recorder, config, window_s,
                    sum(part.figures["offered"] for part in parts),
                    sum(part.figures["refused"] for part in parts),
                    sum(part.figures["cold_loads"] for part in parts))
    changes: Counter = Counter()
    for part in parts:
        changes.update(part.figures["mode_changes"])
    found["mode_changes"] = {lane: changes.get(lane, 0) for lane in ("fast", "standard")}
    found["mode_changes_per_min"] = round(sum(changes.values()) / (window_s / 60), 3)
    for summed in ("preempted", "sim_cpu_s"):
        found[summed] = round(sum(part.figures[summed] for part in parts), 2)
    series = {"waits": waits_over_time(recorder.done), "rounds": []}
    return Outcome(found, series, recorder, sum(part.accepted for part in parts))

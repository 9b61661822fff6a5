"""One account floods a lane on the simulated fleet: do the other accounts' jobs in that
lane wait any longer?

``python -m benchmarks.simulate.flood`` runs the image-service workload (``Profile``:
200 models, 2,020 accounts) at ``--load`` of a ``--gpus`` fleet's capacity, once as it
is and once with one more account sending ``--per-gpu`` jobs per GPU to the fast or the
standard lane at a third of the window, both modes on the same jobs. For the other
accounts' jobs of that lane submitted while the flood drains (the light ones: the 20
heavy accounts, by recent usage, share the flood's level), gpulanes' goal is the
real cluster's (``benchmarks/lane_fairness.py``): their p95 wait within their p95
without the flood plus one job's run time (the workload's mean). Plain lanes serve one
FIFO list per lane: they wait out the flood.
"""
from __future__ import annotations

import argparse
import random
import sys
from typing import Any

from routing.names import FAST, STANDARD

from benchmarks.common import json_option, markdown_table, write_json
from benchmarks.simulate.config import SimConfig
from benchmarks.simulate.metrics import quantiles
from benchmarks.simulate.run import MODES, Fleet, Run
from benchmarks.simulate.scenarios import capacity_jobs_s
from benchmarks.simulate.workload import (
    Arrival,
    Drawer,
    Profile,
    arrivals,
    constant,
    mean_run_s,
    model_specs,
)

FLOODER = "flood"


def flood_jobs(lane: str, count: int, at: float, drawer: Drawer) -> list[Arrival]:
    """``count`` jobs of one account, all at ``at``, drawn as the workload's others."""
    return [Arrival(at, lane, FLOODER, True, job.model, job.cost, job.run_s, job.steps)
            for job in (drawer.job(at) for _ in range(count))]


def p95_s(done: list[Any], lane: str, since: float, until: float,
          heavy: bool = False) -> float | None:
    """p95 wait of the light (``heavy``: heavy) accounts' jobs asking for ``lane``
    submitted in the span, the flood's left out."""
    waits = [job.wait_s for job in done if job.arrival.tier == lane
             and job.arrival.heavy == heavy and job.arrival.account != FLOODER
             and since <= job.arrival.at < until]
    return quantiles(waits)["p95"]


def one_lane(lane: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both modes with and without the flood: the light accounts' p95 waits (s)."""
    profile, config, seed = Profile(), SimConfig(), args.seed
    specs = model_specs(profile, seed)
    window_s = args.minutes * 60
    capacity = capacity_jobs_s(args.gpus, profile, seed, config.overhead_s)
    base = arrivals(constant(args.load), args.load, capacity, window_s,
                    Drawer(profile, specs, random.Random(f"jobs-{seed}")))
    at, count = window_s / 3, args.per_gpu * args.gpus
    flooded = sorted(base + flood_jobs(lane, count, at, Drawer(
        profile, specs, random.Random(f"flood-{seed}"))), key=lambda job: job.at)
    job_s = mean_run_s(profile, specs)
    span = (at, at + count * job_s / args.gpus)  # while the flood drains at full speed
    out: dict[str, Any] = {"flood_jobs": count, "job_s": round(job_s, 3),
                           "span_s": [round(t, 1) for t in span]}
    for mode in MODES:
        found = {}
        for name, jobs in (("alone", base), ("flooded", flooded)):
            done = Run(jobs, specs, Fleet(args.gpus), mode, config, window_s, seed).go() \
                .recorder.done
            found[name] = p95_s(done, lane, *span)
            found[f"heavy_{name}"] = p95_s(done, lane, *span, heavy=True)
        bound = (found["alone"] or 0.0) + job_s
        out[mode] = {"alone_p95_s": found["alone"], "flooded_p95_s": found["flooded"],
                     "bound_s": round(bound, 3),
                     "within_bound": found["flooded"] is not None and found["flooded"] <= bound,
                     "heavy_alone_p95_s": found["heavy_alone"],
                     "heavy_flooded_p95_s": found["heavy_flooded"]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--load", type=float, default=0.8, help="of the fleet's capacity")
    parser.add_argument("--per-gpu", type=int, default=10, help="flood jobs per GPU")
    parser.add_argument("--seed", type=int, default=1)
    json_option(parser, "simulate_flood")
    args = parser.parse_args(argv)
    figures = {"gpus": args.gpus, "minutes": args.minutes, "load": args.load,
               "per_gpu": args.per_gpu, "seed": args.seed,
               "lanes": {lane: one_lane(lane, args) for lane in (STANDARD, FAST)}}
    rows = [[lane, mode, f"{f[mode]['alone_p95_s']}", f"{f[mode]['flooded_p95_s']}",
             f"{f[mode]['bound_s']}", "yes" if f[mode]["within_bound"] else "no"]
            for lane, f in figures["lanes"].items() for mode in MODES]
    print(f"\nOther accounts' p95 wait (s) in the lane one account floods with "
          f"{args.per_gpu * args.gpus} jobs, {args.gpus} simulated GPUs at {args.load}x\n")
    print(markdown_table(["lane", "mode", "alone p95", "flooded p95", "alone + one job",
                          "within"], rows))
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())

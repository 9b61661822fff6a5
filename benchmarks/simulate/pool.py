"""``benchmarks/overload.py``'s workload in the simulator: a small pool driven past capacity.

``python -m benchmarks.simulate.pool`` runs, on a virtual clock, what ``overload.py`` runs
on real workers: ``--workers`` workers of one slot, one model warm on all of them, jobs
evenly spaced at ``--load`` times the pool's capacity for ``--duration`` s, their tiers
drawn by ``--mix`` (fast, standard, relaxed, in %), budgets of 10 and 60 job-times. A
job runs ``--run-ms`` (+-10 %) and its worker spends ``--between-ms`` more on it, of
which ``--unmeasured-ms`` fall between its postrun and the next job's prerun. Per seed,
gpulanes and plain lanes on the same jobs: the share of each tier within its budget
(and the most the mix allows standard, ``benchmarks.overload_report.standard_most``), the
jobs moved at submit and past their budget, served jobs/s.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any, Sequence

from routing.names import FAST, STANDARD

from benchmarks.overload_report import standard_most
from benchmarks.simulate.config import SimConfig
from benchmarks.simulate.run import Fleet, Run
from benchmarks.simulate.workload import Arrival, ModelSpec


def arrivals(workers: int, job_s: float, run_s: float, load: float, mix: Sequence[float],
             duration_s: float, seed: int) -> list[Arrival]:
    """Evenly spaced jobs at ``load`` times the pool's capacity, tiers drawn by ``mix``."""
    rng = random.Random(seed)
    count = int(duration_s * workers / job_s * load)
    tiers = rng.choices(["fast", "standard", "relaxed"], mix, k=count)
    return [Arrival(i * duration_s / count, tier, f"a{i % 4}", False, "demo", 1.0,
                    run_s * rng.uniform(0.9, 1.1), 16) for i, tier in enumerate(tiers)]


def one_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Both modes on one seed's jobs: their figures."""
    run_s, between_s = args.run_ms / 1000, args.between_ms / 1000
    job_s = run_s + between_s
    jobs = arrivals(args.workers, job_s, run_s, args.load, args.mix, args.duration, seed)
    budgets = {FAST: 10 * job_s / args.workers, STANDARD: 60 * job_s / args.workers}
    config = SimConfig(budgets_s=budgets, default_service_s=job_s, overhead_s=between_s,
                       unmeasured_s=args.unmeasured_ms / 1000, heartbeat_s=1.0,
                       push_phases=args.workers)
    fleet = Fleet(args.workers, memory_mb=(1,), hosts=[f"w{i}" for i in range(args.workers)])
    shares = dict(zip(("fast", "standard", "relaxed"), (x / sum(args.mix) for x in args.mix)))
    out: dict[str, Any] = {"seed": seed, "jobs": len(jobs),
                           "standard_most": round(standard_most(args.load, shares), 3)}
    for mode in ("gpulanes", "plain"):
        figures = Run(jobs, [ModelSpec("demo", 0.0, 0.0, 0.0)], fleet, mode, config,
                      args.duration, seed).go().figures
        out[mode] = {"within_budget": figures["within_budget"],
                     "downgrades": figures["downgrades"],
                     "served_jobs_s": figures["served_jobs_s"]}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulate.pool",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--run-ms", type=float, default=18.5)
    parser.add_argument("--between-ms", type=float, default=7.5)
    parser.add_argument("--unmeasured-ms", type=float, default=3.0)
    parser.add_argument("--load", type=float, default=2.0)
    parser.add_argument("--mix", type=lambda v: [float(x) for x in v.split(",")],
                        default=[30.0, 40.0, 30.0])
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")],
                        default=[7, 8, 9])
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if not 0 <= args.unmeasured_ms <= args.between_ms:
        parser.error("--unmeasured-ms is part of --between-ms")
    results = [one_seed(args, seed) for seed in args.seeds]
    print("| seed | standard within budget gpulanes / plain (most) | fast gpulanes / plain "
          "| moved at submit / past budget | served jobs/s gpulanes / plain |")
    print("|---:|---|---|---|---|")
    for r in results:
        g, p = r["gpulanes"], r["plain"]
        moved = g["downgrades"]
        print(f"| {r['seed']} | {g['within_budget'][STANDARD]:.1%} / "
              f"{p['within_budget'][STANDARD]:.1%} ({r['standard_most']:.0%}) | "
              f"{g['within_budget'][FAST]:.1%} / {p['within_budget'][FAST]:.1%} | "
              f"{moved.get('standard_overloaded', 0)} / {moved.get('waited_past_budget', 0)} | "
              f"{g['served_jobs_s']} / {p['served_jobs_s']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "seeds": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

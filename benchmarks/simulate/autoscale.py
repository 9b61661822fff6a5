"""``python -m benchmarks.simulate --autoscale``: scalers compared on a day of jobs.

One pool of up to ``--gpus`` workers serves a day-shaped trace with a flash crowd
(``benchmarks.simulate.day``); a new worker serves after ``--boot-s`` plus ``--load-s``.
On the very same jobs, with the same fleet limits, it runs:

- gpulanes' scaling signal (``routing.scaling``, as beat runs it);
- a KEDA-style queue-length scaler, its target and cooldown chosen by a grid search for
  its best result: the fewest GPU-hours that meet both budgets, else the nearest to them;
- a clairvoyant provisioner (the queueing model, every lane held to a budget, on the
  trace's real arrivals).

It reports each lane's share of jobs that started within its budget, waits, GPU-hours,
hand-overs and starts, and whether gpulanes met its goals. ``python benchmarks/pages.py``
draws the workers paid and serving, and the waits, over the day.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any, Mapping

from beat.scaling import BOOT_S, WITHIN
from routing.names import LANES

from benchmarks.common import json_option, write_json
from benchmarks.simulate.config import SimConfig
from benchmarks.simulate.day import Day, Trace, rates, trace
from benchmarks.simulate.elastic import Outcome, Pool, Scaler
from benchmarks.simulate.scalers import Clairvoyant, QueueLength, Signal

#: What gpulanes must reach: each budgeted lane's share within budget, and GPU-hours
#: against the clairvoyant's.
GOALS = {"fast": 0.999, "standard": 0.95, "gpu_hours_vs_clairvoyant": 1.15}
#: The queue-length scaler's grid, its best inside it: at 32 jobs per worker the fast
#: lane misses its goal (in the first minutes, the scaler starting on an empty queue:
#: the more jobs per worker, the fewer workers it keeps for the first jobs); the
#: shortest cooldowns do best, and 0 (no stabilization window) ends the range.
TARGETS = (1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0)
COOLDOWNS = (0.0, 30.0, 60.0, 300.0)
#: Seconds of each bucket of the waits' series.
WAIT_BUCKET_S = 600.0

_TRACE: list[Trace] = []  # the run's trace, shared with the grid's forked processes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulate --autoscale",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=1000, help="the most workers (1000)")
    parser.add_argument("--hours", type=float, default=24.0,
                        help="the day's shape compressed into so many hours (24)")
    parser.add_argument("--boot-s", type=float, default=BOOT_S,
                        help=f"seconds a new worker takes to start ({BOOT_S:.0f})")
    parser.add_argument("--load-s", type=float, default=15.0,
                        help="seconds it then takes to load its models (15)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--targets", default=",".join(map(str, TARGETS)),
                        help="the queue-length scaler's targets to search")
    parser.add_argument("--cooldowns", default=",".join(f"{c:g}" for c in COOLDOWNS),
                        help="the queue-length scaler's cooldowns (s) to search")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    json_option(parser, "autoscale_sim")
    args = parser.parse_args(argv)
    if args.gpus < 1 or args.hours <= 0:
        parser.error("--gpus must be >= 1 and --hours > 0")
    return args


def budgets() -> dict[str, float]:
    """Each lane's wait budget: the settings', and the relaxed one the simulator uses."""
    config = SimConfig()
    return {lane: config.budget_of(lane) for lane in LANES}


def figures(outcome: Outcome, trace: Trace, extra_gpu_s: float = 0.0) -> dict[str, Any]:
    """A run's figures: per lane, the share within budget and the waits."""
    import numpy as np

    waits, lanes = np.frombuffer(outcome.waits), np.frombuffer(trace.lane, dtype=np.uint8)
    found: dict[str, Any] = {"jobs": len(trace), "started": int(np.isfinite(waits).sum())}
    for i, (lane, budget_s) in enumerate(budgets().items()):
        mine = waits[lanes == i]
        p50, p95, p99, p999 = (np.percentile(mine, [50, 95, 99, 99.9]) if len(mine)
                               else (0.0,) * 4)
        found[lane] = {"jobs": int(len(mine)), "budget_s": budget_s,
                       "within": round(float((mine <= budget_s).mean()) if len(mine) else 1.0, 5),
                       "p50_s": round(float(p50), 2), "p95_s": round(float(p95), 2),
                       "p99_s": round(float(p99), 2), "p999_s": round(float(p999), 2),
                       "max_s": round(float(mine.max()) if len(mine) else 0.0, 1)}
    found.update(gpu_hours=round((outcome.gpu_s + extra_gpu_s) / 3600, 1),
                 handed_over=outcome.handed_over, starts=outcome.starts, most=outcome.most)
    return found


def meets(found: Mapping[str, Any]) -> bool:
    return all(found[lane]["within"] >= GOALS[lane] for lane in ("fast", "standard"))


def shortfall(found: Mapping[str, Any]) -> float:
    """How far a run is from both budgets' goals (0: met), in shares of the late allowed."""
    return sum(max(0.0, GOALS[lane] - found[lane]["within"]) / (1 - GOALS[lane])
               for lane in ("fast", "standard"))


def _run(scaler: Scaler, warm_s: float, least: int, most: int,
         start: int) -> tuple[Outcome, float]:
    began = time.process_time()
    outcome = Pool(_TRACE[0], scaler, warm_s, least, most, start).run()
    return outcome, time.process_time() - began


def _grid_point(args: tuple[float, float, float, int, int, int]) -> dict[str, Any]:
    target, cooldown, warm_s, least, most, start = args
    outcome, cpu_s = _run(QueueLength(target, cooldown), warm_s, least, most, start)
    return {"target": target, "cooldown_s": cooldown, **figures(outcome, _TRACE[0]),
            "series": outcome.series, "waits": _wait_series(outcome, _TRACE[0]),
            "cpu_s": round(cpu_s, 1)}


def _wait_series(outcome: Outcome, trace: Trace) -> dict[str, list[list[float]]]:
    """Per lane, every WAIT_BUCKET_S of arrivals: [bucket start, p99 wait]."""
    import numpy as np

    waits, at = np.frombuffer(outcome.waits), np.frombuffer(trace.at)
    lanes, buckets = np.frombuffer(trace.lane, dtype=np.uint8), (at // WAIT_BUCKET_S)
    found: dict[str, list[list[float]]] = {}
    for i, lane in enumerate(LANES):
        mine = lanes == i
        found[lane] = [[float(b * WAIT_BUCKET_S),
                        round(float(np.percentile(waits[mine & (buckets == b)], 99)), 2)]
                       for b in np.unique(buckets[mine])]
    return found


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Every scaler on one trace: the report."""
    day = Day(hours=args.hours)
    jobs = trace(day, args.gpus, args.seed)
    _TRACE[:] = [jobs]
    limits = dict(least=1, most=args.gpus)
    warm_s = args.boot_s + args.load_s
    seer = Clairvoyant(jobs, SimConfig().budgets_s, warm_s, **limits)
    start = seer.plan[0]
    runs: dict[str, Any] = {}
    outcome, cpu_s = _run(seer, 0.0, start=start, **limits)
    runs["clairvoyant"] = {**figures(outcome, jobs, seer.warm_up_s()), "cpu_s": round(cpu_s, 1),
                           "series": outcome.series, "waits": _wait_series(outcome, jobs)}
    print(f"  clairvoyant: done ({cpu_s:.0f} s CPU)", file=sys.stderr, flush=True)
    first, _ = rates(jobs, 60.0)[0]  # a fleet that has been serving: its rates known
    primed = {"wanted": start, "rates": {lane: [r, r] for lane, r in zip(LANES, first)}}
    signal = Signal(SimConfig().budgets_s, warm_s, state=primed, **limits)
    outcome, cpu_s = _run(signal, warm_s, start=start, **limits)
    runs["gpulanes"] = {**figures(outcome, jobs), "cpu_s": round(cpu_s, 1),
                        "series": outcome.series, "waits": _wait_series(outcome, jobs)}
    print(f"  gpulanes: done ({cpu_s:.0f} s CPU)", file=sys.stderr, flush=True)
    points = [(float(t), float(c), warm_s, limits["least"], limits["most"], start)
              for t in args.targets.split(",") for c in args.cooldowns.split(",")]
    with ProcessPoolExecutor(max(1, args.processes), mp_context=get_context("fork")) as pool:
        grid = list(pool.map(_grid_point, points))
    print(f"  queue-length: {len(grid)} settings done", file=sys.stderr, flush=True)
    best = min(grid, key=lambda g: (shortfall(g), g["gpu_hours"]))
    runs["queue-length"] = best
    return _report(args, jobs, warm_s, runs, grid)


def _report(args: argparse.Namespace, jobs: Trace, warm_s: float, runs: dict[str, Any],
            grid: list[dict[str, Any]]) -> dict[str, Any]:
    ours, keda, seer = runs["gpulanes"], runs["queue-length"], runs["clairvoyant"]
    ratio = ours["gpu_hours"] / seer["gpu_hours"]
    goals = {
        "fast": ours["fast"]["within"] >= GOALS["fast"],
        "standard": ours["standard"]["within"] >= GOALS["standard"],
        "gpu_hours_vs_clairvoyant": ratio <= GOALS["gpu_hours_vs_clairvoyant"],
        "ahead_of_queue_length": all(ours[lane]["within"] >= keda[lane]["within"]
                                     for lane in ("fast", "standard"))
        and ours["gpu_hours"] <= keda["gpu_hours"]}
    series = {name: {"fleet": run.pop("series"), "waits": run.pop("waits")}
              for name, run in runs.items()}
    return {"gpus": args.gpus, "hours": args.hours, "seed": args.seed, "jobs": len(jobs),
            "boot_s": args.boot_s, "load_s": args.load_s, "warm_s": warm_s,
            "budgets_s": budgets(), "within": WITHIN, "goals": GOALS,
            "capacity_jobs_s": round(jobs.capacity_jobs_s, 1),
            "runs": runs, "gpu_hours_vs_clairvoyant": round(ratio, 3),
            "queue_length_vs_clairvoyant": round(keda["gpu_hours"] / seer["gpu_hours"], 3),
            "met": goals,
            "grid": [{k: v for k, v in g.items() if k not in ("series", "waits")}
                     for g in grid],
            "series": series}


def print_report(report: Mapping[str, Any]) -> None:
    print(f"{report['jobs']:,} jobs over {report['hours']:g} h, up to {report['gpus']} GPUs, "
          f"a new one serves after {report['warm_s']:.0f} s")
    print(f"{'scaler':<14}{'fast':>9}{'standard':>10}{'relaxed':>9}{'GPU-h':>9}"
          f"{'handed':>8}{'starts':>8}")
    for name, run in report["runs"].items():
        print(f"{name:<14}{run['fast']['within']:>9.4f}{run['standard']['within']:>10.4f}"
              f"{run['relaxed']['within']:>9.4f}{run['gpu_hours']:>9.1f}"
              f"{run['handed_over']:>8}{run['starts']:>8}")
    keda = report["runs"]["queue-length"]
    print(f"queue-length's best: target {keda['target']:g}, cooldown {keda['cooldown_s']:g} s")
    print(f"GPU-hours vs clairvoyant: gpulanes {report['gpu_hours_vs_clairvoyant']:.3f}, "
          f"queue-length {report['queue_length_vs_clairvoyant']:.3f}")
    print("goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}"
                                for k, v in report["met"].items()))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    report = compare(args)
    report["wall_s"] = round(time.monotonic() - began, 1)
    print_report(report)
    write_json(args.json, report)
    return 0 if all(report["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

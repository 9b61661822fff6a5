"""``python -m benchmarks.simulate``: every scenario on a simulated fleet, both modes."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import json_option, write_json
from benchmarks.simulate.cells import run_cells
from benchmarks.simulate.config import SimConfig
from benchmarks.simulate.report import print_report, versus
from benchmarks.simulate.scenarios import SCENARIOS, run_scenario


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulate",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=1000, help="workers (default: 1000)")
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="simulated minutes of offered load per scenario (default: 10)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, of: {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--seed", type=int, default=1, help="seed of fleet and jobs")
    parser.add_argument("--cells", type=int, default=0,
                        help="spread the fleet over this many cells, each on a Redis of its "
                             "own (default 0: one Redis)")
    json_option(parser, "simulate")
    parser.add_argument("--plots", type=Path, default=Path("/tmp/gpulanes-simulate"),
                        metavar="DIR", help="PNG folder (default: /tmp/gpulanes-simulate)")
    parser.add_argument("--no-plots", action="store_true", help="write no PNG")
    parser.add_argument("--validate", action="store_true",
                        help="compare with a real 2-worker cluster instead (minutes; "
                             "see python -m benchmarks.simulate.validate --help)")
    args = parser.parse_args(argv)
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown or args.gpus < 1 or args.minutes <= 0 or not 0 <= args.cells <= args.gpus:
        parser.error(f"unknown scenario(s) {sorted(unknown)}" if unknown
                     else "--gpus must be >= 1, --minutes > 0 and --cells 0 to --gpus")
    return args


def simulate_all(args: argparse.Namespace, config: SimConfig) -> dict[str, Any]:
    """Run each chosen scenario (both modes on the same jobs) into one report."""
    began, scenarios, capacity = time.process_time(), {}, None
    for name in args.scenarios.split(","):
        found = run_cells(SCENARIOS[name], args.gpus, args.minutes * 60, args.seed, args.cells,
                          config) if args.cells else \
            run_scenario(SCENARIOS[name], args.gpus, args.minutes * 60, args.seed, config)
        capacity = found["capacity_jobs_s"]
        modes = {mode: o.figures for mode, o in found["outcomes"].items()}
        scenarios[name] = {"modes": modes, "versus": versus(modes),
                           "series": {mode: o.series for mode, o in found["outcomes"].items()}}
        print(f"  {name}: done ({sum(f['sim_cpu_s'] for f in modes.values()):.0f} s CPU)",
              file=sys.stderr, flush=True)
    return {"gpus": args.gpus, "minutes": args.minutes, "seed": args.seed,
            **({"cells": found["cells"]} if args.cells else {}),
            "budgets_s": dict(config.budgets_s), "relaxed_budget_s": config.relaxed_budget_s,
            "capacity_jobs_s": capacity, "scenarios": scenarios,
            "cpu_s": round(time.process_time() - began, 1)}


def _plots(report: dict[str, Any], folder: Path, config: SimConfig) -> list[str]:
    from benchmarks.simulate.plots import plot_scenario

    return [str(plot_scenario(name, result["series"], config.budgets_s, folder))
            for name, result in report["scenarios"].items()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = SimConfig()
    report = simulate_all(args, config)
    print_report(report)
    if not args.no_plots:
        report["plots"] = _plots(report, args.plots, config)
        print("plots: " + ", ".join(report["plots"]))
    for result in report["scenarios"].values():  # the figures, not the rounds
        result["series"] = {mode: {"waits": s["waits"]} for mode, s in result["series"].items()}
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Refusal soak: Redis out of memory, or refusing writes for a failing disk, while ten
jobs are in flight on a real cluster (``tests/harness/refusals.py``).

``python tests/soak/refusals.py`` starts a private cluster (an embedded Redis with
AOF on, two CPU workers taking five jobs at a time, beat; the default timeouts) and
runs each blip of ``--blips`` (``oom:4,oom:20,misconf:20`` by default: the fault and
its seconds) with ten jobs of four seconds in flight. It prints one row per blip: the
jobs, what a submit met meanwhile, how many were done, failed or lost, the seconds
after Redis took writes again by which the last was done, and the jobs whose model
ran to the end twice. It exits non-zero if a job failed or was lost, ran twice, or
was done more than ``--within-s`` after Redis healed; ``--json`` writes the rows.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.harness.private import run_private  # noqa: E402
from tests.harness.refusals import FAULTS, refusal_blip  # noqa: E402
from tests.harness.tables import markdown_table  # noqa: E402

HEADERS = ("fault", "seconds", "jobs", "submits refused", "done", "failed", "lost",
           "last done after heal (s)", "ran twice")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blips", default="oom:4,oom:20,misconf:20",
                        help="fault:seconds, comma-separated (faults: %s)" % ", ".join(FAULTS))
    parser.add_argument("--within-s", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def soak(blips: list[tuple[str, float]], state: Path) -> dict[str, Any]:
    from tasks import app
    from tasks.dev.cluster import LocalCluster

    rows = []
    with LocalCluster(state, workers=2, device="cpu") as cluster:
        cluster.start(app, fresh=True)
        for fault, seconds in blips:
            rows.append(refusal_blip(cluster.redis.client(), fault, seconds))
            print(rows[-1], flush=True)
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    blips = [(fault, float(seconds)) for fault, seconds in
             (blip.split(":") for blip in args.blips.split(","))]
    report = run_private("gl-refusals-", lambda state: soak(blips, state), "cluster stopped",
                         MODELS="demo=gpu_worker.demo_model:load,flaky=tests.flaky_model:load",
                         WARM_MODELS="flaky", MAX_BATCH="flaky=5",
                         MAX_QUEUE_DELAY_MS="flaky=500")
    if report is None:
        return 130
    rows = report["rows"]
    print(markdown_table(HEADERS, [
        (r["fault"], r["seconds"], r["jobs"], sum(r["refusals"].values()), r["done"],
         r["failed"], r["lost"], r["latest_s"], r["ran_twice"]) for r in rows]))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    bad = [r for r in rows if r["failed"] or r["lost"] or r["ran_twice"]
           or r["latest_s"] > args.within_s]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

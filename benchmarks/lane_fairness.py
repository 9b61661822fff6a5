"""Fair fast and standard lanes: a light account's wait while another floods its lane.

``python benchmarks/lane_fairness.py`` starts one local cluster (embedded Redis, TWO
gpulanes CPU workers, beat) and TWO plain Celery workers in their own processes (a Redis
database of their own, ``benchmarks/plain_app.py``). For each lane, fast and standard,
and each side:

1. *alone*: a light account sends jobs one at a time, paced, with the lane to itself;
2. *flooded*: a heavy account sends ``--flood`` jobs at once, and the light account
   the same paced jobs right behind, while the flood drains.

gpulanes' goal: the light account's p95 wait flooded stays within its p95 alone plus
one job's run time (the flood's jobs enter at a later level: ``routing.fair.
queued_level``): the time a job holds a worker, from its take to the worker's next
(the model's run, then its result and artifacts stored), measured as the flood's drain
time per job and worker (``service_ms``; ``run_ms``: the model's run alone). Plain Celery serves one FIFO list: the light account waits out the
flood. Waits are submit-to-start, stamped by the worker. The lanes' budgets are set
long, so that no job moves down a lane: what is measured is the order within one.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (  # noqa: E402
    JobSize,
    json_option,
    markdown_table,
    private_env,
    state_dir,
    write_json,
)
from benchmarks.plain_run import PlainClient, PlainWorkers, plain_env, plain_url  # noqa: E402

SIZE = JobSize(steps=8, size=128)
WORKERS = 2
LANES = ("standard", "fast")
#: (lane, account, seed) -> the job's AsyncResult.
Send = Callable[[str, str, int], Any]


def send(lane: str, account: str, seed: int) -> Any:
    """One job through gpulanes' ``submit()``, kept in its lane (not downgradable)."""
    from tasks.api import submit

    return submit(f"job {seed}", tier=lane, account=account, seed=seed, downgradable=False,
                  steps=SIZE.steps, width=SIZE.size, height=SIZE.size)


def plain_send(lane: str, account: str, seed: int) -> Any:
    """The same job on plain Celery: the FIFO queue named like the lane."""
    from benchmarks import plain_app

    return plain_app.send(lane, f"job {seed}", seed, SIZE)


def light_waits(publish: Send, lane: str, count: int, pace_s: float, tag: str) -> list[float]:
    """The light account's ``count`` jobs, one per ``pace_s``: their waits (ms)."""
    sent = []
    for i in range(count):
        sent.append(publish(lane, f"light-{tag}", 5000 + i))
        time.sleep(pace_s)
    return [r.get(timeout=600)["queued_ms"] for r in sent]


def trial(publish: Send, lane: str, flood: int, light: int, pace_s: float,
          tag: str) -> dict[str, Any]:
    """The light account alone, then flooded: its waits (ms), and the flood's run time."""
    alone = light_waits(publish, lane, light, pace_s, f"{tag}-alone")
    flooded = [publish(lane, f"heavy-{tag}", 10_000 + i) for i in range(flood)]
    with_flood = light_waits(publish, lane, light, pace_s, f"{tag}-flood")
    done = [r.get(timeout=1200) for r in flooded]
    drain_s = max(d["started_at"] for d in done) - min(d["started_at"] for d in done)
    return {"alone_ms": alone, "flooded_ms": with_flood,
            "run_ms": statistics.median(d["run_ms"] for d in done),
            "service_ms": round(drain_s * 1000 * WORKERS / (flood - 1), 2),
            "flood_drain_s": round(drain_s, 2)}


def plain_trial(lane: str, flood: int, light: int, pace_s: float, tag: str) -> dict[str, Any]:
    """:func:`trial` in the plain publisher's process."""
    return trial(plain_send, lane, flood, light, pace_s, tag)


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def summary(figures: dict[str, Any]) -> dict[str, Any]:
    """The goal's terms: p95 alone and flooded, the bound, whether it holds."""
    alone, flooded = p95(figures["alone_ms"]), p95(figures["flooded_ms"])
    bound = alone + figures["service_ms"]
    return {"alone_p95_ms": round(alone, 1), "flooded_p95_ms": round(flooded, 1),
            "run_ms": round(figures["run_ms"], 1), "bound_ms": round(bound, 1),
            "within_bound": flooded <= bound}


def run(state: Path, flood: int, light: int, pace_s: float) -> dict[str, Any]:
    """Both sides, each lane: the figures per lane and side."""
    from tasks import app
    from tasks.dev.cluster import LocalCluster

    cluster = LocalCluster(state, workers=WORKERS, device="cpu", beat=True)
    out: dict[str, Any] = {}
    try:
        cluster.start(app)
        env = plain_env(plain_url(cluster.url), state)
        with PlainWorkers(WORKERS, env, state / "logs"), PlainClient(env) as plain:
            for lane in LANES:
                mine = trial(send, lane, flood, light, pace_s, f"gl-{lane}")
                theirs = plain.call(plain_trial, lane, flood, light, pace_s, f"pl-{lane}")
                out[lane] = {"gpulanes": {**mine, **summary(mine)},
                             "plain": {**theirs, **summary(theirs)}}
    finally:
        cluster.stop()
    return out


def report(figures: dict[str, Any], flood: int) -> None:
    print(f"\nA light account's jobs while another sends {flood} at once, {WORKERS} workers "
          "(wait = submit to start, ms)\n")
    rows = [[lane, side, f"{f['alone_p95_ms']:.0f}", f"{f['flooded_p95_ms']:.0f}",
             f"{f['service_ms']:.0f}", f"{f['bound_ms']:.0f}",
             "yes" if f["within_bound"] else "no"]
            for lane, sides in figures.items() if lane in LANES
            for side, f in sides.items()]
    print(markdown_table(["lane", "side", "alone p95", "flooded p95", "one job",
                          "alone p95 + one job", "within"], rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flood", type=int, default=2000, help="the heavy account's jobs")
    parser.add_argument("--light", type=int, default=40, help="the light account's jobs")
    parser.add_argument("--pace-s", type=float, default=0.1,
                        help="seconds between two of the light account's jobs")
    json_option(parser, "lane_fairness")
    args = parser.parse_args(argv)
    with state_dir("gl-lanefair-") as state:
        # long budgets: no job moves down a lane; no fast places: the order alone is fair
        private_env(state, HEARTBEAT_S=1, MAX_WAIT_S="fast=3600,standard=3600",
                    FAST_JOBS_PER_ACCOUNT=0)
        began = time.monotonic()
        figures = run(state, args.flood, args.light, args.pace_s)
    figures.update(flood=args.flood, light=args.light, pace_s=args.pace_s, workers=WORKERS,
                   wall_s=round(time.monotonic() - began, 1))
    report(figures, args.flood)
    print(f"total wall time {figures['wall_s']:.0f}s")
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())

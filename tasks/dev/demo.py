"""``make demo``: a local cluster, a mixed workload through all three lanes, a report.

Starts the embedded Redis (AOF on, under GPULANES_STATE_DIR), two GPU workers
(CPU stand-ins without a GPU) and beat; submits 10 fast, 20 standard and 40
relaxed jobs at once; shows progress; prints latency per lane; writes PNGs to
GPULANES_ARTIFACT_DIR; stops everything.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

from tasks import app, submit
from tasks.dev.cluster import LocalCluster
from tasks.dev.report import Progress, lane_table
from tasks.settings import settings

PROMPTS = ("a lighthouse in a storm", "neon koi pond", "desert at dawn",
           "a cathedral of glass", "moss on old stone", "aurora over a fjord")


def workload(counts: dict[str, int], seed: int) -> list[tuple[str, str]]:
    """(tier, prompt) pairs, shuffled so the lanes interleave as real traffic does."""
    rng = random.Random(seed)
    jobs = [(tier, rng.choice(PROMPTS)) for tier, n in counts.items() for _ in range(n)]
    rng.shuffle(jobs)
    return jobs


def run(counts: dict[str, int], workers: int, device: str, steps: int, size: int) -> int:
    if not settings.embedded_broker:
        sys.exit("the demo runs its own embedded Redis under GPULANES_STATE_DIR; "
                 "unset GPULANES_BROKER_URL to run it")
    cluster = LocalCluster(settings.state_dir, workers=workers, device=device)
    try:
        print(f"starting embedded Redis, {workers} GPU worker(s) on {device} and beat ...")
        cluster.start(app, fresh=True)
        began = time.monotonic()
        done, total = _drive(workload(counts, seed=7), steps, size)
        print(lane_table(done))
        print(f"{len(done)} jobs in {time.monotonic() - began:.1f}s; "
              f"PNGs in {settings.artifact_dir}")
        return 0 if len(done) == total else 1
    finally:
        cluster.stop()


def _drive(jobs: list[tuple[str, str]], steps: int, size: int) -> tuple[list[dict], int]:
    """Submit and wait; the AsyncResults die here, while Redis still answers them."""
    results = [submit(prompt, tier=tier, account=f"user{i % 7}", steps=steps,
                      width=size, height=size, seed=i) for i, (tier, prompt) in enumerate(jobs)]
    return Progress(len(results)).wait(results, timeout_s=settings.max_job_s * 2), len(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.dev.demo", description=__doc__)
    parser.add_argument("--fast", type=int, default=10)
    parser.add_argument("--standard", type=int, default=20)
    parser.add_argument("--relaxed", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default=settings.device, choices=("auto", "cpu", "cuda"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args(argv)
    counts = {"fast": args.fast, "standard": args.standard, "relaxed": args.relaxed}
    return run(counts, args.workers, args.device, args.steps, args.size)


if __name__ == "__main__":
    sys.exit(main())

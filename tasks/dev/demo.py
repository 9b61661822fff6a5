"""``make demo``: a local cluster, a mixed workload through all three lanes, a report.

Starts the embedded Redis (AOF on, under GPULANES_STATE_DIR), two GPU workers
(CPU stand-ins without a GPU) and beat; submits 10 fast, 20 standard and 40
relaxed image jobs of the ``demo`` model, 9 jobs of the ``echo`` model (a class
of the general contract: its output comes back as JSON) and 6 jobs of the ``faces``
model (trained weights: a grid of 4 faces each, as an artifact) at once; shows
progress; prints latency per lane, what each model returned and where the faces
are; writes PNGs to GPULANES_ARTIFACT_DIR; stops everything.
"""
from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time

from routing.names import LANES
from tasks import app, submit
from tasks.dev.cluster import LocalCluster
from tasks.dev.report import Progress, lane_table
from tasks.models.faces import DISTRIBUTION, INSTALL_HINT, PACKAGE
from tasks.settings import settings

#: Faces in each faces job's grid.
FACES_PER_JOB = 4
PROMPTS = ("a lighthouse in a storm", "neon koi pond", "desert at dawn",
           "a cathedral of glass", "moss on old stone", "aurora over a fjord")


def workload(counts: dict[str, int], seed: int) -> list[tuple[str, str]]:
    """(tier, prompt) pairs, shuffled so the lanes interleave as real traffic does."""
    rng = random.Random(seed)
    jobs = [(tier, rng.choice(PROMPTS)) for tier, n in counts.items() for _ in range(n)]
    rng.shuffle(jobs)
    return jobs


def run(counts: dict[str, int], workers: int, device: str, steps: int, size: int,
        echoes: int = 9, faces: int = 6) -> int:
    if not settings.embedded_broker:
        sys.exit("the demo runs its own embedded Redis under GPULANES_STATE_DIR; "
                 "unset GPULANES_BROKER_URL to run it")
    if faces and importlib.util.find_spec(PACKAGE) is None:
        print(f"no faces jobs: {DISTRIBUTION} is not installed ({INSTALL_HINT})")
        faces = 0
    cluster = LocalCluster(settings.state_dir, workers=workers, device=device)
    try:
        print(f"starting embedded Redis, {workers} GPU worker(s) on {device} and beat ...")
        cluster.start(app, fresh=True)
        began = time.monotonic()
        done, total = _drive(workload(counts, seed=7), steps, size, echoes, faces)
        print(lane_table(done))
        print(model_lines(done))
        if faces:
            print(face_lines(done))
        print(f"{len(done)} jobs in {time.monotonic() - began:.1f}s; "
              f"PNGs in {settings.artifact_dir}")
        return 0 if len(done) == total else 1
    finally:
        cluster.stop()


def _drive(jobs: list[tuple[str, str]], steps: int, size: int, echoes: int,
           faces: int) -> tuple[list[dict], int]:
    """Submit and wait; the AsyncResults die here, while Redis still answers them."""
    results = [submit(prompt, tier=tier, account=f"user{i % 7}", steps=steps,
                      width=size, height=size, seed=i) for i, (tier, prompt) in enumerate(jobs)]
    results += [submit(model="echo", text=f"echo {i} ", repeat=2, tier=LANES[i % len(LANES)],
                       account=f"user{i % 7}") for i in range(echoes)]
    results += [submit(model="faces", seed=i + 1, count=FACES_PER_JOB, scale=2,
                       tier=LANES[i % len(LANES)], account=f"user{i % 7}") for i in range(faces)]
    return Progress(len(results)).wait(results, timeout_s=settings.max_job_s * 2), len(results)


def model_lines(results: list[dict]) -> str:
    """Per model: how many jobs, and one example of what it returned."""
    lines = []
    for model in sorted({r["model"] for r in results}):
        mine = [r for r in results if r["model"] == model]
        example = mine[0].get("output") or mine[0].get("image")
        lines.append(f"{model:<9}{len(mine):>5} jobs, e.g. {example}")
    return "\n".join(lines)


def face_lines(results: list[dict]) -> str:
    """Where each faces job's grid is, by seed."""
    grids = sorted((r["output"]["seed"], r["output"]["image"]["url"])
                   for r in results if r["model"] == "faces")
    rows = [f"  seed {seed:<4}{url}" for seed, url in grids]
    return "\n".join([f"faces, a grid of {FACES_PER_JOB} per job:", *rows]) if rows else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.dev.demo", description=__doc__)
    parser.add_argument("--fast", type=int, default=10)
    parser.add_argument("--standard", type=int, default=20)
    parser.add_argument("--relaxed", type=int, default=40)
    parser.add_argument("--echo", type=int, default=9, help="jobs of the echo model")
    parser.add_argument("--faces", type=int, default=6, help="jobs of the faces model")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default=settings.device, choices=("auto", "cpu", "cuda"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args(argv)
    counts = {"fast": args.fast, "standard": args.standard, "relaxed": args.relaxed}
    return run(counts, args.workers, args.device, args.steps, args.size, args.echo,
               args.faces)


if __name__ == "__main__":
    sys.exit(main())

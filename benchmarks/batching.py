"""Jobs/s of one worker at max_batch 1, 4 and 8 on the demo model, side by side.

``python benchmarks/batching.py`` starts one embedded Redis and, for each
setting, a fresh single-worker cluster (CPU, no beat) with
``GPULANES_MAX_BATCH=demo=<B>`` (the supervisor gives it B pool threads), warms
it with one round of B jobs, then publishes the same stream of ``--jobs``
seeded jobs (standard lane, result cache off) at once and waits for all of
them. jobs/s = jobs / (first publish .. last result). Batch 1 is the worker
exactly as without batching. Every batched pass is one ``generate_batch``
call of the demo model; ``mean batch`` is the batch size the results report.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import PROMPT, JobSize, check_size, json_option, markdown_table, run_private, write_json  # noqa: E402

BATCHES = (1, 4, 8)
GOAL_RATIO = 3.0
ACCOUNT = "bench"


def stream(jobs: int, size: JobSize, first_seed: int = 0) -> list[Any]:
    """Publish ``jobs`` seeded jobs of one shape (distinct seeds) and return their results."""
    from tasks.api import submit

    return [submit(f"{PROMPT} {i % 7}", tier="standard", account=ACCOUNT, seed=first_seed + i,
                   steps=size.steps, width=size.size, height=size.size) for i in range(jobs)]


def one_setting(batch: int, args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """A fresh worker with max_batch ``batch``; the stream's throughput and batch sizes."""
    from celery.result import ResultSet

    from tasks import app
    from tasks.dev.cluster import LocalCluster

    size = JobSize(args.steps, args.size)
    env = {"GPULANES_MAX_BATCH": f"demo={batch}",
           "GPULANES_MAX_QUEUE_DELAY_MS": f"demo={args.delay_ms:g}"}
    cluster = LocalCluster(state, workers=1, device=args.device, beat=False,
                           log_dir=state / f"batch{batch}", env=env)
    try:
        cluster.start(app)
        ResultSet(stream(batch, size, first_seed=10**6)).get(timeout=120)  # warm-up round
        began = time.monotonic()
        done = ResultSet(stream(args.jobs, size)).get(timeout=600)
        wall_s = time.monotonic() - began
    finally:
        cluster.stop()
    return {"batch": batch, "jobs": len(done), "wall_s": wall_s, "jobs_per_s": len(done) / wall_s,
            "mean_batch": statistics.fmean(r["batch_size"] for r in done),
            "run_ms": statistics.fmean(r["run_ms"] for r in done)}


def bench(state: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every setting on its own fresh worker, on one Redis emptied in between."""
    from gpu_worker.redis_server import EmbeddedRedis

    check_size("batching.py", JobSize(args.steps, args.size), ACCOUNT)
    redis = EmbeddedRedis(state).start()
    try:
        rows = []
        for batch in args.batches:
            redis.client().flushall()
            rows.append(one_setting(batch, args, state))
            print(f"  max_batch {batch}: {rows[-1]['jobs_per_s']:.1f} jobs/s", file=sys.stderr)
        return {"config": vars(args) | {"json": None}, "rows": rows}
    finally:
        redis.stop()


def table(rows: list[dict[str, Any]]) -> str:
    base = rows[0]["jobs_per_s"]
    return markdown_table(
        ["max_batch", "jobs", "wall s", "jobs/s", "vs batch 1", "mean batch", "model ms per job"],
        [[r["batch"], r["jobs"], f"{r['wall_s']:.1f}", f"{r['jobs_per_s']:.1f}",
          f"{r['jobs_per_s'] / base:.2f}x", f"{r['mean_batch']:.2f}", f"{r['run_ms']:.1f}"]
         for r in rows])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python benchmarks/batching.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=240, help="jobs per setting")
    parser.add_argument("--batches", type=lambda raw: [int(b) for b in raw.split(",")],
                        default=list(BATCHES), help="max_batch settings, the first the base")
    parser.add_argument("--steps", type=int, default=4, help="denoising steps per job")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--delay-ms", type=float, default=10.0, help="max_queue_delay_ms")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the worker runs (cuda: one worker on GPU 0)")
    json_option(parser, "batching")
    args = parser.parse_args(argv)
    if args.jobs < 1 or min(args.batches) < 1:
        parser.error("--jobs and every batch must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run_private("gl-batch-", lambda state: bench(state, args), "clusters stopped")
    if report is None:
        return 130
    rows = report["rows"]
    print(table(rows))
    ratio = rows[-1]["jobs_per_s"] / rows[0]["jobs_per_s"]
    print(f"\nmax_batch {rows[-1]['batch']}: {ratio:.2f}x the jobs/s of max_batch "
          f"{rows[0]['batch']} (goal >= {GOAL_RATIO:g}x at 8: "
          f"{'met' if ratio >= GOAL_RATIO else 'NOT met'}); {args.steps} steps at "
          f"{args.size}x{args.size}, one {args.device} worker, GPULANES_TORCH_THREADS default; "
          f"total wall time {report['wall_s']:.0f}s")
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

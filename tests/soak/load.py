"""Load soak: a burst of submits from several processes against one small cluster.

``python tests/soak/load.py [--jobs 20000 --procs 4]`` starts a local
cluster (its own embedded Redis, ``--workers`` CPU workers, beat), then
``--procs`` submitter processes (``tests/soak/load_submit.py``) that together
call ``submit()`` ``--jobs`` times as fast as they can: 20 % fast, 30 %
standard, 50 % relaxed, eight accounts, one job in ten seeded (result cache
and coalescing), each a few-millisecond generation. The workers drain far
slower than the burst arrives, so the lane limits (``GPULANES_MAX_DEPTH``,
the defaults unless ``--max-depth`` is given) must push back. Then it waits
(at most ``--drain`` s) for every accepted job.

It prints two tables and exits 1 if any bound is broken:

- the burst: accepted, refused with ``LaneFull`` (by requested tier), other
  errors (must be 0), jobs spilled to a lower lane at submit, the deepest
  each lane got against its limit, what became of the accepted jobs (lost
  must be 0), the queue wait of fast jobs against the fast budget (``GPULANES_MAX_WAIT_S``),
  and Redis' memory against what the lane limits allow;
- memory per process: each submitter at the start, middle and end of its
  share, and the workers, beat and Redis over the first and second half of
  the run (burst + drain): memory that grows with the number of jobs shows
  as a second half above the first.
"""
from __future__ import annotations

import argparse
import multiprocessing
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.harness.private import run_private  # noqa: E402
from tests.harness.tables import markdown_table  # noqa: E402
from tests.soak.load_probe import Probe, collect, process_tree  # noqa: E402
from tests.soak.load_report import memory_rows, report_rows  # noqa: E402
from tests.soak.load_submit import Outcome, Share, run_share, status_kb  # noqa: E402

HEARTBEAT_S = 1  # beat works in whole seconds


@dataclass
class Burst:
    """What the submitters reported, and when the burst began and ended."""

    outcomes: list[Outcome]
    began: float
    ended: float


def run_burst(jobs: int, procs: int, seed: int = 1, timeout_s: float = 600) -> Burst:
    """``jobs`` submits from ``procs`` spawned processes that start together."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(procs + 1), ctx.Queue()
    shares = [Share(i, jobs // procs + (i < jobs % procs), seed * 1000 + i) for i in range(procs)]
    children = [ctx.Process(target=run_share, args=(share, barrier, results), daemon=True)
                for share in shares]
    for child in children:
        child.start()
    try:
        barrier.wait(timeout=180)
    except threading.BrokenBarrierError:
        pass  # a submitter could not start: its outcome names the error
    began, outcomes = time.monotonic(), []
    try:
        for _ in children:
            outcomes.append(results.get(timeout=timeout_s))
    except queue.Empty as exc:
        raise RuntimeError(f"only {len(outcomes)} of {procs} submitters reported") from exc
    finally:
        _reap(children)
    return Burst(sorted(outcomes, key=lambda o: o.index), began, time.monotonic())


def _reap(children: list[Any]) -> None:
    for child in children:
        child.join(10)
        if child.is_alive():
            child.kill()


def accepted_ids(burst: Burst) -> list[str]:
    return [job_id for outcome in burst.outcomes for job_id, _ in outcome.accepted]


def stored_bytes_per_job(client: Any, app: Any, job_ids: list[str]) -> float:
    """Mean Redis memory a finished job leaves behind (its result, first-result and
    attempt keys), over a few of them."""
    from tasks.broker.keys import attempts_key, done_key

    sample = job_ids[:: max(1, len(job_ids) // 20)][:20]
    total = 0
    for job_id in sample:
        for key in (app.backend.get_key_for_task(job_id), done_key(job_id),
                    attempts_key(job_id)):
            total += client.memory_usage(key) or 0
    return total / len(sample) if sample else 0.0


def soak(cluster: Any, app: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Run the burst on a started cluster, wait for its jobs, gather the figures."""
    client = cluster.redis.client()
    pids = {**process_tree(cluster.supervisor.pid, "supervisor"), "beat": cluster.beat.pid,
            "redis": cluster.redis.process.pid}
    probe = Probe(client, cluster.hostnames, pids).start()
    before = probe.samples[0].used_memory
    try:
        burst = run_burst(args.jobs, args.procs, args.seed)
        ids = accepted_ids(burst)
        fate = collect(app, client, ids, args.drain)
    finally:
        probe.stop()
    hwm_kb = {name: status_kb(pid, "VmHWM") for name, pid in pids.items()}
    return {"burst": burst, "fate": fate, "probe": probe, "redis_before": before,
            "hwm_kb": hwm_kb,
            "drained_at": time.monotonic(), "stored_bytes": stored_bytes_per_job(
                client, app, list(fate.results))}


def lane_limits() -> dict[str, int]:
    from tasks.settings import settings
    return dict(settings.max_depth)


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """Start the cluster, soak it, stop it."""
    from tasks import app
    from tasks.dev.cluster import LocalCluster

    cluster = LocalCluster(state, workers=args.workers, device="cpu", beat=True,
                           log_dir=state / "logs")
    print(f"starting embedded Redis, {args.workers} CPU workers and beat ...",
          file=sys.stderr, flush=True)
    with cluster:
        cluster.start(app, fresh=True)
        print(f"{args.procs} submitters, {args.jobs} jobs ...", file=sys.stderr, flush=True)
        figures = soak(cluster, app, args)
    from tasks.settings import settings
    figures.update(max_depth=lane_limits(), budget_s=settings.max_wait_s["fast"], procs=args.procs,
                   jobs=args.jobs)
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python tests/soak/load.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20000, help="submits in all (20000)")
    parser.add_argument("--procs", type=int, default=4, help="submitter processes (4)")
    parser.add_argument("--workers", type=int, default=2, help="CPU workers (2)")
    parser.add_argument("--drain", type=float, default=300.0,
                        help="longest wait for the accepted jobs, s (300)")
    parser.add_argument("--max-depth", metavar="F,S,R",
                        help="lane limits fast,standard,relaxed (default: the settings')")
    parser.add_argument("--seed", type=int, default=1, help="seed of the job mix")
    args = parser.parse_args(argv)
    if args.jobs < args.procs or args.procs < 1 or args.workers < 1:
        parser.error("need --procs >= 1, --workers >= 1 and --jobs >= --procs")
    return args


def depth_settings(raw: str | None) -> dict[str, str]:
    """``"500,2000,10000"`` -> the MAX_DEPTH setting (no prefix)."""
    if not raw:
        return {}
    fast, standard, relaxed = raw.split(",")
    return {"MAX_DEPTH": f"fast={fast},standard={standard},relaxed={relaxed}"}


def main(argv: list[str] | None = None) -> int:
    """Run the soak and print its tables; 1 when a bound is broken, 130 after Ctrl-C."""
    args = parse_args(argv)
    figures = run_private("gl-soak-", lambda state: benchmark(args, state),
                          "the cluster is stopped", HEARTBEAT_S=HEARTBEAT_S, CACHE="on",
                          **depth_settings(args.max_depth))
    if figures is None:
        return 130
    rows = report_rows(figures)
    print(markdown_table(("figure", "measured", "bound", "ok"), rows, "llll"))
    print()
    print(markdown_table(("process", "start MB", "middle MB", "end MB", "peak MB"),
                         memory_rows(figures)))
    print(f"\nwall {figures['wall_s']:.0f} s")
    return 0 if all(row[3] != "NO" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Fault soak: a stream of jobs through a real cluster while it is broken on purpose.

``python benchmarks/soak_faults.py`` starts a private cluster (an embedded Redis
with AOF on, ``--workers`` CPU workers, beat) whose visibility timeout is short
(``--visibility-s``), and runs, one after another, each while jobs stream in at
``--rate`` per second:

1. **worker SIGKILL**: ``--kills`` times, ``--kill-every-s`` after the last
   one is back, a random worker is SIGKILLed wherever it is (running a job,
   or waiting for one; the supervisor's restart backoff grows with each kill);
2. **Redis restart**: Redis is SIGKILLed, stays down ``--redis-down-s``, and is
   restarted from its AOF; workers and this (submitting) process reconnect by
   themselves; submits while it is down are refused, not accepted;
3. **long jobs**: ``--long-jobs`` jobs that run longer than the visibility
   timeout, among the stream; each must be delivered and run once;
4. **supervisor restart**: ``python -m gpu_worker`` is SIGKILLed (its workers
   get SIGTERM and finish what they hold) and started again at once.

Then it prints one markdown table: per scenario the jobs submitted, accepted
(``submit()`` returned), refused (it raised), completed, failed, re-run (more
than one run began: a killed run, then another), duplicated (more than one run
finished) and lost (accepted, no result by the deadline; must be 0), and the
scenario's seconds. See ``benchmarks/faults.py`` for how each is counted.
``--quick`` runs a small size; ``--only`` some scenarios; ``--json`` writes
the rows.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import markdown_table, run_private  # noqa: E402
from benchmarks.faults import (HEADERS, Counts, JobStream, kill_a_worker,  # noqa: E402
                               kill_supervisor, settle, small_job, wait_replaced)

SCENARIOS = ("kill", "redis", "long", "supervisor")
#: A long job: about ten seconds of the demo model on one CPU thread here.
LONG_JOB = dict(steps=150, width=1024, height=1024)
SETTLE_S = 60.0  # generous: a job here takes milliseconds, a long one seconds


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=25.0, help="jobs offered per second")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--kill-every-s", type=float, default=2.0)
    parser.add_argument("--stream-s", type=float, default=30.0,
                        help="stream length of the other scenarios (split around the fault)")
    parser.add_argument("--redis-down-s", type=float, default=5.0)
    parser.add_argument("--visibility-s", type=int, default=3)
    parser.add_argument("--long-jobs", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="a small size (the test's)")
    parser.add_argument("--only", action="append", choices=SCENARIOS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.kill_every_s, args.stream_s, args.redis_down_s = 2, 3.0, 5.0, 2.0
        args.long_jobs = 1
    return args


# --- the scenarios: each streams, breaks something, settles --------------------------
def worker_kills(args: argparse.Namespace, cluster: Any, app: Any, client: Any) -> Counts:
    rng, stream = random.Random(1), JobStream().start(args.rate)
    for _ in range(args.kills):
        time.sleep(args.kill_every_s)  # the fault's own clock: a kill every few seconds
        host, pid = kill_a_worker(app, args.workers, rng)
        if not wait_replaced(app, host, pid):
            print(f"warning: {host} did not come back", file=sys.stderr)
    stream.stop()
    counts = settle(stream, "", client, SETTLE_S)
    from beat.ledger import RECOVERED_FIELD
    from routing.names import METRICS_KEY

    put_back = int(client.hget(METRICS_KEY, RECOVERED_FIELD) or 0)
    counts.scenario = (f"worker SIGKILL x{args.kills} ({put_back} popped and lost by a "
                       "killed worker, put back from the ledger)")
    return counts


def redis_restart(args: argparse.Namespace, cluster: Any, app: Any, client: Any) -> Counts:
    stream = JobStream().start(args.rate)
    time.sleep(args.stream_s / 2)
    cluster.redis.kill()
    time.sleep(args.redis_down_s)  # the outage itself
    cluster.redis.start()
    time.sleep(args.stream_s / 2)
    stream.stop()
    return settle(stream, f"Redis SIGKILL, {args.redis_down_s:g}s down, AOF restart",
                  cluster.redis.client(), SETTLE_S)


def long_jobs(args: argparse.Namespace, cluster: Any, app: Any, client: Any) -> Counts:
    long_every = max(2, int(args.rate * args.stream_s / max(1, args.long_jobs)))

    def job(index: int) -> dict[str, Any]:
        if index % long_every == 1:
            return {"prompt": f"long job {index}", "tier": "standard", **LONG_JOB}
        return small_job(index)

    stream = JobStream(job).start(args.rate, limit=int(args.rate * args.stream_s))
    stream.wait_for(int(args.rate * args.stream_s), args.stream_s * 3)
    stream.stop()
    counts = settle(stream, "", client, SETTLE_S)
    long_ids = [i for i, r in stream.accepted.items()
                if r.ready() and r.successful() and r.result["steps"] == LONG_JOB["steps"]]
    log = (cluster.log_dir / "workers.log").read_text(errors="replace")
    again = sum(log.count(f"gpulanes.generate[{i}] received") > 1 for i in long_ids)
    longest_s = max((stream.accepted[i].result["run_ms"] for i in long_ids), default=0) / 1000
    counts.scenario = (f"{len(long_ids)} jobs of up to {longest_s:.0f}s > visibility "
                       f"{args.visibility_s}s (delivered twice: {again})")
    return counts


def supervisor_restart(args: argparse.Namespace, cluster: Any, app: Any,
                       client: Any) -> Counts:
    stream = JobStream().start(args.rate)
    time.sleep(args.stream_s / 2)
    kill_supervisor(cluster)
    cluster.start_workers()
    time.sleep(args.stream_s / 2)
    stream.stop()
    return settle(stream, "supervisor SIGKILL + restart", client, SETTLE_S)


RUNS: dict[str, Callable[..., Counts]] = {"kill": worker_kills, "redis": redis_restart,
                                          "long": long_jobs, "supervisor": supervisor_restart}


def soak(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    from tasks import app
    from tasks.cluster import LocalCluster

    rows = []
    with LocalCluster(state, workers=args.workers, device="cpu") as cluster:
        cluster.start(app, fresh=True)
        for name in args.only or SCENARIOS:
            counts = RUNS[name](args, cluster, app, cluster.redis.client())
            print(markdown_table(HEADERS, [counts.row()]).splitlines()[-1], flush=True)
            rows.append(counts)
            gc.collect()  # results unsubscribe while Redis still answers, not at exit
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run_private("gl-soak-", lambda state: soak(args, state), "cluster stopped",
                         VISIBILITY_TIMEOUT_S=args.visibility_s, HEARTBEAT_S=1,
                         HEARTBEAT_REPLY_S="0.3")
    if report is None:
        return 130
    rows = report["rows"]
    print(f"\n{args.workers} CPU workers, {args.rate:g} jobs/s offered, "
          f"visibility timeout {args.visibility_s}s, {report['wall_s']:.0f}s in all\n")
    print(markdown_table(HEADERS, [c.row() for c in rows]))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in rows], indent=2) + "\n")
    return 1 if any(c.lost for c in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

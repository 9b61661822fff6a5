"""How close the lanes' expected wait comes to the wait a job then has, when jobs
differ in size: priced by each queued job's cost, or counted (depth x service time).

``python benchmarks/estimate.py`` starts a private cluster (an embedded Redis, ONE
CPU worker, beat at a 1 s heartbeat) serving the built-in ``demo`` image model, and
runs a mix of job sizes one at a time so the worker has fitted its line in cost.
Then for each scenario:

1. ``--prime`` jobs of the *recent* size run one at a time (the lane's measured
   service time is theirs);
2. ``depth`` jobs of the *queued* size are published at once;
3. the next snapshot beat writes is read: its ``expected_wait_s`` for the lane
   (what gpulanes estimates: queued jobs priced by their cost) and, from the same
   snapshot, what counting them gives (the lane's depth x its service time, the
   running job as before);
4. a small probe job is published; the wait it had (its start minus the
   snapshot's ``measured_at``) is the truth both are compared with.

The scenarios are the two ways a count goes wrong: big jobs queued behind small
recent ones (a count says far too little), and small jobs behind big recent ones
(a count says far too much). Both estimates come from one snapshot of one run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import finish, json_option, markdown_table, run_private  # noqa: E402

#: (steps, side) of the job sizes: small, the default (cost 1.0), big.
SIZES = {"small": (4, 64), "default": (20, 256), "big": (40, 384)}
#: (recent size, queued size, depth) of each scenario.
SCENARIOS = (("small", "big", 20), ("big", "small", 300), ("default", "default", 60))
LANE = "standard"


class Jobs:
    """Seeds never repeat: no two jobs are one run."""

    def __init__(self) -> None:
        self.seed = 0

    def send(self, size: str) -> Any:
        from tasks import submit

        steps, side = SIZES[size]
        self.seed += 1
        return submit(f"estimate {size}", tier=LANE, seed=self.seed, steps=steps,
                      width=side, height=side)


def next_snapshot(client: Any, after: float, depth: int, timeout_s: float = 10.0) -> dict:
    """The first snapshot measured after ``after`` that sees at least ``depth`` jobs."""
    from tasks.broker.keys import SNAPSHOT_KEY, WORKERS_KEY

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        raw, records = client.pipeline().get(SNAPSHOT_KEY).hgetall(WORKERS_KEY).execute()
        snapshot = json.loads(raw or "{}")
        snapshot["workers"] = {h: json.loads(w) for h, w in records.items()}  # beat's record
        if snapshot.get("measured_at", 0) > after:
            if snapshot["lanes"][LANE]["depth"] >= depth:
                return snapshot
            raise SystemExit(f"the queue drained before beat measured it "
                             f"({snapshot['lanes'][LANE]['depth']} < {depth}): raise the depth")
        time.sleep(0.02)
    raise SystemExit("no snapshot from beat within 10 s")


def counted_s(snapshot: dict) -> float:
    """The wait a count gives: the jobs ahead (this lane and the lanes above) times
    their lane's service time, plus half of each running job, over the job slots."""
    from routing.policy import expected_waits

    lanes = snapshot["lanes"]
    depths = {lane: load["depth"] for lane, load in lanes.items()}
    service = {lane: load["service_s"] for lane, load in lanes.items()}
    from routing.placement import serving

    workers = [w for w in snapshot["workers"].values() if serving(w)]
    slots = sum(w.get("concurrency", 1) for w in workers)
    in_flight = sum(load["in_flight"] for load in lanes.values())
    return expected_waits(depths, service, in_flight, slots)[LANE]


def scenario(client: Any, jobs: Jobs, recent: str, queued: str, depth: int,
             prime: int) -> dict[str, Any]:
    for _ in range(prime):
        jobs.send(recent).get(timeout=120)
    time.sleep(1.2)  # one heartbeat: the worker's figures include the primed jobs
    burst_at = time.time()
    burst = [jobs.send(queued) for _ in range(depth)]
    snapshot = next_snapshot(client, burst_at, min(10, depth))
    probe = jobs.send("small")
    done = probe.get(timeout=600)
    for result in burst:
        result.get(timeout=600)
    actual = done["started_at"] - snapshot["measured_at"]
    load = snapshot["lanes"][LANE]
    return {"recent": recent, "queued": queued, "depth": load["depth"], "actual_s": actual,
            "priced_s": load["expected_wait_s"], "counted_s": counted_s(snapshot),
            "service_s": load["service_s"], "queued_job_s": load["queued_job_s"]}


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    from tasks import app
    from tasks.broker.store import broker_client
    from tasks.dev.cluster import LocalCluster

    cluster = LocalCluster(state, workers=1, device="cpu", beat=True, log_dir=state / "logs")
    try:
        print("starting embedded Redis, one worker (cpu) and beat ...", file=sys.stderr,
              flush=True)
        cluster.start(app)
        jobs, client = Jobs(), broker_client()
        for i in range(args.warm):  # the worker's line in cost: sizes in turn
            jobs.send(tuple(SIZES)[i % len(SIZES)]).get(timeout=120)
        rows = []
        for recent, queued, depth in SCENARIOS:
            rows.append(scenario(client, jobs, recent, queued, depth, args.prime))
            print(f"  {rows[-1]}", file=sys.stderr, flush=True)
        return {"scenarios": rows}
    finally:
        cluster.stop()


def report(figures: dict[str, Any]) -> None:
    rows = [[f"{r['depth']} {r['queued']} behind {r['recent']}", f"{r['actual_s']:.2f}",
             f"{r['priced_s']:.2f}", f"{r['priced_s'] / r['actual_s']:.2f}x",
             f"{r['counted_s']:.2f}", f"{r['counted_s'] / r['actual_s']:.2f}x"]
            for r in figures["scenarios"]]
    print("\none CPU worker, demo model; sizes (steps, side): "
          + ", ".join(f"{name} {size}" for name, size in SIZES.items()) + "\n")
    print(markdown_table(["queue", "actual wait s", "priced s", "priced / actual",
                          "counted s", "counted / actual"], rows))
    print(f"\ntotal wall time {figures['wall_s']:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/estimate.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm", type=int, default=30, help="mixed jobs run first")
    parser.add_argument("--prime", type=int, default=12,
                        help="jobs of the recent size before each burst")
    json_option(parser, "estimate")
    args = parser.parse_args(argv)
    figures = run_private("gl-est-", lambda state: benchmark(args, state),
                          "the cluster is stopped", HEARTBEAT_S=1)
    return finish(figures, report, args.json)


if __name__ == "__main__":
    sys.exit(main())

"""Fault soak: a stream of jobs through a real cluster while it is broken on purpose.

``python tests/soak/faults.py`` starts a private cluster (an embedded Redis
with AOF on, ``--workers`` CPU workers, beat) with the default timeouts, and runs, one after another, each while jobs stream in at ``--rate``
per second:

1. **worker SIGKILL**: ``--kills`` times, ``--kill-every-s`` after the last
   one is back, a random worker is SIGKILLed wherever it is (running a job,
   or waiting for one; the supervisor's restart backoff grows with each kill);
2. **worker SIGSTOP**: ``--freezes`` times the worker running a job of a second
   or two is paused for ``--freeze-s`` (three times the heartbeat miss window:
   the job runs again elsewhere meanwhile) and then resumed: its run must stop
   as stale;
3. **Redis restart**: Redis is SIGKILLed while long jobs run, stays down
   ``--redis-down-s``, and is restarted from its AOF; workers and this
   (submitting) process reconnect by themselves; submits while it is down are
   refused, not accepted; the jobs that were running must finish within
   seconds of the restart (their workers take the lapsed lease again);
4. **Redis SIGSTOP**: Redis stops answering for ``--redis-freeze-s`` without
   closing a connection; submits meanwhile must raise ``BrokerUnavailable``
   within about ``GPULANES_REDIS_TIMEOUT_S``, jobs finishing meanwhile must
   not be reported failed, and a seeded job refused meanwhile must run when
   submitted again (no claim of it left behind);
5. **freeze, then crash**: a worker running a long job is paused until the
   job runs on another worker, resumed, and the new holder is SIGKILLed;
6. **supervisor restart**: ``python -m gpu_worker`` is SIGKILLed (its workers
   get SIGTERM and finish what they hold) and started again at once;
7. **full disk** (root only): the workers write artifacts to a 1 MB tmpfs held
   full for ``--full-disk-s`` under ``--full-disk-jobs`` jobs of 100 kB artifacts
   (``tests/soak/full_disk.py``): no worker comes back while it is full, and no
   model runs twice to its end;
8. **long jobs**: ``--long-jobs`` jobs that run several times their lease's life,
   among the stream; each must be delivered and run once (nothing hands a job out
   again on a timer).

Then it prints one markdown table: per scenario the jobs submitted, accepted
(``submit()`` returned), refused (it raised), completed, failed, falsely
failed, re-run (more than one run began: a killed run, then another),
duplicated (more than one run finished) and lost (accepted, no result by the
deadline; must be 0), and the scenario's seconds. See ``tests/harness/faults.py``
for how each is counted. ``--quick`` runs a small size; ``--only`` some
scenarios; ``--json`` writes the rows.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from routing.names import JOB_TASK  # noqa: E402
from tests.harness.faults import (  # noqa: E402
    HEADERS,
    SMALL,
    Counts,
    JobStream,
    keep_evidence,
    kill_a_worker,
    kill_supervisor,
    settle,
    small_job,
    wait_replaced,
)
from tests.harness.private import run_private  # noqa: E402
from tests.harness.tables import markdown_table  # noqa: E402
from tests.soak.full_disk import full_disk  # noqa: E402

SCENARIOS = ("kill", "freeze", "redis", "redis-freeze", "freeze-crash", "supervisor",
             "full-disk", "long")
#: Run unless ``--only`` says otherwise.
DEFAULT_SCENARIOS = SCENARIOS
#: A long job: about ten seconds of the demo model on one CPU thread here.
LONG_JOB = dict(steps=150, width=1024, height=1024)
#: A job of a second or two here: long enough to be frozen or cut off in the middle of.
MEDIUM_JOB = dict(steps=100, width=512, height=512)
SETTLE_S = 90.0  # generous: a job here takes milliseconds, a long one seconds


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=25.0, help="jobs offered per second")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--kill-every-s", type=float, default=2.0)
    parser.add_argument("--freezes", type=int, default=3)
    parser.add_argument("--freeze-s", type=float, default=6.0)
    parser.add_argument("--stream-s", type=float, default=30.0,
                        help="stream length of the other scenarios (split around the fault)")
    parser.add_argument("--redis-down-s", type=float, default=5.0)
    parser.add_argument("--redis-freeze-s", type=float, default=8.0)
    parser.add_argument("--long-jobs", type=int, default=4)
    parser.add_argument("--full-disk-jobs", type=int, default=100)
    parser.add_argument("--full-disk-s", type=float, default=90.0,
                        help="how long the artifact disk is held full")
    parser.add_argument("--quick", action="store_true", help="a small size (the tests')")
    parser.add_argument("--only", action="append", choices=SCENARIOS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.kill_every_s, args.stream_s, args.redis_down_s = 2, 3.0, 5.0, 2.0
        args.freezes, args.long_jobs = 1, 1
        args.full_disk_jobs, args.full_disk_s = 30, 20.0
    return args


def _stream_around(args: argparse.Namespace, fault: Callable[[], Any],
                   make_job: Callable[[int], dict[str, Any]] = small_job) -> JobStream:
    """Stream for half of ``--stream-s``, break something, stream the other half."""
    stream = JobStream(make_job).start(args.rate)
    time.sleep(args.stream_s / 2)
    fault()
    time.sleep(args.stream_s / 2)  # the fault's own clock: a stream on both sides
    stream.stop()
    return stream


def _metric(client: Any, name: str) -> int:
    from tasks.broker.keys import METRICS_KEY, metric_field

    return int(client.hget(METRICS_KEY, metric_field(name)) or 0)


def _started(result: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """The STARTED meta (worker, pid) of a job once a run of it began."""
    deadline = time.monotonic() + timeout_s
    while result.state != "STARTED" and time.monotonic() < deadline:
        time.sleep(0.05)
    return result.info


def _runs_begun(client: Any, job_id: str) -> int:
    from tasks.broker.keys import attempts_key

    return int(client.get(attempts_key(job_id)) or 0)


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


# --- the scenarios: each streams, breaks something, settles --------------------------
def worker_kills(args: argparse.Namespace, cluster: Any, app: Any, client: Any) -> Counts:
    rng, stream = random.Random(1), JobStream().start(args.rate)
    for _ in range(args.kills):
        time.sleep(args.kill_every_s)  # the fault's own clock: a kill every few seconds
        host, pid = kill_a_worker(app, args.workers, rng)
        if not wait_replaced(app, host, pid):
            print(f"warning: {host} did not come back", file=sys.stderr)
    stream.stop()
    before = _metric(client, "recovered")
    counts = settle(stream, "", client, SETTLE_S)
    counts.scenario = (f"worker SIGKILL x{args.kills} ({_metric(client, 'recovered') - before}"
                       " held by a killed worker, given back by beat)")
    return counts


def worker_freezes(args: argparse.Namespace, cluster: Any, app: Any, client: Any) -> Counts:
    """Each round a worker is frozen in the middle of a job, long enough for the job to
    run again elsewhere; the woken run must stop as stale."""
    from tasks import submit

    stream, before, frozen = JobStream().start(args.rate), _metric(client, "stale_runs"), []
    for index in range(args.freezes):
        time.sleep(args.kill_every_s)
        frozen.append(submit(f"frozen mid-job {index}", **MEDIUM_JOB))
        pid = _started(frozen[-1])["pid"]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(args.freeze_s)  # the freeze itself
        os.kill(pid, signal.SIGCONT)
    time.sleep(args.kill_every_s)
    stream.stop()
    stream.accepted.update((r.id, r) for r in frozen)
    stream.submitted += len(frozen)
    counts = settle(stream, "", client, SETTLE_S)
    counts.scenario = (f"worker SIGSTOP {args.freeze_s:g}s mid-job x{args.freezes} "
                       f"({_metric(client, 'stale_runs') - before} woken runs stopped as stale)")
    return counts


def redis_restart(args: argparse.Namespace, cluster: Any, app: Any, client: Any) -> Counts:
    from tasks import submit

    running: list[Any] = []
    came_back: dict[str, float] = {}

    def fault() -> None:
        running.extend(submit(f"running at the kill {i}", **MEDIUM_JOB) for i in range(2))
        for result in running:
            _started(result)
        cluster.redis.kill()
        time.sleep(args.redis_down_s)  # the outage itself
        cluster.redis.start()
        restarted = time.monotonic()
        done = _wait(lambda: all(r.ready() for r in running), SETTLE_S)
        came_back["after_s"] = time.monotonic() - restarted if done else float("inf")

    stream = _stream_around(args, fault)
    stream.accepted.update((r.id, r) for r in running)
    stream.submitted += len(running)
    counts = settle(stream, "", cluster.redis.client(), SETTLE_S)
    after_s = came_back["after_s"]
    counts.scenario = (f"Redis SIGKILL, {args.redis_down_s:g}s down, AOF restart (the 2 jobs "
                       f"running at the kill done {after_s:.1f}s after the restart)")
    counts.running_done_after_s = round(after_s, 1)  # type: ignore[attr-defined]
    return counts


def _seeded_job(index: int) -> dict[str, Any]:
    """Every other job seeded (a cache claim on the submit path), the rest as usual."""
    job = small_job(index)
    return {**job, "prompt": f"seeded {index}", "seed": index} if index % 2 else job


#: A seeded fast job submitted while Redis is frozen, and again once it answers.
PROBE = dict(prompt="a seeded probe", seed=7, tier="fast", **SMALL)


def _refusal(call: Callable[[], Any]) -> str | None:
    """The name of the error ``call()`` raised, or None if it returned."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001  reported, not raised
        return type(exc).__name__
    return None


def redis_freeze(args: argparse.Namespace, cluster: Any, app: Any, client: Any) -> Counts:
    from tasks import submit

    pid, probe = cluster.redis.process.pid, {}

    def fault() -> None:
        os.kill(pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            probe["refused"] = _refusal(lambda: submit(**PROBE))
            probe["refusal_s"] = round(time.monotonic() - began, 2)
            time.sleep(max(0.0, args.redis_freeze_s - (time.monotonic() - began)))
        finally:
            os.kill(pid, signal.SIGCONT)

    stream = _stream_around(args, fault, _seeded_job)
    counts = settle(stream, "", client, SETTLE_S)
    jobs = [PROBE, *stream.refused_jobs[:10]]
    again = [submit(**job) for job in jobs]
    stuck_ids = [r.id for r in again if _refusal(lambda r=r: r.get(timeout=30)) is not None]
    for job, result in zip(jobs, again):
        if result.id in stuck_ids:
            print(f"submitted again, no result in 30 s: {result.id} "
                  f"({type(result).__name__}, {job})", flush=True)
    stuck = len(stuck_ids)
    counts.lost += stuck  # a claim or place left behind would hang or refuse them
    counts.lost_ids += stuck_ids
    counts.probe = {**probe, "done_after": stuck == 0}  # type: ignore[attr-defined]
    counts.scenario = (f"Redis SIGSTOP {args.redis_freeze_s:g}s (every submit meanwhile "
                       f"refused: {counts.refusals}, the slowest in "
                       f"{max(counts.slowest_refusal_s, probe['refusal_s']):.1f}s; "
                       f"{len(again) - stuck} of {len(again)} refused jobs submitted again done)")
    return counts


def freeze_then_crash(args: argparse.Namespace, cluster: Any, app: Any, client: Any) -> Counts:
    from tasks import submit

    long_job: list[Any] = []

    def fault() -> None:
        long_job.append(submit("frozen, then its new holder killed", **LONG_JOB))
        first = _started(long_job[0])
        os.kill(first["pid"], signal.SIGSTOP)
        try:
            _wait(lambda: _runs_begun(client, long_job[0].id) >= 2, 60)
        finally:
            os.kill(first["pid"], signal.SIGCONT)
        second = long_job[0].info
        if isinstance(second, dict) and second.get("pid") not in (None, first["pid"]):
            os.kill(second["pid"], signal.SIGKILL)

    stream = _stream_around(args, fault)
    stream.accepted[long_job[0].id] = long_job[0]
    stream.submitted += 1
    counts = settle(stream, "", client, SETTLE_S)
    runs = _runs_begun(client, long_job[0].id)
    counts.scenario = (f"worker SIGSTOP mid-job until it runs elsewhere, then that worker "
                       f"SIGKILLed (the job: {runs} runs begun, one result)")
    return counts


def long_jobs(args: argparse.Namespace, cluster: Any, app: Any, client: Any) -> Counts:
    from tasks.settings import current

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
    # a copy that steps aside for a fast job and resumes is delivered again by design
    resumed = {i: log.count(f"job {i} resumes at step") for i in long_ids}
    again = sum(log.count(f"{JOB_TASK}[{i}] received") - resumed[i] > 1
                for i in long_ids)
    longest_s = max((stream.accepted[i].result["run_ms"] for i in long_ids), default=0) / 1000
    counts.scenario = (f"{len(long_ids)} jobs of up to {longest_s:.0f}s, their lease "
                       f"{current().lease_ttl_s}s (delivered twice: {again}; stepped aside for "
                       f"fast jobs and resumed: {sum(bool(n) for n in resumed.values())})")
    return counts


def supervisor_restart(args: argparse.Namespace, cluster: Any, app: Any,
                       client: Any) -> Counts:
    def fault() -> None:
        kill_supervisor(cluster)
        cluster.start_workers()

    return settle(_stream_around(args, fault), "supervisor SIGKILL + restart", client, SETTLE_S)


RUNS: dict[str, Callable[..., Counts]] = {
    "kill": worker_kills, "freeze": worker_freezes, "redis": redis_restart,
    "redis-freeze": redis_freeze, "freeze-crash": freeze_then_crash,
    "supervisor": supervisor_restart, "full-disk": full_disk, "long": long_jobs}


def soak(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    from tasks import app
    from tasks.dev.cluster import LocalCluster

    rows = []
    print(f"state folder: {state}", flush=True)
    with LocalCluster(state, workers=args.workers, device="cpu") as cluster:
        cluster.start(app, fresh=True)
        for name in args.only or DEFAULT_SCENARIOS:
            counts = RUNS[name](args, cluster, app, cluster.redis.client())
            print(markdown_table(HEADERS, [counts.row()]).splitlines()[-1], flush=True)
            if counts.lost_ids:
                kept = keep_evidence(state, cluster.redis.client(), counts.lost_ids)
                print(f"the lost jobs' logs and Redis records: {kept}", flush=True)
            rows.append(counts)
            gc.collect()  # results unsubscribe while Redis still answers, not at exit
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = {"HEARTBEAT_S": 1, "CACHE": "on"}
    report = run_private("gl-soak-", lambda state: soak(args, state), "cluster stopped",
                         **settings)
    if report is None:
        return 130
    rows = report["rows"]
    from tasks.settings import current

    print(f"\n{args.workers} CPU workers, {args.rate:g} jobs/s offered, leases "
          f"{current().lease_ttl_s}s, {report['wall_s']:.0f}s in all\n")
    print(markdown_table(HEADERS, [c.row() for c in rows]))
    for counts in rows:
        if counts.lost_ids:
            print(f"lost in {counts.scenario}: {counts.lost_ids[:20]}")
    if args.json:
        args.json.write_text(json.dumps([vars(c) for c in rows], indent=2) + "\n")
    return 1 if any(c.lost or c.falsely_failed for c in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

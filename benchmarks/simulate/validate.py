"""The simulator against a real local cluster: the same jobs, waits per lane compared.

``python -m benchmarks.simulate --validate`` starts what ``benchmarks/overload.py``
starts (an embedded Redis, ``--workers`` CPU workers, beat only during a trial) and
measures the pool's capacity the same way (its functions are called, not copied).
Then, for each load (0.5x, 1x and 2x of that capacity), it offers the overload
benchmark's open-loop workload through ``submit()`` with beat running, and gives the
simulator the very same jobs: each accepted job's submit time (its result's
``started_at - queued_ms``), tier, account and measured ``run_ms``; the same number of
workers; the time a worker spends per job beyond its run (start-to-start time minus
run time, from the capacity bursts); the lane budgets and heartbeat of the trial; and
the pick lag, the floor of an idle worker's pickup, by which a job reaches the workers
after its stamp (:func:`pick_lag_s`).
The table compares p50 and p95 wait (``queued_ms``) per lane the jobs ran in:
ratio simulated / real, PASS within 20%.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import JobSize, markdown_table, percentile, run_private, write_json  # noqa: E402

LOADS = (0.5, 1.0, 2.0)
TOLERANCE = 0.2
LANE_NAMES = ("fast", "standard", "relaxed")


def _waits(jobs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """p50/p95 wait (s) and count per lane a job ran in."""
    out = {}
    for lane in LANE_NAMES:
        waits = [j["wait_s"] for j in jobs if j["lane"] == lane]
        out[lane] = {"jobs": len(waits), "p50": percentile(waits, 0.5),
                     "p95": percentile(waits, 0.95)}
    return out


def real_jobs(trial: Any) -> list[dict[str, Any]]:
    """What each finished job of a real trial was: submitted when, where it ran."""
    done = [o for o in trial.outcomes if o["state"] == "done"]
    jobs = [{"submitted": r["started_at"] - r["queued_ms"] / 1000, "tier": o["tier"],
             "lane": r["lane"], "wait_s": r["queued_ms"] / 1000, "run_s": r["run_ms"] / 1000,
             "started_at": r["started_at"], "worker": r["worker"],
             "reason": r.get("downgrade_reason"), "preempted": r.get("preempted", 0)}
            for o in done for r in [o["result"]]]
    return sorted(jobs, key=lambda j: j["submitted"])


def busy_s(jobs: list[dict[str, Any]], default_s: float = 0.0
           ) -> tuple[float, float, list[float]]:
    """(overhead, pickup) seconds of this trial's workers, and each job's own overhead
    (``extra_s``) where it was measured. Overhead: a worker's time per job beyond its
    run, start-to-start minus the run of jobs run back to back (the next was submitted
    before the last one's run ended: no idling between); the mean of those stands for
    the others, and ``default_s`` (the capacity bursts' job-time less their run) where
    no worker ran two jobs back to back (a light load spread over the shared lane).
    Pickup: from publish to start on an idle worker, the median wait of the jobs that
    found their worker idle (submitted after its last job's run and overhead); those
    waits themselves come third (the simulator draws from them)."""
    pairs = [pair for mine in _by_worker(jobs).values() for pair in _pairs(mine)]
    for a, b in pairs:
        if b["submitted"] <= a["started_at"] + a["run_s"]:
            a["extra_s"] = b["started_at"] - a["started_at"] - a["run_s"]
    gaps = [job["extra_s"] for job in jobs if "extra_s" in job]
    extra_s = statistics.fmean(gaps) if gaps else default_s
    pickups = [b["wait_s"] for a, b in pairs
               if b["submitted"] > a["started_at"] + a["run_s"] + extra_s]
    return extra_s, statistics.median(pickups) if pickups else 0.0, pickups


def _by_worker(jobs: list[dict[str, Any]]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for job in jobs:
        runs.setdefault(job["worker"], []).append(job)
    return runs


def _pairs(jobs: list[dict[str, Any]]) -> list[tuple[dict, dict]]:
    ordered = sorted(jobs, key=lambda job: job["started_at"])
    return list(zip(ordered, ordered[1:]))


#: The quantile of the idle workers' pickups every pickup pays: see :func:`pick_lag_s`.
PICK_LAG_QUANTILE = 0.1


def pick_lag_s(loads: dict[str, dict[str, Any]]) -> float:
    """How long after its stamp (``submitted_at``) a job can first be taken: the publish
    itself, then a worker's set-up between taking a job and starting it. An idle
    worker's pickup is that and a little more; its floor, the 10th percentile of the
    pickups measured over all loads (0 when none was), is paid by every job. A job
    published less than that before a busy worker frees is not the one it takes next."""
    pickups = [p for found in loads.values() for p in found["trial"].get("pickups_s", ())]
    return percentile(pickups, PICK_LAG_QUANTILE) or 0.0


def simulated(jobs: list[dict[str, Any]], trial: dict[str, Any]) -> list[dict[str, Any]]:
    """The simulator on a real trial's jobs (``trial``: its workers, budgets, heartbeat,
    steps, overhead, pickups and pick lag): each job's wait and lane. A job reaches the
    simulator's lists the pick lag after its stamp, an idle worker starts it after the
    rest of a measured pickup, and its wait counts from the stamp."""
    from benchmarks.simulate.config import SimConfig
    from benchmarks.simulate.run import Fleet, Run
    from benchmarks.simulate.workload import Arrival, ModelSpec

    lag = trial.get("pick_lag_s", 0.0)
    first = jobs[0]["submitted"]
    whole = statistics.median([j["run_s"] for j in jobs if not j["preempted"]] or [0.0])
    # each job busies its worker for its run and its own overhead where measured (a
    # resumed job's run_ms is its last part only: it counts as a median job)
    arrivals = [Arrival(j["submitted"] - first + lag, j["tier"], "a", False, "demo", 1.0,
                        (whole if j["preempted"] else j["run_s"])
                        + j.get("extra_s", trial["overhead_s"]), trial["steps"])
                for j in jobs]
    budgets = trial["budgets_s"]
    config = SimConfig(budgets_s=dict(budgets), default_service_s=trial["job_s"],
                       unmeasured_s=trial.get("unmeasured_s", 0.0),
                       heartbeat_s=trial["heartbeat_s"],
                       heartbeat_reply_s=trial["heartbeat_reply_s"],
                       pickup_s=max(0.0, trial["pickup_s"] - lag),
                       pickups_s=tuple(max(0.0, p - lag) for p in trial.get("pickups_s", ())),
                       preempt=trial.get("preempt", True),
                       push_phases=len(trial["hosts"]))
    outcome = Run(arrivals, [ModelSpec("demo", 0.0, 0.0, 0.0)],
                  Fleet(len(trial["hosts"]), memory_mb=(1,), hosts=trial["hosts"]), "gpulanes",
                  config, arrivals[-1].at + 1e-3).go()
    return [{"lane": job.lane, "wait_s": job.wait_s + lag, "reason": job.reason,
             "preempted": job.preemptions} for job in outcome.recorder.done]


def simulate_loads(report: dict[str, Any]) -> dict[str, Any]:
    """Every load's real jobs through the simulator, with the pick lag of them all."""
    lag = pick_lag_s(report["loads"])
    for found in report["loads"].values():
        found["trial"]["pick_lag_s"] = lag
        found.update(compared(found["jobs"], found["trial"]))
    return report


def compared(jobs: list[dict[str, Any]], trial: dict[str, Any]) -> dict[str, Any]:
    """Real and simulated waits of one load, and what moved and stepped aside."""
    sim = simulated(jobs, trial)
    return {"real": _waits(jobs), "sim": _waits(sim),
            "downgrades": {"real": _reasons(jobs), "sim": _reasons(sim)},
            "preempted": {"real": sum(j["preempted"] for j in jobs),
                          "sim": sum(j["preempted"] for j in sim)}}


def _reasons(jobs: list[dict[str, Any]]) -> dict[str, int]:
    return dict(Counter(job["reason"] for job in jobs if job["reason"]))


def compare(real: dict, sim: dict) -> list[list[Any]]:
    """Rows of (lane, quantile, real, simulated, ratio, verdict) for one load."""
    rows = []
    for lane in LANE_NAMES:
        for q in ("p50", "p95"):
            r, s = real[lane][q], sim[lane][q]
            if r is None or s is None:
                rows.append([lane, q, real[lane]["jobs"], sim[lane]["jobs"], r, s, "-", "n/a"])
                continue
            ratio = s / r if r > 0 else float("inf")
            verdict = "PASS" if abs(ratio - 1) <= TOLERANCE else "FAIL"
            rows.append([lane, q, real[lane]["jobs"], sim[lane]["jobs"], round(r, 3),
                         round(s, 3), round(ratio, 3), verdict])
    return rows


def capacity(size: JobSize) -> tuple[float, float]:
    """(jobs/s, mean run_ms) of the gpulanes pool: its best burst after a warm-up, as
    ``benchmarks/overload.py`` measures it."""
    from benchmarks.overload import CAPACITY_BURSTS, gpulanes_send
    from benchmarks.overload_trial import capacity_burst, warm_up

    send = gpulanes_send(size)
    warm_up(send)
    return max(capacity_burst(send) for _ in range(CAPACITY_BURSTS))


def measure(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """Capacity, then a real gpulanes trial and its simulation per load."""
    from beat.heartbeat import PUSH_GRACE_S
    from benchmarks.overload_plan import Budgets
    from benchmarks.overload_side import Beat
    from tasks import app
    from tasks.dev.cluster import LocalCluster
    from tasks.settings import settings

    cluster = LocalCluster(state, workers=args.workers, device="cpu", beat=False,
                           log_dir=state / "logs")
    try:
        cluster.start(app, fresh=True)
        jobs_s, run_ms = capacity(JobSize(args.steps, args.size))
        budgets = Budgets.from_capacity(jobs_s, args.workers)
        print(f"capacity {jobs_s:.2f} jobs/s, job-time {budgets.job_s * 1000:.1f} ms, run "
              f"{run_ms:.1f} ms", file=sys.stderr, flush=True)
        base = {"hosts": cluster.hostnames, "steps": args.steps, "job_s": budgets.job_s,
                "overhead_default_s": max(0.0, budgets.job_s - run_ms / 1000),
                "budgets_s": {"fast": budgets.fast_s, "standard": budgets.standard_s},
                "heartbeat_s": settings.heartbeat_s,
                "heartbeat_reply_s": PUSH_GRACE_S}
        beat = Beat(cluster, budgets, state / "logs")
        loads = {f"{load:g}x": one_load(args, beat, load * jobs_s, base) for load in args.loads}
    finally:
        cluster.stop()
    return simulate_loads({"capacity_jobs_s": jobs_s, "run_ms": run_ms, **base, "loads": loads})


def one_load(args: argparse.Namespace, beat: Any, rate: float,
             base: dict[str, Any]) -> dict[str, Any]:
    """A real trial at ``rate`` jobs/s (beat running), then the simulator on its jobs."""
    from benchmarks.overload import Sides
    from benchmarks.overload_trial import workload

    plan = workload(rate, args.duration, args.mix, args.seed)
    sides = Sides(beat, None, JobSize(args.steps, args.size), 2 * args.duration + 60)
    jobs = real_jobs(sides.gpulanes_trial(plan))
    extra_s, pickup_s, pickups = busy_s(jobs, base["overhead_default_s"])
    service = reported_service_s(base["hosts"])
    unmeasured = unmeasured_s(jobs, extra_s, service)
    trial = {**base, "overhead_s": extra_s, "pickup_s": pickup_s, "pickups_s": pickups,
             "service_s": service, "unmeasured_s": unmeasured}
    print(f"  {rate:.1f} jobs/s: {len(jobs)} jobs, {extra_s * 1000:.1f} ms per job beyond "
          f"its run ({unmeasured * 1000:.1f} ms of it outside the service time the "
          f"workers report), pickup {pickup_s * 1000:.1f} ms", file=sys.stderr, flush=True)
    return {"trial": trial, "jobs": jobs}


#: The last jobs of a trial whose time per job is set against the workers' service
#: time (a moving average over their recent jobs).
RECENT_JOBS = 50


def reported_service_s(hosts: list[str]) -> dict[str, float]:
    """Per lane, the service time (a job's run, prerun to postrun, plus the worker's
    measured time between jobs; a moving average over recent jobs) the trial's workers
    last reported in beat's worker record, the mean over workers. Reports saved before
    workers measured the time between jobs hold the run alone: a replay of one sets the
    simulated workers' time between jobs, which they now count too, from it."""
    from tasks.broker.app import redis_client
    from tasks.broker.keys import WORKERS_KEY

    records = [json.loads(raw) for raw in redis_client().hmget(WORKERS_KEY, hosts) if raw]
    samples: dict[str, list[float]] = {}
    for record in records:
        for lane, ms in record.get("service_ms", {}).items():
            if ms:
                samples.setdefault(lane, []).append(ms / 1000)
    return {lane: statistics.fmean(found) for lane, found in samples.items()}


def unmeasured_s(jobs: list[dict[str, Any]], extra_s: float,
                 service_s: dict[str, float] | None) -> float:
    """Of a worker's time per job (run plus what lies between two starts), the part
    outside the service time it reports: per lane, its last ``RECENT_JOBS`` jobs against
    the lane's reported service time; their mean, weighted by jobs (0: unknown)."""
    total_s, counted = 0.0, 0
    for lane, service in (service_s or {}).items():
        recent = sorted((j for j in jobs if j["lane"] == lane),
                        key=lambda j: j["started_at"])[-RECENT_JOBS:]
        if recent:
            per_job_s = statistics.fmean(j["run_s"] + j.get("extra_s", extra_s) for j in recent)
            total_s += max(0.0, per_job_s - service) * len(recent)
            counted += len(recent)
    return total_s / counted if counted else 0.0


def replay(path: Path) -> dict[str, Any]:
    """A saved validation (``--json``) with the simulator run again on its real jobs:
    a change to the simulator is checked against the same real runs in seconds."""
    report = json.loads(path.read_text())
    for found in report["loads"].values():
        default_s = max(0.0, report["job_s"] - report["run_ms"] / 1000)
        trial = found["trial"]
        trial["overhead_s"], trial["pickup_s"], trial["pickups_s"] = busy_s(found["jobs"],
                                                                            default_s)
        trial["unmeasured_s"] = unmeasured_s(found["jobs"], trial["overhead_s"],
                                             trial.get("service_s"))
    return simulate_loads(report)


def print_table(report: dict[str, Any]) -> None:
    """One table: per load, lane and quantile, real and simulated waits (s)."""
    print(f"{len(report['hosts'])} CPU workers, capacity {report['capacity_jobs_s']:.2f} "
          f"jobs/s (job-time {report['job_s'] * 1000:.0f} ms), budgets fast "
          f"{report['budgets_s']['fast']:.2f} s, standard {report['budgets_s']['standard']:.2f} s\n")
    for load, found in report["loads"].items():
        trial = found["trial"]
        print(f"{load}: overhead {trial['overhead_s'] * 1000:.1f} ms, pickup "
              f"{trial['pickup_s'] * 1000:.1f} ms, pick lag "
              f"{trial['pick_lag_s'] * 1000:.1f} ms; moved down {found['downgrades']}; "
              f"preempted {found['preempted']}")
    print()
    rows = [[load, *row] for load, found in report["loads"].items()
            for row in compare(found["real"], found["sim"])]
    print(markdown_table(["load", "lane", "wait", "real jobs", "sim jobs", "real s", "sim s",
                          "sim/real", f"within {TOLERANCE:.0%}"], rows, "lll" + "r" * 6))
    verdicts = [row[-1] for row in rows if row[-1] != "n/a"]
    print(f"\n{verdicts.count('PASS')} of {len(verdicts)} within {TOLERANCE:.0%}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from benchmarks.overload import DEFAULT_MIX, tier_mix

    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulate --validate",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="CPU workers (default: 2)")
    parser.add_argument("--duration", type=float, default=30.0,
                        help="seconds of offered load per trial (default: 30)")
    parser.add_argument("--loads", type=lambda raw: [float(x) for x in raw.split(",")],
                        default=list(LOADS), help="multiples of capacity (default: 0.5,1,2)")
    parser.add_argument("--steps", type=int, default=16, help="denoising steps per job")
    parser.add_argument("--size", type=int, default=128, help="image side in pixels")
    parser.add_argument("--mix", type=tier_mix, default=tier_mix(DEFAULT_MIX),
                        help=f"percent fast,standard,relaxed (default: {DEFAULT_MIX})")
    parser.add_argument("--seed", type=int, default=7, help="seed of the job sequence")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write results here (with every real job)")
    parser.add_argument("--replay", type=Path, metavar="PATH",
                        help="no cluster: simulate again the real jobs of a saved --json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the validation and print its table; 130 after Ctrl-C."""
    from benchmarks.overload import CLUSTER_ENV

    args = parse_args(argv)
    if args.replay:
        report = replay(args.replay)
    else:
        report = run_private("gl-simval-", lambda state: measure(args, state),
                             "the cluster is stopped", **CLUSTER_ENV)
    if report is None:
        return 130
    print_table(report)
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

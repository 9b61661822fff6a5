"""One worker pool driven at 2x its capacity: gpulanes against plain Celery lanes.

``python benchmarks/overload.py`` starts an embedded Redis and, on it, two pools of
``--workers`` CPU worker processes each, both reading ``fast,standard,relaxed`` in
that order: gpulanes' (``LocalCluster``, no beat yet) and a plain Celery user's
(``benchmarks/plain_app.py``, in a Redis database of its own). Then:

1. **capacity** of each pool: bursts through all three lanes of jobs of one size
   (``--steps``, ``--size``); a burst's jobs/s is the sum over workers of one
   over their start-to-start time; a pool's capacity is the best of its three
   bursts, the two pools' taking turns (other load on the machine only lowers a
   burst's rate). The higher of the two is *the* capacity, so each pool starts at
   2x its own or more; one *job-time* is ``workers / capacity``. The gpulanes
   budgets follow from it (fast 10, standard 60 job-times) and are printed; heartbeat
   1 s (``GPULANES_HEARTBEAT_S=1``: beat works in whole seconds, where a setting below 1
   acts as 1).
2. **a trial per mode** (``--repeats`` each, the order alternating): an open
   loop offers evenly spaced jobs at 2x capacity, as many as ``--duration`` s holds;
   after its first 3 s it holds the rate at 2x the jobs/s its pool has served so far
   in the trial (``Pace``: this machine's speed drifts by a quarter between minutes,
   so a rate fixed from the bursts met 1.9x-2.7x; ``--fixed-rate`` keeps it fixed). By
   default 20% fast, 30% standard, 50% relaxed (``--mix``) from four accounts,
   the same seeded sequence in both modes; then it waits (at most ``--drain``
   s) for every accepted job. With the default mix fast+standard alone offer
   about 1x capacity; ``--mix 30,40,30`` makes them 1.4x, where the policy
   has real work to do.

*gpulanes*: ``submit()`` with its defaults (standard may move down, fast may
not), beat running heartbeats, the overload policy and the deadline mover;
``LaneFull`` refusals are counted apart (the caller is told). Beat (fresh
snapshot, fresh hysteresis) runs for each gpulanes trial only and stops once that
trial's jobs are done. Accounts have ample fast seconds and fair-relax levels stay
0 (relaxed is FIFO): those features answer other questions.
*plain*: what a careful plain Celery user runs: a default Celery app (kombu's stock
Redis transport, Celery's stock result backend; late acks, prefetch 1, JSON, queues
``fast,standard,relaxed`` read in that order by ``queue_order_strategy="priority"``),
its own ``celery worker --pool threads -c 1 -E`` processes, as many as gpulanes',
running the same demo model at the same size; its jobs published by
``apply_async(queue=tier)`` from a process of its own that never imports gpulanes'
client, app or transport (``benchmarks.plain_run``). No policy, no beat. While one
pool serves a trial the other sits idle.

Reading the tables: one row per (requested tier, mode). Latency is what the
worker measures, ``queued_ms + run_ms``, from publishing (the plain task stamps the
same fields). ``within budget``:
share of the tier's jobs whose latency met its lane budget. ``moved down``:
``downgrade_reason`` counts, with those jobs' median latency; ``ran in``: the
lanes they really ran in; ``no result``: accepted jobs with no result when the
wait ended (must be 0). Per mode: the rate really offered, jobs served per
second over window + drain, the mean latency of all jobs (scheduling moves
waiting between jobs, it adds no capacity), the drain time, the client's CPU
per job (the publishing process's: this one for gpulanes, the plain publisher's for
plain), beat's CPU as a share of one core, and the CPU per served job of the mode's
worker processes and of Redis (each side idle while the other serves). The lines
below compare the modes; the first says how hard each pool was really driven: the
rate offered over the rate it served while jobs were offered.
"""
from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import PROMPT, TIERS, JobSize, check_size, json_option, run_private, write_json  # noqa: E402
from benchmarks.overload_plan import Budgets, Settings  # noqa: E402
from benchmarks.overload_report import MODES, print_report, summary  # noqa: E402
from benchmarks.overload_side import Beat, lanes_depth, redis_cpu_s, tree_cpu_s  # noqa: E402
from benchmarks.overload_trial import (  # noqa: E402
    ACCOUNTS,
    Pace,
    Send,
    Trial,
    capacity_burst,
    drain,
    offer,
    plain_burst,
    plain_trial,
    plain_warm_up,
    warm_up,
    workload,
)
from benchmarks.plain_run import PlainClient, PlainWorkers, plain_env, plain_url  # noqa: E402

DEFAULT_MIX = "20,30,50"
LOAD_FACTOR = 2.0
HEARTBEAT_S = 1  # beat works in whole seconds; below 1 acts as 1
CAPACITY_BURSTS = 3
# fast-time accounting never interferes
CLUSTER_ENV = {"HEARTBEAT_S": HEARTBEAT_S, "FAST_SECONDS_DEFAULT": "1e9"}


def gpulanes_send(size: JobSize) -> Send:
    """gpulanes' publish of one job: ``submit()`` with its defaults (may raise ``LaneFull``)."""
    from tasks.api import submit

    return lambda tier, account, seed: submit(PROMPT, tier=tier, account=account, seed=seed,
                                              steps=size.steps, width=size.size,
                                              height=size.size)


@dataclass
class Sides:
    """What drives each side's trials: gpulanes' beat, the plain publisher's process."""

    beat: Beat
    plain: PlainClient
    size: JobSize
    drain_s: float
    #: The load each trial is held at (``Pace``); None: the plan's fixed rate.
    load: float | None = None
    #: Each mode's worker processes (gpulanes': its supervisor, the workers below it);
    #: a mode not named here reports no workers' CPU.
    worker_pids: dict[str, list[int]] = field(default_factory=dict)

    def trial(self, mode: str, plan: list[tuple[float, str, str]]) -> Trial:
        """Offer ``plan`` on ``mode``'s side and drain it; what its workers and Redis
        (idle for the other side meanwhile) spent on the CPU."""
        pids = self.worker_pids.get(mode, [])
        workers, redis = tree_cpu_s(pids), redis_cpu_s(self.beat.client)
        if mode == "plain":
            trial = self.plain.call(plain_trial, plan, self.size, self.drain_s, self.load)
        else:
            trial = self.gpulanes_trial(plan)
        trial.workers_cpu_s = tree_cpu_s(pids) - workers
        trial.redis_cpu_s = redis_cpu_s(self.beat.client) - redis
        return trial

    def gpulanes_trial(self, plan: list[tuple[float, str, str]]) -> Trial:
        """One gpulanes trial, beat running for it alone."""
        from tasks.errors import LaneFull

        trial = Trial("gpulanes")
        try:
            self.beat.start()
            beat_cpu_s = self.beat.cpu_s()  # beat's start-up is not the trial's cost
            depth = partial(lanes_depth, self.beat.client)
            offer(trial, plan, gpulanes_send(self.size), (LaneFull,),
                  Pace(self.load, depth) if self.load else None)
            drain(trial, self.drain_s, depth)
            trial.beat_cpu_s = self.beat.cpu_s() - beat_cpu_s
        finally:
            self.beat.stop()
        return trial


# --- driver ------------------------------------------------------------------------------
def capacities(plain: PlainClient, size: JobSize) -> dict[str, tuple[float, float]]:
    """Each pool's (jobs/s, mean run_ms): its best burst, the pools' bursts taking turns
    so that other load on the machine hits both alike."""
    gpulanes = gpulanes_send(size)
    warm_up(gpulanes)
    plain.call(plain_warm_up, size)
    bursts: dict[str, list[tuple[float, float]]] = {"gpulanes": [], "plain": []}
    for _ in range(CAPACITY_BURSTS):
        bursts["gpulanes"].append(capacity_burst(gpulanes))
        bursts["plain"].append(plain.call(plain_burst, size))
    return {side: max(rates) for side, rates in bursts.items()}


def run_all(cluster: Any, plain: PlainClient, settings: Settings, state: Path,
            worker_pids: dict[str, list[int]]) -> dict[str, Any]:
    """Capacity first, then every trial, the mode order alternating per repeat."""
    by_side = capacities(plain, settings.size)
    capacity, run_ms = max(by_side.values())
    budgets = Budgets.from_capacity(capacity, settings.workers)
    rate = LOAD_FACTOR * capacity
    print("capacity " + ", ".join(f"{side} {c:.1f} jobs/s (run {ms:.1f} ms)"
                                  for side, (c, ms) in by_side.items())
          + f"; job-time {budgets.job_s * 1000:.1f} ms; offering {rate:.1f} jobs/s; budgets "
          f"fast {budgets.fast_s:.2f}s, standard {budgets.standard_s:.2f}s",
          file=sys.stderr, flush=True)
    sides = Sides(Beat(cluster, budgets, state / "logs"), plain, settings.size, settings.drain_s,
                  LOAD_FACTOR if settings.paced else None, worker_pids)
    plan, trials = workload(rate, settings.duration_s, settings.mix, settings.seed), []
    for repeat in range(settings.repeats):
        for mode in (MODES if repeat % 2 == 0 else MODES[::-1]):
            trials.append(t := sides.trial(mode, plan))
            print(f"  repeat {repeat} {mode:<8} offered {t.offered} in {t.submit_s:.1f}s, "
                  f"refused {sum(t.refused.values())}, drained in {t.drain_s:.1f}s",
                  file=sys.stderr, flush=True)
    return {"capacity_jobs_s": capacity, "run_ms": run_ms, "capacity_by_side": by_side,
            "offered_jobs_s": rate, "paced": settings.paced, "mix": settings.mix,
            "budgets": asdict(budgets), "summary": summary(trials, budgets, settings.mix)}


def run_both(cluster: Any, settings: Settings, state: Path) -> dict[str, Any]:
    """Start the plain pool and its publisher beside gpulanes' cluster; run everything."""
    env = plain_env(plain_url(cluster.url), state)
    with PlainWorkers(settings.workers, env, state / "logs") as workers, \
            PlainClient(env) as plain:
        pids = {"gpulanes": [cluster.supervisor.pid],
                "plain": [process.pid for process in workers.processes]}
        return run_all(cluster, plain, settings, state, pids)


def benchmark(settings: Settings, state: Path) -> dict[str, Any]:
    """Start both pools (gpulanes' without beat), run everything, stop them."""
    from tasks import app
    from tasks.dev.cluster import LocalCluster

    check_size("overload.py", settings.size, ACCOUNTS[0])
    cluster = LocalCluster(state, workers=settings.workers, device="cpu", beat=False,
                           log_dir=state / "logs")
    interrupted = False
    try:
        print(f"starting embedded Redis and {settings.workers} CPU workers per side ...",
              file=sys.stderr, flush=True)
        cluster.start(app, fresh=True)
        return run_both(cluster, settings, state)
    except KeyboardInterrupt:
        # Re-raised only below: leaving this block drops the traceback, so the frames
        # holding AsyncResults go while Redis still answers (their __del__ unsubscribes;
        # after Redis stops it would retry for ~20 s at exit).
        interrupted = True
    finally:
        if interrupted:
            gc.collect()
        cluster.stop()
    raise KeyboardInterrupt


def tier_mix(raw: str) -> dict[str, float]:
    """``"20,30,50"`` -> {"fast": 0.2, "standard": 0.3, "relaxed": 0.5}."""
    parts = [float(x) for x in raw.split(",")]
    if len(parts) != len(TIERS) or min(parts) < 0 or sum(parts) <= 0:
        raise argparse.ArgumentTypeError("expected three non-negative percentages")
    return {tier: part / sum(parts) for tier, part in zip(TIERS, parts)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; at least one worker and repeat, a positive duration."""
    parser = argparse.ArgumentParser(prog="python benchmarks/overload.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="CPU workers (default: 2)")
    parser.add_argument("--duration", type=float, default=30.0,
                        help="seconds of offered load per trial (default: 30)")
    parser.add_argument("--drain", type=float, default=None,
                        help="longest wait for the backlog (default: 2 x duration + 30)")
    parser.add_argument("--repeats", type=int, default=1, help="trials per mode (default: 1)")
    parser.add_argument("--steps", type=int, default=16, help="denoising steps per job")
    parser.add_argument("--size", type=int, default=128, help="image side in pixels")
    parser.add_argument("--mix", type=tier_mix, default=tier_mix(DEFAULT_MIX),
                        help="percent fast,standard,relaxed (default: %s)" % DEFAULT_MIX)
    parser.add_argument("--seed", type=int, default=7, help="seed of the job sequence")
    parser.add_argument("--fixed-rate", action="store_true",
                        help="offer at 2x the capacity bursts throughout, not at 2x what "
                             "each trial's pool serves")
    json_option(parser, "overload")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.repeats < 1 or args.duration <= 0:
        parser.error("--workers and --repeats must be >= 1, --duration > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its report; 130 after Ctrl-C."""
    args = parse_args(argv)
    settings = Settings(args.workers, args.duration, args.drain or 2 * args.duration + 30,
                        args.repeats, JobSize(args.steps, args.size), args.mix, args.seed,
                        not args.fixed_rate)
    report = run_private("gl-ovl-", lambda state: benchmark(settings, state),
                         "the cluster is stopped", **CLUSTER_ENV)
    if report is None:
        return 130
    print_report(report, settings)
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

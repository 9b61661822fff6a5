"""Fast jobs arriving while every worker runs long relaxed jobs: with preemption, and
without (``GPULANES_PREEMPT=false``), side by side in one run.

``python benchmarks/preempt.py`` starts, for each mode in turn (``--rounds`` times,
the order alternating), a private cluster: an embedded Redis, TWO CPU workers and
beat, serving the built-in ``demo`` model. Each round publishes ``--relaxed`` long
relaxed jobs (``--steps`` at ``--side`` px: seconds each) so both workers are busy,
then ``--fast`` small fast jobs at seeded random moments while the backlog runs, and
waits for every job. Measured:

- each fast job's wait (submit to start, ``queued_ms``), in milliseconds and in
  *step times* (a relaxed job's run time over its steps, measured in that round);
- the relaxed backlog's throughput: relaxed jobs finished per second, from the
  first publish to the last relaxed job's end (the fast jobs' own GPU time is the
  same in both modes), and the share of the two workers' time that went into
  relaxed model runs (jobs x a whole run's median time over 2 x that span): the
  loss is measured on the share, paired by round, since a slow stretch of this
  shared machine lengthens runs and rounds alike and cancels out of it.

Goals: fast wait <= 2 step times with preemption (without: about half a relaxed
job); relaxed throughput lost <= 5%.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import finish, json_option, markdown_table, percentile, run_private  # noqa: E402

MODES = ("preempt", "no preempt")
WAIT_GOAL_STEPS = 2.0
LOSS_GOAL = 0.05
FAST = dict(steps=10, width=256, height=256)


def round_of(state: Path, mode: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Fresh workers and beat of ``mode`` on the run's Redis, one workload; its figures."""
    from tasks import app
    from tasks.dev.cluster import LocalCluster

    cluster = LocalCluster(state, workers=2, device="cpu", beat=True,
                           log_dir=state / "logs" / f"{mode.replace(' ', '-')}-{seed}",
                           env={"GPULANES_PREEMPT": "true" if mode == "preempt" else "false"})
    try:
        cluster.start(app)
        figures = workload(args, seed)
        if mode == "preempt":
            figures["cancel_ms"] = cancel_ms(args, seed)
        return figures
    finally:
        cluster.stop()


def cancel_ms(args: argparse.Namespace, seed: int) -> float:
    """From ``revoke()`` of a running relaxed job to its REVOKED state, in ms."""
    from tasks import submit

    job = submit("cancel me", tier="relaxed", seed=seed * 1000 + 999, steps=args.steps,
                 width=args.side, height=args.side)
    deadline = time.monotonic() + 60
    while not (job.state == "PROGRESS" and job.info["step"] >= 3):
        if time.monotonic() > deadline:
            raise SystemExit("the job to cancel never reported step 3")
        time.sleep(0.01)
    began = time.monotonic()
    job.revoke()
    while job.state != "REVOKED":
        if time.monotonic() - began > 60:
            raise SystemExit("the cancelled job did not stop within 60 s")
        time.sleep(0.002)
    return (time.monotonic() - began) * 1000


def workload(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from tasks import submit

    rng = random.Random(seed)
    relaxed_size = dict(steps=args.steps, width=args.side, height=args.side)
    began = time.time()
    relaxed = [submit(f"backlog {i}", tier="relaxed", seed=seed * 1000 + i, **relaxed_size)
               for i in range(args.relaxed)]
    # fast jobs at random moments within the first half of the backlog's expected run
    span_s = args.relaxed * args.job_s / 2 / 2
    moments = sorted(rng.uniform(1.0, span_s) for _ in range(args.fast))
    fast = []
    for i, at in enumerate(moments):
        time.sleep(max(0.0, began + at - time.time()))
        fast.append(submit(f"urgent {i}", tier="fast", seed=seed * 1000 + 500 + i, **FAST))
    fast_out = [r.get(timeout=600) for r in fast]
    relaxed_out = [r.get(timeout=600) for r in relaxed]
    ended = max(out["started_at"] + out["run_ms"] / 1000 for out in relaxed_out)
    whole_ms = statistics.median(out["run_ms"] for out in relaxed_out if not out["preempted"])
    # the share of the two workers' time spent in relaxed model runs: a slow stretch of
    # the machine lengthens the runs and the round alike, so it cancels out
    busy = len(relaxed_out) * whole_ms / 1000 / (2 * (ended - began))
    return {"fast_wait_ms": [out["queued_ms"] for out in fast_out],
            "relaxed_per_s": len(relaxed_out) / (ended - began), "relaxed_busy": busy,
            "step_ms": whole_ms / args.steps,
            "preempted": sum(out["preempted"] for out in relaxed_out),
            "fast_lanes": sorted({out["lane"] for out in fast_out})}


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """One Redis for the whole run (each round's cluster reuses it), the rounds in turn."""
    from gpu_worker.redis_server import EmbeddedRedis

    server = EmbeddedRedis(state).start()
    try:
        return play(args, state)
    finally:
        server.stop()


def play(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for r in range(args.rounds):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            print(f"round {r}: {mode} ...", file=sys.stderr, flush=True)
            rounds[mode].append(round_of(state, mode, args, seed=100 + r))
            figures = rounds[mode][-1]
            print(f"  fast wait p50 {percentile(figures['fast_wait_ms'], 0.5):.0f} ms, "
                  f"relaxed {figures['relaxed_per_s']:.3f} jobs/s "
                  f"({100 * figures['relaxed_busy']:.1f}% of the workers' time), "
                  f"{figures['preempted']} preemptions", file=sys.stderr, flush=True)
    return {"rounds": rounds}


def report(figures: dict[str, Any], args: argparse.Namespace) -> None:
    rows, summary = [], {}
    step_ms = statistics.median(r["step_ms"] for rounds in figures["rounds"].values()
                                for r in rounds if r["step_ms"])
    for mode, rounds in figures["rounds"].items():
        waits = [w for r in rounds for w in r["fast_wait_ms"]]
        rate = statistics.mean(r["relaxed_per_s"] for r in rounds)
        busy = statistics.mean(r["relaxed_busy"] for r in rounds)
        summary[mode] = {"p50": percentile(waits, 0.5), "p95": percentile(waits, 0.95),
                         "rate": rate}
        rows.append([mode, len(waits), f"{summary[mode]['p50']:.0f}",
                     f"{summary[mode]['p95']:.0f}", f"{max(waits):.0f}",
                     f"{summary[mode]['p50'] / step_ms:.1f}",
                     f"{summary[mode]['p95'] / step_ms:.1f}", f"{rate:.3f}",
                     f"{100 * busy:.1f}%",
                     sum(r["preempted"] for r in rounds)])
    print(f"\ntwo CPU workers, demo model; relaxed jobs {args.steps} steps at {args.side} px "
          f"(a step {step_ms:.0f} ms), fast jobs {FAST['steps']} steps at "
          f"{FAST['width']} px\n")
    print(markdown_table(["mode", "fast jobs", "wait p50 ms", "wait p95 ms", "wait max ms",
                          "p50 in steps", "p95 in steps", "relaxed jobs/s",
                          "workers' time in relaxed runs",
                          "preemptions"], rows))
    cancels = [r["cancel_ms"] for r in figures["rounds"]["preempt"] if "cancel_ms" in r]
    print(f"\ncancel of a running relaxed job: REVOKED {statistics.median(cancels):.0f} ms "
          f"after revoke() (median of {len(cancels)}), "
          f"{statistics.median(cancels) / step_ms:.1f} step times")
    on, off = summary["preempt"], summary["no preempt"]
    # each round runs both modes back to back: a slow stretch of the machine hits a pair
    loss = 1 - statistics.median(a["relaxed_busy"] / b["relaxed_busy"] for a, b in
                                 zip(figures["rounds"]["preempt"],
                                     figures["rounds"]["no preempt"]))
    print(f"\nfast wait p50 {on['p50'] / step_ms:.1f} step times with preemption, "
          f"{off['p50'] / step_ms:.1f} without (goal <= {WAIT_GOAL_STEPS:g}: "
          f"{'met' if on['p50'] / step_ms <= WAIT_GOAL_STEPS else 'NOT met'}); relaxed "
          f"throughput lost {100 * loss:.1f}% (share of the workers' time in relaxed runs, "
          f"median of paired rounds; goal <= {100 * LOSS_GOAL:g}%: "
          f"{'met' if loss <= LOSS_GOAL else 'NOT met'}); total wall time "
          f"{figures['wall_s']:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/preempt.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="rounds per mode")
    parser.add_argument("--relaxed", type=int, default=16, help="relaxed jobs per round")
    parser.add_argument("--fast", type=int, default=10, help="fast jobs per round")
    parser.add_argument("--steps", type=int, default=40, help="a relaxed job's steps")
    parser.add_argument("--side", type=int, default=1024, help="a relaxed job's side (px)")
    parser.add_argument("--job-s", type=float, default=2.2,
                        help="about how long a relaxed job runs (spreads the fast jobs)")
    json_option(parser, "preempt")
    args = parser.parse_args(argv)
    figures = run_private("gl-pre-", lambda state: benchmark(args, state),
                          "the cluster is stopped", HEARTBEAT_S=1)
    return finish(figures, lambda found: report(found, args), args.json)


if __name__ == "__main__":
    sys.exit(main())

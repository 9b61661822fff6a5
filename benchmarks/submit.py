"""What the submit path costs: ``submit()`` against a plain Celery app's ``apply_async``.

``python benchmarks/submit.py`` starts an embedded Redis in a short temporary
folder (no workers, no beat: nothing consumes, we only publish) and one process per
way of publishing, each publishing the same jobs on its own:

*submit*: ``tasks.submit(prompt, tier=...)`` without a seed (one is drawn): validate
every field, read the in-process lane snapshot, ``decide()`` the lane, publish
through the lane script (limit, fast place and fast time: one round trip).
*submit_seeded*: the same with ``seed=i``: a seeded job of a deterministic model is
also claimed in the result cache, by the publish script itself (each job here is new,
so each claim leads and its job is pushed).
*submit_echo*: ``submit(model="echo", text=...)``: a class model, its input checked
by pydantic.
*plain*: what a plain Celery user runs: a default ``Celery("plain", broker=url,
backend=url)`` app in a process that never imports gpulanes (kombu's stock Redis
transport, Celery's stock Redis result backend and every other setting at its
default), calling ``apply_async(kwargs=..., queue=tier)`` on a task of the same name
with kwargs of the same shape (``benchmarks.common.plain_kwargs``). Its default
publishes no task-sent event; neither does gpulanes'. A
Flower user runs the *workers* with ``-E``; Flower reads queue lengths from the
broker itself.

So that ``submit()`` really routes through ``decide()`` with a live view (not
the tier-only fallback it takes when the snapshot is stale), a thread of the
parent stands in for beat: every heartbeat (1 s) it writes a realistic snapshot
(lane depths, policy, two workers, exhausted accounts, relax levels) with a fresh
``at``. Before every round a gpulanes process checks that ``submit()`` has a live
view, and aborts if not.

The ``--jobs`` jobs per mode (tiers in turn: fast, standard, relaxed) run in
``--rounds`` interleaved rounds, each process publishing while the others wait;
the order alternates, so machine noise hits all alike. Each round's AsyncResults
are kept until its clock stops (as a caller would keep them), and the lanes are
emptied between rounds so Redis does not grow. One unrecorded warm-up round per
mode runs first.

Reading the table: jobs/s per mode over all rounds (total jobs / total time), the
median round, the wall time per call and the CPU time its process spent per call
(less sensitive to other load on the machine than wall time). The ratios are the
medians of the per-round ratios against *plain* (each round runs every mode back to
back, so a slow stretch of the machine hits both sides of one pair): the goals are
``submit`` >= 0.9x and ``submit_seeded`` >= 0.75x. The lower rows time the pure parts
of ``submit()`` alone, in memory with no Redis call, in microseconds per call.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (  # noqa: E402
    PROMPT,
    TIERS,
    json_option,
    markdown_table,
    run_private,
    write_json,
)
from benchmarks.submit_modes import ACCOUNT, MODES, SIZE, Publishers  # noqa: E402

#: Each mode's goal: its paired rate / plain Celery's.
GOALS = {"submit": 0.9, "submit_seeded": 0.75}
HEARTBEAT_S = 1  # beat works in whole seconds; the router refreshes every HEARTBEAT_S / 2
PURE_CALLS = 20000


# --- a stand-in for beat: a realistic snapshot with a fresh "at" --------------
def fake_snapshot(now: float) -> dict[str, Any]:
    """A snapshot shaped like ``beat.heartbeat.build_snapshot``'s, of a busy 2-GPU cluster."""
    loads = {lane: {"depth": depth, "in_flight": flight, "workers": 2, "service_s": 1.8,
                    "expected_wait_s": wait}
             for lane, depth, flight, wait in (("fast", 1, 1, 1.8), ("standard", 12, 1, 12.6),
                                               ("relaxed", 240, 0, 228.6))}
    workers = {f"gpu{i}@bench": {"device": "cuda:0", "pid": 1000 + i, "at": now,
                                 "in_flight": {"fast": 1} if i else {"standard": 1},
                                 "service_ms": {lane: 1800.0 for lane in TIERS},
                                 "lanes": list(TIERS), "last_seen": now, "missed": 0,
                                 "alive": True} for i in range(2)}
    return {"at": now, "lanes": loads, "workers": workers,
            "policy": {"fast": {"overloaded": False, "calm_samples": 0},
                       "standard": {"overloaded": False, "calm_samples": 0}},
            "exhausted": ["acct-7", "acct-9"],
            "levels": {"acct-3": 1, "acct-5": 2, "acct-11": 3}}


class SnapshotWriter(threading.Thread):
    """Rewrites the snapshot every ``HEARTBEAT_S``, as beat would, until ``stop()``."""

    def __init__(self, client: Any) -> None:
        super().__init__(name="fake-beat", daemon=True)
        self.client, self.stopped = client, threading.Event()

    def write(self) -> None:
        """Write one fresh snapshot now."""
        from tasks.broker.keys import SNAPSHOT_KEY

        self.client.set(SNAPSHOT_KEY, json.dumps(fake_snapshot(time.time())))

    def run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            self.write()

    def stop(self) -> None:
        """Stop rewriting and wait (at most 5 s) for the thread to end."""
        self.stopped.set()
        self.join(5)


def flush_lanes(client: Any) -> None:
    """Empty every lane (all priority levels), its counts and due index; the bindings
    stay."""
    from routing.names import LANES
    from tasks.broker.keys import (LANE_DEPTHS_KEY, LIST_DEPTHS_KEY, due_key, lane_keys,
                                   lists_key)

    client.delete(LANE_DEPTHS_KEY, LIST_DEPTHS_KEY,
                  *[key for lane in LANES
                    for key in (*lane_keys(lane), due_key(lane), lists_key(lane))])


def run_rounds(client: Any, publishers: Publishers, jobs: int,
               rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(wall s, CPU s) per round per mode, the order alternating; a warm-up round first."""
    per_round = max(1, jobs // rounds)
    for mode in MODES:  # seeds past the recorded rounds: every recorded submit is a new job
        publishers.batch(mode, rounds * per_round, min(200, per_round))
    flush_lanes(client)
    seconds: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for r in range(rounds):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            seconds[mode].append(publishers.batch(mode, r * per_round, per_round))
            flush_lanes(client)
        print(f"  round {r}: " + ", ".join(f"{m} {per_round / seconds[m][-1][0]:7.0f} jobs/s"
                                           for m in MODES), file=sys.stderr, flush=True)
    return seconds


# --- the pure parts, alone -----------------------------------------------------
def per_call_us(fn: Callable[[int], Any], calls: int) -> float:
    """Mean microseconds per call of ``fn(i)`` over ``calls`` calls."""
    began = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - began) * 1e6 / calls


def pure_parts() -> dict[str, Callable[[int], Any]]:
    """The in-memory steps of ``submit()``, each as ``fn(i)``; imports done once, here."""
    from routing.policy import decide
    from tasks.broker.view import snapshot_cache
    from tasks.jobs.cache import digest, sightings
    from tasks.jobs.schema import validate

    cache, view = snapshot_cache(), snapshot_cache().view()

    def check(i: int) -> Any:
        return validate(PROMPT, tier=TIERS[i % 3], account=ACCOUNT, model="demo", seed=i,
                        steps=SIZE.steps, width=SIZE.size, height=SIZE.size)

    def routed(i: int) -> Any:
        job = check(i)
        return job.encode(), decide(job.tier, job.account, job.downgradable, cache.view())

    def check_echo(i: int) -> Any:
        return validate(model="echo", text=PROMPT, tier=TIERS[i % 3], account=ACCOUNT)

    job = check(1)
    seen = sightings()
    return {"validate": check, "validate, echo (pydantic Input)": check_echo,
            "job.encode() (message body)": lambda i: job.encode(),
            "cache digest + Bloom sighting": lambda i: seen.seen_before(digest(job.encode())),
            "view": lambda i: cache.view(),
            "decide": lambda i: decide(TIERS[i % 3], job.account, True, view),
            "all four in a row": routed}


def time_pure(calls: int) -> dict[str, float]:
    """µs/call of validate, the message body, the snapshot view, decide, and all in a row."""
    return {name: per_call_us(fn, calls) for name, fn in pure_parts().items()}


# --- report ----------------------------------------------------------------------
def summary(seconds: dict[str, list[tuple[float, float]]],
            per_round: int) -> dict[str, dict[str, float]]:
    """Per mode: total jobs/s, median-round jobs/s, wall and CPU µs per call."""
    out = {}
    for mode, rounds in seconds.items():
        walls, cpus = [w for w, _ in rounds], [c for _, c in rounds]
        rate = per_round * len(walls) / sum(walls)
        out[mode] = {"jobs_s": rate, "median_round_jobs_s": per_round / statistics.median(walls),
                     "us_per_call": 1e6 / rate,
                     "cpu_us_per_call": 1e6 * sum(cpus) / (per_round * len(cpus))}
    return out


def paired_ratio(seconds: dict[str, list[tuple[float, float]]], mode: str,
                 against: str = "plain") -> float:
    """Median over rounds of ``mode``'s rate / ``against``'s rate in the same round."""
    return statistics.median(a[0] / s[0] for s, a in zip(seconds[mode], seconds[against]))


LABELS = {"submit": "`submit()` without a seed (validate + route + publish)",
          "submit_seeded": "`submit(seed=i)` (claimed in the result cache, same script)",
          "submit_echo": "`submit(model=\"echo\")` (a class model: pydantic)",
          "plain": "plain Celery: a default app's `apply_async(queue=tier)`, own process"}


def table(modes: dict[str, dict[str, float]], pure: dict[str, float],
          paired: dict[str, float]) -> str:
    """The markdown table printed at the end."""
    plain = modes["plain"]
    rows = [[LABELS[mode], f"{m['jobs_s']:.0f}", f"{m['median_round_jobs_s']:.0f}",
             f"{m['us_per_call']:.0f}", f"{m['cpu_us_per_call']:.0f}"]
            for mode, m in modes.items()]
    for mode, ratio in paired.items():
        m = modes[mode]
        rows.append([f"ratio {mode} / plain", f"{m['jobs_s'] / plain['jobs_s']:.3f}x",
                     f"{ratio:.3f}x (paired)",
                     f"gap {m['us_per_call'] - plain['us_per_call']:+.0f}",
                     f"gap {m['cpu_us_per_call'] - plain['cpu_us_per_call']:+.0f}"])
    rows += [[f"pure part: {part}", "", "", f"{us:.1f}", ""] for part, us in pure.items()]
    return markdown_table(["what", "jobs/s (all rounds)", "jobs/s (median round)",
                           "µs per call", "CPU µs per call"], rows)


def verdict(paired: dict[str, float]) -> str:
    """One line per goal, stated for the paired ratio."""
    return "\n".join(
        f"{mode} publishes at {paired[mode]:.3f}x plain Celery's rate (median of paired "
        f"rounds); goal >= {goal:g}x: {'met' if paired[mode] >= goal else 'NOT met'}."
        for mode, goal in GOALS.items())


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """Start Redis, the snapshot writer and the publishers, run every round, stop all."""
    from gpu_worker.redis_server import EmbeddedRedis
    from tasks.settings import settings

    server = EmbeddedRedis(state).start()
    writer, interrupted, publishers = SnapshotWriter(server.client()), False, None
    try:
        writer.write()
        writer.start()
        publishers = Publishers(settings.broker_url)
        seconds = run_rounds(server.client(), publishers, args.jobs, args.rounds)
        pure = time_pure(PURE_CALLS)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if publishers is not None:
            publishers.stop()
        writer.stop()
        server.stop()
    if interrupted:
        raise KeyboardInterrupt
    return {"modes": summary(seconds, max(1, args.jobs // args.rounds)), "pure_us": pure,
            "paired_ratio": {mode: paired_ratio(seconds, mode) for mode in MODES[:-1]},
            "seconds": seconds}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--jobs`` must be at least ``--rounds``."""
    parser = argparse.ArgumentParser(prog="python benchmarks/submit.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per mode (default: 3000)")
    parser.add_argument("--rounds", type=int, default=20,
                        help="interleaved rounds the jobs are split into (default: 20; short "
                             "rounds keep a slow stretch of a shared machine from landing "
                             "on one mode)")
    json_option(parser, "submit")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.jobs < args.rounds:
        parser.error("--rounds must be >= 1 and --jobs at least --rounds")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table and the verdicts; 130 after Ctrl-C."""
    args = parse_args(argv)
    report = run_private("gl-sub-", lambda state: benchmark(args, state), "Redis is stopped",
                         HEARTBEAT_S=HEARTBEAT_S, CACHE="on")
    if report is None:
        return 130
    print(table(report["modes"], report["pure_us"], report["paired_ratio"]))
    print(verdict(report["paired_ratio"]))
    print(f"{args.jobs // args.rounds * args.rounds} jobs per mode in {args.rounds} rounds, "
          f"a process per mode, embedded Redis; total wall time {report['wall_s']:.1f}s")
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What routing costs on the submit path: ``submit()`` against a plain ``apply_async``.

``python benchmarks/submit.py`` starts an embedded Redis in a short temporary
folder (no workers, no beat: nothing consumes, we only publish) and, in one
process, publishes the same jobs two ways:

*submit*: ``tasks.api.submit(prompt, tier=..., seed=i)``: validate every
field, claim the job's digest in the result cache (one Lua round trip, as
every seeded job does; each job here is new, so each claim leads and is
published), read the in-process lane snapshot, ``decide()`` the lane,
``apply_async``.
*apply_async*: ``generate.apply_async(kwargs=..., queue=tier)`` with a kwargs
dict of the same shape built by hand (``benchmarks.common.plain_kwargs``, no
validation, no routing), which is what a plain Celery user does.

So that ``submit()`` really routes through ``decide()`` with a live view (not
the tier-only fallback it takes when the snapshot is stale), a background
thread stands in for beat: every heartbeat it writes a realistic snapshot
(lane depths, policy, two workers, exhausted accounts, relax levels) with a
fresh ``at`` under ``routing.names.SNAPSHOT_KEY``. The heartbeat is 1 s
(``GPULANES_HEARTBEAT_S=1``; it was 0.5): beat works in whole seconds, where
a setting below 1 acts as 1, so the stand-in writes at the pace a real beat
does; the router refreshes its view every 0.5 s. Before every round the run
checks that ``submit()`` has a live view, and aborts if not.

The ``--jobs`` jobs per mode (tiers in turn: fast, standard, relaxed) run in
``--rounds`` interleaved rounds; who goes first alternates, so machine noise
hits both alike. Each round's AsyncResults are kept until its clock stops
(as a caller would keep them), and the lanes are emptied between rounds so
Redis does not grow. One unrecorded warm-up round per mode runs first.

Reading the table: jobs/s per mode over all rounds (total jobs / total
time), the median round, the wall time per call that implies and the CPU
time this process spent per call (less sensitive to other load on the
machine than wall time; it includes the snapshot threads). Two ratios
submit/apply_async follow: of the totals, and the median of the per-round
ratios (each round runs both modes back to back, so a slow stretch of the
machine hits both sides of one pair; this is the headline, goal >= 0.9x,
and the verdict names both). The lower rows time the pure parts of
``submit()`` alone, in memory with no Redis call: ``validate``, building the
message body (``Job.encode()``), the snapshot ``view()``, ``decide()`` and
all four in a row, in microseconds per call; compare the last with the
per-call gaps between the two modes.
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
    JobSize,
    markdown_table,
    plain_kwargs,
    run_private,
    write_json,
)

MODES = ("submit", "submit_echo", "apply_async")
ACCOUNT = "bench"
SIZE = JobSize(steps=20, size=256)
GOAL_RATIO = 0.9
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


# --- the two ways to publish -------------------------------------------------
def send_submit(i: int) -> Any:
    """Publish job ``i`` through gpulanes' ``submit()``."""
    from tasks.api import submit

    return submit(PROMPT, tier=TIERS[i % 3], account=ACCOUNT, seed=i,
                  steps=SIZE.steps, width=SIZE.size, height=SIZE.size)


def send_plain(i: int) -> Any:
    """What a plain Celery user writes: the same kwargs shape, queue = tier."""
    from tasks.worker.generate import generate

    tier = TIERS[i % 3]
    return generate.apply_async(kwargs=plain_kwargs(PROMPT, tier, ACCOUNT, i, SIZE), queue=tier)


def send_echo(i: int) -> Any:
    """Publish job ``i`` of ``echo``, a class model: its inputs checked by pydantic."""
    from tasks.api import submit

    return submit(model="echo", text=f"{PROMPT} {i}", tier=TIERS[i % 3], account=ACCOUNT)


SENDERS: dict[str, Callable[[int], Any]] = {"submit": send_submit, "submit_echo": send_echo,
                                            "apply_async": send_plain}


def assert_live_view() -> None:
    """Fail loudly if ``submit()`` would route by tier only (stale or missing snapshot)."""
    from tasks.broker.enqueue import snapshot_cache

    if snapshot_cache().view() is None:
        raise SystemExit("benchmarks/submit.py: submit() sees no fresh snapshot; "
                         "the measurement would skip decide()")


def timed_batch(mode: str, first: int, n: int) -> tuple[float, float]:
    """(wall s, this process's CPU s) to publish ``n`` jobs; results kept until the clocks stop."""
    send, kept = SENDERS[mode], []
    began, cpu = time.perf_counter(), time.process_time()
    for i in range(first, first + n):
        kept.append(send(i))
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    del kept  # unsubscribing from the results happens here, off the clock
    return elapsed, cpu


def flush_lanes(client: Any) -> None:
    """Empty every lane (all priority levels) and the publish ledger; kombu's bindings stay."""
    from routing.names import LANES
    from tasks.broker.keys import LEDGER_KEY, lane_keys

    client.delete(LEDGER_KEY, *[key for lane in LANES for key in lane_keys(lane)])


def run_rounds(client: Any, jobs: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(wall s, CPU s) per round per mode, the order alternating; a warm-up round first."""
    per_round = max(1, jobs // rounds)
    for mode in MODES:  # seeds past the recorded rounds: every recorded submit is a new job
        timed_batch(mode, rounds * per_round, min(200, per_round))
    flush_lanes(client)
    seconds: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for r in range(rounds):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            assert_live_view()
            seconds[mode].append(timed_batch(mode, r * per_round, per_round))
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
    from tasks.broker.enqueue import snapshot_cache
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


def paired_ratio(seconds: dict[str, list[tuple[float, float]]], mode: str = "submit",
                 against: str = "apply_async") -> float:
    """Median over rounds of ``mode``'s rate / ``against``'s rate in the same round."""
    return statistics.median(a[0] / s[0] for s, a in zip(seconds[mode], seconds[against]))


def table(modes: dict[str, dict[str, float]], pure: dict[str, float], paired: float,
          echo_paired: float) -> str:
    """The markdown table printed at the end."""
    s, e, a = modes["submit"], modes["submit_echo"], modes["apply_async"]
    rows = [[label, f"{m['jobs_s']:.0f}", f"{m['median_round_jobs_s']:.0f}",
             f"{m['us_per_call']:.0f}", f"{m['cpu_us_per_call']:.0f}"]
            for m, label in ((s, "`submit()` (validate + route + publish)"),
                             (e, "`submit(model=\"echo\")` (a class model: pydantic)"),
                             (a, "plain `generate.apply_async(queue=tier)`"))]
    for label, m, o, ratio in (("submit / apply_async", s, a, paired),
                               ("submit echo / submit", e, s, echo_paired)):
        rows.append([f"ratio {label}", f"{m['jobs_s'] / o['jobs_s']:.3f}x",
                     f"{ratio:.3f}x (paired)", f"gap {m['us_per_call'] - o['us_per_call']:+.0f}",
                     f"gap {m['cpu_us_per_call'] - o['cpu_us_per_call']:+.0f}"])
    rows += [[f"pure part: {part}", "", "", f"{us:.1f}", ""] for part, us in pure.items()]
    return markdown_table(["what", "jobs/s (all rounds)", "jobs/s (median round)",
                           "µs per call", "client CPU µs per call"], rows)


def verdict(modes: dict[str, dict[str, float]], paired: float) -> str:
    """One line on the goal, stated for the paired ratio."""
    ratio = modes["submit"]["jobs_s"] / modes["apply_async"]["jobs_s"]
    met = "met" if paired >= GOAL_RATIO else "NOT met"
    return (f"submit() publishes at {paired:.3f}x the rate of a plain apply_async, median of "
            f"paired rounds ({ratio:.3f}x over all rounds); goal >= {GOAL_RATIO:g}x: {met}.")


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """Start Redis and the snapshot writer, run every round, stop both."""
    from gpu_worker.redis_server import EmbeddedRedis

    server = EmbeddedRedis(state).start()
    writer, interrupted = SnapshotWriter(server.client()), False
    try:
        writer.write()
        writer.start()
        seconds = run_rounds(server.client(), args.jobs, args.rounds)
        pure = time_pure(PURE_CALLS)
    except KeyboardInterrupt:
        # Re-raised below: leaving this block drops the frames that hold AsyncResults
        # while Redis still answers (after it stops, their __del__ retries for ~20 s).
        interrupted = True
    finally:
        writer.stop()
        server.stop()
    if interrupted:
        raise KeyboardInterrupt
    return {"modes": summary(seconds, max(1, args.jobs // args.rounds)), "pure_us": pure,
            "paired_ratio": paired_ratio(seconds),
            "echo_paired_ratio": paired_ratio(seconds, "submit_echo", "submit"),
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
    parser.add_argument("--cache", choices=("on", "off"), default="on",
                        help="GPULANES_CACHE for submit(): off skips the claim round trip "
                             "(default: on)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write results here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.jobs < args.rounds:
        parser.error("--rounds must be >= 1 and --jobs at least --rounds")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table and the verdict; 130 after Ctrl-C."""
    args = parse_args(argv)
    report = run_private("gl-sub-", lambda state: benchmark(args, state), "Redis is stopped",
                         HEARTBEAT_S=HEARTBEAT_S, CACHE=args.cache)
    if report is None:
        return 130
    print(table(report["modes"], report["pure_us"], report["paired_ratio"],
                report["echo_paired_ratio"]))
    print(verdict(report["modes"], report["paired_ratio"]))
    print(f"{args.jobs // args.rounds * args.rounds} jobs per mode in {args.rounds} rounds, "
          f"one process, embedded Redis; total wall time {report['wall_s']:.1f}s")
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

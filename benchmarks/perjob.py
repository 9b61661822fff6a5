"""Redis commands and CPU per job, end to end: gpulanes against a plain Celery app.

``python benchmarks/perjob.py`` starts an embedded Redis and both sides on it at once,
each serving a job that does nothing, so that what is left is the per-job path.
*gpulanes*: one worker (``LocalCluster``, no beat) serving the ``echo`` model (no
weights, warm); its caller, this process, sends ``submit(model="echo",
tier="standard")`` and reads each result with ``.get()``. *plain*: a default Celery
app (``benchmarks/perjob_plain.py``, never importing gpulanes, its own Redis database):
its worker ``--pool threads -c 1 -E``, late acks, prefetch 1; its caller, a process of
its own, sends ``apply_async`` and reads each result with ``.get()``. Both store
STARTED and SUCCESS, send task events, and report no progress (echo's one step is
its last, which gpulanes never reports).

1. End to end, in rounds alternating the sides: ``CONFIG RESETSTAT``, a round of jobs
   sent and each ``.get()``, a short settle; ``INFO commandstats`` and ``INFO cpu``
   (Redis' user + sys time) over it. Each round is followed by as long a wait with no
   jobs, the idle background (both sides' workers and callers, this process's reads),
   subtracted. A round under ``MONITOR`` counts the commands run inside Lua scripts:
   those sent are the rest (a script counts once).
2. The worker alone: jobs queued while the worker is paused (SIGSTOP), counted from
   its resume until every result is stored (this process's ``EXISTS`` polls subtracted).
3. Idle pickup: one job sent to an idle worker, from just before the send to the
   job's start as the worker stamps it (``time.time()``, one clock); the sides
   interleaved, a random pause of 0.2-1 s before each.
4. Idle CPU: both workers idle for ``--idle-s``, each one's processes' CPU time
   (threads and child processes, in 10 ms clock ticks) as a share of one core.

The goals are the ``GOAL_*`` constants; ``--json`` writes the figures.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (  # noqa: E402
    finish, json_option, markdown_table, percentile, run_private)
from benchmarks.perjob_sides import ECHO_SETTINGS, SETTLE_S, Side, on_both_sides  # noqa: E402

GOAL_COMMANDS = 1.5  #: end-to-end Redis commands per job, at most this times plain's
GOAL_REDIS_CPU = 1.2  #: Redis CPU per job, at most this times plain's
GOAL_RATE = 0.7  #: end-to-end jobs/s, at least this times plain's
GOAL_PICKUP = 1.0  #: idle pickup p50 and p99, at most this times plain's
GOAL_IDLE_CPU_PCT = 1.0  #: an idle worker's CPU, at most this % of one core
SIDES = ("gpulanes", "plain")


# --- what Redis did --------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """What Redis did over one stretch: its length, calls per command, CPU seconds."""

    seconds: float
    calls: Counter
    cpu_s: float


def redis_cpu_s(client: Any) -> float:
    """Redis' CPU time so far (user + sys, all its threads)."""
    cpu = client.info("cpu")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"]


def window(client: Any, action: Callable[[], Any]) -> Window:
    """``action()`` between ``CONFIG RESETSTAT`` and ``INFO commandstats``."""
    client.config_resetstat()
    cpu_s, began = redis_cpu_s(client), time.perf_counter()
    action()
    seconds, cpu_s = time.perf_counter() - began, redis_cpu_s(client) - cpu_s
    calls = Counter({name.removeprefix("cmdstat_"): stats["calls"]
                     for name, stats in client.info("commandstats").items()})
    return Window(seconds, calls, cpu_s)


def idle_like(client: Any, busy: Window) -> Window:
    """A window as long as ``busy`` with no jobs: the background, the same own reads."""
    return window(client, lambda: time.sleep(busy.seconds))


def net_per_job(busy: list[Window], idle: list[Window], jobs: int,
                own: Counter | None = None) -> dict[str, Any]:
    """Per job: the commands and Redis CPU of ``busy`` less those of ``idle`` (as long)
    and ``own`` (this process's calls not in ``idle``). The total keeps every command's
    net count, noise below zero included; the commands listed are those above zero."""
    calls = sum((w.calls for w in busy), Counter())
    calls.subtract(sum((w.calls for w in idle), Counter()))
    calls.subtract(own or Counter())
    return {"jobs": jobs, "seconds": sum(w.seconds for w in busy),
            "commands_per_job": sum(calls.values()) / jobs,
            "per_job": {name: n / jobs for name, n in sorted(calls.items()) if n > 0},
            "redis_cpu_us_per_job": 1e6 * (sum(w.cpu_s for w in busy)
                                           - sum(w.cpu_s for w in idle)) / jobs}


class ScriptCommands:
    """Counts the commands Redis runs inside Lua scripts while it lasts (``MONITOR``
    marks them ``lua``). A pass of its own: ``MONITOR`` slows Redis down."""

    def __init__(self, client: Any) -> None:
        self.client, self.count, self.mark = client, 0, f"perjob-{uuid.uuid4()}"
        self._monitor, self._seen = client.monitor(), threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def __enter__(self) -> "ScriptCommands":
        self._monitor.__enter__()
        self._thread.start()
        return self

    def _listen(self) -> None:
        try:
            for command in self._monitor.listen():
                self.count += command.get("client_type") == "lua"
                if self.mark in command.get("command", ""):
                    self._seen.set()
        except Exception:  # noqa: BLE001  the connection closed: the pass is over
            return

    def __exit__(self, *exc: Any) -> None:
        self.client.echo(self.mark)  # read up to here before closing
        self._seen.wait(30)
        self._monitor.connection.disconnect()
        self._thread.join(5)


# --- the measurements ----------------------------------------------------------------
def end_to_end(client: Any, sides: list[Side], jobs: int, rounds: int,
               pass_jobs: int) -> dict[str, Any]:
    """Each side's jobs end to end, in ``rounds`` rounds alternating which goes first,
    each followed by its idle background; then ``pass_jobs`` under ``MONITOR``."""
    busy: dict[str, list[Window]] = {side.name: [] for side in sides}
    idle: dict[str, list[Window]] = {side.name: [] for side in sides}
    per_round = jobs // rounds
    for index in range(rounds):
        for side in sides if index % 2 == 0 else sides[::-1]:
            busy[side.name].append(window(client, lambda: side.run(per_round)))
            idle[side.name].append(idle_like(client, busy[side.name][-1]))
    figures = {}
    for side in sides:
        net = net_per_job(busy[side.name], idle[side.name], per_round * rounds)
        net["jobs_s"] = per_round * rounds / (net["seconds"] - rounds * SETTLE_S)
        net["in_scripts_per_job"] = in_scripts(client, side, pass_jobs)
        net["sent_per_job"] = net["commands_per_job"] - net["in_scripts_per_job"]
        figures[side.name] = net
    return figures


def in_scripts(client: Any, side: Side, jobs: int) -> float:
    """Commands per job Redis runs inside Lua scripts for ``side``, end to end."""
    with ScriptCommands(client) as busy:
        began = time.perf_counter()
        side.run(jobs)
        took_s = time.perf_counter() - began
    with ScriptCommands(client) as idle:
        time.sleep(took_s)
    return max(0.0, (busy.count - idle.count) / jobs)


def worker_only(client: Any, side: Side, jobs: int) -> dict[str, Any]:
    """Commands per job of ``side``'s worker alone: its jobs queued while it is paused,
    counted from its resume until every result is stored."""
    import redis

    results = redis.Redis(unix_socket_path=client.connection_pool.connection_kwargs["path"],
                          db=side.db)
    results.ping()  # connected before the count
    os.kill(side.worker_pid, signal.SIGSTOP)
    try:
        keys = [f"celery-task-meta-{job_id}" for job_id in side.caller.send(jobs)]
    except BaseException:
        os.kill(side.worker_pid, signal.SIGCONT)
        raise
    polls: list[int] = []
    busy = window(client, lambda: (os.kill(side.worker_pid, signal.SIGCONT),
                                   polls.append(wait_stored(results, keys))))
    idle = idle_like(client, busy)
    side.caller.fetch()
    figures = net_per_job([busy], [idle], jobs, Counter(exists=polls[0]))
    return {key: figures[key] for key in ("jobs", "commands_per_job", "per_job")}


def wait_stored(client: Any, keys: list[str]) -> int:
    """Poll until every result key exists; how many ``EXISTS`` this cost (then a settle)."""
    polls, deadline = 0, time.monotonic() + 600
    while True:
        polls += 1
        if client.exists(*keys) == len(keys):
            time.sleep(SETTLE_S)
            return polls
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmarks/perjob.py: {len(keys)} jobs not done in 600 s")
        time.sleep(0.05)


def pickups(sides: list[Side], count: int, rng: random.Random) -> dict[str, dict[str, Any]]:
    """Idle pickup of each side, ``count`` times, the sides in a random order each time
    (after a couple of seconds' rest)."""
    waits: dict[str, list[float]] = {side.name: [] for side in sides}
    time.sleep(2)
    for _ in range(count):
        for side in rng.sample(sides, len(sides)):
            time.sleep(rng.uniform(0.2, 1.0))
            waits[side.name].append(1000 * side.caller.pickup())
    return {name: {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99),
                   "max": max(ms), "samples": len(ms)} for name, ms in waits.items()}


def process_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` and its live children, all their threads."""
    import psutil

    root = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)])


def idle_cpu(client: Any, sides: list[Side], seconds: float) -> dict[str, float]:
    """Each side's worker processes' CPU, and Redis', as % of one core over ``seconds``
    with no jobs (after a couple of seconds' rest)."""
    time.sleep(2)
    before = {side.name: process_cpu_s(side.root_pid) for side in sides}
    redis_before, began = redis_cpu_s(client), time.perf_counter()
    time.sleep(seconds)
    took_s = time.perf_counter() - began
    pct = {side.name: 100 * (process_cpu_s(side.root_pid) - before[side.name]) / took_s
           for side in sides}
    return {**pct, "redis": 100 * (redis_cpu_s(client) - redis_before) / took_s}


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    return on_both_sides(state, lambda client, sides: measure(client, sides, args))


def measure(client: Any, sides: list[Side], args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of both sides, their ratios and the goals met."""
    total = end_to_end(client, sides, args.jobs, args.rounds, args.pass_jobs)
    alone = {side.name: worker_only(client, side, args.pass_jobs) for side in sides}
    waits = pickups(sides, args.pickups, random.Random(args.seed))
    idle = idle_cpu(client, sides, args.idle_s)
    figures = {
        "config": {"jobs": args.jobs // args.rounds * args.rounds, "rounds": args.rounds,
                   "pass_jobs": args.pass_jobs, "pickups": args.pickups,
                   "idle_s": args.idle_s, "settle_s": SETTLE_S},
        "goals": {"commands": GOAL_COMMANDS, "redis_cpu": GOAL_REDIS_CPU, "jobs_s": GOAL_RATE,
                  "pickup": GOAL_PICKUP, "idle_cpu_pct": GOAL_IDLE_CPU_PCT},
        "sides": {name: {"end_to_end": total[name], "worker_only": alone[name],
                         "pickup_ms": waits[name], "idle_cpu_pct": idle[name]}
                  for name in SIDES},
        "idle_redis_cpu_pct": idle["redis"]}
    return {**figures, **verdicts(figures["sides"])}


def figure(side: dict[str, Any], path: tuple[str, ...]) -> Any:
    """The figure at ``path`` of a side's figures."""
    for key in path:
        side = side[key]
    return side


#: gpulanes over plain: (name, the figure's path)
RATIOS = (("commands", ("end_to_end", "commands_per_job")),
          ("sent", ("end_to_end", "sent_per_job")),
          ("redis_cpu", ("end_to_end", "redis_cpu_us_per_job")),
          ("jobs_s", ("end_to_end", "jobs_s")),
          ("worker_commands", ("worker_only", "commands_per_job")),
          ("pickup_p50", ("pickup_ms", "p50")), ("pickup_p99", ("pickup_ms", "p99")))


def verdicts(sides: dict[str, Any]) -> dict[str, Any]:
    """gpulanes over plain for each figure, and whether each goal is met."""
    ratios = {name: figure(sides["gpulanes"], path) / figure(sides["plain"], path)
              for name, path in RATIOS}
    met = {"commands": ratios["commands"] <= GOAL_COMMANDS,
           "redis_cpu": ratios["redis_cpu"] <= GOAL_REDIS_CPU,
           "jobs_s": ratios["jobs_s"] >= GOAL_RATE,
           "pickup": max(ratios["pickup_p50"], ratios["pickup_p99"]) <= GOAL_PICKUP,
           "idle_cpu_pct": all(sides[name]["idle_cpu_pct"] <= GOAL_IDLE_CPU_PCT
                               for name in SIDES)}
    return {"ratios": ratios, "met": met}


#: the report's rows: (label, the figure's path, digits)
ROWS = (("Redis commands per job, end to end", ("end_to_end", "commands_per_job"), 1),
        ("of them inside Lua scripts", ("end_to_end", "in_scripts_per_job"), 1),
        ("commands sent per job (a script counts once)", ("end_to_end", "sent_per_job"), 1),
        ("Redis CPU per job (µs)", ("end_to_end", "redis_cpu_us_per_job"), 0),
        ("jobs/s, end to end", ("end_to_end", "jobs_s"), 0),
        ("Redis commands per job, worker alone", ("worker_only", "commands_per_job"), 1),
        ("idle pickup p50 (ms)", ("pickup_ms", "p50"), 1),
        ("idle pickup p99 (ms)", ("pickup_ms", "p99"), 1),
        ("idle worker CPU (% of a core)", ("idle_cpu_pct",), 2))


def report(figures: dict[str, Any]) -> None:
    sides = figures["sides"]
    print(markdown_table(["per job", "gpulanes", "plain Celery"], [
        [label, *(f"{figure(sides[name], path):.{digits}f}" for name in SIDES)]
        for label, path, digits in ROWS]))
    print("gpulanes / plain: " + ", ".join(f"{name} {value:.2f}x"
                                           for name, value in figures["ratios"].items()))
    print("goals (" + ", ".join(f"{name} {bound:g}" for name, bound in
                                figures["goals"].items()) + "): " + ", ".join(
        f"{name} {'met' if met else 'NOT met'}" for name, met in figures["met"].items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/perjob.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kind, default, what in (
            ("--jobs", int, 400, "jobs per side end to end"),
            ("--rounds", int, 8, "rounds they are split in, alternating the sides"),
            ("--pass-jobs", int, 100, "jobs per side under MONITOR, and for the worker alone"),
            ("--pickups", int, 100, "idle pickups per side"),
            ("--idle-s", float, 10.0, "seconds of idle CPU"),
            ("--seed", int, 0, "of the random pauses")):
        parser.add_argument(flag, type=kind, default=default, help=f"{what} (default: {default})")
    json_option(parser, "perjob")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= args.jobs:
        parser.error("--rounds must be at least 1 and at most --jobs")
    figures = run_private("gl-perjob-", lambda state: benchmark(args, state),
                          "Redis is stopped", **ECHO_SETTINGS)
    return finish(figures, report, args.json)


if __name__ == "__main__":
    sys.exit(main())

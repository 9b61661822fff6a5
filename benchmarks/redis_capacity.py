"""How many jobs/s one Redis core carries: gpulanes against a plain Celery app.

``python benchmarks/redis_capacity.py`` starts an embedded Redis and the two sides of
``benchmarks/perjob.py`` on it (a gpulanes worker serving ``echo``, and a default
Celery app's worker and caller, each its own process). Each side, in rounds taking
turns, at the highest rate this machine gives it:

1. **send**: with its worker paused (SIGSTOP), its caller sends ``--jobs`` jobs as
   fast as it can (``submit()``; plain: ``apply_async``);
2. **drain**: the worker resumed, until every result is stored; then the caller reads
   each result (``.get()``).

Over both windows, Redis' CPU (``INFO cpu``: user + sys) and the time its commands
ran (``INFO commandstats``: the sum of ``usec``), less those of an as-long window
with no jobs. Per job, that gives:

- ``cpu_us``: Redis' CPU for the job: its commands, and reading and answering them.
  One core at 50 % busy carries ``0.5 s / cpu_us`` jobs/s. Measured at the rate this
  machine reaches: Redis reads more commands per wake-up at higher rates, so a faster
  fleet costs it less per job, and this figure is an upper bound of the cost;
- ``command_us``: the time its commands ran alone, the cost no batching removes:
  ``0.5 s / command_us`` bounds what one core carries at 50 % from above.

The fleet's need: the jobs/s 10,000 GPUs finish (``benchmarks/fleet_routing``'s
fleet, each worker's concurrency over its service time), against the two bounds.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import finish, json_option, markdown_table, run_private  # noqa: E402
from benchmarks.perjob import redis_cpu_s  # noqa: E402
from benchmarks.perjob_sides import ECHO_SETTINGS, Side, on_both_sides  # noqa: E402

#: The share of a core Redis may be busy with jobs: the rest is headroom for bursts,
#: the heartbeats and a replica's sync.
BUSY_SHARE = 0.5
FLEET_GPUS = 10_000
TOP = 6  #: the commands listed with their time per job, the costliest first


@dataclass(frozen=True)
class Spent:
    """What Redis spent over a stretch: seconds of it, of its CPU, of each command."""

    seconds: float
    cpu_s: float
    usec: Counter = field(default_factory=Counter)  #: microseconds each command ran

    @property
    def command_s(self) -> float:
        return sum(self.usec.values()) / 1e6

    def __add__(self, other: "Spent") -> "Spent":
        return Spent(self.seconds + other.seconds, self.cpu_s + other.cpu_s,
                     self.usec + other.usec)

    def __sub__(self, other: "Spent") -> "Spent":
        usec = Counter(self.usec)
        usec.subtract(other.usec)
        return Spent(self.seconds - other.seconds, self.cpu_s - other.cpu_s, usec)


def command_usec(client: Any) -> Counter:
    """Microseconds each command has run since the last ``CONFIG RESETSTAT``."""
    return Counter({name.removeprefix("cmdstat_"): stats["usec"]
                    for name, stats in client.info("commandstats").items()})


def spent(client: Any, action: Callable[[], Any]) -> Spent:
    """What Redis spent while ``action()`` ran (``CONFIG RESETSTAT`` first)."""
    client.config_resetstat()
    cpu_s, began = redis_cpu_s(client), time.perf_counter()
    action()
    seconds, cpu_s = time.perf_counter() - began, redis_cpu_s(client) - cpu_s
    return Spent(seconds, cpu_s, command_usec(client))


def one_round(client: Any, side: Side, jobs: int) -> dict[str, float]:
    """``jobs`` sent to ``side``'s paused worker, then drained and read: per job, Redis' CPU and
    command time less an idle window as long; the send and drain rates and Redis' busy
    share over them."""
    os.kill(side.worker_pid, signal.SIGSTOP)
    try:
        send = spent(client, lambda: side.caller.send(jobs))
    finally:
        os.kill(side.worker_pid, signal.SIGCONT)
    drain = spent(client, side.caller.fetch)  # each result read, as its caller would
    busy = send + drain
    idle = spent(client, lambda: time.sleep(busy.seconds))
    net = busy - idle
    return {"cpu_us": 1e6 * net.cpu_s / jobs, "command_us": 1e6 * net.command_s / jobs,
            "send_jobs_s": jobs / send.seconds, "drain_jobs_s": jobs / drain.seconds,
            "busy_pct": 100 * busy.cpu_s / busy.seconds,
            "commands_us": {name: usec / jobs for name, usec in net.usec.items() if usec > 0}}


def script_costs(client: Any, side: Side, jobs: int) -> dict[str, dict[str, float]]:
    """Each Lua script ``side``'s jobs run: calls per job and µs per call, from a pass
    of ``jobs`` under a ``SLOWLOG`` that logs every command (it slows Redis: a pass of
    its own)."""
    import hashlib

    from tasks.broker.scripts import LUA_DIR, source

    names = {hashlib.sha1(source(path.stem).encode()).hexdigest(): path.stem
             for path in LUA_DIR.glob("*.lua")}
    config = client.config_get("slowlog-*")
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 100 * jobs)
    client.slowlog_reset()
    try:
        side.run(jobs)
        entries = client.slowlog_get(100 * jobs)
    finally:
        client.config_set("slowlog-log-slower-than", config["slowlog-log-slower-than"])
        client.config_set("slowlog-max-len", config["slowlog-max-len"])
    calls: Counter = Counter()
    usec: Counter = Counter()
    for entry in entries:
        words = entry["command"].split()
        if words and words[0].upper() == b"EVALSHA":
            name = names.get(words[1].decode(), "other")
            calls[name] += 1
            usec[name] += entry["duration"]
    return {name: {"calls_per_job": round(n / jobs, 2), "us_per_call": round(usec[name] / n, 1)}
            for name, n in calls.most_common()}


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over ``runs``; of the commands, the :data:`TOP` costliest."""
    figures = {key: round(statistics.median(run[key] for run in runs), 1)
               for key in runs[0] if key != "commands_us"}
    names = {name for run in runs for name in run["commands_us"]}
    commands = {name: statistics.median(run["commands_us"].get(name, 0.0) for run in runs)
                for name in names}
    top = sorted(commands.items(), key=lambda item: -item[1])[:TOP]
    return {**figures, "commands_us": {name: round(us, 1) for name, us in top}}


def fleet_jobs_s(gpus: int) -> float:
    """Jobs/s a fleet of ``gpus`` workers finishes (``benchmarks.fleet_routing``'s)."""
    from benchmarks.fleet_routing import service_rate
    from tests.harness.fleet import fleet_snapshot

    return service_rate(fleet_snapshot(gpus, 1))


def by_policy(client: Any, sides: list[Side], jobs: int, rounds: int) -> dict[str, Any]:
    """Each side's median round under the AOF policy Redis has now, and the jobs/s one
    core carries."""
    found: dict[str, list[dict[str, float]]] = {side.name: [] for side in sides}
    for index in range(rounds):
        for side in sides if index % 2 == 0 else sides[::-1]:
            found[side.name].append(one_round(client, side, jobs))
            print(f"  {side.name}: {found[side.name][-1]['cpu_us']:.0f} µs",
                  file=sys.stderr, flush=True)
    figures = {name: medians(runs) for name, runs in found.items()}
    for side in figures.values():
        side["core_jobs_s"] = round(BUSY_SHARE * 1e6 / side["cpu_us"])
        side["core_jobs_s_most"] = round(BUSY_SHARE * 1e6 / side["command_us"])
    return {"sides": figures, "ratios": {key: figures["gpulanes"][key] / figures["plain"][key]
                                         for key in ("cpu_us", "command_us")}}


def measure(client: Any, sides: list[Side], args: argparse.Namespace) -> dict[str, Any]:
    """Each AOF policy's figures (``appendfsync``), the scripts' costs, and the fleet's
    need against what one core carries under each."""
    policies = {}
    for policy in args.fsync.split(","):
        client.config_set("appendfsync", policy)
        policies[policy] = by_policy(client, sides, args.jobs, args.rounds)
    scripts = script_costs(client, sides[0], min(args.jobs, 200))
    need = fleet_jobs_s(FLEET_GPUS)
    for found in policies.values():
        ours = found["sides"]["gpulanes"]
        found["fleet_cores"] = [round(need / ours["core_jobs_s_most"], 2),
                                round(need / ours["core_jobs_s"], 2)]
    return {"config": {"jobs": args.jobs, "rounds": args.rounds, "busy_share": BUSY_SHARE},
            "policies": policies, "scripts": scripts,
            "fleet": {"gpus": FLEET_GPUS, "jobs_s": round(need),
                      "one_redis_carries": any(need <= found["sides"]["gpulanes"]["core_jobs_s"]
                                               for found in policies.values())}}


def benchmark(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    return on_both_sides(state, lambda client, sides: measure(client, sides, args), 10)


def report(figures: dict[str, Any]) -> None:
    rows = [("Redis CPU per job (µs)", "cpu_us"),
            ("Redis command time per job (µs)", "command_us"),
            ("jobs/s sent / drained", None),
            ("Redis busy over the round (% of a core)", "busy_pct"),
            (f"jobs/s one core carries at {BUSY_SHARE:.0%} busy", "core_jobs_s"),
            ("at most (command time alone)", "core_jobs_s_most")]
    fleet = figures["fleet"]
    for policy, found in figures["policies"].items():
        sides = found["sides"]
        print(f"\nappendfsync {policy}\n" + markdown_table(
            ["per job", "gpulanes", "plain Celery"],
            [[label, *(f"{sides[s]['send_jobs_s']:.0f} / {sides[s]['drain_jobs_s']:.0f}"
                       if key is None else f"{sides[s][key]:,.0f}" for s in sides)]
             for label, key in rows]))
        for name, side in sides.items():
            print(f"{name}, µs per job: " + ", ".join(
                f"{command} {us:.0f}" for command, us in side["commands_us"].items()))
        least, most = found["fleet_cores"]
        print(f"{fleet['gpus']:,} GPUs finish {fleet['jobs_s']:,} jobs/s: {least:.1f} to "
              f"{most:.1f} Redis cores at {BUSY_SHARE:.0%} busy")
    print("\ngpulanes' scripts, calls per job x µs each: " + ", ".join(
        f"{name} {cost['calls_per_job']:g} x {cost['us_per_call']:.0f}"
        for name, cost in figures["scripts"].items()))
    print(f"one Redis carries {fleet['gpus']:,} GPUs: {fleet['one_redis_carries']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/redis_capacity.py",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per round (1000)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per side (4)")
    parser.add_argument("--fsync", default="always,everysec",
                        help="AOF policies measured in turn (always: the embedded default)")
    json_option(parser, "redis_capacity")
    args = parser.parse_args(argv)
    figures = run_private("gl-capacity-", lambda state: benchmark(args, state),
                          "Redis is stopped", **ECHO_SETTINGS)
    return finish(figures, report, args.json)


if __name__ == "__main__":
    sys.exit(main())

"""The publish ledger's cost: kombu's Redis transport against gpulanes'
(``tasks.broker.transport``).

``python benchmarks/ledger.py`` starts a private embedded Redis and publishes
the same ``generate`` job message with ``apply_async`` through two broker
connections of one process, in alternating rounds: one built on kombu's own
Redis transport (what plain Celery uses), one on gpulanes' transport, which
also writes each message to the ledger in the same Lua call. It reports
publishes per second of each, their ratio (median of paired rounds), and
Redis memory per queued message (``used_memory`` before and after a round,
lanes emptied between rounds).

Two more modes publish through gpulanes' transport inside
``tasks.broker.publish.lane_limit`` (as ``submit()`` does), so that each publish
first sums the lengths of the lane's lists: with the lane in one list, and
with ``--lists`` lists (a lane spread over that many workers' queues and
priority levels, each holding a job). For every mode the table also gives
Redis' own time per publish (``INFO commandstats``, reset before each round):
the cost the one Redis of a cluster pays, free of this process' noise.

This compares two transports under one app and one process, everything else held
equal (no workers): the kombu side is kombu's transport alone, not a plain Celery
user's app; ``benchmarks/submit.py`` sets the whole publish against a default Celery
app in its own process.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402
    json_option,
    markdown_table,
    plain_kwargs,
    run_private,
    write_json,
)

TRANSPORTS = {"kombu's Redis transport": "kombu.transport.redis:Transport",
              "gpulanes' (with the ledger)": "tasks.broker.transport:Transport"}
#: Mode -> (transport, lists the lane is spread over, limit checked).
LIMITED = "gpulanes' with the lane limit"


def modes(lists: int) -> dict[str, tuple[str, int, bool]]:
    ours = TRANSPORTS["gpulanes' (with the ledger)"]
    return {**{name: (cls, 1, False) for name, cls in TRANSPORTS.items()},
            f"{LIMITED}, lane in 1 list": (ours, 1, True),
            f"{LIMITED}, lane in {lists} lists": (ours, lists, True)}


def one_round(connection: Any, client: Any, jobs: int, size: Any, lists: int = 1,
              limited: bool = False) -> tuple[float, float, float]:
    """(publishes per second, bytes of Redis memory per queued message, Redis
    microseconds per publish)."""
    from tasks.broker.keys import lists_key
    from tasks.broker.publish import lane_limit
    from tasks.worker.generate import generate

    client.flushdb()
    for n in range(1, lists):  # other lists of the lane, one job in each
        client.lpush(f"standard.gpu{n}@bench", "x")
        client.sadd(lists_key("standard"), f"standard.gpu{n}@bench")
    before = client.info("memory")["used_memory"]
    client.config_resetstat()
    began = time.perf_counter()
    with lane_limit(10 ** 9 if limited else 0):
        for i in range(jobs):
            generate.apply_async(kwargs=plain_kwargs("a fox", "standard", "bench", i, size),
                                 queue="standard", connection=connection)
    elapsed = time.perf_counter() - began
    redis_us = sum(stat["usec"] for stat in client.info("commandstats").values())
    return (jobs / elapsed, (client.info("memory")["used_memory"] - before) / jobs,
            redis_us / jobs)


def _connection(url: str, transport: str) -> Any:
    """A broker connection on ``transport`` (a class path), whatever the URL names."""
    from kombu import Connection
    from kombu.utils.imports import symbol_by_name

    connection = Connection(url)
    connection.transport_cls = symbol_by_name(transport)  # before its first use
    return connection


def bench(state: Path, args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.common import JobSize
    from gpu_worker.redis_server import EmbeddedRedis
    from tasks import app

    redis_server = EmbeddedRedis(state).start()
    try:
        client, size = redis_server.client(), JobSize(steps=20, size=256)
        runs = {name: (_connection(app.conf.broker_url, cls), lists, limited)
                for name, (cls, lists, limited) in modes(args.lists).items()}
        rounds: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, (connection, lists, limited) in runs.items():
                rounds[name].append(one_round(connection, client, args.jobs, size, lists,
                                              limited))
        return rounds
    finally:
        redis_server.stop()


def report(rounds: dict[str, list[tuple[float, float, float]]],
           args: argparse.Namespace) -> None:
    kombu, ours = (rounds[name] for name in TRANSPORTS)
    ratio = statistics.median(o[0] / k[0] for k, o in zip(kombu, ours))
    rows = []
    for name in modes(args.lists):
        rate, size, redis_us = (statistics.median(column) for column in zip(*rounds[name]))
        rows.append((name, f"{rate:.0f}", f"{size:.0f}", f"{redis_us:.1f}"))
    print(f"\n{args.jobs} publishes per round, {args.rounds} rounds each, alternating\n")
    print(markdown_table(["transport", "publishes/s (median round)",
                          "Redis bytes per queued job", "Redis µs per publish"], rows, "lrrr"))
    print(f"\nledger / kombu: {ratio:.2f}x the publish rate (median of paired rounds)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--lists", type=int, default=64,
                        help="lists the lane is spread over in the last mode (default 64)")
    json_option(parser, "ledger")
    args = parser.parse_args(argv)
    rounds = run_private("gl-ledger-", lambda state: bench(state, args), "Redis stopped")
    if rounds is None:
        return 130
    report(rounds, args)
    wall_s = rounds.pop("wall_s")  # each round: publishes/s, bytes per job, Redis µs per publish
    write_json(args.json, {"jobs": args.jobs, "rounds": args.rounds, "lists": args.lists,
                           "modes": rounds, "wall_s": wall_s})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The publish ledger's cost: kombu's Redis transport against gpulanes' (``tasks.transport``).

``python benchmarks/ledger.py`` starts a private embedded Redis and publishes
the same ``generate`` job message with ``apply_async`` through two broker
connections of one process, in alternating rounds: one built on kombu's own
Redis transport (what plain Celery uses), one on gpulanes' transport, which
also writes each message to the ledger in the same Lua call. It reports
publishes per second of each, their ratio (median of paired rounds), and
Redis memory per queued message (``used_memory`` before and after a round,
lanes emptied between rounds).
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

from benchmarks.common import markdown_table, plain_kwargs, run_private  # noqa: E402

TRANSPORTS = {"kombu's Redis transport": "kombu.transport.redis:Transport",
              "gpulanes' (with the ledger)": "tasks.transport:Transport"}


def one_round(connection: Any, client: Any, jobs: int, size: Any) -> tuple[float, float]:
    """(publishes per second, bytes of Redis memory per queued message)."""
    from tasks.generate import generate

    client.flushdb()
    before = client.info("memory")["used_memory"]
    began = time.perf_counter()
    for i in range(jobs):
        generate.apply_async(kwargs=plain_kwargs("a fox", "standard", "bench", i, size),
                             queue="standard", connection=connection)
    elapsed = time.perf_counter() - began
    return jobs / elapsed, (client.info("memory")["used_memory"] - before) / jobs


def _connection(url: str, transport: str) -> Any:
    """A broker connection on ``transport`` (the URL's scheme would pick gpulanes')."""
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
        connections = {name: _connection(app.conf.broker_url, cls)
                       for name, cls in TRANSPORTS.items()}
        rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in TRANSPORTS}
        for _ in range(args.rounds):
            for name, connection in connections.items():
                rounds[name].append(one_round(connection, client, args.jobs, size))
        return rounds
    finally:
        redis_server.stop()


def report(rounds: dict[str, list[tuple[float, float]]], args: argparse.Namespace) -> None:
    kombu, ours = (rounds[name] for name in TRANSPORTS)
    ratio = statistics.median(o[0] / k[0] for k, o in zip(kombu, ours))
    rows = [(name, f"{statistics.median(r[0] for r in runs):.0f}",
             f"{statistics.median(r[1] for r in runs):.0f}")
            for name, runs in ((name, rounds[name]) for name in TRANSPORTS)]
    print(f"\n{args.jobs} publishes per round, {args.rounds} rounds each, alternating\n")
    print(markdown_table(["transport", "publishes/s (median round)", "Redis bytes per queued job"],
                         rows, "lrr"))
    print(f"\nledger / kombu: {ratio:.2f}x the publish rate (median of paired rounds)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    rounds = run_private("gl-ledger-", lambda state: bench(state, args), "Redis stopped")
    if rounds is None:
        return 130
    report(rounds, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

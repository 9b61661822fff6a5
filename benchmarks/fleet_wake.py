"""Redis' time per publish, its wake-up included, against the number of idle workers.

``python benchmarks/fleet_wake.py`` starts an embedded Redis and, for 10, 100, 1,000
and (as far as the file-descriptor limit allows) 3,000 idle consumers (``--sizes``:
others), times a job's publish (``lua/publish.lua``) two ways:

- ``before``: every consumer subscribed to its lane's shared wake-up channel, as the
  transport subscribed before, and each publish announced there: the script (its wake
  set empty: one ZPOPMAX of nothing), then the PUBLISH the earlier script sent, heard by
  all of them;
- ``after``: every consumer subscribed to its own channel and recorded as idle by its
  take (``tasks.broker.handover.take``), and each publish waking one of them in its
  script; the one woken then takes the job and finds the lanes empty, idle again,
  as a worker does.

Redis' own microseconds (``INFO commandstats``, reset before each publish) exclude the
socket writes to subscribers that Redis makes after the command. Each round measures
every size both ways, one after the other; reported: per size, the median over the
rounds of each round's median of a few hundred publishes.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import finish, json_option, markdown_table, run_private  # noqa: E402

SIZES = (10, 100, 1_000, 3_000)
PUBLISHES = 300
#: Publishes timed together (one ``INFO commandstats`` read), each waking another of
#: the idle consumers, as many as the smallest fleet has.
BATCH = 10
WARMUP = 2  #: batches run before those timed


def wake_publish_us(client: Any, subscribers: int, *, before: bool = False,
                    publishes: int = PUBLISHES) -> float:
    """Redis' median microseconds per publish of a standard job, its wake-up included,
    with ``subscribers`` idle consumers subscribed (``before``: to the lane's shared
    channel, the earlier wake-ups)."""
    return statistics.median(publish_times_us(client, subscribers, before, publishes))


def publish_times_us(client: Any, subscribers: int, before: bool, publishes: int) -> list[float]:
    """Redis' microseconds per publish, of each batch of :data:`BATCH` publishes that
    ``publishes`` make (:func:`wake_publish_us`)."""
    from routing.names import STANDARD
    from tasks.broker.keys import CONSUMER_WAKE_PREFIX, WAKE_PREFIX

    client.flushdb()
    channels = [f"{CONSUMER_WAKE_PREFIX}bench-{n}" for n in range(subscribers)]
    listeners = _unbounded(client)
    subs = [_subscribed(listeners, WAKE_PREFIX + STANDARD if before else name)
            for name in channels]
    try:
        if not before:
            for n, name in enumerate(channels):
                _take(client, n, name)  # finds nothing: idle
        batches = [_batch(client, before, min(BATCH, subscribers))
                   for _ in range(WARMUP + max(1, publishes // BATCH))]
        return batches[WARMUP:]
    finally:
        for sub in subs:
            sub.close()


def _unbounded(client: Any) -> Any:
    """A client of the same Redis whose pool has no limit: a connection per subscriber."""
    import redis

    pool = client.connection_pool
    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=100_000,
        **pool.connection_kwargs))


def _subscribed(client: Any, channel: str) -> Any:
    sub = client.pubsub(ignore_subscribe_messages=True)
    sub.subscribe(channel)
    sub.get_message(timeout=5.0)  # the confirmation: subscribed from here on
    return sub


def _take(client: Any, n: int, wake: str) -> Any:
    """Consumer ``n``'s take over a worker's queues (its own, then the shared lanes')."""
    from routing.names import worker_queues
    from tasks.broker import handover
    from tasks.broker.bindings import PRIORITY_STEPS, lists

    keys = lists(worker_queues(f"bench{n}@host"), PRIORITY_STEPS)
    return handover.take(client, f"bench{n}", keys, uuid.uuid4().hex, record=False, wake=wake)


def _batch(client: Any, before: bool, size: int) -> float:
    """Redis' microseconds per publish of ``size`` publishes in a row (and, ``before``,
    the PUBLISH to all after each); then the jobs are taken, and every consumer woken
    takes again, finds the lanes empty and is idle again."""
    from routing.names import STANDARD
    from tasks.broker.keys import WAKE_PREFIX, wake_key
    from tasks.broker.publish import Message, publish

    idle = set(client.zrange(wake_key(STANDARD), 0, -1))
    messages = [Message(STANDARD, STANDARD, {"headers": {"id": uuid.uuid4().hex}, "body": ""},
                        time.time()) for _ in range(size)]
    client.config_resetstat()
    for message in messages:
        publish(client, message)
        if before:
            client.publish(WAKE_PREFIX + STANDARD, "")
    stats = client.info("commandstats")
    usec = stats.get("cmdstat_evalsha", {}).get("usec", 0)
    if before:
        usec += stats.get("cmdstat_publish", {}).get("usec", 0)
    while _take(client, 0, "") is not None:
        pass
    for name in idle - set(client.zrange(wake_key(STANDARD), 0, -1)):  # "...bench-<n>"
        _take(client, int(name.decode().rsplit("-", 1)[1]), name.decode())
    return usec / size


def sizes_allowed(sizes: tuple[int, ...] = SIZES) -> list[int]:
    """The sizes the file-descriptor limit leaves room for (a connection each)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return [size for size in sizes if size + 200 <= soft]


def benchmark(state: Path, rounds: int, sizes: tuple[int, ...]) -> dict[str, Any]:
    from gpu_worker.redis_server import EmbeddedRedis

    server = EmbeddedRedis(state).start()
    try:
        client = server.client()
        sizes = sizes_allowed(sizes)
        client.config_set("maxclients", max(sizes) + 100)
        runs: dict[int, dict[str, list[float]]] = {
            size: {"before_us": [], "after_us": []} for size in sizes}
        for _ in range(rounds):
            for size in sizes:
                runs[size]["before_us"].append(wake_publish_us(client, size, before=True))
                runs[size]["after_us"].append(wake_publish_us(client, size))
                print(f"{size} subscribers: {runs[size]}", file=sys.stderr)
        return {"subscribers": {size: {way: statistics.median(found)
                                       for way, found in run.items()}
                                for size, run in runs.items()}}
    finally:
        server.stop()


def report(figures: dict[str, Any]) -> None:
    rows = figures["subscribers"]
    print(markdown_table(
        ["idle subscribers", "before: µs per publish", "after: µs per publish"],
        [[f"{size:,}", f"{row['before_us']:.1f}", f"{row['after_us']:.1f}"]
         for size, row in rows.items()]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/fleet_wake.py",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every size (3)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="idle consumers, comma-separated (10,100,1000,3000)")
    json_option(parser, "fleet_wake")
    args = parser.parse_args(argv)
    sizes = tuple(int(size) for size in args.sizes.split(","))
    figures = run_private("gl-wake-", lambda state: benchmark(state, args.rounds, sizes),
                          "Redis is stopped")
    return finish(figures, report, args.json)


if __name__ == "__main__":
    sys.exit(main())

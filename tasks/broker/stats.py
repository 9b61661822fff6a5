"""Workers push their own stats; beat reads them all in one round trip.

Each worker writes its load figures (``gpu_worker.stats``) every heartbeat, stamped
on Redis' clock (``lua/stats_push.lua``). Beat reads every record and stamp at once
and takes as this round's answer each record pushed within the freshness window: a
worker that stopped pushing (dead, frozen, cut off) misses its rounds, and no round
waits for a broadcast's replies to go quiet, whatever the number of workers.
"""
from __future__ import annotations

import json
import logging
from typing import Any

import redis

from tasks.broker import scripts
from tasks.broker.keys import (
    FAIR_WINDOW_S,
    USAGE_BUCKET_S,
    USAGE_PREFIX,
    WORKER_STATS_AT_KEY,
    WORKER_STATS_KEY,
    counts_pushed_key,
)

log = logging.getLogger(__name__)
#: How long Redis remembers a worker process's last batch of counts (a push retried
#: within it is not added twice).
COUNTS_NUMBER_KEPT_S = 86400


def push_stats(client: redis.Redis, host: str, stats: dict[str, Any],
               counts: tuple[str, int, dict[tuple[str, str], float]] | None = None) -> None:
    """Store ``host``'s stats, stamped now, and add ``counts`` (the worker process, the
    batch's number, {(hash, field): amount}) unless that batch is in."""
    keys, args = [WORKER_STATS_KEY, WORKER_STATS_AT_KEY], [host, json.dumps(stats)]
    if counts:
        holder, number, amounts = counts
        place = {key: i for i, key in enumerate(dict.fromkeys(k for k, _ in amounts), 1)}
        keys += [counts_pushed_key(holder), *place]
        args += [number, COUNTS_NUMBER_KEPT_S, *(_kept_s(key) for key in place),
                 *(item for (key, field), amount in amounts.items()
                   for item in (place[key], field, repr(amount)))]
    scripts.run(client, "stats_push", keys, args)


def _kept_s(key: str) -> int:
    """How long a counters hash lasts after a push adds to it (0: for good): an
    account's usage bucket as long as fair shares read it."""
    return FAIR_WINDOW_S + USAGE_BUCKET_S if key.startswith(USAGE_PREFIX) else 0


def fresh_stats(client: redis.Redis, fresh_s: float, forget_s: float) -> dict[str, dict]:
    """{host: stats} of every worker that pushed within ``fresh_s`` (Redis' clock);
    records silent for ``forget_s`` are dropped on the way."""
    with client.pipeline(transaction=False) as pipe:
        (seconds, micros), records, stamps = pipe.time().hgetall(WORKER_STATS_KEY) \
            .zrange(WORKER_STATS_AT_KEY, 0, -1, withscores=True).execute()
    now = seconds + micros / 1e6
    gone = [host for host, at in stamps if now - at > forget_s]
    if gone:
        client.pipeline().hdel(WORKER_STATS_KEY, *gone).zrem(WORKER_STATS_AT_KEY, *gone) \
            .execute()
    replies = {}
    for host, at in stamps:
        raw = records.get(host)
        if now - at <= fresh_s and raw is not None:
            try:
                replies[_text(host)] = json.loads(raw)
            except ValueError:
                log.error("worker %s pushed unreadable stats: ignored", _text(host))
    return replies


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

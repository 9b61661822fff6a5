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
from tasks.broker.keys import WORKER_STATS_AT_KEY, WORKER_STATS_KEY

log = logging.getLogger(__name__)


def push_stats(client: redis.Redis, host: str, stats: dict[str, Any]) -> None:
    """Store ``host``'s stats, stamped now."""
    scripts.run(client, "stats_push", [WORKER_STATS_KEY, WORKER_STATS_AT_KEY],
                [host, json.dumps(stats)])


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

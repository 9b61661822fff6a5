"""Workers push their own stats; beat reads what changed since its last round.

Each worker writes its load figures (``gpu_worker.stats``) every heartbeat, stamped
on Redis' clock (``lua/stats_push.lua``); stats the same as the last are only stamped.
A new leader reads every record and stamp once (``fresh_stats``); then each round
(``lua/stats_read.lua``) reads the records changed since the last and finds by score
the workers whose last push fell out of the freshness window: a worker that stopped
pushing (dead, frozen, cut off) misses its rounds, no round waits for a broadcast's
replies, and a round costs what changed, whatever the number of workers.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Iterable

import redis

from tasks.broker import scripts
from tasks.broker.keys import (
    FAIR_WINDOW_S,
    USAGE_BUCKET_S,
    USAGE_PREFIX,
    WORKER_STATS_AT_KEY,
    WORKER_STATS_CHANGED_KEY,
    WORKER_STATS_KEY,
    WORKER_STATS_QUIET_KEY,
    WORKERS_BY_KEY,
    counts_pushed_key,
)

log = logging.getLogger(__name__)
#: How long Redis remembers a worker process's last batch of counts (a push retried
#: within it is not added twice).
COUNTS_NUMBER_KEPT_S = 86400
#: The stats keys, in the order the scripts take them.
STATS_KEYS = [WORKER_STATS_KEY, WORKER_STATS_AT_KEY, WORKER_STATS_CHANGED_KEY,
              WORKER_STATS_QUIET_KEY]


def push_stats(client: redis.Redis, host: str, stats: dict[str, Any],
               counts: tuple[str, int, dict[tuple[str, str], float]] | None = None) -> None:
    """Store ``host``'s stats, stamped now, and add ``counts`` (the worker process, the
    batch's number, {(hash, field): amount}) unless that batch is in. Its own clock
    (``at``) is left out: the same stats as the last push are only stamped, and beat
    times them by Redis' clock."""
    stats = {key: value for key, value in stats.items() if key != "at"}
    keys, args = [*STATS_KEYS], [host, json.dumps(stats)]
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


@dataclass
class Round:
    """What one round reads (``read_round``): Redis' time, who wrote beat's worker record
    last, {host: stats} of the workers heard whose stats changed since the round asked
    or that were silent (``at``: when they changed; ``quiet_since``: the push before,
    from which they were the same as before), and the workers whose last push fell out
    of the window since the last round (``cutoff``: this round's)."""

    now: float
    writer: str
    heard: dict[str, dict]
    silent: list[str]
    cutoff: float


def read_round(client: redis.Redis, since: float | str, fresh_s: float,
               last_cutoff: float | str, forget_s: float, asked: Iterable[str]) -> Round:
    """One round's read (``lua/stats_read.lua``): the stats changed since ``since`` and
    those of the workers ``asked`` about (silent so far) heard within ``fresh_s``, the
    workers silent since ``last_cutoff`` (the window of the round before); stats silent
    for ``forget_s`` are dropped."""
    now, writer, records, silent, cutoff = scripts.run(
        client, "stats_read", [*STATS_KEYS, WORKERS_BY_KEY],
        [since, fresh_s, last_cutoff, forget_s, *asked])
    heard = {}
    for i in range(0, len(records), 4):
        host, at, quiet, raw = records[i:i + 4]
        try:
            heard[_text(host)] = {**json.loads(raw), "at": float(at),
                                    "quiet_since": float(quiet)}
        except ValueError:
            log.error("worker %s pushed unreadable stats: ignored", _text(host))
    return Round(float(now), _text(writer), heard, [_text(h) for h in silent], float(cutoff))


def fresh_stats(client: redis.Redis, fresh_s: float, forget_s: float) -> dict[str, dict]:
    """{host: stats} of every worker that pushed within ``fresh_s`` (Redis' clock)."""
    return read_all(client, fresh_s, forget_s).heard


def read_all(client: redis.Redis, fresh_s: float, forget_s: float) -> Round:
    """Every record (a new leader's first round): the stats of every worker that pushed
    within ``fresh_s`` (Redis' clock), each with ``at``: when they last changed, and
    ``quiet_since``: the push before (the same stats from then on); records silent for
    ``forget_s`` are dropped on the way."""
    with client.pipeline(transaction=False) as pipe:
        pipe.time().hgetall(WORKER_STATS_KEY).zrange(WORKER_STATS_AT_KEY, 0, -1, withscores=True)
        pipe.zrange(WORKER_STATS_CHANGED_KEY, 0, -1, withscores=True)
        (seconds, micros), records, stamps, changes, quiet = \
            pipe.hgetall(WORKER_STATS_QUIET_KEY).execute()
    now, changed_at = seconds + micros / 1e6, dict(changes)
    gone = [host for host, at in stamps if now - at > forget_s]
    if gone:
        with client.pipeline() as pipe:
            pipe.hdel(WORKER_STATS_KEY, *gone).hdel(WORKER_STATS_QUIET_KEY, *gone)
            pipe.zrem(WORKER_STATS_AT_KEY, *gone).zrem(WORKER_STATS_CHANGED_KEY, *gone).execute()
    replies = {}
    for host, at in stamps:
        raw = records.get(host)
        if now - at <= fresh_s and raw is not None:
            try:
                replies[_text(host)] = {**json.loads(raw), "at": changed_at.get(host, at),
                                        "quiet_since": float(quiet.get(host) or 0)}
            except ValueError:
                log.error("worker %s pushed unreadable stats: ignored", _text(host))
    return Round(now, "", replies, [], now - fresh_s)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

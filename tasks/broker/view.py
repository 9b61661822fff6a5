"""This process's copy of beat's lane snapshot (of the cell it works in), and how far
Redis' clock is from this process's: what a publish routes by and states its deadline
on."""
from __future__ import annotations

import time
from functools import lru_cache

import redis

from routing.snapshot import SnapshotCache
from tasks.broker.cell import url_now
from tasks.broker.keys import SNAPSHOT_KEY, members_key
from tasks.broker.store import broker_client
from tasks.settings import settings

#: Bounded loads: a worker over (1 + HASH_EPSILON) x the mean load passes jobs on.
HASH_EPSILON = 0.25

#: Redis' clock minus this process's (seconds), measured with each quick snapshot read
#: (under ``CLOCK_READ_S``): a publish's deadline is stated on Redis' clock, which is
#: what its script reads.
_redis_clock_offset_s = [0.0]
CLOCK_READ_S = 0.05


def _read_snapshot(client: redis.Redis) -> str | None:
    """The snapshot, and by the way how far Redis' clock is from ours."""
    sent = time.time()
    with client.pipeline(transaction=False) as pipe:
        raw, (seconds, micros) = pipe.get(SNAPSHOT_KEY).time().execute()
    received = time.time()
    if received - sent < CLOCK_READ_S:  # a slow read would blur the estimate
        _redis_clock_offset_s[0] = seconds + micros / 1e6 - (sent + received) / 2
    return raw


def publish_deadline() -> float:
    """The Redis time after which a publish sent now must not happen: the caller gives
    up at ``GPULANES_REDIS_TIMEOUT_S``; the margin leaves room for the reply."""
    margin_s = min(1.0, settings.redis_timeout_s / 4)
    return time.time() + _redis_clock_offset_s[0] + settings.redis_timeout_s - margin_s


def snapshot_cache() -> SnapshotCache:
    """This process's copy of the lane snapshot (inside ``tasks.broker.cell.within``,
    of that cell's): read in the first ``submit()``'s own call, before it routes, then
    refreshed in the background; each read gives up within ``GPULANES_REDIS_TIMEOUT_S``
    (one second at most: routing falls back to the tiers)."""
    return _snapshot_cache(url_now())


@lru_cache(maxsize=None)
def _snapshot_cache(url: str) -> SnapshotCache:
    read_s = min(1.0, settings.redis_timeout_s)
    client = broker_client(socket_timeout=read_s, socket_connect_timeout=read_s)
    return SnapshotCache(lambda: _read_snapshot(client), refresh_s=settings.heartbeat_s / 2,
                         stale_s=settings.snapshot_stale_s, max_depth=settings.max_depth,
                         epsilon=HASH_EPSILON,
                         fetch_members=lambda v: client.get(members_key(v)))


snapshot_cache.cache_info = _snapshot_cache.cache_info  # type: ignore[attr-defined]

"""Health checks that heal: put a dead worker's jobs back in their lanes at once.

Workers record which incarnation holds each broker message
(``gpu_worker.hooks.HeldJobs``). When an incarnation is dead (it missed its
heartbeats, or a newer process took over its name) each message it still
holds goes back to the front of its lane, long before Redis' visibility
timeout would return it. The move is one Redis transaction that re-checks
the holder, so a message that meanwhile went to another worker stays there.
A job whose lease its holder still extends (``gpu_worker.hooks.KeepHeld``)
stays put: that process lives and runs it, though it no longer answers
heartbeats (a warm shutdown); a dead runner's lease lapses within seconds.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

import redis
from kombu.utils.json import loads

from routing.names import HOLDERS_KEY, lease_key

log = logging.getLogger(__name__)


def _parts(incarnation: str) -> tuple[str, float]:
    host, _pid, started_at = incarnation.rsplit("/", 2)
    return host, float(started_at)


def dead_incarnations(incarnations: Iterable[str], workers: Mapping[str, dict]) -> set[str]:
    """Incarnations ("host/pid/start") whose jobs must be put back (pure)."""
    dead = set()
    for incarnation in set(incarnations):
        host, started_at = _parts(incarnation)
        worker = workers.get(host)
        if worker is None:
            continue  # not heard from yet: too new to judge
        if worker.get("incarnation") == incarnation:
            if not worker["alive"]:
                dead.add(incarnation)
        elif worker.get("alive") and worker.get("started_at", 0) > started_at:
            dead.add(incarnation)  # restarted under the same name
    return dead


def restore_if_held(channel: Any, client: redis.Redis, tag: str, incarnation: str) -> bool:
    """Put message ``tag`` back in its lane if ``incarnation`` still holds it."""
    qos = channel.qos

    def move(pipe: redis.client.Pipeline) -> bool:
        if pipe.hget(HOLDERS_KEY, tag) != incarnation:
            return False
        raw = pipe.hget(qos.unacked_key, tag)
        message, exchange, routing_key = loads(raw) if raw else (None, None, None)
        if message and pipe.get(lease_key(message["headers"]["id"])) == incarnation:
            return False  # silent, yet still running it (a warm shutdown): not dead yet
        pipe.multi()
        pipe.hdel(HOLDERS_KEY, tag).zrem(qos.unacked_index_key, tag).hdel(qos.unacked_key, tag)
        if message:
            channel._do_restore_message(message, exchange, routing_key, pipe)
        return bool(raw)

    return client.transaction(move, HOLDERS_KEY, qos.unacked_key, value_from_callable=True)


def requeue_dead(app: Any, client: redis.Redis, workers: Mapping[str, dict]) -> int:
    """Restore every message a dead incarnation holds; returns how many."""
    holders = client.hgetall(HOLDERS_KEY)
    dead = dead_incarnations(holders.values(), workers)
    if not dead:
        return 0
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        restored = sum(restore_if_held(channel, client, tag, who)
                       for tag, who in holders.items() if who in dead)
    log.warning("dead worker(s) %s: %d job(s) put back in their lanes", sorted(dead), restored)
    return restored

"""Health checks that heal: put a dead worker's jobs back in their lanes at once.

The queue protocol records which incarnation holds each message in the step that
takes it (``tasks.broker.handover``). When an incarnation is dead (it missed its
heartbeats, or a newer process took over its name) each message it still holds
goes back to the front of its list. Each move is one Lua step that re-checks the
record, so a message that meanwhile went elsewhere stays there. A job whose lease
its holder still extends (``gpu_worker.hooks.KeepLeases``) stays put: that process
lives and runs it, though it no longer answers heartbeats (a warm shutdown); a dead
runner's lease lapses within seconds.
"""
from __future__ import annotations

import logging
from typing import Iterable, Mapping

import redis

from tasks.broker import leader
from tasks.broker.handover import put_back_all
from tasks.broker.keys import METRICS_KEY, metric_field

log = logging.getLogger(__name__)
#: The ``METRICS_KEY`` field counting messages put back (``gpulanes_recovered_total``).
RECOVERED_FIELD = metric_field("recovered")
#: Heartbeat rounds a worker may miss in a row before it is dead to routing and beat
#: puts back the jobs it held.
MISSES_ALLOWED = 2


def _parts(incarnation: str) -> tuple[str, float]:
    host, _pid, started_at = incarnation.rsplit("/", 2)
    return host, float(started_at)


def unheard_holders(incarnations: Iterable[str], workers: Mapping[str, dict],
                    now: float) -> dict[str, dict]:
    """Records for processes that hold messages yet never answered a heartbeat (frozen
    or killed just after they began taking jobs), counted from ``now``: they are not
    routed to, and are dead once they miss as many rounds as any worker (pure)."""
    records = {}
    for incarnation in set(incarnations):
        host, started_at = _parts(incarnation)
        worker = workers.get(host)
        if worker is None or (worker.get("incarnation") != incarnation and not worker["alive"]
                              and worker.get("started_at", 0) < started_at):
            records[host] = {"incarnation": incarnation, "started_at": started_at,
                             "last_seen": now, "missed": 0, "alive": False, "unheard": True}
    return records


def dead_incarnations(incarnations: Iterable[str], workers: Mapping[str, dict],
                      misses_allowed: int = MISSES_ALLOWED) -> set[str]:
    """Incarnations ("host/pid/start") whose jobs must be put back (pure)."""
    dead = set()
    for incarnation in set(incarnations):
        host, started_at = _parts(incarnation)
        worker = workers.get(host)
        if worker is None:
            continue  # not heard from yet: too new to judge (see unheard_holders)
        if worker.get("incarnation") == incarnation:
            if not worker["alive"] and (not worker.get("unheard")
                                        or worker["missed"] >= misses_allowed):
                dead.add(incarnation)
        elif worker.get("started_at", 0) > started_at:
            # restarted under the same name (alive or not yet heard): the old process
            # is gone, or finishing what it runs, whose lease then keeps its job
            dead.add(incarnation)
    return dead


def requeue_dead(client: redis.Redis, workers: Mapping[str, dict], holders: Iterable[str],
                 misses_allowed: int) -> int:
    """Give back every message a dead incarnation among ``holders`` holds; how many."""
    dead = dead_incarnations(holders, workers, misses_allowed)
    if not dead:
        return 0
    restored = sum(put_back_all(client, who, epoch=leader.epoch()) for who in sorted(dead))
    if restored:
        client.hincrby(METRICS_KEY, RECOVERED_FIELD, restored)
    log.warning("dead worker(s) %s: %d job(s) put back in their lanes", sorted(dead), restored)
    return restored

"""Health checks that heal: put a dead worker's jobs back in their lanes at once.

Workers record the broker messages they hold (``gpu_worker.hooks.HeldJobs``).
When a worker incarnation is dead (it missed its heartbeats, or a newer
process took over its name) its messages go back to the front of their lanes
through kombu's own restore, long before Redis' visibility timeout would.
"""
from __future__ import annotations

import logging
from typing import Mapping

from routing.names import INCARNATIONS_KEY, held_key

log = logging.getLogger(__name__)


def dead_incarnations(incarnations: Mapping[str, float],
                      workers: Mapping[str, dict]) -> list[str]:
    """Incarnations ("host/pid" -> start time) whose jobs must be put back (pure)."""
    dead = []
    for incarnation, started_at in incarnations.items():
        worker = workers.get(incarnation.rsplit("/", 1)[0])
        if worker is None:
            continue  # not heard from yet: too new to judge
        if worker.get("incarnation") == incarnation:
            if not worker["alive"]:
                dead.append(incarnation)
        elif worker.get("alive") and worker.get("started_at", 0) > float(started_at):
            dead.append(incarnation)  # restarted under the same name
    return dead


def requeue_dead(app, client, workers: Mapping[str, dict]) -> int:
    """Restore every message a dead incarnation held; returns how many."""
    incarnations = client.hgetall(INCARNATIONS_KEY)
    restored = 0
    for incarnation in dead_incarnations(incarnations, workers):
        tags = client.hkeys(held_key(incarnation))
        if tags:
            with app.connection_for_write() as conn:
                qos = conn.default_channel.qos
                for tag in tags:
                    qos.restore_by_tag(tag)
        client.delete(held_key(incarnation))
        client.hdel(INCARNATIONS_KEY, incarnation)
        restored += len(tags)
        log.warning("worker %s is dead: %d job(s) put back in their lanes",
                    incarnation, len(tags))
    return restored

"""A dead or sick worker's own queues go back to the shared lanes, in order, at the front."""
from __future__ import annotations

import logging

import redis

from routing.names import LANES, worker_queue
from tasks.broker.keys import LIST_DEPTHS_KEY, lane_keys
from tasks.broker.moves import readdress

log = logging.getLogger(__name__)


def return_to_shared_lanes(client: redis.Redis, node: str, why: str = "is gone") -> int:
    """Move every job queued for worker ``node`` to the front of its shared lane
    (``why``: for the log, the worker "is gone" or "is sick"). Only the lists the
    depth counters say hold jobs are read (one read for all of them)."""
    pairs = [(own, shared, lane) for lane in LANES
             for own, shared in zip(lane_keys(worker_queue(lane, node)), lane_keys(lane))]
    counts = client.hmget(LIST_DEPTHS_KEY, [own for own, _, _ in pairs])
    moved = sum(readdress(client, own, shared, lane)
                for (own, shared, lane), count in zip(pairs, counts) if int(count or 0) > 0)
    if moved:
        log.warning("worker %s %s: %d queued job(s) back in the shared lanes", node, why,
                    moved)
    return moved

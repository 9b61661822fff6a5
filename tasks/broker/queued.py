"""Where a queued job waits, and about how many jobs go before it (``lanes job ID``).

An operator's question, not the per-job path: it reads every list of the lanes (each
lane's set of lists, ``lists_key``), so it costs what the lanes hold. The count is
the jobs before it in its own list, in every list of the lanes above and in its
lane's lists of a higher level; which worker takes what from the other lists of its
own lane and level is left out (each worker serves its own queue first).
"""
from __future__ import annotations

from typing import Any

import redis

from routing.names import LANES
from tasks.broker import envelope
from tasks.broker.keys import PRIORITY_SEP, lists_key
from tasks.broker.moves import next_to_run


def _level(key: str) -> int:
    """The priority level of a lane list (0 runs first)."""
    _, sep, level = key.partition(PRIORITY_SEP)
    return int(level) if sep and level.isdigit() else 0


def place(client: redis.Redis, job_id: str) -> dict[str, Any] | None:
    """Where job ``job_id`` waits: its lane, its queue (the lane, or a worker's own queue
    of it) and the jobs ahead of it (those before it in its list, in the lanes above,
    and in its lane's lists of a higher level); None if no list holds it."""
    lists = {lane: sorted(client.smembers(lists_key(lane))) for lane in LANES}
    ahead_of_lane = 0
    for lane in LANES:
        for key in lists[lane]:
            found = _index(next_to_run(client, key, 0), job_id)
            if found is None:
                continue
            before, length = found
            level = _level(key)
            higher = sum(client.llen(other) for other in lists[lane]
                         if _level(other) < level)
            return {"lane": lane, "queue": key.partition(PRIORITY_SEP)[0],
                    "ahead": ahead_of_lane + higher + (length - 1 - before)}
        ahead_of_lane += sum(client.llen(key) for key in lists[lane])
    return None


def _index(items: list[Any], job_id: str) -> tuple[int, int] | None:
    """(index, length) of the job's message in a list as ``moves.next_to_run`` reads it
    (the very next one last)."""
    for i, raw in enumerate(items):
        try:
            if envelope.job_id(envelope.decode(raw)) == job_id:
                return i, len(items)
        except ValueError:
            continue
    return None

"""Where a message goes: the bindings of direct and topic exchanges, kept in Redis for
every process, and the list of a queue at a message's priority.

Both kombu's publishes (``tasks.broker.lanes``) and gpulanes' own
(``tasks.broker.enqueue``, a worker's retry) read them here, so a job reaches the same
list whichever way it is sent.
"""
from __future__ import annotations

import time
from bisect import bisect
from typing import Iterable

import redis

from routing.names import LANES, lane_of
from tasks.broker.keys import BINDINGS_PREFIX, PRIORITY_SEP, list_key

#: Seconds a lane exchange's bindings are kept before they are read again.
TABLE_KEPT_S = 5.0
#: Priority levels of a queue's lists, unless ``priority_steps`` says otherwise (kombu's).
PRIORITY_STEPS = (0, 3, 6, 9)

Binding = tuple[str, str, str]  # (routing key, pattern, queue)


def is_lane(queue: str) -> bool:
    """A lane or a worker's own queue of one: the queues jobs wait in."""
    return lane_of(queue) in LANES


class Bindings:
    """The bindings of one Redis, a lane exchange's kept ``TABLE_KEPT_S``."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.kept: dict[str, tuple[float, list[Binding]]] = {}  # exchange -> (read at, table)

    def table(self, exchange: str) -> list[Binding]:
        """The exchange's bindings. A lane's change only when a worker binds or drops
        its own queue: kept. A lane queue nobody has bound (its worker gone, or not
        started yet) is served by its shared lane, where any worker takes it: an
        unrouted job would be dropped, its caller never knowing."""
        if not is_lane(exchange):
            return self.read(exchange)
        now, kept = time.monotonic(), self.kept.get(exchange)
        if kept is not None and now - kept[0] < TABLE_KEPT_S:
            return kept[1]
        table = self.read(exchange)
        if table:
            self.kept[exchange] = (now, table)
            return table
        return [(exchange, "", lane_of(exchange))]

    def read(self, exchange: str) -> list[Binding]:
        members = self.client.smembers(BINDINGS_PREFIX + exchange)
        return [tuple(_text(member).split(PRIORITY_SEP, 2)) for member in members]

    def bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        self.kept.pop(exchange, None)  # this process's own binds are seen at once
        self.client.sadd(BINDINGS_PREFIX + exchange, _member(routing_key, pattern, queue))

    def unbind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        self.kept.pop(exchange, None)
        self.client.srem(BINDINGS_PREFIX + exchange, _member(routing_key, pattern, queue))

    def queue_of(self, exchange: str) -> str:
        """The queue a job published to lane exchange ``exchange``, under its own name as
        routing key, goes to (a direct exchange's lookup)."""
        return next((queue for key, _, queue in self.table(exchange) if key == exchange),
                    lane_of(exchange))


def lists(queues: Iterable[str], steps: Iterable[int]) -> list[str]:
    """The lists of ``queues``, in the order they are served: lane by lane (a lane and
    the workers' own queues of it, in the order of ``queues``), within a lane level by
    level, each level in the order of its queues. So a lane's levels never pass the
    lanes above it (kombu's Redis transport serves level by level across all queues)."""
    lanes: dict[str, list[str]] = {}
    for queue in queues:
        lanes.setdefault(lane_of(queue), []).append(queue)
    steps = sorted(steps)
    return [list_key(queue, step) for group in lanes.values() for step in steps
            for queue in group]


def list_of(queue: str, priority: int | None, steps: Iterable[int]) -> str:
    """The list of ``queue`` a message of ``priority`` goes to: the level at or below it."""
    steps = sorted(steps)
    return list_key(queue, steps[max(0, bisect(steps, priority or 0) - 1)])


def _member(routing_key: str, pattern: str, queue: str) -> str:
    return PRIORITY_SEP.join((routing_key or "", pattern or "", queue))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value

"""The worker's lane reads, guarded: an item on a lane list that is not a kombu
envelope never reaches kombu (it would stop the worker with ``Unrecoverable error``
or drop its broker connection). BRPOP has already taken it off the lane: it is
handed to ``refuse`` (the worker dead-letters it) and the read goes on."""
from __future__ import annotations

from typing import Any, Callable

from kombu.transport import redis as kombu_redis

from tasks.broker import envelope

#: kombu members wrapped here (pinned, like the transport's: tests/test_kombu_hooks.py).
KOMBU_HOOKS = {
    kombu_redis.Channel: ("handlers", "_brpop_read", "connection"),
    kombu_redis.Transport: ("_deliver",),
}
#: ``refuse(problem, details)``: what was wrong with an item, and what is known of it.
Refuse = Callable[[str, dict[str, Any]], None]


def guard_lane_reads(channel: Any, refuse: Refuse) -> bool:
    """Wrap ``channel``'s lane reads; False when it is not kombu's Redis channel."""
    if "BRPOP" not in getattr(channel, "handlers", {}):
        return False
    transport, read = channel.connection, channel._brpop_read
    deliver, delivering = transport._deliver, []

    def guarded_read(**options: Any) -> Any:
        delivering.clear()  # (broadcasts reach deliver too, through LISTEN)
        try:
            return read(**options)
        except ValueError as exc:  # JSON, UTF-8 or base64 of an item, before delivery
            if delivering:
                raise
            refuse(f"a lane item that is not JSON: {exc}", {})
            return True

    def guarded_deliver(item: Any, queue: str) -> None:
        problem = envelope.problem(item)
        if problem is None:
            delivering.append(True)
            return deliver(item, queue)
        refuse(problem, {"queue": queue, "item": item})

    channel.handlers["BRPOP"] = guarded_read
    transport._deliver = guarded_deliver
    return True

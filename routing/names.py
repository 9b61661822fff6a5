"""Lane, tier, queue, task and command names: what routing speaks of (Redis keys
are the broker's: ``tasks.broker.keys``)."""
from __future__ import annotations

FAST = "fast"
STANDARD = "standard"
RELAXED = "relaxed"
#: Lanes in priority order: workers consume them in exactly this order.
LANES: tuple[str, ...] = (FAST, STANDARD, RELAXED)
TIERS: tuple[str, ...] = LANES
#: kombu priority steps; fast and standard use only 0, so lane order holds and
#: the relaxed lane is split into four levels (light users first).
RELAX_PRIORITIES: tuple[int, ...] = (0, 3, 6, 9)


def worker_queue(lane: str, node: str) -> str:
    """A worker's own queue of ``lane``: jobs routed to it for its warm models."""
    return f"{lane}.{node}"


def lane_of(queue: str) -> str:
    """The lane a queue serves: ``fast.gpu0@host`` and ``fast`` are both ``fast``."""
    return queue.split(".", 1)[0]


def worker_queues(node: str) -> list[str]:
    """What a worker consumes, in order: its own queue before each shared lane."""
    return [name for lane in LANES for name in (worker_queue(lane, node), lane)]


GENERATE_TASK = "gpulanes.generate"
HEARTBEAT_TASK = "gpulanes.heartbeat"
MOVERS_TASK = "gpulanes.move_queued"
#: Custom worker inspect command answered by the consumer thread.
STATS_COMMAND = "lanes_stats"
#: Custom worker control command: load a model ahead of traffic.
PREWARM_COMMAND = "lanes_prewarm"
#: Custom worker control command: consume exactly these queues, in this order (a
#: sick worker stepping aside sends itself none, and its queues when it is well).
CONSUME_COMMAND = "lanes_consume"


def worker_hostname(index: int) -> str:
    """Celery node name of the worker pinned to device ``index``."""
    return f"gpu{index}@%h"

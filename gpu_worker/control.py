"""Control commands answered by the consumer thread, even while a job runs."""
from __future__ import annotations

from typing import Any

from celery.worker.control import control_command, inspect_command

from gpu_worker.batch_run import BATCHER
from gpu_worker.health import HEALTH
from gpu_worker.runtime import RUNTIME
from gpu_worker.stuck import WATCHDOG
from routing.names import CONSUME_COMMAND, PREWARM_COMMAND, STATS_COMMAND, lane_of
from tasks.settings import settings


def stats_of(consumer: Any) -> dict[str, Any]:
    """gpulanes load figures: device, pool, in-flight jobs, service time, warm models,
    ``sick`` (why this worker stepped aside, or None) and ``stuck`` (why its own
    bookkeeping is wedged, or None), and ``leaving`` once it shuts down: what it pushes
    every heartbeat (``gpu_worker.stats``) and answers to ``celery inspect lanes_stats``."""
    reply = RUNTIME.stats()
    taking = consumer.task_consumer  # None once the worker shuts down: it takes nothing
    queues = [q.name for q in taking.queues] if taking is not None else []
    reply["queues"] = queues
    reply["lanes"] = list(dict.fromkeys(lane_of(name) for name in queues))
    reply["concurrency"] = consumer.controller.concurrency
    reply["pool"] = settings.pool
    reply["batching"] = BATCHER.stats()
    reply.update(HEALTH.stats())
    reply.update(WATCHDOG.stats())
    if taking is None:  # its last push: no job goes to it (``routing.placement.serving``)
        reply["leaving"] = True
    return reply


@inspect_command(name=STATS_COMMAND)
def lanes_stats(state: Any, **_: Any) -> dict[str, Any]:
    """The worker's stats (:func:`stats_of`), asked for."""
    return stats_of(state.consumer)


@control_command(name=PREWARM_COMMAND, args=[("model", str)], signature="<model>")
def lanes_prewarm(state: Any, model: str, **_: Any) -> dict[str, str]:
    """Load a model ahead of traffic, in the background; replies at once."""
    try:
        return {"ok": RUNTIME.prewarm(model)}
    except KeyError as exc:
        return {"error": str(exc)}


def consume_only(consumer: Any, queues: list[str]) -> None:
    """Make ``consumer`` consume exactly ``queues``, in this order (in its own thread).

    Queue order is lane priority with kombu's priority cycle, and adding a queue
    appends it: so unless the order is already right, every queue goes and the
    wanted ones come back in order, in this one step.
    """
    current = [q.name for q in consumer.task_consumer.queues]
    if current == queues:
        return
    for queue in current:
        consumer.cancel_task_queue(queue)
    for queue in queues:
        consumer.add_task_queue(queue)


@control_command(name=CONSUME_COMMAND, args=[("queues", str)], signature="<queue,...>")
def lanes_consume(state: Any, queues: str | list[str] = "", **_: Any) -> dict[str, str]:
    """Consume exactly these queues, in order; none to step aside (``gpu_worker.health``).

    One command for the whole list: Celery applies each ``add_consumer`` through
    kombu's ``Hub.call_soon``, which keeps pending calls in a set, so several are
    applied in any order, and the order is the lanes' priority.
    """
    names = [q for q in (queues.split(",") if isinstance(queues, str) else queues) if q]
    # like Celery's own add/cancel_consumer: change the consumer between its reads
    state.consumer.call_soon(consume_only, state.consumer, names)
    return {"ok": f"consuming {', '.join(names) or 'nothing'}"}

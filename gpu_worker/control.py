"""Control commands answered by the consumer thread, even while a job runs."""
from __future__ import annotations

from typing import Any

from celery.worker.control import control_command, inspect_command

from gpu_worker.batching import BATCHER
from gpu_worker.runtime import RUNTIME
from routing.names import PREWARM_COMMAND, STATS_COMMAND, lane_of


@inspect_command(name=STATS_COMMAND)
def lanes_stats(state: Any, **_: Any) -> dict[str, Any]:
    """gpulanes load figures: device, in-flight jobs, service time, warm models."""
    reply = RUNTIME.stats()
    queues = [q.name for q in state.consumer.task_consumer.queues]
    reply["queues"] = queues
    reply["lanes"] = list(dict.fromkeys(lane_of(name) for name in queues))
    reply["concurrency"] = state.consumer.controller.concurrency
    reply["batching"] = BATCHER.stats()
    return reply


@control_command(name=PREWARM_COMMAND, args=[("model", str)], signature="<model>")
def lanes_prewarm(state: Any, model: str, **_: Any) -> dict[str, str]:
    """Load a model ahead of traffic, in the background; replies at once."""
    try:
        return {"ok": RUNTIME.prewarm(model)}
    except KeyError as exc:
        return {"error": str(exc)}

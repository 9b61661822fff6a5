"""The worker's heartbeat reply, answered by the consumer thread even mid-job."""
from __future__ import annotations

from typing import Any

from celery.worker.control import inspect_command

from gpu_worker.runtime import RUNTIME
from routing.names import STATS_COMMAND


@inspect_command(name=STATS_COMMAND)
def lanes_stats(state: Any, **_: Any) -> dict[str, Any]:
    """gpulanes load figures: device, in-flight jobs, service time, warm models."""
    reply = RUNTIME.stats()
    reply["lanes"] = [q.name for q in state.consumer.task_consumer.queues]
    reply["concurrency"] = state.consumer.controller.concurrency
    return reply

"""Every queue name, task name and Redis key gpulanes uses, in one place."""
from __future__ import annotations

FAST = "fast"
STANDARD = "standard"
RELAXED = "relaxed"
#: Lanes in priority order: workers consume them in exactly this order.
LANES: tuple[str, ...] = (FAST, STANDARD, RELAXED)
TIERS: tuple[str, ...] = LANES

GENERATE_TASK = "gpulanes.generate"
HEARTBEAT_TASK = "gpulanes.heartbeat"
#: Custom worker inspect command answered by the consumer thread.
STATS_COMMAND = "lanes_stats"

PREFIX = "gpulanes"
#: Hash: worker hostname -> JSON of its last heartbeat reply.
WORKERS_KEY = f"{PREFIX}:workers"
#: JSON: the latest load snapshot written by beat.
SNAPSHOT_KEY = f"{PREFIX}:snapshot"


def attempts_key(job_id: str) -> str:
    """Counter of runs started for one job (survives redelivery)."""
    return f"{PREFIX}:attempts:{job_id}"


def worker_hostname(index: int) -> str:
    """Celery node name of the worker pinned to device ``index``."""
    return f"gpu{index}@%h"
